"""The routes that stream: a turn's updates as it runs, and every update of a conversation from
now on, as Server-Sent Events (each event named by the update's kind, its data the update as
JSON; ``done`` carries the conversation's state as the API shows it)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Final

from fastapi import APIRouter
from fastapi.sse import EventSourceResponse, format_sse_event

from segue.executor.errors import ConversationNotFoundError, UpdatesLostError
from segue.executor.runtime import Runtime
from segue.executor.store_port import StoredConversation
from segue.executor.updates import DoneUpdate, Update
from segue.server.ending import StreamsEnd
from segue.server.schemas import ConversationView, SendMessage

_SSE_RESPONSE: Final[dict[str, Any]] = {
    "description": "Server-Sent Events: each event named by the update's kind, its data the "
    "update as JSON; a turn ends with `done`, carrying the conversation's state.",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}


def router(runtime: Runtime, end: StreamsEnd) -> APIRouter:
    """The routes over ``runtime``; ``end`` ends the open watch streams as the server stops."""
    routes = APIRouter(
        prefix="/api/conversations/{conversation_id}", responses={200: _SSE_RESPONSE}
    )

    # response_model=None: the body is the event stream, not a JSON value to validate
    @routes.post("/messages", response_model=None)
    async def send(conversation_id: str, body: SendMessage) -> EventSourceResponse:
        """Send a message (``pinned``: never summarised away); the turn's updates stream back
        as Server-Sent Events, ``done`` last with the conversation's state. A client that
        disconnects loses nothing: the turn finishes and is stored."""
        updates = runtime.stream(conversation_id, body.text, wait=False, pinned=body.pinned)
        first = await anext(updates)  # a refusal raises here, before any byte is sent
        return EventSourceResponse(_events(runtime, first, updates))

    @routes.get("/events", response_model=None)
    async def events(conversation_id: str) -> EventSourceResponse:
        """Every update of the conversation from now on (a second tab, a client that
        reconnected after reading the state)."""
        watch = runtime.watch(conversation_id)  # watching from here on, before any byte
        # Reading the store from here on too, before the client hears the stream is open
        # (and reads the state): another process's turn starting in between is not missed.
        # An unknown id raises here (a 404), and the watch is over.
        await watch.start()
        end.add(watch)
        return EventSourceResponse(_watched(runtime, watch))

    return routes


def _sse(update: Update, state: dict[str, Any] | None = None) -> bytes:
    """One update as an SSE event: its kind as the event name, the update as JSON data (a
    ``done`` carries the conversation's state as the API shows it)."""
    if state is not None:
        data = {"kind": "done", "state": state, "reply": getattr(update, "reply", None)}
        text = json.dumps(data, ensure_ascii=False)
    else:
        text = update.model_dump_json()
    return format_sse_event(event=update.kind, data_str=text)


async def _done_state(runtime: Runtime, update: DoneUpdate) -> dict[str, Any]:
    stored: StoredConversation | None
    try:
        stored = await runtime.conversation(update.state.id)
    except ConversationNotFoundError:
        stored = None
    return ConversationView.of(update.state, stored).model_dump(mode="json")


async def _events(
    runtime: Runtime, first: Update, rest: AsyncIterator[Update]
) -> AsyncIterator[bytes]:
    """A streamed turn's updates as SSE text, ``done`` last with the API's state."""
    update: Update | None = first
    try:
        while update is not None:
            if isinstance(update, DoneUpdate):
                yield _sse(update, await _done_state(runtime, update))
                return
            yield _sse(update)
            update = await anext(rest, None)
    finally:
        await rest.aclose()  # type: ignore[attr-defined]  # an async generator


async def _watched(runtime: Runtime, watch: Any) -> AsyncIterator[bytes]:
    """A conversation's updates as SSE text, until the client goes away or the watch is
    ended (the server stops)."""
    try:
        async for update in watch:
            if isinstance(update, DoneUpdate):
                yield _sse(update, await _done_state(runtime, update))
            else:
                yield _sse(update)
    except UpdatesLostError as exc:
        yield format_sse_event(event="lost", data_str=json.dumps(str(exc)))
    finally:
        await watch.aclose()


__all__ = ["router"]
