"""``segue serve``: the REST API and the web page (``segue.server``) on uvicorn.

Without the provider's key (``ANTHROPIC_API_KEY``, or ``OPENAI_API_KEY`` with ``--provider
openai``) the offline scripted model answers (the page says so), so a fresh clone shows
everything working; with it, the provider's model. It binds to 127.0.0.1 unless told
otherwise, and to anything else only with a token.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from urllib.parse import quote

import typer

from segue.cli._app import (
    BaseUrlOption,
    BehaviorOption,
    CliError,
    CompactionOption,
    ContextEditsOption,
    DbOption,
    HeaderOption,
    MaxAttemptsOption,
    MaxContinuationsOption,
    MaxToolRoundsOption,
    PauseAfterSecondsOption,
    PauseAfterTurnsOption,
    RepoOption,
    RetryBaseDelayOption,
    RetryMaxDelayOption,
    SummaryRequestOption,
    app,
    context_edits_of,
    fail,
    headers_of,
    limits_of,
    options_of,
    whole_number,
    window_tokens,
)
from segue.cli._models import DEFAULT_MODELS, KEY_VARIABLES, offline_line, provider_for
from segue.cli._output import console, printable, say
from segue.cli._stores import DatabaseUrlOption, is_segue_store
from segue.statemachine import ContextExhaustionBehavior as Behavior

if TYPE_CHECKING:
    from segue.server.run import ServerConfig


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


def _store_usable(db: Path, database_url: str | None) -> None:
    """Fail with one line, before anything is announced, if the store cannot be used: a file
    that is not a segue store (some other program's database, a text file), a database that
    cannot be opened. The store is opened once and closed again (its tables made if new)."""
    from segue.server.run import ServerConfig, build_store  # noqa: PLC0415

    if database_url is None and db.is_file() and db.stat().st_size > 0:
        with db.open("rb") as file:
            is_sqlite = file.read(16) == b"SQLite format 3\x00"
        if not is_sqlite:
            fail(f"{db} is not a SQLite database (give a new file, or a segue store)", 2)
        if not is_segue_store(db):
            fail(f"{db} is another program's SQLite database, not a segue store", 2)
    store = build_store(ServerConfig(db=db, database_url=database_url))

    async def probe() -> None:
        try:
            await store.with_pending()
        finally:
            await store.close()

    try:
        asyncio.run(probe())
    except Exception as error:  # noqa: BLE001  # any failure to open it: one line, not a traceback
        where = "the PostgreSQL database" if database_url else str(db)
        fail(f"cannot use {where}: {type(error).__name__}: {printable(str(error))}", 2)


_NO_KEY_HINT = {name: f"export {variable}" for name, variable in KEY_VARIABLES.items()}


def _address(host: str, port: int, token: str | None) -> str:
    """Where to open the page (with the token for the page to take, when there is one). A
    wildcard host (``0.0.0.0``, ``::``) is where the server listens, not an address a browser
    can open: this machine's loopback is shown for it, of the same family."""
    if _is_wildcard(host):
        host = "::1" if ":" in host else "127.0.0.1"
    shown = f"[{host}]" if ":" in host else host
    address = f"http://{shown}:{port}/"
    return f"{address}#token={quote(token, safe='')}" if token else address


def _is_wildcard(host: str) -> bool:
    """Whether ``host`` is the address of every interface (``0.0.0.0``, ``::``)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:  # a name
        return False


@app.command()
def serve(
    db: DbOption = Path("segue.db"),
    database_url: DatabaseUrlOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(parser=whole_number(1, 65_535), metavar="N", help="Port to listen on.")
    ] = 8000,
    model: Annotated[
        str | None,
        typer.Option(help="Model of new conversations (default: claude-sonnet-4-6, or gpt-4o)."),
    ] = None,
    provider: Annotated[
        str | None,
        typer.Option(help="anthropic or openai (default: told by --model, else anthropic)."),
    ] = None,
    behavior: BehaviorOption = Behavior.THRESHOLD_BASED_CONTINUATION,
    context_window: Annotated[
        int | None,
        typer.Option(
            parser=window_tokens,
            metavar="N",
            help="Window of new conversations in tokens (a small one reaches the limit in a "
            "few messages; default: the model's).",
        ),
    ] = None,
    base_url: BaseUrlOption = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="SEGUE_TOKEN",
            help="Bearer token every API request must send (required beyond 127.0.0.1).",
        ),
    ] = None,
    header: HeaderOption = None,
    repo: RepoOption = None,
    max_continuations: MaxContinuationsOption = None,
    max_attempts: MaxAttemptsOption = None,
    max_tool_rounds: MaxToolRoundsOption = None,
    retry_base_delay: RetryBaseDelayOption = None,
    retry_max_delay: RetryMaxDelayOption = None,
    pause_after_turns: PauseAfterTurnsOption = None,
    pause_after_seconds: PauseAfterSecondsOption = None,
    metrics: Annotated[
        bool,
        typer.Option(
            help="Expose the runtime's metrics at /metrics in Prometheus' text format (behind "
            "the token; needs segue[metrics])."
        ),
    ] = False,
    compaction: CompactionOption = "segue",
    context_edits: ContextEditsOption = None,
    summary_request: SummaryRequestOption = "tool_less",
) -> None:
    """Serve the REST API and the web page (offline scripted model without an API key).
    \f
    Twenty-two parameters, over the bound of ten, and as many declarations, over sixty lines,
    because typer makes each option of a command a parameter of its function and has no way to
    group them; the work is ``_serve``'s, which takes them as one value.
    """
    limits = limits_of(
        max_continuations,
        max_attempts,
        max_tool_rounds,
        retry_base_delay,
        retry_max_delay,
        pause_after_turns=pause_after_turns,
        pause_after_seconds=pause_after_seconds,
    )
    _serve(
        ServeOptions(
            db=db,
            database_url=database_url,
            host=host,
            port=port,
            model=model,
            provider=provider,
            behavior=behavior,
            context_window=context_window,
            base_url=base_url,
            token=token,
            header=tuple(header or ()),
            repo=repo,
            limits=limits,
            metrics=metrics,
            compaction=compaction,
            context_edits=context_edits,
            summary_request=summary_request,
        )
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeOptions:
    """What ``segue serve`` was told, as parsed (its provider not yet chosen, no key read)."""

    db: Path
    database_url: str | None
    host: str
    port: int
    model: str | None
    provider: str | None
    behavior: Behavior
    context_window: int | None
    base_url: str | None
    token: str | None
    header: tuple[str, ...]
    """``NAME:VALUE`` as given: read (a usage error for anything else) where the config is made."""
    repo: Path | None
    limits: dict[str, int | float]
    compaction: str
    context_edits: str | None
    """``--context-edits`` as given (JSON, or ``@FILE``): read where the config is made."""
    metrics: bool = False
    summary_request: str = "tool_less"


def _serve(asked: ServeOptions) -> None:
    """Check what can be checked before anything is announced, then serve until stopped."""
    try:
        from segue.errors import MissingExtraError, UnsafeBindError  # noqa: PLC0415
        from segue.server.run import build_app, run_app  # noqa: PLC0415
    except ImportError as error:  # the extra is not installed
        fail(f"segue serve needs the server extra: pip install 'segue[server]' ({error})", 2)

    config = _config(asked)
    try:
        application = build_app(config)
    except (UnsafeBindError, MissingExtraError) as error:
        fail(str(error), 2)
    except ImportError as missing:  # the provider's client is an extra
        chosen = config.provider
        fail(
            f"--provider {chosen} needs the {chosen} extra: pip install 'segue[{chosen}]' "
            f"({missing})",
            2,
        )
    _store_usable(asked.db, asked.database_url)
    _free(asked.host, asked.port)
    if config.api_key is None:
        say(console(), offline_line(config.provider, config.base_url))
    answered = (
        ("Claude" if config.provider == "anthropic" else f"{config.model} (OpenAI API)")
        if config.api_key
        else "the offline scripted model"
    )
    address = _address(asked.host, asked.port, asked.token)
    out = console()
    say(out, f"segue serve: {address} answered by {answered}; Ctrl-C stops it")
    if _is_wildcard(asked.host):  # listening on every interface: reached from others too
        elsewhere = _address(socket.gethostname(), asked.port, asked.token)
        say(out, f"  from another machine: {elsewhere}")
    run_app(application, host=asked.host, port=asked.port)


def _config(asked: ServeOptions) -> ServerConfig:
    """The server's configuration: the provider chosen, its key read from the environment (a
    usage error for an empty token or a provider that does not fit the model)."""
    from segue.server.run import ServerConfig  # noqa: PLC0415  # the server extra's, checked

    if asked.token is not None and not asked.token.strip():
        fail("the token is empty (--token or SEGUE_TOKEN): give one, or leave it out", 2)
    try:
        chosen = provider_for(asked.provider, asked.model)
        edits = options_of(  # checked as a conversation's, then the server's default
            {
                "model": asked.model or DEFAULT_MODELS[chosen],
                "behavior": Behavior.COMPACT_IN_PLACE,
                "compaction": asked.compaction,
                "context_edits": context_edits_of(asked.context_edits),
            }
        ).context_edits
    except CliError as error:
        fail(error.message, error.code)
    api_key = os.environ.get(KEY_VARIABLES[chosen], "").strip() or None
    if api_key is None and (asked.compaction == "provider" or edits):
        given = "--compaction provider" if asked.compaction == "provider" else "--context-edits"
        fail(f"{given} needs the provider: the offline model has none ({_NO_KEY_HINT[chosen]})", 2)
    return ServerConfig(
        db=asked.db,
        database_url=asked.database_url,
        host=asked.host,
        port=asked.port,
        provider=chosen,
        model=asked.model or DEFAULT_MODELS[chosen],
        behavior=asked.behavior,
        context_window=asked.context_window,
        api_key=api_key,
        base_url=asked.base_url,
        token=asked.token,
        headers=headers_of(list(asked.header)),
        repo=asked.repo,
        limits=asked.limits,
        metrics=asked.metrics,
        compaction="provider" if asked.compaction == "provider" else "segue",
        context_edits=tuple(edits),
        summary_request="reuse_prefix" if asked.summary_request == "reuse_prefix" else "tool_less",
    )
