"""Which conversations this runtime is working on, and one drive at a time for each.

A conversation's drive holds its lock from the commit of its event until the outbox is empty,
so two turns of one conversation never interleave in a runtime (across runtimes, the store's
version check and claims do that). A streamed turn counts as busy from the moment it is
scheduled, before its task even takes the lock, so that a second message with ``wait=False``
sees it. Locks are forgotten once nobody holds or waits for them: a server sees many
conversations once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator


@dataclasses.dataclass(slots=True)
class _Gate:
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    users: int = 0
    """Holders and waiters: the gate is dropped when none are left."""


class Locks:
    """Each conversation's lock, the drives under way and the streamed turns scheduled."""

    __slots__ = ("_driving", "_gates", "_scheduled")

    def __init__(self) -> None:
        self._gates: dict[str, _Gate] = {}
        self._driving: set[str] = set()
        self._scheduled: dict[str, int] = {}

    def __len__(self) -> int:
        """Conversations whose lock is held or awaited now."""
        return len(self._gates)

    @contextlib.asynccontextmanager
    async def holding(self, conversation_id: str) -> AsyncIterator[None]:
        """Hold the conversation's lock (waiting for it)."""
        gate = self._gates.get(conversation_id)
        if gate is None:
            gate = self._gates[conversation_id] = _Gate()
        gate.users += 1
        try:
            async with gate.lock:
                yield
        finally:
            gate.users -= 1
            if not gate.users:
                del self._gates[conversation_id]

    @contextlib.asynccontextmanager
    async def driving(self, conversation_id: str) -> AsyncIterator[None]:
        """Hold the lock as the conversation's drive (``is_driving`` says so meanwhile)."""
        async with self.holding(conversation_id):
            self._driving.add(conversation_id)
            try:
                yield
            finally:
                self._driving.discard(conversation_id)

    def is_driving(self, conversation_id: str) -> bool:
        """Whether a drive of the conversation runs here (a pause it will take at its next
        boundary, rather than by waiting for the lock)."""
        return conversation_id in self._driving

    def is_held(self, conversation_id: str) -> bool:
        """Whether anything holds the conversation's lock now."""
        gate = self._gates.get(conversation_id)
        return gate is not None and gate.lock.locked()

    def busy(self, conversation_id: str) -> bool:
        """Whether this runtime runs, waits to run, or has scheduled a turn of it."""
        return conversation_id in self._scheduled or conversation_id in self._gates

    def schedule(self, conversation_id: str) -> None:
        """A streamed turn of the conversation is scheduled (``unschedule`` when it ends)."""
        self._scheduled[conversation_id] = self._scheduled.get(conversation_id, 0) + 1

    def unschedule(self, conversation_id: str) -> None:
        left = self._scheduled[conversation_id] - 1
        if left:
            self._scheduled[conversation_id] = left
        else:
            del self._scheduled[conversation_id]
