"""The routes that read and create conversations: what the server runs, a new conversation, a
page of the list, one conversation's state and its transcript; and ``StateViews``, how every
route (and every stream's ``done``) shows a conversation."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable
from typing import Annotated, Any, Final
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response
from pydantic import TypeAdapter, ValidationError

from segue.executor.requests import support_of
from segue.executor.runtime import Runtime
from segue.executor.store_port import StoredConversation
from segue.server.errors import ApiError, readable
from segue.server.schemas import (
    ABOUT_ONE,
    EVERY_ROUTE,
    ConversationView,
    CreateConversation,
    Info,
    MessageView,
    Metadata,
    documented,
)
from segue.statemachine import ConversationState
from segue.views import title_of

TITLES_KEPT: Final = 10_000
"""Titles remembered (the most recently shown): a title never changes once there is one."""
PAGE: Final = 50
"""Conversations a page of the list holds unless the request says (at most ``MAX_PAGE``)."""
MAX_PAGE: Final = 1_000
METADATA_PREFIX: Final = "metadata."
"""A query parameter ``metadata.<key>=<value>`` lists only conversations labelled so."""
_LISTING_PARAMETERS: Final = frozenset({"limit", "cursor"})
_METADATA: Final = TypeAdapter(Metadata)
_LINK_HEADER: Final[dict[str, Any]] = {
    "Link": {
        "description": 'The next page, when there is one: `<address>; rel="next"` (RFC 8288), '
        "the same query with the next page's `cursor`.",
        "schema": {"type": "string"},
    }
}


class StateViews:
    """Conversations as the API shows them (``ConversationView``), each with its title: the
    first words of its first user message, read from the transcript once and remembered (a
    transcript only grows, so a title found never changes)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._titles: OrderedDict[str, str] = OrderedDict()

    def forget(self, conversation_ids: Iterable[str]) -> None:
        """Let go of the titles of deleted conversations (an id may be imported again)."""
        for cid in conversation_ids:
            self._titles.pop(cid, None)

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
        """The view of ``state`` (``stored``: the child, the creation time, the metadata; a
        title the metadata holds spares reading the transcript)."""
        titled = stored is not None and stored.metadata.get("title", "").strip()
        first_words = None if titled else await self.title(state.id)
        return ConversationView.of(state, stored, title=first_words)

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
        """What the server runs (offline: the scripted model answers), and what its model
        adapter can do (the provider's compaction), as the create route decides it."""
        can_compact = support_of(runtime.llm, info.model).compaction
        return info.model_copy(update={"provider_compaction": can_compact})

    @routes.post("/conversations", status_code=201, responses=documented(413, 415, 422))
    async def create(body: CreateConversation) -> ConversationView:
        """Create a conversation (``metadata``: the application's labels, a ``title`` among
        them shown as its title). Options the model's adapter cannot honour (the provider's
        compaction, context edits) are refused: 422 ``unsupported_option``."""
        options = body.options(info)
        state = await runtime.create_conversation(options, metadata=body.metadata)
        return await views.read(state.id)

    @routes.get(
        "/conversations",
        responses={200: {"headers": _LINK_HEADER}, **documented(422)},
    )
    async def listed(
        request: Request,
        response: Response,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = PAGE,
        cursor: Annotated[str | None, Query(min_length=1, max_length=1_000)] = None,
    ) -> list[ConversationView]:
        """A page of conversations, newest first, each with its title and creation time:
        ``limit`` of them (1 to 1,000), only those whose metadata holds every
        ``metadata.<key>=<value>`` of the query (``?metadata.user=u-17``). The next page is in
        the ``Link`` header (``rel="next"``), absent on the last; ``cursor`` is what it
        carries. Any other query parameter is refused (a misspelt filter would list
        everyone's)."""
        metadata = _metadata_filter(request.query_params.multi_items())
        page = await runtime.list_conversations(metadata=metadata, limit=limit, cursor=cursor)
        if page.next_cursor is not None:
            response.headers["link"] = _next_link(request, page.next_cursor)
        shown = await asyncio.gather(*(views.of(c.state, c) for c in page.conversations))
        return list(shown)

    @routes.get("/conversations/{conversation_id}", responses=documented(*ABOUT_ONE))
    async def one(conversation_id: str) -> ConversationView:
        """A conversation's state."""
        return await views.read(conversation_id)

    @routes.get("/conversations/{conversation_id}/messages", responses=documented(*ABOUT_ONE))
    async def messages(conversation_id: str) -> list[MessageView]:
        """The whole transcript, in order."""
        return [MessageView.of(m) for m in await runtime.messages(conversation_id)]

    return routes


def _metadata_filter(parameters: Iterable[tuple[str, str]]) -> dict[str, str] | None:
    """The ``metadata.<key>=<value>`` pairs of a listing's query (None: no filter); a 422 for
    a parameter the listing does not take, or a key given twice."""
    pairs: dict[str, str] = {}
    for name, value in parameters:
        if name in _LISTING_PARAMETERS:
            continue
        if not name.startswith(METADATA_PREFIX):
            message = f"the list takes limit, cursor and metadata.<key>=<value>, not {name[:80]!r}"
            raise ApiError(422, "invalid_request", message)
        key = name.removeprefix(METADATA_PREFIX)
        if key in pairs:
            raise ApiError(422, "invalid_request", f"{name[:80]!r} is given twice")
        pairs[key] = value
    if not pairs:
        return None
    try:
        return _METADATA.validate_python(pairs)
    except ValidationError as error:
        message = f"a metadata filter is not valid: {readable(error.errors())}"
        raise ApiError(422, "invalid_metadata", message) from None


def _next_link(request: Request, cursor: str) -> str:
    """The ``Link`` header's value for the next page: this request's path and query, with the
    next page's ``cursor`` (relative to the server, so it holds behind a proxy's host)."""
    query = [(k, v) for k, v in request.query_params.multi_items() if k != "cursor"]
    query.append(("cursor", cursor))
    return f'<{request.url.path}?{urlencode(query)}>; rel="next"'


__all__ = ["MAX_PAGE", "PAGE", "StateViews", "router"]
