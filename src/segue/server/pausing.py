"""A pause asked of the server, whichever process runs the conversation's turn.

``Runtime.pause`` takes a pause at the running turn's next boundary. When this server's runtime
runs the turn it records the request and returns at once. When another process runs it (several
``segue serve`` workers on one database), the request goes through the store and the call
returns only once that process has paused, which may be a whole model request later: a page
waiting that long for its button's answer looks broken. So the server answers as soon as the
request is in the store (``pause_requested``, no snapshot yet) and leaves the wait to a task of
its own, which ends when the owner pauses (the page sees it on its event stream).
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from segue.executor._log import get_logger
from segue.executor.claims import live_holder
from segue.executor.runtime import Runtime
from segue.executor.store_port import StoredConversation
from segue.server.errors import ApiError
from segue.statemachine import ConversationState, Paused

_log = get_logger("segue.server")
NOTHING_TO_PAUSE: Final = frozenset({"paused", "context_exhausted", "failed"})
"""Phases a pause does not apply to: it would be a 200 that does nothing."""
RECORDED_WITHIN: Final = 10.0
"""Seconds the answer waits for the request to reach the store (a commit: far less)."""
_FIRST_LOOK, _LONGEST_LOOK = 0.01, 0.2


def held_elsewhere(runtime: Runtime, stored: StoredConversation) -> bool:
    """Whether another live runtime (another process) is performing the conversation's work."""
    holder = live_holder(stored.pending)
    return holder is not None and holder != runtime.owner


class Pauses:
    """The pauses this server waits on for turns other processes run."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.waiting: set[asyncio.Task[ConversationState]] = set()

    async def pause(
        self, conversation_id: str, reason: str, force_after: float | None
    ) -> ConversationState:
        """Pause now (idle), or at the running turn's next boundary; 409 ``conflict`` when the
        conversation has nothing to pause (already paused, read-only, failed).

        ``force_after``: wait at most this long for the turn to end, then cancel it and pause."""
        stored = await self.runtime.conversation(conversation_id)
        phase = stored.state.phase.kind
        if phase in NOTHING_TO_PAUSE:
            said = "already paused" if phase == "paused" else phase
            message = f"conversation {conversation_id} is {said}: there is nothing to pause"
            raise ApiError(409, "conflict", message)
        if not held_elsewhere(self.runtime, stored):
            return await self.runtime.pause(conversation_id, reason, timeout=force_after)
        task = asyncio.ensure_future(self._at_boundary(conversation_id, reason, force_after))
        self.waiting.add(task)
        task.add_done_callback(self._done)
        return await self._recorded(conversation_id, task)

    async def _at_boundary(
        self, conversation_id: str, reason: str, force_after: float | None
    ) -> ConversationState:
        if force_after is None:
            return await self.runtime.pause(conversation_id, reason)
        try:
            async with asyncio.timeout(force_after):
                return await self.runtime.pause(conversation_id, reason)
        except TimeoutError:
            await self.runtime.cancel(conversation_id)  # which drops the request in the store
            return await self.runtime.pause(conversation_id, reason)

    async def _recorded(
        self, conversation_id: str, task: asyncio.Task[ConversationState]
    ) -> ConversationState:
        """The conversation once the request is in the store (or the pause is over)."""
        delay, deadline = _FIRST_LOOK, time.monotonic() + RECORDED_WITHIN
        while True:
            if task.done():
                return task.result()
            state = (await self.runtime.conversation(conversation_id)).state
            if state.pause_requested or time.monotonic() > deadline:
                return state
            await asyncio.wait({task}, timeout=delay)
            delay = min(delay * 2, _LONGEST_LOOK)

    def _done(self, task: asyncio.Task[ConversationState]) -> None:
        self.waiting.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            _log.warning("pause_failed", error_type=type(error).__name__)

    async def close(self) -> None:
        """Stop waiting (the request stays in the store: the owner still pauses)."""
        for task in list(self.waiting):
            task.cancel()
        if self.waiting:
            await asyncio.gather(*self.waiting, return_exceptions=True)


def snapshot_version(state: ConversationState) -> int | None:
    """The version of the snapshot a paused state holds (None when not paused)."""
    phase = state.phase
    return phase.snapshot.version if isinstance(phase, Paused) else None


__all__ = ["NOTHING_TO_PAUSE", "Pauses", "held_elsewhere", "snapshot_version"]
