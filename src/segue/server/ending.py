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
import weakref

from segue.executor.bus import Watch


class StreamsEnd:
    """The watches behind the open ``/events`` streams, ended together as the server stops.

    Callable from any thread or from a signal handler (the server's own runs in the loop's
    thread, between any two bytecodes): the watches are ended by the loop itself. ``reset()``
    as the app starts again."""

    __slots__ = ("_loop", "_said", "_watches")

    def __init__(self) -> None:
        self._said = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watches: weakref.WeakSet[Watch] = weakref.WeakSet()

    def __call__(self) -> None:
        """The server is stopping: end the streams."""
        self._said = True
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing is open
                loop.call_soon_threadsafe(self._end_all)

    def reset(self) -> None:
        """The app starts (again): streams run until the next stop."""
        self._said = False
        self._loop = None
        self._watches = weakref.WeakSet()

    def add(self, watch: Watch) -> None:
        """``watch`` feeds a stream (called in the loop that serves it); ended at once if the
        server is already stopping."""
        self._loop = asyncio.get_running_loop()
        if self._said:
            watch.end()
        else:
            self._watches.add(watch)

    def _end_all(self) -> None:
        for watch in list(self._watches):
            watch.end()
        self._watches.clear()


def streams_end(app: object) -> StreamsEnd | None:
    """The ``StreamsEnd`` of an app ``create_app`` made (None for any other app)."""
    found = getattr(getattr(app, "state", None), "streams_end", None)
    return found if isinstance(found, StreamsEnd) else None
