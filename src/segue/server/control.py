"""The routes that steer a conversation rather than talk in it: take the path at the limit now
(with a focus), cancel, pause and resume, the pause snapshots, the continuation chain and the
one child. Each answers what happened, or a 409 when the state does not allow it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from segue.executor.runtime import Runtime
from segue.server.errors import ApiError
from segue.server.pausing import Pauses, snapshot_version
from segue.server.schemas import (
    Continue,
    ConversationView,
    LinkView,
    Pause,
    PauseView,
    Resume,
    SnapshotView,
    StartChild,
)
from segue.server.turns import continue_now
from segue.statemachine import BUSY_PHASES
from segue.statemachine.checkpoint import SessionSnapshot


def install(app: FastAPI, runtime: Runtime, guard: Any, pauses: Pauses) -> None:
    """The control routes on ``app`` (``guard``: the token check every route depends on)."""

    async def view(conversation_id: str) -> ConversationView:
        stored = await runtime.conversation(conversation_id)
        return ConversationView.of(stored.state, stored)

    @app.post("/api/conversations/{conversation_id}/continue", dependencies=[guard])
    async def continue_manually(
        conversation_id: str, body: Continue | None = None
    ) -> ConversationView:
        """Take the conversation's path at the limit now (continue in a new conversation,
        compact, restart from a checkpoint): only from idle, else 409. ``focus``: what the
        summary (checkpoint, compaction) must keep above all."""
        await continue_now(runtime, conversation_id, (body or Continue()).focus)
        return await view(conversation_id)

    @app.post("/api/conversations/{conversation_id}/cancel", dependencies=[guard])
    async def cancel(conversation_id: str) -> ConversationView:
        """Stop what is in flight; on a paused conversation, end the pause (idle again, its
        snapshot kept)."""
        await runtime.cancel(conversation_id)
        return await view(conversation_id)

    @app.post("/api/conversations/{conversation_id}/pause", dependencies=[guard])
    async def pause(conversation_id: str, body: Pause | None = None) -> PauseView:
        """Pause now (idle: ``snapshot_version`` names the snapshot taken), or at the running
        turn's next boundary, whichever process runs it (``pause_requested``, no snapshot
        yet); ``timeout``: wait at most that long for the turn, then cancel it and pause.
        409 ``conflict`` when there is nothing to pause (paused, read-only, failed)."""
        request = body or Pause()
        state = await pauses.pause(conversation_id, request.reason, request.timeout)
        stored = await runtime.conversation(conversation_id)
        shown = ConversationView.of(stored.state, stored).model_dump()
        waiting = stored.state.phase.kind in BUSY_PHASES and state.phase.kind != "paused"
        shown["pause_requested"] = shown["pause_requested"] or waiting
        return PauseView(**shown, snapshot_version=snapshot_version(state))

    @app.post("/api/conversations/{conversation_id}/resume", dependencies=[guard])
    async def resume(conversation_id: str, body: Resume | None = None) -> ConversationView:
        """Resume a paused conversation in a new session (its first turn runs before this
        answers; watch ``/events`` to see it stream)."""
        stored = await runtime.conversation(conversation_id)
        if stored.state.phase.kind != "paused":
            message = f"conversation {conversation_id} is {stored.state.phase.kind}, not paused"
            raise ApiError(409, "not_paused", message)
        await runtime.resume(conversation_id, (body or Resume()).prompt)
        return await view(conversation_id)

    @app.get("/api/conversations/{conversation_id}/snapshots", dependencies=[guard])
    async def snapshots(conversation_id: str) -> list[SnapshotView]:
        """The conversation's pause snapshots, oldest first."""
        await runtime.conversation(conversation_id)
        return [SnapshotView.of(s) for s in await runtime.store.snapshots(conversation_id)]

    @app.get("/api/conversations/{conversation_id}/snapshots/{version}", dependencies=[guard])
    async def snapshot(conversation_id: str, version: int) -> SessionSnapshot:
        """One pause snapshot, whole: the checkpoint and its sections, decisions, errors, the
        session's usage and duration, the application's context."""
        await runtime.conversation(conversation_id)
        for found in await runtime.store.snapshots(conversation_id):
            if found.version == version:
                return found
        message = f"conversation {conversation_id} has no snapshot {version}"
        raise ApiError(404, "not_found", message)

    @app.get("/api/conversations/{conversation_id}/lineage", dependencies=[guard])
    async def lineage(conversation_id: str) -> list[LinkView]:
        """The continuation chain the conversation belongs to, root first."""
        return [LinkView.of(link) for link in await runtime.lineage(conversation_id)]

    @app.post("/api/conversations/{conversation_id}/children", dependencies=[guard])
    async def child(conversation_id: str, body: StartChild | None = None) -> ConversationView:
        """The one child of an exhausted conversation (asked twice, the same child)."""
        request = body or StartChild()
        state = await runtime.start_new_from(
            conversation_id,
            seed_with_summary=request.seed_with_summary,
            auto_continue=request.auto_continue and request.seed_with_summary,
        )
        return await view(state.id)


__all__ = ["install"]
