"""The routes to what a conversation's sessions left and where they led: the pause snapshots
(each a session's checkpoint, with its decisions, errors and usage), the continuation chain the
conversation belongs to, and the one child of an exhausted conversation.
"""

from __future__ import annotations

from fastapi import APIRouter

from segue.executor.runtime import Runtime
from segue.server.conversations import StateViews
from segue.server.errors import ApiError
from segue.server.schemas import (
    ABOUT_ONE,
    EVERY_ROUTE,
    SENDING,
    ConversationView,
    LinkView,
    SnapshotView,
    StartChild,
    documented,
)
from segue.statemachine.checkpoint import SessionSnapshot


def router(runtime: Runtime, views: StateViews) -> APIRouter:
    """The routes over ``runtime``."""
    routes = APIRouter(
        prefix="/api/conversations/{conversation_id}",
        responses=documented(*EVERY_ROUTE, *ABOUT_ONE),
    )

    @routes.get("/snapshots")
    async def snapshots(conversation_id: str) -> list[SnapshotView]:
        """The conversation's pause snapshots, oldest first."""
        await runtime.conversation(conversation_id)
        return [SnapshotView.of(s) for s in await runtime.store.snapshots(conversation_id)]

    @routes.get("/snapshots/{version}")
    async def snapshot(conversation_id: str, version: int) -> SessionSnapshot:
        """One pause snapshot, whole: the checkpoint and its sections, decisions, errors, the
        session's usage and duration, the application's context."""
        await runtime.conversation(conversation_id)
        for found in await runtime.store.snapshots(conversation_id):
            if found.version == version:
                return found
        message = f"conversation {conversation_id} has no snapshot {version}"
        raise ApiError(404, "not_found", message)

    @routes.get("/lineage")
    async def lineage(conversation_id: str) -> list[LinkView]:
        """The continuation chain the conversation belongs to, root first."""
        return [LinkView.of(link) for link in await runtime.lineage(conversation_id)]

    @routes.post("/children", responses=documented(*SENDING))
    async def child(conversation_id: str, body: StartChild | None = None) -> ConversationView:
        """The one child of an ended conversation, read-only at its limit or failed (asked
        twice, the same child); the old one keeps its summary or its failure's reason."""
        request = body or StartChild()
        state = await runtime.start_new_from(
            conversation_id,
            seed_with_summary=request.seed_with_summary,
            auto_continue=request.auto_continue and request.seed_with_summary,
            recent_turns=request.recent_turns,
        )
        return await views.read(state.id)

    return routes


__all__ = ["router"]
