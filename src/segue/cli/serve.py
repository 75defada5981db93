"""``segue serve``: the REST API and the web page (``segue.server``) on uvicorn.

Without ``ANTHROPIC_API_KEY`` the offline scripted model answers (the page says so), so a
fresh clone shows everything working; with it, Claude. It binds to 127.0.0.1 unless told
otherwise, and to anything else only with a token.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from typing import Annotated

import typer

from segue.cli._app import (
    BaseUrlOption,
    BehaviorOption,
    DbOption,
    HeaderOption,
    app,
    fail,
    headers_of,
)
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
    model: Annotated[str, typer.Option(help="Model of new conversations.")] = "claude-sonnet-4-6",
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

    key = os.environ.get("ANTHROPIC_API_KEY", "").strip() or None
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
    except UnsafeBindError as error:
        fail(str(error), 2)
    _free(host, port)
    shown = f"[{host}]" if ":" in host else host
    answered = "Claude" if key else "the offline scripted model (set ANTHROPIC_API_KEY for Claude)"
    typer.echo(f"segue serve: http://{shown}:{port}/ answered by {answered}; Ctrl-C stops it")
    uvicorn.run(
        application,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
    )
