"""The routes that stream: a turn's updates as it runs, and every update of a conversation from
now on, as Server-Sent Events (each event named by the update's kind, its data the update as
JSON; ``done`` carries the conversation's state as every route shows it, ``ConversationView``).

Each stream goes through a ``relay``: a client that reads slowly, or not at all, is dropped
with a ``reset`` event once it is too far behind, rather than held in memory or allowed to slow
the turn and the other clients. An update is encoded once however many clients it goes to.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Final

from fastapi import APIRouter
from fastapi.sse import EventSourceResponse, format_sse_event

from segue.executor.bus import Watch
from segue.executor.errors import ConversationNotFoundError, UpdatesLostError
from segue.executor.runtime import Runtime
from segue.executor.store_port import StoredConversation
from segue.executor.updates import UPDATE_TYPES, DoneUpdate, Update
from segue.server.conversations import StateViews
from segue.server.ending import StreamsEnd
from segue.server.relay import relayed, reset_event
from segue.server.schemas import ABOUT_ONE, EVERY_ROUTE, SENDING, SendMessage, documented
from segue.views import update_json

EVENTS: Final = (
    *(kind.model_fields["kind"].default for kind in UPDATE_TYPES),
    "reset",
    "deleted",
)
"""The names of the events a stream sends: each update's kind, ``reset`` and ``deleted``."""
_SSE_RESPONSE: Final[dict[str, Any]] = {
    "description": "Server-Sent Events: each event named by the update's kind, its data the "
    "update as JSON; a turn ends with `done`, carrying the conversation's state. A client that "
    "falls too far behind gets `reset` and the stream ends: read the state, then watch again. "
    "A conversation deleted meanwhile (by another server too) ends the stream with `deleted`.",
    "content": {
        "text/event-stream": {  # before OpenAPI 3.2, ``schema`` describes each event
            "schema": {
                "type": "object",
                "required": ["event", "data"],
                "properties": {
                    "event": {"type": "string", "enum": list(EVENTS)},
                    "data": {"type": "string", "contentMediaType": "application/json"},
                    "id": {"type": "string"},
                    "retry": {"type": "integer", "minimum": 0},
                },
            }
        }
    },
}
ENCODED_KEPT: Final = 256
"""Recent updates kept encoded, for the other clients of the same conversation."""


class Encoder:
    """Updates as SSE events, each encoded once for every client it goes to (a watched
    conversation's update reaches each of its watchers as the same object)."""

    def __init__(self, runtime: Runtime, views: StateViews) -> None:
        self.runtime = runtime
        self.views = views
        self._recent: OrderedDict[int, tuple[Update, bytes]] = OrderedDict()

    async def event(self, update: Update) -> bytes:
        """``update`` as an SSE event."""
        known = self._recent.get(id(update))
        if known is not None and known[0] is update:  # the object itself, not a reused id
            return known[1]
        encoded = await self._encoded(update)
        self._recent[id(update)] = (update, encoded)
        if len(self._recent) > ENCODED_KEPT:
            self._recent.popitem(last=False)
        return encoded

    async def _encoded(self, update: Update) -> bytes:
        if not isinstance(update, DoneUpdate):
            return format_sse_event(event=update.kind, data_str=update_json(update))
        stored: StoredConversation | None
        try:
            stored = await self.runtime.conversation(update.state.id)
        except ConversationNotFoundError:
            stored = None
        title = await self.views.title(update.state.id)
        return format_sse_event(event="done", data_str=update_json(update, stored, title=title))


def router(runtime: Runtime, views: StateViews, end: StreamsEnd) -> APIRouter:
    """The routes over ``runtime``; ``end`` ends the open watch streams as the server stops."""
    routes = APIRouter(
        prefix="/api/conversations/{conversation_id}",
        responses={200: _SSE_RESPONSE, **documented(*EVERY_ROUTE, *ABOUT_ONE)},
    )
    encoder = Encoder(runtime, views)

    # response_model=None: the body is the event stream, not a JSON value to validate
    @routes.post("/messages", response_model=None, responses=documented(*SENDING))
    async def send(conversation_id: str, body: SendMessage) -> EventSourceResponse:
        """Send a message (``pinned``: never summarised away); the turn's updates stream back
        as Server-Sent Events, ``done`` last with the conversation's state. A client that
        disconnects, or falls too far behind (``reset``), loses nothing: the turn finishes
        and is stored."""
        updates = runtime.stream(conversation_id, body.text, wait=False, pinned=body.pinned)
        first = await anext(updates)  # a refusal raises here, before any byte is sent
        return EventSourceResponse(relayed(_turn(encoder, conversation_id, first, updates)))

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
        return EventSourceResponse(relayed(_watched(encoder, watch)))

    return routes


def deleted_event(conversation_id: str) -> bytes:
    """The event that ends a stream whose conversation was deleted while it ran (by this
    server, the turn is cancelled first and ends with ``done``; by another, the turn finds
    it gone): the stream ends after it, whole, rather than cut mid-body."""
    message = f"conversation {conversation_id} was deleted"
    data = json.dumps({"id": conversation_id, "message": message})
    return format_sse_event(event="deleted", data_str=data)


async def _turn(
    encoder: Encoder, conversation_id: str, first: Update, rest: AsyncIterator[Update]
) -> AsyncGenerator[bytes, None]:
    """A streamed turn's updates as SSE events, ``done`` last."""
    update: Update | None = first
    try:
        while update is not None:
            yield await encoder.event(update)
            if isinstance(update, DoneUpdate):
                return
            try:
                update = await anext(rest, None)
            except ConversationNotFoundError:  # deleted under the turn, by another process
                yield deleted_event(conversation_id)
                return
    finally:
        await rest.aclose()  # type: ignore[attr-defined]  # an async generator


async def _watched(encoder: Encoder, watch: Watch) -> AsyncGenerator[bytes, None]:
    """A conversation's updates as SSE events, until the client goes away or the watch is
    ended (the server stops); ``reset`` if the runtime dropped the watch."""
    try:
        async for update in watch:
            yield await encoder.event(update)
    except UpdatesLostError:
        yield reset_event()
    except ConversationNotFoundError:
        yield deleted_event(watch.conversation_id)
    finally:
        await watch.aclose()


__all__ = ["Encoder", "router"]
