"""The reference server: segue's ``Runtime`` over HTTP, and the page that uses it.

A thin adapter (routes translate HTTP to ``Runtime`` calls and ``Runtime.stream`` updates to
Server-Sent Events, nothing more): every rule about conversations lives in the library. Errors
are one JSON shape, ``{"error": code, "message": text}``, mapped once from segue's exceptions:
404 for an unknown id, 409 when the conversation cannot take the request now (busy, read-only,
paused, failed), 422 for input that can never be taken (an empty message, one too large for the
window, an unknown field), 401 without the bearer token when one is required.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, Final

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.sse import EventSourceResponse, format_sse_event
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from segue.executor._log import get_logger
from segue.executor.bus import UpdatesLostError
from segue.executor.ports import (
    ConversationExhaustedError,
    ConversationNotFoundError,
    InvalidMessageError,
    MessageRejectedError,
    SegueError,
    StoredConversation,
)
from segue.executor.runtime import Runtime
from segue.executor.updates import DoneUpdate, Update
from segue.server.schemas import (
    ConversationView,
    CreateConversation,
    ErrorBody,
    Info,
    LinkView,
    MessageView,
    Pause,
    Resume,
    SendMessage,
    SnapshotView,
    StartChild,
)

_log = get_logger("segue.server")
MAX_BODY: Final = 8 * 1024 * 1024
"""Bytes a request body may hold: far more than any message a window can take."""
_STATIC: Final = resources.files("segue.server") / "static"
_SSE_RESPONSE: Final[dict[str, Any]] = {
    "description": "Server-Sent Events: each event named by the update's kind, its data the "
    "update as JSON; a turn ends with `done`, carrying the conversation's state.",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}
_PAGES: Final = {"app.js": "text/javascript", "app.css": "text/css"}
_ERRORS: Final[dict[str, tuple[int, str]]] = {
    "too_large": (422, "message_too_large"),
    "busy": (409, "busy"),
    "paused": (409, "paused"),
    "failed": (409, "failed"),
    "exhausted": (409, "read_only"),
}
"""A refused message's cause, as an HTTP status and a stable error code."""


class ApiError(Exception):
    """An error the API answers with its own status and code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(ErrorBody(error=code, message=message).model_dump(), status_code=status)


def _mapped(error: Exception) -> JSONResponse:
    """segue's exceptions as the API's errors (one place, by type, never by message text)."""
    if isinstance(error, ApiError):
        return _error(error.status, error.code, error.message)
    if isinstance(error, ConversationNotFoundError):
        return _error(404, "not_found", str(error))
    if isinstance(error, ConversationExhaustedError):
        return _error(409, "read_only", str(error))
    if isinstance(error, MessageRejectedError):
        status, code = _ERRORS.get(error.cause, (409, "rejected"))
        return _error(status, code, str(error))
    if isinstance(error, InvalidMessageError | ValidationError | ValueError):
        return _error(422, "invalid_request", str(error))
    if isinstance(error, SegueError):
        return _error(409, "conflict", str(error))
    _log.error("request_failed", error_type=type(error).__name__)
    return _error(500, "internal", "the server failed; nothing of the request was lost")


def create_app(
    runtime: Runtime,
    *,
    info: Info,
    token: str | None = None,
) -> FastAPI:
    """The API and the page over ``runtime``; ``token``: required as ``Authorization: Bearer``
    on every API route when given. The runtime is entered (``recover()``) when the app starts
    and closed when it stops."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with runtime:
            yield

    app = FastAPI(
        title="segue",
        version=info.version,
        description="Conversations that carry on across the context-window limit.",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's docs pages load their scripts from a CDN; this works offline
        redoc_url=None,
    )
    _errors(app)
    _limits(app)
    guard = Depends(_bearer(token))
    _pages(app)
    _routes(app, runtime, info, guard)
    return app


