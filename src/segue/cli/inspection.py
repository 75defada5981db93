"""``segue list``, ``show`` and ``status``: a store inspected, never written.

The file is opened in SQLite's read-only mode, so inspecting cannot add tables to some other
SQLite file or turn an empty file into a store; a conversation is named by its id or any prefix
that matches only it. ``--json`` prints the same views the REST API serves.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from segue.cli._app import DbOption, JsonOption, app, run
from segue.cli._output import (
    clip,
    console,
    existing_store,
    meter,
    percent,
    print_json,
    resolve,
    say,
    table,
)
from segue.executor.chains import lineage, usage_report
from segue.executor.inputs import failure_of
from segue.executor.store_port import StoredConversation, TransitionRecord
from segue.statemachine import ConversationState, Message
from segue.statemachine.checkpoint import SessionSnapshot
from segue.views import ConversationView, LinkView, MessageView, SnapshotView

IdArgument = Annotated[
    str, typer.Argument(help="Conversation id, or the start of one (see `segue list`).")
]
FullOption = Annotated[bool, typer.Option("--full", help="Whole texts, not one clipped line.")]


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


# --------------------------------------------------------------------------- list


async def _list(db: Path, as_json: bool) -> None:
    store = existing_store(db, read_only=True)
    try:
        conversations = (await store.list_conversations())[::-1]  # newest first
    finally:
        await store.close()
    if as_json:
        print_json([_view(c) for c in conversations])
        return
    rows = [
        (
            c.state.id,
            c.state.model,
            c.state.behavior.value,
            c.state.phase.kind,
            occupancy(c.state),
            c.state.parent_id,
            c.child_id,
        )
        for c in conversations
    ]
    columns = "id|model|behavior|phase|tokens / window|parent|child"
    console().print(table(f"conversations in {db}", columns, rows))


def _view(stored: StoredConversation) -> dict[str, Any]:
    return ConversationView.of(stored.state, stored).model_dump(mode="json")


@app.command("list")
def list_(db: DbOption = Path("segue.db"), as_json: JsonOption = False) -> None:
    """List the conversations in a store, newest first."""
    run(_list(db, as_json))


# --------------------------------------------------------------------------- show


async def _show(given: str, db: Path, full: bool, as_json: bool) -> None:
    store = existing_store(db, read_only=True)
    try:
        cid = await resolve(store, given)
        stored = await store.load(cid)
        messages, log = await store.messages(cid), await store.transitions(cid)
    finally:
        await store.close()
    if as_json:
        print_json(
            {
                "conversation": _view(stored),
                "messages": [MessageView.of(m).model_dump(mode="json") for m in messages],
                "transitions": [_record(r) for r in log],
            }
        )
        return
    state, out = stored.state, console()
    say(out, f"{cid}: {state.model}, {state.behavior.value}, {state.phase.kind}", "bold")
    family = f"parent {state.parent_id or '-'}; child {stored.child_id or '-'}"
    say(out, f"tokens {occupancy(state)}; {family}")
    rows = [(m.seq, *_cells(m.message, full)) for m in messages]
    out.print(table("messages", "seq|kind|s/g|text", rows))
    entries = [(r.seq, r.event_kind, *_moves(r)) for r in log]
    out.print(table("transitions", "seq|event|from -> to|tokens|reason|effects", entries))


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
    return phases, record.context_tokens, record.reason, ", ".join(record.effect_kinds)


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
    full: FullOption = False,
    as_json: JsonOption = False,
) -> None:
    """Show a conversation's messages and its transition log."""
    run(_show(conversation_id, db, full, as_json))


# --------------------------------------------------------------------------- status


async def _status(given: str, db: Path, full: bool, as_json: bool) -> None:
    store = existing_store(db, read_only=True)
    try:
        cid = await resolve(store, given)
        stored = await store.load(cid)
        snapshots = await store.snapshots(cid)
        chain = await lineage(store, cid)
        report = usage_report(await store.messages(cid))
    finally:
        await store.close()
    if as_json:
        print_json(
            {
                "conversation": _view(stored),
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
        f"usage: {report.requests} requests, {total.input_tokens:,} input and "
        f"{total.output_tokens:,} output tokens",
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
    phase: Any = state.phase
    if (failure := failure_of(state)) is not None:
        say(out, f"failed: {failure.error_kind.value}: {failure.message}", "bold red")
    elif phase.kind == "paused":
        say(out, f"paused: {phase.snapshot.reason or phase.snapshot.trigger}", "bold cyan")
    summary = getattr(phase, "summary", None)
    if isinstance(summary, str):
        say(out, f"summary: {summary if full else clip(summary, 200)}")
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
                when(s.created_at),
                f"{s.trigger}: {s.reason}" if s.reason else s.trigger,
                s.session,
                ran_for(s.session_seconds),
                f"{s.context_tokens or 0:,} / {s.context_window:,}",
            )
            for s in snapshots
        ]
        columns = "version|when|why|session|ran for|tokens / window"
        out.print(table("snapshots", columns, rows))
    else:
        say(out, "snapshots: none")


@app.command()
def status(
    conversation_id: IdArgument,
    db: DbOption = Path("segue.db"),
    full: FullOption = False,
    as_json: JsonOption = False,
) -> None:
    """A conversation at a glance: phase, meter, snapshots, its child and its chain."""
    run(_status(conversation_id, db, full, as_json))


__all__ = ["occupancy", "print_status", "when"]
