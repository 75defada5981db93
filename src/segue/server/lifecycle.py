"""The runtime's life with the app's: entered (``recover()``) as the app starts, closed as it
stops; and, in an app mounted in another whose lifespan does not run this one's, the recovery
started by the first request instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI

from segue.executor._log import get_logger
from segue.executor.runtime import Runtime
from segue.server.ending import StreamsEnd
from segue.server.pausing import Pauses

_log = get_logger("segue.server")


class Startup:
    """Whether the runtime's startup work (``recover()``) ran, and running it once if not."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.started = False
        self.task: asyncio.Task[None] | None = None

    def ensure(self) -> None:
        """Start the recovery in the background (a request never waits for another
        conversation's recovered work)."""
        if self.started or self.task is not None:
            return
        self.started = True
        self.task = asyncio.ensure_future(self.runtime.recover())
        self.task.add_done_callback(_log_failure)

    def lifespan(
        self, pauses: Pauses, end: StreamsEnd
    ) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
        """The app's lifespan: the runtime entered (its recovery run) while the app serves;
        as it stops, the waits on other processes' pauses given up."""

        @asynccontextmanager
        async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
            end.reset()  # served (again): its watch streams run until it stops
            async with self.runtime:
                self.started = True
                try:
                    yield
                finally:
                    await pauses.close()

        return lifespan


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        _log.error("recovery_failed", error_type=type(exc).__name__)


class StartOnFirstRequest:
    """Run the startup work with the first request when no lifespan ran it (a mounted app)."""

    def __init__(self, app: Any, *, startup: Startup) -> None:
        self.app = app
        self.startup = startup

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self.startup.started:
            self.startup.ensure()
        await self.app(scope, receive, send)


__all__ = ["StartOnFirstRequest", "Startup"]
