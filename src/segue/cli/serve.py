"""``segue serve``: the REST API and the web page (``segue.server``) on uvicorn.

Without the provider's key (``ANTHROPIC_API_KEY``, or ``OPENAI_API_KEY`` with ``--provider
openai``) the offline scripted model answers (the page says so), so a fresh clone shows
everything working; with it, the provider's model. It binds to 127.0.0.1 unless told
otherwise, and to anything else only with a token.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from segue.cli._app import (
    BaseUrlOption,
    BehaviorOption,
    CliError,
    DbOption,
    HeaderOption,
    app,
    fail,
    headers_of,
)
from segue.cli._models import DEFAULT_MODELS, KEY_VARIABLES, build_llm, provider_for
from segue.statemachine import ContextExhaustionBehavior as Behavior


def _free(host: str, port: int) -> None:
    """Fail with one line if ``host:port`` cannot be bound (uvicorn would log a traceback)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            where = f"cannot listen on {host}:{port}"
            if error.errno == errno.EADDRINUSE:
                fail(f"{where}: the port is in use (choose another with --port)", 1)
            fail(f"{where}: {error.strerror}", 1)


def _openai_app(config: Any, key: str) -> Any:
    """The server over ``OpenAIModel``: ``segue.server.build_app`` builds Claude's, so until
    ``ServerConfig`` knows providers this is its application with the OpenAI adapter, from the
    server's public parts (``build_app`` has already checked the bind)."""
    from segue import __version__  # noqa: PLC0415
    from segue.executor.runtime import Runtime  # noqa: PLC0415
    from segue.server.app import create_app  # noqa: PLC0415
    from segue.server.run import build_store  # noqa: PLC0415
    from segue.server.schemas import Info  # noqa: PLC0415

    llm = build_llm("openai", key, base_url=config.base_url, headers=config.headers)
    runtime = Runtime(store=build_store(config), llm=llm)
    info = Info(version=__version__, offline=False, model=config.model, behavior=config.behavior)
    return create_app(runtime, info=info, token=config.token)


@app.command()
def serve(
    db: DbOption = Path("segue.db"),
    database_url: Annotated[
        str | None,
        typer.Option(
            envvar="SEGUE_DATABASE_URL", help="PostgreSQL URL (instead of the SQLite --db)."
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65_535, help="Port to listen on.")] = 8000,
    model: Annotated[
        str | None,
        typer.Option(help="Model of new conversations (default: claude-sonnet-4-6, or gpt-4o)."),
    ] = None,
    provider: Annotated[
        str | None,
        typer.Option(help="anthropic or openai (default: told by --model, else anthropic)."),
    ] = None,
    behavior: BehaviorOption = Behavior.THRESHOLD_BASED_CONTINUATION,
    base_url: BaseUrlOption = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="SEGUE_TOKEN",
            help="Bearer token every API request must send (required beyond 127.0.0.1).",
        ),
    ] = None,
    header: HeaderOption = None,
) -> None:
    """Serve the REST API and the web page (offline scripted model without an API key)."""
    try:
        from segue.server.run import (  # noqa: PLC0415
            SHUTDOWN_GRACE,
            ServerConfig,
            UnsafeBindError,
            build_app,
        )
    except ImportError as error:  # the extra is not installed
        fail(f"segue serve needs the server extra: pip install 'segue[server]' ({error})", 2)
    import uvicorn  # noqa: PLC0415

    try:
        chosen = provider_for(provider, model)
    except CliError as error:
        fail(error.message, error.code)
    model = model or DEFAULT_MODELS[chosen]
    key = os.environ.get(KEY_VARIABLES[chosen], "").strip() or None
    config = ServerConfig(
        db=db,
        database_url=database_url,
        host=host,
        port=port,
        model=model,
        behavior=behavior,
        api_key=key,
        base_url=base_url,
        token=token,
        headers=headers_of(header),
    )
    try:
        application = build_app(config)
        if chosen == "openai" and key is not None:
            application = _openai_app(config, key)
    except UnsafeBindError as error:
        fail(str(error), 2)
    _free(host, port)
    shown = f"[{host}]" if ":" in host else host
    answered = (
        ("Claude" if chosen == "anthropic" else f"{model} (OpenAI API)")
        if key
        else f"the offline scripted model (set {KEY_VARIABLES[chosen]} for {chosen})"
    )
    typer.echo(f"segue serve: http://{shown}:{port}/ answered by {answered}; Ctrl-C stops it")
    uvicorn.run(
        application,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
    )