class _BodyLimit:
    """ASGI middleware that counts a request body's bytes as the app reads them: past
    ``limit`` it answers 413 itself, and the app reads a disconnect (whatever the app then tries
    to answer is dropped). A body sent in chunks has no ``Content-Length`` to refuse it by."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        seen = 0
        refused = False

        async def counted() -> Any:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    refused = True
                    await _too_large(send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Any) -> None:
            if not refused:
                await send(message)

        await self.app(scope, counted, guarded)


async def _too_large(send: Any) -> None:
    body = ErrorBody(
        error="too_large", message=f"a request body may hold {MAX_BODY:,} bytes"
    ).model_dump_json()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
        }
    )
    await send({"type": "http.response.body", "body": body.encode()})


def _errors(app: FastAPI) -> None:
    # Every error a client can cause has a handler of its own type: Starlette's catch-all for
    # ``Exception`` answers too, but then re-raises (a traceback in the log, the connection
    # closed under a client that did nothing worse than send bad input).
    @app.exception_handler(Exception)
    async def any_error(_request: Request, error: Exception) -> JSONResponse:
        return _mapped(error)

    @app.exception_handler(ValueError)  # pydantic's ValidationError included
    async def bad_value(_request: Request, error: ValueError) -> JSONResponse:
        return _mapped(error)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, error: ApiError) -> JSONResponse:
        return _mapped(error)

    @app.exception_handler(SegueError)
    async def segue_error(_request: Request, error: SegueError) -> JSONResponse:
        return _mapped(error)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        detail = "; ".join(
            f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        return _error(422, "invalid_request", detail or "the request is not valid")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code == 400:  # a body FastAPI could not parse: bad input, like the rest
            return _error(422, "invalid_request", error.detail)
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}
        return _error(error.status_code, code.get(error.status_code, "http_error"), error.detail)


def _limits(app: FastAPI) -> None:
    app.add_middleware(_BodyLimit, limit=MAX_BODY)

    @app.middleware("http")
    async def bounded(request: Request, call_next: Callable[..., Any]) -> Response:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
            return _error(413, "too_large", f"a request body may hold {MAX_BODY:,} bytes")
        response: Response = await call_next(request)
        return response


def _bearer(token: str | None) -> Callable[[Request], None]:
    expected = (token or "").encode("utf-8")

    def check(request: Request) -> None:
        if token is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        # As bytes: compare_digest refuses str with characters beyond ASCII (a 500 for a bad
        # token), and the header's bytes are what the client sent (HTTP decodes them latin-1).
        sent = value.strip().encode("latin-1", "replace")
        if scheme.lower() != "bearer" or not secrets.compare_digest(sent, expected):
            raise ApiError(401, "unauthorized", "send Authorization: Bearer <token>")

    return check


def _pages(app: FastAPI) -> None:
    page = (_STATIC / "index.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def home() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/c/{conversation_id}", response_class=HTMLResponse, include_in_schema=False)
    async def conversation_page(conversation_id: str) -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        media = _PAGES.get(name)
        if media is None:  # a fixed set of files: a name from the URL is never a path
            raise ApiError(404, "not_found", f"no static file {name!r}")
        return Response((_STATIC / name).read_text(encoding="utf-8"), media_type=media)


def _routes(app: FastAPI, runtime: Runtime, info: Info, guard: Any) -> None:
    async def view(conversation_id: str) -> ConversationView:
        stored = await runtime.conversation(conversation_id)
        return ConversationView.of(stored.state, stored)

    @app.get("/api/info", dependencies=[guard])
    async def about() -> Info:
        """What the server runs (offline: the scripted model answers)."""
        return info

    @app.post("/api/conversations", status_code=201, dependencies=[guard])
    async def create(body: CreateConversation) -> ConversationView:
        """Create a conversation."""
        state = await runtime.create_conversation(
            model=body.model or info.model,
            behavior=body.behavior or info.behavior,
            system=body.system,
            warning_threshold=body.warning_threshold,
            continuation_threshold=body.continuation_threshold,
            context_window=body.context_window,
        )
        return await view(state.id)

    @app.get("/api/conversations", dependencies=[guard])
    async def listed() -> list[ConversationView]:
        """Every conversation, newest first."""
        return [ConversationView.of(c.state, c) for c in await runtime.conversations()]

    @app.get("/api/conversations/{conversation_id}", dependencies=[guard])
    async def one(conversation_id: str) -> ConversationView:
        """A conversation's state."""
        return await view(conversation_id)

    @app.get("/api/conversations/{conversation_id}/messages", dependencies=[guard])
    async def messages(conversation_id: str) -> list[MessageView]:
        """The whole transcript, in order."""
        return [MessageView.of(m) for m in await runtime.messages(conversation_id)]

    @app.post(
        "/api/conversations/{conversation_id}/messages",
        dependencies=[guard],
        response_model=None,
        responses={200: _SSE_RESPONSE},
    )
    async def send(conversation_id: str, body: SendMessage) -> EventSourceResponse:
        """Send a message; the turn's updates stream back as Server-Sent Events, ``done``
        last with the conversation's state. A client that disconnects loses nothing: the turn
        finishes and is stored."""
        updates = runtime.stream(conversation_id, body.text, wait=False)
        first = await anext(updates)  # a refusal raises here, before any byte is sent
        return EventSourceResponse(_events(runtime, first, updates))

    @app.get(
        "/api/conversations/{conversation_id}/events",
        dependencies=[guard],
        response_model=None,
        responses={200: _SSE_RESPONSE},
    )
    async def events(conversation_id: str) -> EventSourceResponse:
        """Every update of the conversation from now on (a second tab, a client that
        reconnected after reading the state)."""
        await runtime.conversation(conversation_id)
        watch = runtime.watch(conversation_id)
        return EventSourceResponse(_watched(runtime, watch))

    @app.post("/api/conversations/{conversation_id}/continue", dependencies=[guard])
    async def continue_now(conversation_id: str) -> ConversationView:
        """Continue in a new conversation now (from idle; a no-op while a turn runs)."""
        await runtime.continue_manually(conversation_id)
        return await view(conversation_id)

    @app.post("/api/conversations/{conversation_id}/cancel", dependencies=[guard])
    async def cancel(conversation_id: str) -> ConversationView:
        """Stop what is in flight."""
        await runtime.cancel(conversation_id)
        return await view(conversation_id)

    @app.post("/api/conversations/{conversation_id}/pause", dependencies=[guard])
    async def pause(conversation_id: str, body: Pause | None = None) -> ConversationView:
        """Pause at the next turn boundary (``timeout``: then cancel and pause)."""
        request = body or Pause()
        await runtime.pause(conversation_id, request.reason, timeout=request.timeout)
        return await view(conversation_id)

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
    """A conversation's updates as SSE text, until the client goes away."""
    try:
        async for update in watch:
            if isinstance(update, DoneUpdate):
                yield _sse(update, await _done_state(runtime, update))
            else:
                yield _sse(update)
    except UpdatesLostError as error:
        yield format_sse_event(event="lost", data_str=json.dumps(str(error)))
    finally:
        await watch.aclose()


__all__ = ["ApiError", "create_app"]
