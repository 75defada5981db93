"""The routes that steer a conversation rather than talk in it: take the path at the limit now
(with a focus), cancel, pause and resume, make the latest summary again or take the latest
compaction back. Each answers what happened, or a 409 when the state
does not allow it.
"""

from __future__ import annotations

from fastapi import APIRouter

from segue.executor.runtime import Runtime
from segue.server.conversations import StateViews
from segue.server.pausing import Pauses, snapshot_version
from segue.server.schemas import (
    ABOUT_ONE,
    EVERY_ROUTE,
    SENDING,
    Continue,
    ConversationView,
    Pause,
    PauseView,
    RedoSummary,
    Resume,
    documented,
)
from segue.server.turns import continue_now
from segue.statemachine import BUSY_PHASES


def router(runtime: Runtime, views: StateViews, pauses: Pauses) -> APIRouter:
    """The routes over ``runtime``; ``pauses`` waits on the pauses of turns other processes
    run."""
    routes = APIRouter(
        prefix="/api/conversations/{conversation_id}",
        responses=documented(*EVERY_ROUTE, *ABOUT_ONE, *SENDING),
    )

    @routes.post("/continue")
    async def continue_manually(
        conversation_id: str, body: Continue | None = None
    ) -> ConversationView:
        """Take the conversation's path at the limit now (continue in a new conversation,
        compact, restart from a checkpoint): only from idle, else 409. ``focus``: what the
        summary (checkpoint, compaction) must keep above all."""
        await continue_now(runtime, conversation_id, (body or Continue()).focus)
        return await views.read(conversation_id)

    @routes.post("/cancel")
    async def cancel(conversation_id: str) -> ConversationView:
        """Stop what is in flight; on a paused conversation, end the pause (idle again, its
        snapshot kept)."""
        await runtime.cancel(conversation_id)
        return await views.read(conversation_id)

    @routes.post("/pause")
    async def pause(conversation_id: str, body: Pause | None = None) -> PauseView:
        """Pause now (idle: ``snapshot_version`` names the snapshot taken), or at the running
        turn's next boundary, whichever process runs it (``pause_requested``, no snapshot
        yet; ``running_in`` names another process running it); ``timeout``: wait at most that
        long for the turn, then cancel it and pause.
        409 ``conflict`` when there is nothing to pause (paused, read-only, failed)."""
        request = body or Pause()
        state, turn = await pauses.pause(conversation_id, request.reason, request.timeout)
        stored = await runtime.conversation(conversation_id)
        shown = (await views.of(stored.state, stored)).model_dump()
        waiting = stored.state.phase.kind in BUSY_PHASES and state.phase.kind != "paused"
        shown["pause_requested"] = shown["pause_requested"] or waiting
        version = snapshot_version(state)
        return PauseView(**shown, snapshot_version=version, running_in=turn.holder)

    @routes.post("/resume")
    async def resume(conversation_id: str, body: Resume | None = None) -> ConversationView:
        """Resume a paused conversation in a new session (its first turn runs before this
        answers; watch ``/events`` to see it stream)."""
        await runtime.resume(conversation_id, (body or Resume()).prompt)  # 409 not_paused
        return await views.read(conversation_id)

    @routes.post("/redo-summary", responses=documented(409, 422))
    async def redo_summary(
        conversation_id: str, body: RedoSummary | None = None
    ) -> ConversationView:
        """Make the latest compaction's summary again from the history it replaced, with a
        ``focus`` and, for this summary only, a ``summary_prompt`` and ``summary_model``
        (REQ-SEG-063); the old summary stays as a version. 409 ``busy`` while a turn runs,
        409 ``no_compaction`` when there is none to make again."""
        asked = body or RedoSummary()
        await runtime.redo_summary(
            conversation_id,
            focus=asked.focus,
            summary_prompt=asked.summary_prompt,
            summary_model=asked.summary_model,
        )
        return await views.read(conversation_id)

    @routes.post("/undo-compaction", responses=documented(409, 422))
    async def undo_compaction(conversation_id: str) -> ConversationView:
        """Take the latest compaction back: the history before it, and what came after, in a
        new generation (REQ-SEG-064). 422 ``does_not_fit`` with ``needed_tokens`` and
        ``threshold_tokens`` when it would not fit now; 409 ``busy`` while a turn runs, 409
        ``no_compaction`` when there is none to take back."""
        await runtime.undo_compaction(conversation_id)
        return await views.read(conversation_id)

    return routes


__all__ = ["router"]
