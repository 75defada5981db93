"""The reference server: segue's ``Runtime`` over HTTP, and the page that uses it.

A thin adapter (routes translate HTTP to ``Runtime`` calls and ``Runtime.stream`` updates to
Server-Sent Events, nothing more): every rule about conversations lives in the library. Errors
are one JSON shape (``errors``); what every request passes first (the host, the origin, the body's
type and size, the security headers) is ``guard``; the page is ``pages``; the routes that steer a
conversation (continue, cancel, pause, resume, snapshots, children) are ``control``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any, Final

from fastapi import Depends, FastAPI
from fastapi.sse import EventSourceResponse, format_sse_event

from segue import __version__
from segue.executor._log import get_logger
from segue.executor.errors import ConversationNotFoundError, UpdatesLostError
from segue.executor.models.scripted import ScriptedModel
from segue.executor.runtime import Runtime
from segue.executor.store_port import StoredConversation
from segue.executor.updates import DoneUpdate, Update
from segue.server import control, errors, pages
from segue.server.auth import bearer
from segue.server.ending import StreamsEnd
from segue.server.errors import ApiError
from segue.server.guard import BodyLimit, CrossSiteCheck, HostCheck, Shield
from segue.server.pausing import Pauses
from segue.server.schemas import (
    ConversationView,
    CreateConversation,
    Info,
    MessageView,
    SendMessage,
)
from segue.statemachine import ContextExhaustionBehavior

_log = get_logger("segue.server")
MAX_BODY: Final = 8 * 1024 * 1024
"""Bytes a request body may hold: far more than any message a window can take."""
DEFAULT_MODEL: Final = "claude-sonnet-4-6"
"""The model of a conversation created without one, unless ``info`` says otherwise."""
_SSE_RESPONSE: Final[dict[str, Any]] = {
    "description": "Server-Sent Events: each event named by the update's kind, its data the "
    "update as JSON; a turn ends with `done`, carrying the conversation's state.",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}


def default_info(runtime: Runtime) -> Info:
    """What a server over ``runtime`` says about itself when the application did not say."""
    return Info(
        version=__version__,
        offline=isinstance(runtime.llm, ScriptedModel),
        model=DEFAULT_MODEL,
        behavior=ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION,
    )


def create_app(
    runtime: Runtime,
    *,
    info: Info | None = None,
    token: str | None = None,
    allowed_hosts: Iterable[str] = (),
) -> FastAPI:
    """The API and the page over ``runtime``.

    ``info``: what ``/api/info`` says and what a new conversation gets when the request leaves
    it out (default: ``default_info(runtime)``). ``token``: required as ``Authorization:
    Bearer`` on every API route and on ``/openapi.json`` (an empty one is refused: it would let
    anyone in). Without a token only requests to a loopback name (``localhost``, 127.0.0.1,
    ``[::1]``) or one of ``allowed_hosts`` are answered.

    The runtime is entered (``recover()``) when the app starts and closed when it stops. Mounted
    in another app (``parent.mount("/segue", app)``), whose lifespan does not run this one's,
    include it in the parent's (``FastAPI(lifespan=app.router.lifespan_context)``); left out,
    the recovery starts with the first request instead, and the runtime is the application's to
    close.
    """
    if token is not None and not token.strip():
        msg = "token is empty: give a real one, or None for a server only this machine reaches"
        raise ValueError(msg)
    shown = info or default_info(runtime)
    start = _Startup(runtime)
    pauses = Pauses(runtime)
    end = StreamsEnd()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        end.reset()  # served (again): its watch streams run until it stops
        async with runtime:
            start.started = True
            try:
                yield
            finally:
                await pauses.close()

    app = FastAPI(
        title="segue",
        version=shown.version,
        description="Conversations that carry on across the context-window limit.",
        lifespan=lifespan,
        openapi_url=None,  # served below, behind the token
        docs_url=None,  # FastAPI's docs pages load their scripts from a CDN; this works offline
        redoc_url=None,
    )
    app.state.streams_end = end  # called by the server that runs the app as it stops
    errors.install(app)
    guard = Depends(bearer(token))
    pages.install(app)
    _routes(app, runtime, shown, guard, end)
    control.install(app, runtime, guard, pauses)

    @app.get("/openapi.json", include_in_schema=False, dependencies=[guard])
    async def schema() -> dict[str, Any]:
        return app.openapi()

    # Outermost last: the headers on everything, then the host, the origin, the body's size.
    app.add_middleware(BodyLimit, limit=MAX_BODY)
    app.add_middleware(CrossSiteCheck)
    app.add_middleware(HostCheck, open_to_any=token is not None, also=allowed_hosts)
    app.add_middleware(_StartOnFirstRequest, startup=start)
    app.add_middleware(Shield)
    return app


class _Startup:
    """Whether the runtime's startup work (``recover()``) ran, and running it once if not."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.started = False
        self.task: asyncio.Task[None] | None = None

    def ensure(self) -> None:
        """Start the recovery in the background (a request never waits for another
        conversation's recovered work)."""
        if self.started or self.task is not None:
            return
        self.started = True
        self.task = asyncio.ensure_future(self.runtime.recover())
        self.task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        _log.error("recovery_failed", error_type=type(exc).__name__)


class _StartOnFirstRequest:
    """Run the startup work with the first request when no lifespan ran it (a mounted app)."""

    def __init__(self, app: Any, *, startup: _Startup) -> None:
        self.app = app
        self.startup = startup

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self.startup.started:
            self.startup.ensure()
        await self.app(scope, receive, send)


def _routes(app: FastAPI, runtime: Runtime, info: Info, guard: Any, end: StreamsEnd) -> None:
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
        options = body.options(
            model=info.model, behavior=info.behavior, context_window=info.context_window
        )
        state = await runtime.create_conversation(options)
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
        """Send a message (``pinned``: never summarised away); the turn's updates stream back
        as Server-Sent Events, ``done`` last with the conversation's state. A client that
        disconnects loses nothing: the turn finishes and is stored."""
        updates = runtime.stream(conversation_id, body.text, wait=False, pinned=body.pinned)
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
        watch = runtime.watch(conversation_id)  # watching from here on, before any byte
        # Reading the store from here on too, before the client hears the stream is open
        # (and reads the state): another process's turn starting in between is not missed.
        # An unknown id raises here (a 404), and the watch is over.
        await watch.start()
        end.add(watch)
        return EventSourceResponse(_watched(runtime, watch))


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


__all__ = ["DEFAULT_MODEL", "ApiError", "create_app", "default_info"]
