"""Ending the open watch streams when the server stops.

A page keeps a conversation's ``/events`` stream open for as long as it is shown. A server
told to stop (Ctrl-C, SIGTERM) waits for open responses before it runs the app's shutdown, so
with a tab open it would wait out its whole grace period and then cancel the stream with an
error in its log. The server that runs the app (``segue serve``, ``segue.server.run.serve``)
calls ``StreamsEnd`` as it is told to stop instead: every watch stream ends at once, cleanly,
and the page goes back to trying to reconnect (to another worker behind the same address, or
to this one when it is back).
"""

from __future__ import annotations

import asyncio
import contextlib


class StreamsEnd:
    """Said once the server stops; watch streams wait on ``ended()`` beside their updates.

    Callable from any thread or from a signal handler (the server's own runs in the loop's
    thread, between any two bytecodes): the event is set by the loop itself. ``reset()`` as
    the app starts again (served once more, perhaps on another loop)."""

    __slots__ = ("_event", "_loop", "_said")

    def __init__(self) -> None:
        self._said = False
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self) -> None:
        """The server is stopping: end the streams."""
        self._said = True
        event, loop = self._event, self._loop
        if event is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing is open
                loop.call_soon_threadsafe(event.set)

    def reset(self) -> None:
        """The app starts (again): streams run until the next stop."""
        self._said = False
        self._event = self._loop = None

    async def ended(self) -> None:
        """Return once the server stops (at once if it already did)."""
        loop = asyncio.get_running_loop()
        if self._event is None or self._loop is not loop:
            self._event, self._loop = asyncio.Event(), loop
            if self._said:
                self._event.set()
        await self._event.wait()


def streams_end(app: object) -> StreamsEnd | None:
    """The ``StreamsEnd`` of an app ``create_app`` made (None for any other app)."""
    found = getattr(getattr(app, "state", None), "streams_end", None)
    return found if isinstance(found, StreamsEnd) else None
