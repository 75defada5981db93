"""The routes that read and create conversations: what the server runs, a new conversation, the
list, one conversation's state and its transcript; and ``StateViews``, how every route (and
every stream's ``done``) shows a conversation."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Final

from fastapi import APIRouter, Request

from segue.executor.runtime import Runtime
from segue.executor.store_port import StoredConversation
from segue.server.schemas import (
    ABOUT_ONE,
    EVERY_ROUTE,
    ConversationView,
    CreateConversation,
    Info,
    MessageView,
    documented,
)
from segue.statemachine import ConversationState
from segue.views import title_of

TITLES_KEPT: Final = 10_000
"""Titles remembered (the most recently shown): a title never changes once there is one."""


class StateViews:
    """Conversations as the API shows them (``ConversationView``), each with its title: the
    first words of its first user message, read from the transcript once and remembered (a
    transcript only grows, so a title found never changes)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._titles: OrderedDict[str, str] = OrderedDict()

    async def title(self, conversation_id: str) -> str | None:
        """The conversation's title (None while it has no user message)."""
        known = self._titles.get(conversation_id)
        if known is not None:
            self._titles.move_to_end(conversation_id)
            return known
        found = title_of(await self.runtime.messages(conversation_id))
        if found is not None:
            self._titles[conversation_id] = found
            if len(self._titles) > TITLES_KEPT:
                self._titles.popitem(last=False)
        return found

    async def of(
        self, state: ConversationState, stored: StoredConversation | None = None
    ) -> ConversationView:
        """The view of ``state`` (``stored``: the child and the creation time)."""
        return ConversationView.of(state, stored, title=await self.title(state.id))

    async def read(self, conversation_id: str) -> ConversationView:
        """The conversation as the store holds it now (an unknown id: 404 through
        ``errors``)."""
        stored = await self.runtime.conversation(conversation_id)
        return await self.of(stored.state, stored)


def router(runtime: Runtime, views: StateViews, info: Info) -> APIRouter:
    """The routes over ``runtime``; ``info`` is what ``/api/info`` says and what a new
    conversation gets where the request leaves it out."""
    routes = APIRouter(prefix="/api", responses=documented(*EVERY_ROUTE))

    @routes.get("/info")
    async def about() -> Info:
        """What the server runs (offline: the scripted model answers)."""
        return info

    @routes.post("/conversations", status_code=201, responses=documented(413, 415, 422))
    async def create(body: CreateConversation, request: Request) -> ConversationView:
        """Create a conversation."""
        given = await request.json()  # which fields the client set (FastAPI read it already)
        options = body.options(info, given=set(given) if isinstance(given, dict) else set())
        state = await runtime.create_conversation(options)
        return await views.read(state.id)

    @routes.get("/conversations")
    async def listed() -> list[ConversationView]:
        """Every conversation, newest first, each with its title and creation time."""
        found = await runtime.conversations()
        return list(await asyncio.gather(*(views.of(c.state, c) for c in found)))

    @routes.get("/conversations/{conversation_id}", responses=documented(*ABOUT_ONE))
    async def one(conversation_id: str) -> ConversationView:
        """A conversation's state."""
        return await views.read(conversation_id)

    @routes.get("/conversations/{conversation_id}/messages", responses=documented(*ABOUT_ONE))
    async def messages(conversation_id: str) -> list[MessageView]:
        """The whole transcript, in order."""
        return [MessageView.of(m) for m in await runtime.messages(conversation_id)]

    return routes


__all__ = ["StateViews", "router"]
