"""Events on their way to one client, so that a client reading slowly (or not at all) costs the
server a bounded amount of memory and slows nobody else.

A stream's updates are taken from the runtime as they come (by a task of the relay's own), and
sent as fast as the client reads them. Between the two sits at most ``BEHIND`` bytes of
encoded events (and the one event that crossed it): a client that falls further behind is
dropped. What was waiting for it is
let go, one ``reset`` event takes its place (the client reads the state again and reconnects,
as after any broken stream), and the stream ends after it. The runtime's update bus never waits
for a client: its queue is emptied as fast as updates arrive, whatever the client does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Final

from fastapi.sse import format_sse_event

BEHIND: Final = 256 * 1024
"""Bytes of encoded events a client may fall behind by before it is dropped (a long reply's
deltas, several times over; far less than the runtime's own bound on a watcher)."""
RESET_TEXT: Final = "you fell too far behind: read the conversation again, then watch it again"


def reset_event() -> bytes:
    """The event that replaces what a dropped client did not read."""
    return format_sse_event(event="reset", data_str=json.dumps({"message": RESET_TEXT}))


class Relay:
    """The encoded events of one stream, from ``pump(source)`` to whoever iterates it."""

    def __init__(self, behind: int = BEHIND) -> None:
        self.behind = behind
        self._queued: deque[bytes] = deque()
        self._size = 0
        self._ended = False
        self._ready = asyncio.Event()
        self.dropped = False
        """The client fell more than ``behind`` bytes behind and was sent ``reset``."""

    def _put(self, event: bytes) -> bool:
        """Queue ``event``, unless the client is already ``behind`` bytes behind: then drop
        it (one large event, a ``done`` carrying a long reply, is taken whole by a client that
        keeps up). False once the client is dropped (stop producing)."""
        if self._ended:
            return False
        if self._size >= self.behind:
            self._queued.clear()
            self._queued.append(reset_event())
            self._size, self._ended, self.dropped = 0, True, True
        else:
            self._queued.append(event)
            self._size += len(event)
        self._ready.set()
        return not self._ended

    def _end(self) -> None:
        self._ended = True
        self._ready.set()

    async def pump(self, source: AsyncGenerator[bytes, None]) -> None:
        """Take ``source``'s events into the relay until it ends or the client is dropped
        (then ``source`` is closed: the runtime stops keeping anything for it)."""
        try:
            async for event in source:
                if not self._put(event):
                    break
        finally:
            self._end()
            await source.aclose()

    async def events(self) -> AsyncIterator[bytes]:
        """The queued events as the client takes them, until the stream ends."""
        while True:
            while self._queued:
                event = self._queued.popleft()
                self._size -= len(event)
                yield event
            if self._ended:
                return
            self._ready.clear()
            await self._ready.wait()


async def relayed(
    source: AsyncGenerator[bytes, None], behind: int = BEHIND
) -> AsyncIterator[bytes]:
    """``source``'s events as a client reads them, through a ``Relay``: the response's body."""
    relay = Relay(behind)
    pumping = asyncio.ensure_future(relay.pump(source))
    try:
        async for event in relay.events():
            yield event
        await pumping  # its errors are the stream's
    finally:
        if not pumping.done():
            pumping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pumping


__all__ = ["BEHIND", "Relay", "relayed", "reset_event"]
