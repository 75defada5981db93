"""segue's command line: the offline demo, a chat with real Claude, and a store inspector.

Every command is a thin shell over the public ``Runtime``, so what the demo shows is what an
embedding application gets. Expected failures (no API key, unknown model, locked store, read-only
conversation) are one line on stderr with exit code 2 (usage or setup) or 1 (runtime); a
traceback means a bug. Output goes through ``rich`` but reads the same without a terminal (CI
logs): the meter is a line of text per turn, not a live widget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import sys
import tempfile
from collections.abc import Coroutine, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import structlog
import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from segue import __version__
from segue import effects as fx
from segue.executor.models.scripted import ScriptedModel
from segue.executor.ports import ConversationNotFoundError, LlmModel, SegueError, TransitionRecord
from segue.executor.runtime import (
    ConversationExhaustedError,
    MessageRejectedError,
    Runtime,
    failure_of,
)
from segue.executor.stores.sqlite import SqliteStore, StoreLockedError
from segue.executor.tools import ToolRegistry
from segue.statemachine import ContextExhaustionBehavior as Behavior
from segue.statemachine import ConversationState, Message
from segue.statemachine.spec import load_rows, mermaid

if TYPE_CHECKING:
    import anthropic

T = TypeVar("T")
DEMO_PACE = 0.05
"""Seconds between demo turns, so the meter visibly moves; ``--fast`` skips it."""
DEMO_CHUNK_PACE = 0.002
"""Seconds between the scripted model's text deltas, so the reply visibly streams."""
PREVIEW_CHARS = 70
"""How much of each streamed reply the demo shows."""
NEW_HINT = "type /new to continue in a new conversation seeded with its summary"
NO_KEY = "ANTHROPIC_API_KEY is not set: export your Anthropic API key, or try `segue demo`"

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # a bug report must never print an API key
)
DbOption = Annotated[
    Path, typer.Option("--db", envvar="SEGUE_DB", help="SQLite store file.", show_default=True)
]
BehaviorOption = Annotated[
    Behavior, typer.Option(case_sensitive=False, help="What happens when the window fills up.")
]


class CliError(Exception):
    """An expected failure: printed as one line, exit ``code`` (2 setup/usage, 1 runtime)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def _exit(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; expected failures become one line and an exit code."""
    try:
        return asyncio.run(coroutine)
    except CliError as error:
        _exit(error.message, error.code)
    except ConversationNotFoundError as error:
        _exit(str(error), 2)
    except StoreLockedError as error:
        _exit(f"{error} (is another segue process using it?)", 1)
    except sqlite3.OperationalError as error:  # raised while opening, before the store wraps it
        if "locked" in str(error) or "busy" in str(error):
            _exit("database is locked: another process holds its write lock (segue?)", 1)
        _exit(f"database error: {error}", 1)
    except sqlite3.DatabaseError as error:
        _exit(f"cannot use the database: {error}", 2)
    except SegueError as error:
        _exit(str(error), 1)
    except KeyboardInterrupt:
        _exit("interrupted", 130)


@contextlib.contextmanager
def _logging(verbosity: int) -> Iterator[None]:
    """With ``-v`` segue's events go to stderr as key=value lines (``-vv``: debug too); without,
    the CLI stays as quiet as the library. The ``segue`` logger is put back as it was
    afterwards, so a program (or test session) calling the CLI keeps its own setup."""
    if verbosity <= 0:
        yield
        return
    logger = logging.getLogger("segue")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=structlog.dev.ConsoleRenderer(colors=False),
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.ExtraAdder(),
                _without_duplicate,
            ],
        )
    )
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbosity > 1 else logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def _without_duplicate(_logger: Any, _name: str, event: Any) -> Any:
    """``segue_event`` holds the fields a second time (for handlers that want one dict)."""
    event.pop("segue_event", None)
    return event


