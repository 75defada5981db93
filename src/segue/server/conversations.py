"""The routes that read and create conversations: what the server runs, a new conversation, the
list, one conversation's state and its transcript."""

from __future__ import annotations

from fastapi import APIRouter

from segue.executor.runtime import Runtime
from segue.server.schemas import ConversationView, CreateConversation, Info, MessageView


async def view(runtime: Runtime, conversation_id: str) -> ConversationView:
    """The conversation as every route answers it (an unknown id: 404 through ``errors``)."""
    stored = await runtime.conversation(conversation_id)
    return ConversationView.of(stored.state, stored)


def router(runtime: Runtime, info: Info) -> APIRouter:
    """The routes over ``runtime``; ``info`` is what ``/api/info`` says and what a new
    conversation gets where the request leaves it out."""
    routes = APIRouter(prefix="/api")

    @routes.get("/info")
    async def about() -> Info:
        """What the server runs (offline: the scripted model answers)."""
        return info

    @routes.post("/conversations", status_code=201)
    async def create(body: CreateConversation) -> ConversationView:
        """Create a conversation."""
        options = body.options(
            model=info.model, behavior=info.behavior, context_window=info.context_window
        )
        state = await runtime.create_conversation(options)
        return await view(runtime, state.id)

    @routes.get("/conversations")
    async def listed() -> list[ConversationView]:
        """Every conversation, newest first."""
        return [ConversationView.of(c.state, c) for c in await runtime.conversations()]

    @routes.get("/conversations/{conversation_id}")
    async def one(conversation_id: str) -> ConversationView:
        """A conversation's state."""
        return await view(runtime, conversation_id)

    @routes.get("/conversations/{conversation_id}/messages")
    async def messages(conversation_id: str) -> list[MessageView]:
        """The whole transcript, in order."""
        return [MessageView.of(m) for m in await runtime.messages(conversation_id)]

    return routes


__all__ = ["router", "view"]
