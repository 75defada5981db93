"""The routes a chat backend keeps its conversations with (``docs/data.md``): replace a
conversation's metadata, delete it (or its whole chain), export it as one JSON document, import
such a document, and purge what nobody wrote to for a while. The application stores nothing of
its own: the labels it finds a user's conversations by are the conversations' metadata, and
``GET /api/conversations?metadata.user=...`` pages through them (``conversations``).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Final

from fastapi import APIRouter, Body, Query, Request, Response

from segue.executor.errors import ConversationBusyError, ConversationExistsError
from segue.executor.runtime import Runtime
from segue.server.conversations import StateViews
from segue.server.errors import ApiError
from segue.server.schemas import (
    ABOUT_ONE,
    EVERY_ROUTE,
    SENDING,
    ConversationId,
    ConversationView,
    ErrorBody,
    Metadata,
    Purge,
    Purged,
    documented,
)

MAX_IMPORTS: Final = 2
"""How many imports a server reads at once. An import holds its document (up to 64 MB) and
the values parsed from it until it is stored; bounded, a burst of them cannot run the server
out of memory."""
_RETRY_AFTER: Final = 2
_DOCUMENT_EXAMPLE = {"format": "segue.conversation", "version": 1, "conversation": {}}
_IMPORT_BODY: Final[dict[str, Any]] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"type": "object"}, "example": _DOCUMENT_EXAMPLE}
        },
    }
}
_IMPORTS_FULL: Final[dict[str, Any]] = {
    "description": f"{MAX_IMPORTS} imports are being read already (`too_many_imports`): send "
    "it again after `Retry-After` seconds.",
    "model": ErrorBody,
}
_EXPORT_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The conversation as one JSON document (`docs/data.md`): its state, "
        "whole transcript, event log, snapshots, pending work, metadata, lineage and usage.",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}


def _busy(conversation_id: str, doing: str, way_out: str) -> ApiError:
    """A 409 ``busy`` in the API's words (the runtime's name Python arguments)."""
    message = f"conversation {conversation_id} is answering a turn: {doing}; {way_out}"
    return ApiError(409, "busy", message)


def router(runtime: Runtime, views: StateViews) -> APIRouter:
    """The routes over ``runtime``; ``views`` forgets the titles of what is deleted."""
    routes = APIRouter(prefix="/api", responses=documented(*EVERY_ROUTE))
    _keeping(routes, runtime, views)
    _moving(routes, runtime, views)
    return routes


def _keeping(routes: APIRouter, runtime: Runtime, views: StateViews) -> None:
    """Labelling conversations, deleting one (or its chain), and retention."""

    @routes.put(
        "/conversations/{conversation_id}/metadata", responses=documented(*ABOUT_ONE, *SENDING)
    )
    async def set_metadata(
        conversation_id: str, metadata: Annotated[Metadata, Body()]
    ) -> ConversationView:
        """Replace the conversation's metadata with the body (``{"user": "u-17", "title":
        "Tides"}``; ``{}`` removes every label). A ``title`` is shown as its title."""
        stored = await runtime.set_metadata(conversation_id, metadata)
        return await views.of(stored.state, stored)

    @routes.delete(
        "/conversations/{conversation_id}",
        status_code=204,
        response_class=Response,
        responses=documented(*ABOUT_ONE, 409),
    )
    async def delete(
        conversation_id: str,
        chain: Annotated[bool, Query()] = False,
        cancel: Annotated[bool, Query()] = False,
    ) -> Response:
        """Delete the conversation: its transcript, event log, snapshots, metadata, pending
        work and files. ``chain=true``: its whole continuation chain (otherwise its neighbours
        only lose the link). A turn that runs is refused, 409 ``busy``, before anything is
        deleted; ``cancel=true`` stops it first."""
        try:
            deleted = await runtime.delete_conversation(conversation_id, chain=chain, cancel=cancel)
        except ConversationBusyError as error:
            doing = "nothing was deleted"
            raise _busy(error.conversation_id, doing, "wait for it, or add ?cancel=true") from None
        views.forget(deleted)
        return Response(status_code=204)

    @routes.post("/purge", responses=documented(413, 415, 422), response_model_exclude_none=True)
    async def purge(body: Purge) -> Purged:
        """Retention: delete the conversations nobody wrote to for ``older_than`` seconds
        (only those whose metadata holds every pair of ``metadata``), each alone, as ``DELETE``
        deletes one; one whose turn runs is left for the next purge. ``vacuum``: then rewrite
        the store's files without the deleted text (PostgreSQL's ``VACUUM FULL``)."""
        deleted = await runtime.purge(older_than=body.older_than, metadata=body.metadata)
        vacuumed = await runtime.vacuum() if body.vacuum else None
        return Purged(deleted=deleted, vacuumed=vacuumed)


def _moving(routes: APIRouter, runtime: Runtime, views: StateViews) -> None:
    """A conversation out as one document, and in again here or in another deployment."""

    @routes.get(
        "/conversations/{conversation_id}/export",
        responses={**_EXPORT_RESPONSE, **documented(*ABOUT_ONE, 409)},
    )
    async def export(conversation_id: str) -> dict[str, Any]:
        """The conversation as one JSON document, for ``POST /api/conversations/import`` here
        or in another deployment. A turn that runs is refused, 409 ``busy``: the document
        would be out of date before it is sent."""
        try:
            return await runtime.export_conversation(conversation_id)
        except ConversationBusyError:
            raise _busy(
                conversation_id, "its state would be out of date", "export it after"
            ) from None

    imports = asyncio.Semaphore(MAX_IMPORTS)

    @routes.post(
        "/conversations/import",
        status_code=201,
        responses={**documented(409, 413, 415, 422), 503: _IMPORTS_FULL},
        openapi_extra=_IMPORT_BODY,
    )
    async def import_(
        request: Request, conversation_id: Annotated[ConversationId | None, Query()] = None
    ) -> ConversationView:
        """Store the conversation an export holds, under ``conversation_id`` when given (else
        its own id): it continues where it was. A document that is not a sound export is
        refused, 422 ``invalid_document`` saying why and naming the ``field``; an id taken,
        409 ``exists``; either way nothing is stored. Documents over the server's bound on a
        body (64 MB) go through ``segue import``. At most ``MAX_IMPORTS`` (2) imports are read
        at once: another is answered 503 ``too_many_imports`` with ``Retry-After``, before its
        body is read."""
        if imports.locked():
            message = f"{MAX_IMPORTS} imports are being read; send this one again shortly"
            retry = {"retry-after": str(_RETRY_AFTER)}
            raise ApiError(503, "too_many_imports", message, headers=retry)
        async with imports:
            try:
                state = await runtime.import_conversation(
                    await _body(request), conversation_id=conversation_id
                )
            except ConversationExistsError as exists:
                way = "import it under another id (?conversation_id=...) or delete that one first"
                raise ApiError(409, "exists", f"{exists}: {way}") from None
        views.forget([state.id])
        return await views.read(state.id)


async def _body(request: Request) -> bytearray:
    """The request's body, gathered from its chunks: the document is parsed straight from it
    (``BodyLimit`` bounds it as it arrives)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk  # each chunk let go as it is added: the body is held once
    return body


__all__ = ["router"]
