"""A multi-user chat backend on segue's public API alone: nothing of its own to store.

Run: ``CHAT_DB=chat.db uvicorn examples.multi_user:app`` (offline with the scripted model; set
``ANTHROPIC_API_KEY`` and pass ``AnthropicModel(AsyncAnthropic())`` for Claude). Each user's
conversations carry the user in their metadata, so listing, ownership, deletion and export are
segue's: the ``X-User`` header stands for whatever authentication the application has.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException
from fastapi.responses import StreamingResponse

from segue import (
    ConversationNotFoundError,
    MessageRejectedError,
    Runtime,
    ScriptedModel,
    SqliteStore,
)

runtime = Runtime(store=SqliteStore(os.environ.get("CHAT_DB", "chat.db")), llm=ScriptedModel())
User = Annotated[str, Header(alias="X-User", min_length=1)]


@asynccontextmanager
async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
    async with runtime:  # finishes what a crash left pending; closes the store at the end
        yield


app = FastAPI(lifespan=lifespan)


async def owned(conversation_id: str, user: str) -> str:
    """The conversation if it is the user's; another user's is as good as missing (404)."""
    try:
        stored = await runtime.conversation(conversation_id)
    except ConversationNotFoundError:
        stored = None
    if stored is None or stored.metadata.get("user") != user:
        raise HTTPException(404, "no such conversation")
    return conversation_id


@app.post("/conversations", status_code=201)
async def create(user: User, title: str = "New chat") -> dict[str, Any]:
    state = await runtime.create_conversation(
        model="claude-sonnet-4-6", metadata={"user": user, "title": title}
    )
    return {"id": state.id, "title": title}


@app.get("/conversations")
async def mine(user: User, cursor: str | None = None) -> dict[str, Any]:
    page = await runtime.list_conversations(metadata={"user": user}, limit=20, cursor=cursor)
    items = [{"id": c.state.id, "title": c.metadata.get("title")} for c in page.conversations]
    return {"conversations": items, "next": page.next_cursor}


@app.post("/conversations/{conversation_id}/messages")
async def send(conversation_id: str, text: str, user: User) -> StreamingResponse:
    updates = runtime.stream(await owned(conversation_id, user), text, wait=False)
    try:
        first = await anext(updates)  # a refusal (busy, read-only...) raises before any update
    except MessageRejectedError as refused:
        raise HTTPException(409, refused.reason) from refused

    async def events() -> AsyncIterator[str]:
        update = first
        while True:
            yield f"event: {update.kind}\ndata: {update.model_dump_json()}\n\n"
            if update.kind == "done":
                return
            update = await anext(updates)

    return StreamingResponse(events(), media_type="text/event-stream")


@app.delete("/conversations/{conversation_id}", status_code=204)
async def delete(conversation_id: str, user: User) -> None:
    await runtime.delete_conversation(await owned(conversation_id, user), chain=True)


@app.get("/conversations/{conversation_id}/export")
async def export(conversation_id: str, user: User) -> dict[str, Any]:
    return await runtime.export_conversation(await owned(conversation_id, user))
