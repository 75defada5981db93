"""The runtime's life with the app's: its startup work (``recover()``) run as the app starts, the
runtime closed as it stops and opened again if the app starts again (one app, many
``TestClient``s); in an app mounted in another whose lifespan does not run this one's, the
recovery started by the first request instead. And what ``/readyz`` reports of it.

A store that cannot be reached at startup (a database that comes up after the application, as
happens under an orchestrator) does not stop the app from starting: the recovery is tried again
in the background until it succeeds, and ``/readyz`` answers 503 with the reason meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final

from fastapi import FastAPI

from segue.executor._log import get_logger
from segue.executor.errors import StoreLockedError, StoreUnavailableError
from segue.executor.runtime import Runtime
from segue.server.ending import StreamsEnd
from segue.server.pausing import Pauses

_log = get_logger("segue.server")
RETRY_FIRST, RETRY_LONGEST = 0.5, 10.0
"""Seconds between attempts at the startup recovery while the store cannot be reached."""
_UNREACHABLE: Final = (StoreUnavailableError, StoreLockedError, OSError)


class Startup:
    """The runtime's startup work: run once per start of the app, retried while the store
    cannot be reached, and whether it is done (``/readyz``)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.task: asyncio.Task[None] | None = None
        self.recovered = False
        """The startup recovery finished: what a crash left pending is performed."""
        self.problem: str | None = None
        """Why the recovery has not finished (None: it has, or it is under way)."""
        self._closed = False
        """The app's last shutdown closed the runtime (its store is opened again at start)."""
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def started(self) -> bool:
        """Whether the startup work is done or under way."""
        return self.recovered or (self.task is not None and not self.task.done())

    def ensure(self) -> asyncio.Event:
        """Start the recovery in the background, unless it is done or under way (a request
        never waits for another conversation's recovered work); the event is set once its
        first attempt is over."""
        attempted = asyncio.Event()
        if self.started:
            attempted.set()
            return attempted
        self.task = asyncio.ensure_future(self._recover_until_done(attempted))
        self.task.add_done_callback(_retrieved)
        return attempted

    async def _recover_until_done(self, attempted: asyncio.Event) -> None:
        delay = RETRY_FIRST
        try:
            while True:
                try:
                    await self.runtime.recover()
                except _UNREACHABLE as error:
                    self.problem = f"the store cannot be reached ({type(error).__name__})"
                    _log.warning("recovery_postponed", error_type=type(error).__name__)
                except Exception as error:
                    self.problem = f"the startup recovery failed ({type(error).__name__})"
                    _log.error("recovery_failed", error_type=type(error).__name__)
                    raise
                else:
                    self.recovered, self.problem = True, None
                    return
                attempted.set()
                await asyncio.sleep(delay)  # a backoff between attempts, not a wait on an event
                delay = min(delay * 2, RETRY_LONGEST)
        finally:
            attempted.set()

    async def _open(self) -> None:
        """As the app starts: the store opened again if a shutdown closed it, then the
        recovery's first attempt waited for (an app whose store answers serves once what a
        crash left pending is performed, as ``async with runtime`` would; one that cannot
        reach its store starts anyway and keeps trying)."""
        if self._closed:
            await self.runtime.reopen()
            self._closed = False
        self.recovered = False
        await self.ensure().wait()
        task = self.task
        if task is not None and task.done() and not task.cancelled():
            error = task.exception()
            if error is not None:
                raise error

    async def _sweep(self) -> None:
        """Every lease, take over work that no live runtime holds any more (one that stopped,
        or crashed, with its claims let go or lapsed): without it such work waits for the
        conversation's next message, or for a process to start. Work another live runtime
        holds is left to it (``recover`` claims only what nobody holds)."""
        while True:
            await asyncio.sleep(self.runtime.lease)
            if not self.recovered:
                continue  # the startup recovery is still at it
            try:
                await self.runtime.recover()
            except Exception as error:  # noqa: BLE001  # logged; the next sweep tries again
                _log.warning("sweep_failed", error_type=type(error).__name__)

    async def _close(self) -> None:
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
        task, self.task = self.task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.recovered = False
        self._closed = True
        await self.runtime.close()

    def lifespan(
        self, pauses: Pauses, end: StreamsEnd
    ) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
        """The app's lifespan: the runtime recovered while the app serves and closed as it
        stops (the waits on other processes' pauses given up first); opened again by the next
        start."""

        @asynccontextmanager
        async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
            end.reset()  # served (again): its watch streams run until it stops
            await self._open()
            self._sweeper = asyncio.ensure_future(self._sweep())
            try:
                yield
            finally:
                await pauses.close()
                await self._close()

        return lifespan


def _retrieved(task: asyncio.Task[None]) -> None:
    """Read a finished recovery's outcome (logged where it failed), so that asyncio does not
    report it again as never retrieved."""
    if not task.cancelled():
        task.exception()


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
