"""Building and running the reference server: what ``segue serve`` does, as functions tests and
applications can call too.

Without an API key the server runs the offline scripted model (said on the page), so a new user
sees everything work on a fresh clone; with one, the provider's model: Claude, or OpenAI
(``base_url`` for any compatible server of either). It binds to 127.0.0.1 unless told otherwise,
and anywhere else only with a token.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final

from fastapi import FastAPI

from segue._version import __version__
from segue.errors import UnsafeBindError
from segue.executor.model_port import LlmModel
from segue.executor.models.providers import (
    DEFAULT_MODELS,
    PROVIDERS,
    Provider,
    adapter,
    build_llm,
    new_client,
    release_connections,
)
from segue.executor.runtime import Runtime
from segue.executor.snapshots import git_context
from segue.executor.store_port import Store
from segue.executor.tools import ToolRegistry
from segue.server.app import create_app
from segue.server.ending import streams_end
from segue.server.metrics import prometheus
from segue.server.schemas import Info
from segue.statemachine import ContextExhaustionBehavior, SummaryRequest
from segue.statemachine.state import Compaction


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """What ``segue serve`` was asked for."""

    db: Path = Path("segue.db")
    database_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    provider: Provider = "anthropic"
    """Whose model answers when there is an ``api_key``: ``anthropic`` or ``openai``."""
    model: str | None = None
    """The model of conversations created without one (None: the provider's default,
    ``claude-sonnet-4-6`` or ``gpt-4o``)."""
    behavior: ContextExhaustionBehavior = ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION
    api_key: str | None = None
    """The provider's key; without one the offline scripted model answers."""
    base_url: str | None = None
    token: str | None = None
    context_window: int | None = None
    """The window of conversations created without one (a limit reached in a few messages)."""
    chunk_delay: float = 0.02
    """Seconds between the offline model's text pieces, so its replies visibly stream."""
    headers: dict[str, str] = field(default_factory=dict)
    limits: dict[str, int | float] = field(default_factory=dict)
    """``ConversationOptions`` bounds new conversations get unless the request sets them
    (``max_continuations``, ``max_attempts``, ``max_tool_rounds``, ``retry_base_delay``,
    ``retry_max_delay``)."""
    repo: Path | None = None
    """The git repository whose state a pause records (branch, HEAD, changed files); None:
    the directory the server runs in (nothing is recorded outside a repository)."""
    metrics: bool = False
    """Expose the runtime's metrics at ``/metrics`` (``server.metrics``)."""
    compaction: Compaction = "segue"
    """Who compacts new ``compact_in_place`` conversations unless the request says."""
    context_edits: tuple[dict[str, Any], ...] = ()
    """The provider's context edits new conversations get unless the request says."""
    summary_request: SummaryRequest = "tool_less"
    """How new conversations send the limit's requests unless the request says."""

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            msg = f"unknown provider {self.provider!r}: choose one of {', '.join(PROVIDERS)}"
            raise ValueError(msg)

    @property
    def default_model(self) -> str:
        """The model new conversations get: ``model``, else the provider's default."""
        return self.model or DEFAULT_MODELS[self.provider]


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def demo_tools() -> ToolRegistry:
    """A tool the offline model calls now and then, so the page shows tools running."""
    tools = ToolRegistry()

    @tools.tool(description="Look a topic up in the demo's notes.")
    async def lookup(tool_input: dict[str, object]) -> str:
        return f"Notes on {tool_input.get('query')}: a deterministic fact."

    return tools


def build_model(config: ServerConfig) -> LlmModel:
    """The provider's model with an API key (or any compatible server at ``base_url``), else
    the offline scripted model (its replies sized to each conversation's window)."""
    if config.api_key is None:
        from segue.executor.models.offline import OfflineModel  # noqa: PLC0415  # chat's model too

        return OfflineModel(tool_every=3, chunk_delay=config.chunk_delay)
    return build_llm(
        config.provider, config.api_key, base_url=config.base_url, headers=config.headers
    )