def _version(value: bool) -> None:
    if value:
        typer.echo(f"segue {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    ctx: typer.Context,
    verbose: Annotated[
        int, typer.Option("--verbose", "-v", count=True, help="Log to stderr (-vv: debug).")
    ] = 0,
    version: Annotated[  # handled by its callback
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Carry LLM conversations across the context-window limit."""
    ctx.with_resource(_logging(verbose))


# --------------------------------------------------------------------------- output


def _console() -> Console:
    """Stdout; a pipe or CI log gets 220 columns so that ids and paths stay whole."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 220
    return console


def _say(console: Console, text: str, style: str = "") -> None:
    """One unwrapped line without markup: messages quote ids, paths and model output."""
    console.print(Text(text, style=style), soft_wrap=True)


def _meter(console: Console, label: str, state: ConversationState) -> None:
    """Tokens / window, percent, phase; ``~`` marks an estimate (no usage reported yet)."""
    window, config, measured = state.context_window, state.config, state.context_tokens
    tokens = measured if measured is not None else state.projected_tokens
    style = "green" if tokens < config.warning_tokens else "yellow"
    style = "red" if tokens >= config.continuation_tokens else style
    full, empty = ("█", "░") if console.encoding.lower().startswith("utf") else ("#", ".")
    filled = min(30, round(30 * tokens / window))
    line = Text(f"{label:<8} ").append(full * filled, style).append(empty * (30 - filled), "dim")
    line.append(f" {'' if measured is not None else '~'}{tokens:>6,} / {window:,}  ")
    line.append(f"{tokens / window:6.1%}", style).append(f"  {state.phase.kind}")
    console.print(line, soft_wrap=True)


def _narration(effect: fx.Effect) -> tuple[str, str] | None:
    """What a person watching should hear before an effect runs, and in which style."""
    match effect:
        case fx.NotifyContextWarning(context_tokens=used, context_window=window):
            text = f"WARNING: context {used / window:.0%} full ({used:,} / {window:,} tokens)"
            return f"{text}, past the warning threshold", "bold yellow"
        case fx.RequestContinuation():
            return "threshold reached: asking for a continuation summary", "bold red"
        case fx.NotifyContextExhausted():
            return "context exhausted: the conversation is now read-only", "bold red"
        case fx.RequestCheckpoint(purpose=purpose):
            return f"threshold reached: asking for a checkpoint ({purpose})", "red"
        case fx.SaveSnapshot(snapshot=snapshot):
            return f"paused: snapshot v{snapshot.version} saved ({snapshot.trigger})", "bold cyan"
        case fx.StartSession(session=session, reason=reason):
            return f"new session {session} ({reason})", "bold cyan"
        case fx.ArchiveTranscript(generation=generation):
            return f"archiving the transcript (generation {generation})", "cyan"
        case fx.RequestCompaction():
            return "threshold reached: compacting older messages", "red"
        case fx.StartGeneration(generation=generation):
            return f"new generation {generation} starts from a summary", "bold cyan"
        case fx.ScheduleRetry(delay_seconds=delay, attempt=attempt):
            return f"retrying in {delay:.1f}s (attempt {attempt})", ""
        case fx.NotifyFailed(error_kind=kind, message=message):
            return f"failed: {kind.value}: {message}", "bold red"
    return None


def _narrate(runtime: Runtime, console: Console) -> None:
    def listener(cid: str, effect: fx.Effect) -> None:
        if (said := _narration(effect)) is not None:
            _say(console, f"  {said[0]}", said[1])

    runtime.subscribe(listener)


def _clip(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


async def _last(runtime: Runtime, cid: str, kind: str = "assistant") -> str:
    """The text of the conversation's latest message of ``kind``."""
    messages = await runtime.messages(cid)
    return next((m.text for m in reversed(messages) if m.kind == kind and m.text), "")


# --------------------------------------------------------------------------- demo


async def _demo(db: Path, behavior: Behavior, fast: bool, console: Console) -> None:
    tools = ToolRegistry()

    @tools.tool(description="Look a topic up in the demo's notes.")
    async def lookup(tool_input: dict[str, Any]) -> str:
        return f"Notes on {tool_input.get('query')}: " + "a deterministic fact. " * 40

    model = ScriptedModel(
        window=24_000, reply_chars=3_000, tool_every=3, chunk_delay=0 if fast else DEMO_CHUNK_PACE
    )
    archives = db.parent / f"{db.stem}-archives"
    async with Runtime(store=SqliteStore(db), llm=model, tools=tools, archive_dir=archives) as rt:
        _narrate(rt, console)
        state = await rt.create_conversation(model="segue-demo", behavior=behavior)
        cid, config = state.id, state.config
        _say(console, f"segue demo: {behavior.name} with the offline scripted model", "bold")
        _say(
            console,
            f"conversation {cid}: window {config.context_window:,} tokens, warning at "
            f"{config.warning_tokens:,} ({config.warning_threshold:.0%}), threshold at "
            f"{config.continuation_tokens:,} ({config.continuation_threshold:.0%})",
        )
        start = (state.session, state.generation)
        for turn in range(1, 100):
            moved = (state.session, state.generation) != start
            state = await _streamed(rt, cid, f"Tell me more about topic {turn}.", console)
            if not moved and (state.session, state.generation) != start:
                await _crossing(rt, console, state)  # one more turn shows that it goes on
            _meter(console, f"turn {turn}", state)
            if state.phase.kind in ("context_exhausted", "failed", "paused") or moved:
                break
            if not fast:
                await asyncio.sleep(DEMO_PACE)
        await _ending(rt, console, state, start, archives)
    _say(console, f"\ndatabase: {db}", "bold")
    _say(console, f"inspect it: segue list --db {db} ; segue show {cid} --db {db}")


async def _streamed(rt: Runtime, cid: str, text: str, console: Console) -> ConversationState:
    """One turn through ``Runtime.stream``: each reply's first words as the model writes them,
    and the tools as they run."""
    response, shown = None, 0
    async for update in rt.stream(cid, text):
        if update.kind == "text":
            if update.response != response:
                lead = "\n  assistant: " if response is not None else "  assistant: "
                console.print(lead, end="")
                response, shown = update.response, 0
            piece = update.text.replace("\n", " ")[: max(0, PREVIEW_CHARS - shown)]
            console.print(Text(piece), end="")
            shown += len(piece)
            if piece and shown >= PREVIEW_CHARS:
                console.print("...", end="")
        elif update.kind == "tool_started":
            console.print(Text(f"\n  tool: {update.name}({_clip(str(update.input), 40)})"), end="")
            response = response or -1
        elif update.kind == "done":
            if response is not None:
                console.print()
            return update.state
    raise CliError("the turn's updates ended without done", 1)


async def _crossing(runtime: Runtime, console: Console, state: ConversationState) -> None:
    """The figure that crossed the threshold, from the transition log: a restart or compaction
    completes within the turn, so the meter itself only shows the emptied context."""
    log = await runtime.store.transitions(state.id)
    record = next(r for r in reversed(log) if r.to_phase in ("awaiting_checkpoint", "compacting"))
    tokens, window = record.context_tokens or 0, state.context_window
    moved = f"{record.from_phase} -> {record.to_phase} ({record.reason})"
    _say(console, f"  crossed at {tokens:,} / {window:,} ({tokens / window:.1%}): {moved}", "red")


async def _ending(
    rt: Runtime, console: Console, state: ConversationState, start: tuple[int, int], archives: Path
) -> None:
    """Show what the behaviour did at the limit; a demo that did not get there fails."""
    cid, behavior, failure = state.id, state.behavior, failure_of(state)
    exhausted = state.phase.kind == "context_exhausted"
    if behavior is Behavior.THRESHOLD_BASED_CONTINUATION and exhausted:
        summary = await _last(rt, cid, "continuation")
        console.print(Panel(Text(summary), title="continuation summary", expand=False))
        try:
            await rt.send(cid, "One more question?")
        except ConversationExhaustedError as error:
            _say(console, f"read-only: send() refused: {error}", "bold")
        else:
            raise CliError("an exhausted conversation accepted a message", 1)
        child = await rt.start_new_from(cid)
        _say(console, f"child conversation {child.id} (parent {child.parent_id}), seeded", "bold")
        _meter(console, "child", await rt.send(child.id, "Let us carry on where we left off."))
        _say(console, f"  assistant: {_clip(await _last(rt, child.id), 90)}")
    elif behavior is Behavior.INTENTIONALLY_UNHANDLED and failure is not None:
        _say(console, f"typed failure: Failed(error_kind={failure[0].name}): {failure[1]}", "bold")
        try:
            await rt.send(cid, "One more question?")
        except MessageRejectedError as error:
            _say(console, f"send() refused: {error}")
        else:
            raise CliError("a failed conversation accepted a message", 1)
        _say(console, "a parent agent would now spawn a replacement with a fresh window")
    elif behavior is Behavior.CHECKPOINT_PAUSE and state.phase.kind == "paused":
        snapshot = (await rt.store.snapshots(cid))[-1]
        console.print(Panel(Text(snapshot.checkpoint), title="checkpoint", expand=False))
        _say(
            console,
            f"paused at the limit: snapshot v{snapshot.version} (trigger {snapshot.trigger}, "
            f"{snapshot.llm_calls} LLM calls, {snapshot.tool_calls} tool calls)",
            "bold",
        )
        resumed = await rt.resume(cid)
        _say(console, f"an orchestrator resumes it: session {resumed.session}", "bold")
        _meter(console, "resumed", resumed)
    elif failure is None and (state.session, state.generation) != start:
        restart = behavior is Behavior.CHECKPOINT_RESTART
        kind = "checkpoint" if restart else "summary"
        console.print(Panel(Text(await _last(rt, cid, kind)), title=kind, expand=False))
        moved = (
            f"session {start[0]} -> {state.session}"
            if restart
            else (f"generation {start[1]} -> {state.generation} (archive in {archives})")
        )
        _say(console, f"{moved}; continuations: {state.continuations}; still going", "bold")
    else:
        shown = f"{failure[0].value}: {failure[1]}" if failure else state.phase.kind
        raise CliError(f"the demo ended unexpectedly ({shown})", 1)


@app.command()
def demo(
    db: Annotated[
        Path | None, typer.Option(help="SQLite file to write (default: a new one in a temp dir).")
    ] = None,
    behavior: BehaviorOption = Behavior.THRESHOLD_BASED_CONTINUATION,
    fast: Annotated[bool, typer.Option(help="No pause between turns.")] = False,
) -> None:
    """Offline demo: a long conversation against a scripted model, through the limit."""
    path = db if db is not None else Path(tempfile.mkdtemp(prefix="segue-demo-")) / "segue.db"
    _run(_demo(path, behavior, fast, _console()))


# --------------------------------------------------------------------------- chat


async def _anthropic(
    key: str, base_url: str | None, model: str
) -> tuple[anthropic.AsyncAnthropic, LlmModel]:
    """A client and its adapter, once the API has confirmed the model (else exit 2)."""
    import anthropic  # noqa: PLC0415  # ~2 s to import: only ``chat`` pays for it

    from segue.executor.models.anthropic import AnthropicModel, call_error  # noqa: PLC0415

    client = anthropic.AsyncAnthropic(api_key=key, base_url=base_url)
    try:
        await client.models.retrieve(model)
    except anthropic.APIStatusError as exc:
        error = call_error(exc, model=model, secrets=(key,))
        if error.fatal:  # unknown model, bad key: no message can succeed
            await client.close()
            raise CliError(error.message, 2) from exc
    except anthropic.APIError:
        pass  # unreachable for now: the first message says so, after the runtime's retries
    return client, AnthropicModel(client=client)


async def _chat(
    *, key: str, model: str, behavior: Behavior, base_url: str | None, db: Path, resume: str | None
) -> int:
    async with contextlib.AsyncExitStack() as stack:
        store = SqliteStore(db)
        stack.push_async_callback(store.close)  # also when the setup below fails
        state = (await store.load(resume)).state if resume else None
        model = state.model if state else model
        client, llm = await _anthropic(key, base_url, model)
        stack.push_async_callback(client.close)
        runtime = await stack.enter_async_context(Runtime(store=store, llm=llm))
        if state is None:
            state = await runtime.create_conversation(model=model, behavior=behavior)
        return await _converse(runtime, state, db)


async def _converse(runtime: Runtime, state: ConversationState, db: Path) -> int:
    """The read-send-print loop: 1 if the last message was refused, else 0."""
    console = _console()
    _narrate(runtime, console)
    cid, refused = state.id, False
    _say(console, f"conversation {cid} ({state.model}, {state.behavior.name}); db {db}")
    _say(console, "type a message; /new continues an exhausted conversation; /quit ends")
    _meter(console, "context", state)
    while (line := await asyncio.to_thread(_read_line, console)) is not None:
        text = line.strip()
        if text in ("/quit", "/exit"):
            break
        if text == "/new":
            state = await runtime.start_new_from(cid)
            cid, refused = state.id, False
            _say(console, f"continuing in conversation {cid} (parent {state.parent_id})")
        elif text:
            try:
                state = await runtime.send(cid, text)
            except (ConversationExhaustedError, MessageRejectedError) as error:
                exhausted = isinstance(error, ConversationExhaustedError)
                hint = f" Hint: {NEW_HINT}." if exhausted else ""
                typer.echo(f"error: {error}{hint}", err=True)
                refused = True
                continue
            if (failure := failure_of(state)) is not None:
                raise CliError(f"{failure[1]} ({failure[0].value})", 1)
            refused = False
            console.print(Text(await _last(runtime, cid)))
            _meter(console, "context", state)
            if state.phase.kind == "context_exhausted":
                _say(console, f"this conversation is read-only now: {NEW_HINT}", "bold")
    return 1 if refused else 0


def _read_line(console: Console) -> str | None:
    if sys.stdin.isatty():
        console.print("you> ", end="")
    return sys.stdin.readline() or None


@app.command()
def chat(
    model: Annotated[str, typer.Option(help="Claude model id.")] = "claude-sonnet-4-6",
    behavior: BehaviorOption = Behavior.THRESHOLD_BASED_CONTINUATION,
    base_url: Annotated[
        str | None,
        typer.Option(help="API base URL (default: $ANTHROPIC_BASE_URL or the real API)."),
    ] = None,
    db: DbOption = Path("segue.db"),
    conversation: Annotated[
        str | None, typer.Option(help="Continue this stored conversation instead.")
    ] = None,
) -> None:
    """Chat with real Claude (ANTHROPIC_API_KEY), one stdin line per message."""
    key = os.environ.get("ANTHROPIC_API_KEY", "").strip()
    if not key:
        _exit(NO_KEY, 2)
    chatting = _chat(
        key=key, model=model, behavior=behavior, base_url=base_url, db=db, resume=conversation
    )
    raise typer.Exit(_run(chatting))


# --------------------------------------------------------------------------- inspection


def _existing(db: Path) -> SqliteStore:
    """A store on ``db`` only if it exists: inspecting must not create an empty database."""
    if not db.is_file():
        raise CliError(f"no database at {db} (set --db or $SEGUE_DB; `segue demo` makes one)", 2)
    return SqliteStore(db)


def _occupancy(state: ConversationState) -> str:
    tokens, window = state.context_tokens, state.context_window
    if tokens is None:
        return f"- / {window:,}"
    return f"{tokens:,} / {window:,} ({tokens / window:.0%})"


def _status(state: ConversationState) -> tuple[str, str, str, str]:
    return state.model, state.behavior.value, state.phase.kind, _occupancy(state)


def _table(title: str, columns: str, rows: Iterable[Iterable[object]]) -> Table:
    """A table of plain text (never markup: cells quote model output); ids never wrap."""
    table = Table(title=Text(title))
    for column in columns.split("|"):
        table.add_column(column, overflow="fold", no_wrap=column in ("id", "parent", "child"))
    for row in rows:
        table.add_row(*(Text("-" if cell is None else str(cell)) for cell in row))
    return table


async def _list(db: Path) -> None:
    store = _existing(db)
    try:
        conversations = await store.list_conversations()
    finally:
        await store.close()
    rows = [(c.state.id, *_status(c.state), c.state.parent_id, c.child_id) for c in conversations]
    columns = "id|model|behavior|phase|tokens / window|parent|child"
    _console().print(_table(f"conversations in {db}", columns, rows))


@app.command("list")
def list_(db: DbOption = Path("segue.db")) -> None:
    """List the conversations in a store."""
    _run(_list(db))


async def _show(cid: str, db: Path) -> None:
    store = _existing(db)
    try:
        stored = await store.load(cid)
        messages, log = await store.messages(cid), await store.transitions(cid)
    finally:
        await store.close()
    state, console = stored.state, _console()
    _say(console, f"{cid}: {state.model}, {state.behavior.value}, {state.phase.kind}", "bold")
    family = f"parent {state.parent_id or '-'}; child {stored.child_id or '-'}"
    _say(console, f"tokens {_occupancy(state)}; {family}")
    rows = [(m.seq, *_cells(m.message)) for m in messages]
    console.print(_table("messages", "seq|kind|s/g|text", rows))
    entries = [(r.seq, r.event_kind, *_moves(r)) for r in log]
    console.print(_table("transitions", "seq|event|from -> to|tokens|reason|effects", entries))


def _cells(message: Message) -> tuple[str, str, str]:
    calls = (f" -> {call.name}({_clip(str(call.input), 30)})" for call in message.tool_calls)
    where = f"{message.session}/{message.generation}"
    return message.kind, where, _clip(message.text, 70) + "".join(calls)


def _moves(record: TransitionRecord) -> tuple[object, ...]:
    phases = f"{record.from_phase} -> {record.to_phase}"
    return phases, record.context_tokens, record.reason, ", ".join(record.effect_kinds)


@app.command()
def show(
    conversation_id: Annotated[str, typer.Argument(help="Conversation id (see `segue list`).")],
    db: DbOption = Path("segue.db"),
) -> None:
    """Show a conversation's messages and its transition log."""
    _run(_show(conversation_id, db))


@app.command()
def diagram() -> None:
    """Print the state diagram (Mermaid), generated from the transition table."""
    typer.echo(mermaid(load_rows()).rstrip("\n"))


def main() -> None:
    """The ``segue`` console script."""
    app()
