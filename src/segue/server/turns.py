"""Decisions a route makes from the conversation's state before it calls the runtime, so the
API answers what happened (409 when nothing could) rather than a 200 for a no-op."""

from __future__ import annotations

from segue.executor.runtime import Runtime
from segue.server.errors import ApiError
from segue.statemachine import BUSY_PHASES, ConversationState


async def continue_now(
    runtime: Runtime, conversation_id: str, focus: str | None = None
) -> ConversationState:
    """Take the conversation's path at the limit now (``focus``: what its request must keep
    above all), or say why not: 409 ``busy`` while a turn runs (``continue_manually`` would do
    nothing), 409 ``conflict`` in any other phase but idle (paused, read-only, failed)."""
    before = (await runtime.conversation(conversation_id)).state
    _must_be_idle(before)
    after = await runtime.continue_manually(conversation_id, focus=focus)
    if after.phase.kind == "idle" and (after.session, after.generation) == (
        before.session,
        before.generation,
    ):
        # Still idle in the same session and generation: a turn took the conversation
        # between the check and the call, and the runtime let it be.
        raise ApiError(409, "busy", f"conversation {conversation_id} started a turn meanwhile")
    return after


def _must_be_idle(state: ConversationState) -> None:
    phase = state.phase.kind
    if phase in BUSY_PHASES:
        message = f"conversation {state.id} is {phase}: wait for the turn to end (or cancel it)"
        raise ApiError(409, "busy", message)
    if phase != "idle":
        message = f"conversation {state.id} is {phase}: only an idle conversation continues now"
        raise ApiError(409, "conflict", message)


__all__ = ["continue_now"]