def build_store(config: ServerConfig) -> Store:
    """The store ``config`` names: PostgreSQL at ``database_url``, else the SQLite file ``db``."""
    if config.database_url is not None:
        from segue.executor.stores.postgres import PostgresStore  # noqa: PLC0415  # optional

        return PostgresStore(config.database_url)
    from segue.executor.stores.sqlite import SqliteStore  # noqa: PLC0415

    return SqliteStore(config.db)


def build_app(
    config: ServerConfig, *, store: Store | None = None, tools: ToolRegistry | None = None
) -> FastAPI:
    """The application ``segue serve`` runs (``UnsafeBindError`` for a public bind without a
    token). ``tools``: what the model may call (default: the demo's lookup for the offline
    model, none with a key)."""
    if not is_loopback(config.host) and not config.token:
        msg = (
            f"binding to {config.host} lets other machines in: give a token "
            "(--token or SEGUE_TOKEN), which every API request must then send as "
            "'Authorization: Bearer <token>'"
        )
        raise UnsafeBindError(msg)
    offline = config.api_key is None
    exported = prometheus() if config.metrics else None
    client = None  # the provider's client, made here: its connections are released at a stop
    if config.api_key is not None:
        client = new_client(
            config.provider, config.api_key, base_url=config.base_url, headers=config.headers
        )
    runtime = Runtime(
        store=store or build_store(config),
        llm=build_model(config) if client is None else adapter(config.provider, client),
        tools=tools if tools is not None else demo_tools() if offline else None,
        snapshot_context=git_context(config.repo or Path.cwd()),
        meter_provider=exported.meter_provider if exported is not None else None,
    )
    info = Info(
        version=__version__,
        offline=offline,
        model=config.default_model,
        behavior=config.behavior,
        context_window=config.context_window,
        limits=config.limits,
        compaction=config.compaction,
        context_edits=list(config.context_edits),
        summary_request=config.summary_request,
    )
    app = create_app(runtime, info=info, token=config.token, metrics=exported)
    if client is not None:
        _release_on_stop(app, client)
    return app


def _release_on_stop(app: FastAPI, client: Any) -> None:
    """Release ``client``'s pooled connections each time the app stops (after the runtime is
    closed): they belong to the event loop that is ending, and an app started again (one app,
    many ``TestClient``s) runs on another, opening connections of its own."""
    serve = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(served: Any) -> AsyncIterator[Any]:
        async with serve(served) as state:
            yield state
        await release_connections(client)

    app.router.lifespan_context = lifespan


SHUTDOWN_GRACE: Final = 3
"""Seconds a stopping server waits for open responses (a turn's stream) before closing them.
The pages' watch streams, open for as long as a page is shown, end as it is told to stop."""


SEND_BUFFER: Final = 128 * 1024
"""Bytes the kernel may hold for one client that does not read (its socket's send buffer, set
on the listening socket, which every accepted one inherits). Left to itself, Linux grows it to
4 MB a connection: 200 stalled tabs would hold most of a gigabyte. A stream's own bound is the
relay's (``segue.server.relay``); this bounds what lies beyond it."""
BACKLOG: Final = 2048


def listening_socket(host: str, port: int) -> socket.socket:
    """The socket ``segue serve`` listens on: ``host:port``, each connection's send buffer
    bounded by ``SEND_BUFFER``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        listener.bind((host, port))
        listener.listen(BACKLOG)
    except BaseException:
        listener.close()
        raise
    return listener


def serve(config: ServerConfig) -> None:
    """Run the server until interrupted."""
    run_app(build_app(config), host=config.host, port=config.port)


def run_app(app: FastAPI, *, host: str, port: int) -> None:
    """Run ``app`` with uvicorn until interrupted. Told to stop (Ctrl-C, SIGTERM), it ends the
    watch streams of an app ``create_app`` made at once (``segue.server.ending``), and gives
    what else is open ``SHUTDOWN_GRACE`` seconds."""
    import uvicorn  # noqa: PLC0415  # the server's own dependency

    end = streams_end(app)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if end is not None:
                end()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_GRACE
    )
    with (
        listening_socket(host, port) as listener,
        contextlib.suppress(KeyboardInterrupt),  # Ctrl-C is how it is meant to stop
    ):
        Server(config).run(sockets=[listener])
