"""A pause asked of the server: the answer comes once the request is recorded.

``Runtime.request_pause`` knows where the conversation's turn runs. When this server's runtime
runs it, or nothing runs, the pause is taken (or recorded) as ``Runtime.pause`` takes it (both
wait on ``PauseRequest.outcome``). When
another process runs it (several ``segue serve`` workers on one database), taking the pause may
be a whole model request away: a page waiting that long for its button's answer looks broken.
So the server answers as soon as the request is in the store (``pause_requested``, no snapshot
yet) and leaves the wait, and the forced pause after ``timeout``, to a task of its own (the page
sees the pause on its event stream).
"""

from __future__ import annotations

import asyncio

from segue.executor._log import get_logger
from segue.executor.runtime import Runtime
from segue.executor.turn_holder import Turn
from segue.server.errors import ApiError
from segue.statemachine import ENDED_PHASES, ConversationState, Paused

_log = get_logger("segue.server")


class Pauses:
    """The pauses this server waits on for turns other processes run."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.waiting: set[asyncio.Task[ConversationState]] = set()

    async def pause(
        self, conversation_id: str, reason: str, force_after: float | None
    ) -> tuple[ConversationState, Turn]:
        """Pause now (idle), or at the running turn's next boundary; 409 ``conflict`` when the
        conversation has nothing to pause (already paused, read-only, failed). The state, and
        where the turn ran when the pause was asked.

        ``force_after``: wait at most this long for the turn to end, then cancel it and pause."""
        state = await self.runtime.state(conversation_id)
        phase = state.phase.kind
        if phase == "paused" or phase in ENDED_PHASES:
            said = "already paused" if phase == "paused" else phase
            message = f"conversation {conversation_id} is {said}: there is nothing to pause"
            raise ApiError(409, "conflict", message)
        request = await self.runtime.request_pause(conversation_id, reason)
        if request.where != "elsewhere":
            return await request.outcome(force_after), request.turn
        task = asyncio.ensure_future(request.outcome(force_after))
        self.waiting.add(task)
        task.add_done_callback(self._done)
        return await request.recorded(), request.turn

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


__all__ = ["Pauses", "snapshot_version"]
