"""``segue list``, ``show`` and ``status``: a store inspected, never written.

A SQLite file is opened in SQLite's read-only mode, so inspecting cannot add tables to some
other SQLite file or turn an empty file into a store; a PostgreSQL database (``--database-url``)
must hold segue's tables already. A conversation is named by its id or any prefix that matches
only it. Tables fit the terminal (``_tables``); ``--json`` prints the same views the REST API
serves (``segue.views``, ``docs/views.md``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from segue.cli._app import CliError, DbOption, JsonOption, app, run, whole_number
from segue.cli._labels import MetadataOption, labels, metadata_of
from segue.cli._output import (
    FALLBACK_WORDS,
    clip,
    console,
    meter,
    percent,
    print_json,
    printable,
    say,
    window_words,
)
from segue.cli._stores import DatabaseUrlOption, StoreAt, existing_store, resolve
from segue.cli._tables import Column, fitted
from segue.executor.chains import lineage, usage_report
from segue.executor.errors import InvalidCursorError
from segue.executor.inputs import failure_of
from segue.executor.store_port import LogReader, StoredConversation, TransitionRecord
from segue.statemachine import ConversationState, Message
from segue.statemachine.checkpoint import SessionSnapshot
from segue.views import ConversationView, LinkView, MessageView, SnapshotView, title_of

IdArgument = Annotated[
    str, typer.Argument(help="Conversation id, or the start of one (see `segue list`).")
]
FullOption = Annotated[bool, typer.Option("--full", help="Whole texts, not one clipped line.")]
PAGE = 50
"""Conversations ``segue list`` shows at once unless told (the API's page too)."""
MAX_PAGE = 1_000
SHORT_ID = 8
"""Characters of an id a narrow table shows (any unique start names a conversation)."""


def occupancy(state: ConversationState) -> str:
    """``tokens / window (percent)``, or ``-`` before the model has reported any usage."""
    tokens, window = state.context_tokens, state.context_window
    if tokens is None:
        return f"- / {window:,}"
    return f"{tokens:,} / {window:,} ({percent(tokens, window):.0f}%)"


def when(timestamp: float | None) -> str:
    """A Unix time as a UTC timestamp a person reads (``-`` if unknown)."""
    if not timestamp:
        return "-"
    moment = dt.datetime.fromtimestamp(timestamp, tz=dt.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def plural(count: int, noun: str) -> str:
    """``1 request``, ``2 requests``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


async def _titled(store: LogReader, stored: StoredConversation) -> dict[str, Any]:
    """The conversation's view as the API shows it, its title the metadata's or read from its
    messages."""
    titled = stored.metadata.get("title", "").strip()
    title = None if titled else title_of(await store.messages(stored.state.id))
    return ConversationView.of(stored.state, stored, title=title).model_dump(mode="json")


# --------------------------------------------------------------------------- list


LIST_COLUMNS = (
    Column("id", need=10),
    Column("title", need=9, wraps=True),
    Column("phase", need=8),
    Column("used", need=7),
    Column("created (UTC)", need=6),
    Column("model", need=4),
    Column("behavior", need=3),
    Column("parent", need=2),
    Column("child", need=1),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Listing:
    """Which page of which conversations ``segue list`` was asked for."""

    limit: int
    metadata: list[str] | None
    cursor: str | None


async def _list(where: StoreAt, asked: Listing, as_json: bool) -> None:
    labelled = metadata_of(asked.metadata)
    store = existing_store(where, read_only=True)
    try:
        page = await store.list_page(metadata=labelled, limit=asked.limit, cursor=asked.cursor)
        conversations = page.conversations  # newest first
        views = [await _titled(store, c) for c in conversations]
    except InvalidCursorError:
        msg = f"--cursor {printable(asked.cursor or '')!r} is not one `segue list` printed here"
        raise CliError(msg, 2) from None
    finally:
        await store.close()
    if as_json:
        print_json(views)
        if page.next_cursor is not None:  # stdout stays the JSON list
            typer.echo(f"next page: --cursor {page.next_cursor}", err=True)
        return
    out = console()
    whole_ids = out.width >= 150
    rows = [
        (
            _id(view["id"], whole_ids),
            view["title"] or "(no message yet)",
            view["phase"],
            _used(c.state),
            when(c.created_at).removesuffix(" UTC")[:16],
            view["model"],
            view["behavior"],
            _id(view["parent_id"], whole_ids),
            _id(view["child_id"], whole_ids),
        )
        for c, view in zip(conversations, views, strict=True)
    ]
    among = f" labelled {labels(labelled)}" if labelled else ""
    if not rows:
        past = " past that cursor" if asked.cursor else ""
        say(out, f"no conversation{among} in {where}{past}")
        return
    out.print(fitted(f"conversations in {where}{among}", LIST_COLUMNS, rows, out.width))
    if page.next_cursor is not None:
        say(out, f"more: segue list --cursor {page.next_cursor} (with the same options)")


def _id(cid: str | None, whole: bool) -> str | None:
    return cid if cid is None or whole else cid[:SHORT_ID]


def _used(state: ConversationState) -> str:
    """How full, in few characters: ``88% of 3,000``, or ``- of 3,000`` before any usage."""
    tokens, window = state.context_tokens, state.context_window
    shown = "-" if tokens is None else f"{percent(tokens, window):.0f}%"
    return f"{shown} of {window:,}"


@app.command("list")
def list_(
    limit: Annotated[
        int,
        typer.Option(
            parser=whole_number(1, MAX_PAGE), metavar="N", help="Conversations on a page."
        ),
    ] = PAGE,
    metadata: MetadataOption = None,
    cursor: Annotated[
        str | None,
        typer.Option(help="Where the next page starts (printed under the previous one)."),
    ] = None,
    db: DbOption = Path("segue.db"),
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the conversations in a store, newest first, a page at a time."""
    asked = Listing(limit=limit, metadata=metadata, cursor=cursor)
    run(_list(StoreAt(db, database_url), asked, as_json))


# --------------------------------------------------------------------------- show


MESSAGE_COLUMNS = (
    Column("seq", need=9),
    Column("kind", need=8),
    Column("s/g", need=4),
    Column("text", need=9, wraps=True),
)
TRANSITION_COLUMNS = (
    Column("seq", need=9),
    Column("event", need=8),
    Column("from -> to", need=7),
    Column("tokens", need=6),
    Column("effects", need=4, wraps=True),
    Column("reason", need=3, wraps=True),
)


async def _show(given: str, where: StoreAt, full: bool, as_json: bool) -> None:
    store = existing_store(where, read_only=True)
    try:
        cid = await resolve(store, given)
        stored = await store.load(cid)
        messages, log = await store.messages(cid), await store.transitions(cid)
    finally:
        await store.close()
    view = ConversationView.of(stored.state, stored, title=title_of(messages))
    if as_json:
        print_json(
            {
                "conversation": view.model_dump(mode="json"),
                "messages": [MessageView.of(m).model_dump(mode="json") for m in messages],
                "transitions": [_record(r) for r in log],
            }
        )
        return
    state, out = stored.state, console()
    say(out, f"{cid}: {view.title or '(no message yet)'}", "bold")
    say(out, f"{state.model}, {state.behavior.value}, {state.phase.kind}")
    family = f"parent {state.parent_id or '-'}; child {stored.child_id or '-'}"
    say(out, f"tokens {occupancy(state)}; {family}")
    rows = [(m.seq, *_cells(m.message, full)) for m in messages]
    out.print(fitted("messages", MESSAGE_COLUMNS, rows, out.width))
    entries = [(r.seq, r.event_kind, *_moves(r)) for r in log]
    out.print(fitted("transitions", TRANSITION_COLUMNS, entries, out.width))


def _record(record: TransitionRecord) -> dict[str, Any]:
    return {
        "seq": record.seq,
        "event": record.event_kind,
        "from": record.from_phase,
        "to": record.to_phase,
        "context_tokens": record.context_tokens,
        "reason": record.reason,
        "effects": list(record.effect_kinds),
        "at": record.at,
    }


def _cells(message: Message, full: bool) -> tuple[str, str, str]:
    limit = 30 if not full else None
    calls = (
        f" -> {call.name}({str(call.input) if limit is None else clip(str(call.input), limit)})"
        for call in message.tool_calls
    )
    where = f"{message.session}/{message.generation}"
    text = message.text if full else clip(message.text, 70)
    return message.kind, where, text + "".join(calls)


def _moves(record: TransitionRecord) -> tuple[object, ...]:
    phases = f"{record.from_phase} -> {record.to_phase}"
    return phases, record.context_tokens, ", ".join(record.effect_kinds), record.reason


def ran_for(seconds: float | None) -> str:
    """How long a session ran, as a person reads it (``4 s``, ``2 min 5 s``, ``1 h 3 min``)."""
    if seconds is None:
        return "unknown"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes = whole // 60
    if minutes < 60:
        return f"{minutes} min {whole % 60} s"
    return f"{minutes // 60} h {minutes % 60} min"


@app.command()
def show(
    conversation_id: IdArgument,
    db: DbOption = Path("segue.db"),
    database_url: DatabaseUrlOption = None,
    full: FullOption = False,
    as_json: JsonOption = False,
) -> None:
    """Show a conversation's messages and its transition log."""
    run(_show(conversation_id, StoreAt(db, database_url), full, as_json))


# --------------------------------------------------------------------------- status


async def _status(given: str, where: StoreAt, full: bool, as_json: bool) -> None:
    store = existing_store(where, read_only=True)
    try:
        cid = await resolve(store, given)
        stored = await store.load(cid)
        snapshots = await store.snapshots(cid)
        chain = await lineage(store, cid)
        messages = await store.messages(cid)
    finally:
        await store.close()
    report = usage_report(messages)
    if as_json:
        view = ConversationView.of(stored.state, stored, title=title_of(messages))
        print_json(
            {
                "conversation": view.model_dump(mode="json"),
                "snapshots": [SnapshotView.of(s).model_dump(mode="json") for s in snapshots],
                "lineage": [LinkView.of(link).model_dump(mode="json") for link in chain],
                "usage": {
                    "requests": report.requests,
                    "input_tokens": report.total.input_tokens,
                    "output_tokens": report.total.output_tokens,
                },
            }
        )
        return
    out = console()
    print_status(out, stored, snapshots, [(link.id, link.label) for link in chain], full=full)
    total = report.total
    say(
        out,
        f"usage: {plural(report.requests, 'request')}, {total.input_tokens:,} input and "
        f"{total.output_tokens:,} output tokens",
    )


SNAPSHOT_COLUMNS = (
    Column("version", need=9),
    Column("why", need=8, wraps=True),
    Column("tokens / window", need=7),
    Column("when (UTC)", need=6),
    Column("session", need=5),
    Column("ran for", need=4),
)


def print_status(
    out: Console,
    stored: StoredConversation,
    snapshots: list[SessionSnapshot],
    chain: list[tuple[str, str]],
    *,
    full: bool = False,
) -> None:
    """Phase, meter, family and snapshots of a conversation (also ``/status`` in chat)."""
    state = stored.state
    say(out, f"{state.id}: {state.model}, {state.behavior.value}", "bold")
    meter(out, "context", state)
    say(out, window_words(state.context_window, state.config.window_source))
    if state.compaction_fallback:
        say(out, FALLBACK_WORDS, "yellow")
    phase: Any = state.phase
    if (failure := failure_of(state)) is not None:
        say(out, f"failed: {failure.error_kind.value}: {failure.message}", "bold red")
    elif phase.kind == "paused":
        say(out, f"paused: {phase.snapshot.reason or phase.snapshot.trigger}", "bold cyan")
    summary = getattr(phase, "summary", None)
    if isinstance(summary, str):
        say(out, f"summary: {summary if full else clip(summary, 200)}")
    bound = state.config.max_continuations
    say(out, f"continuations: {state.continuations} of at most {bound}; session {state.session}")
    say(out, f"parent {state.parent_id or '-'}; child {stored.child_id or '-'}")
    if len(chain) > 1:
        links = " -> ".join(
            f"{label} {cid[:8]}" + ("*" if cid == state.id else "") for cid, label in chain
        )
        say(out, f"chain: {links}")
    if snapshots:
        rows = [
            (
                s.version,
                f"{s.trigger}: {s.reason}" if s.reason else s.trigger,
                f"{s.context_tokens or 0:,} / {s.context_window:,}",
                when(s.created_at).removesuffix(" UTC"),
                s.session,
                ran_for(s.session_seconds),
            )
            for s in snapshots
        ]
        out.print(fitted("snapshots", SNAPSHOT_COLUMNS, rows, out.width))
    else:
        say(out, "snapshots: none")


@app.command()
def status(
    conversation_id: IdArgument,
    db: DbOption = Path("segue.db"),
    database_url: DatabaseUrlOption = None,
    full: FullOption = False,
    as_json: JsonOption = False,
) -> None:
    """A conversation at a glance: phase, meter, continuations, snapshots, its child and its
    chain."""
    run(_status(conversation_id, StoreAt(db, database_url), full, as_json))


__all__ = ["occupancy", "plural", "print_status", "when"]
