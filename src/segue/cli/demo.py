"""``segue demo``: a long conversation against the offline scripted model, through the limit,
told as it happens (the meter per turn, each reply streaming, what the behaviour does there).

Without ``--db`` the store lives in a temporary directory that is removed at the end: a demo
leaves nothing behind unless asked to keep it.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from segue.cli._app import BehaviorOption, CliError, app, run
from segue.cli._output import clip, console, entry, last_text, meter, narrate, printable, say
from segue.executor.errors import ConversationExhaustedError, MessageRejectedError
from segue.executor.inputs import failure_of
from segue.executor.models.scripted import ScriptedModel
from segue.executor.runtime import Runtime
from segue.executor.stores.sqlite import SqliteStore
from segue.executor.tools import ToolRegistry
from segue.statemachine import WAITING_PHASES, ConversationState
from segue.statemachine import ContextExhaustionBehavior as Behavior

DEMO_MODEL = "segue-demo"
"""The model name demo conversations carry: ``pause``/``resume`` answer them offline too."""
DEMO_PACE = 0.05
"""Seconds between demo turns, so the meter visibly moves; ``--fast`` skips it."""
DEMO_CHUNK_PACE = 0.002
"""Seconds between the scripted model's text deltas, so the reply visibly streams."""


def demo_model(chunk_delay: float = 0.0) -> ScriptedModel:
    """The offline model of the demo (a 24,000-token window: the limit comes in a few turns)."""
    return ScriptedModel(window=24_000, reply_chars=3_000, tool_every=3, chunk_delay=chunk_delay)


def demo_tools() -> ToolRegistry:
    """One tool the scripted model calls every few turns, with a long answer."""
    tools = ToolRegistry()

    @tools.tool(description="Look a topic up in the demo's notes.")
    async def lookup(tool_input: dict[str, Any]) -> str:
        return f"Notes on {tool_input.get('query')}: " + "a deterministic fact. " * 40

    return tools


class _Line:
    """Whether a reply's line is still open on the console, so that anything said meanwhile
    (a warning the turn raised) starts on a line of its own."""

    def __init__(self, out: Console) -> None:
        self.out = out
        self.open = False

    def start(self, lead: str) -> None:
        self.end()
        self.out.print(Text(printable(lead)), end="")
        self.open = True

    def end(self) -> None:
        if self.open:
            self.out.print()
            self.open = False


async def _demo(db: Path, behavior: Behavior, fast: bool, out: Console) -> str:
    model = demo_model(0 if fast else DEMO_CHUNK_PACE)
    archives = db.parent / f"{db.stem}-archives"
    store = SqliteStore(db)
    line = _Line(out)
    async with Runtime(store=store, llm=model, tools=demo_tools(), archive_dir=archives) as rt:
        narrate(rt, out, before=line.end)
        state = await rt.create_conversation(model=DEMO_MODEL, behavior=behavior)
        cid, config = state.id, state.config
        say(out, f"segue demo: {behavior.name} with the offline scripted model", "bold")
        say(
            out,
            f"conversation {cid}: window {config.context_window:,} tokens, warning at "
            f"{config.warning_tokens:,} ({config.warning_threshold:.0%}), threshold at "
            f"{config.continuation_tokens:,} ({config.continuation_threshold:.0%})",
        )
        start = (state.session, state.generation)
        for turn in range(1, 100):
            moved = (state.session, state.generation) != start
            state = await _streamed(rt, cid, f"Tell me more about topic {turn}.", line)
            if not moved and (state.session, state.generation) != start:
                await _crossing(rt, out, state)  # one more turn shows that it goes on
            meter(out, f"turn {turn}", state)
            if moved or (state.phase.kind != "idle" and state.phase.kind in WAITING_PHASES):
                break
            if not fast:
                await asyncio.sleep(DEMO_PACE)
        await _ending(rt, out, state, start, archives)
    return cid


async def _streamed(rt: Runtime, cid: str, text: str, line: _Line) -> ConversationState:
    """One turn through ``Runtime.stream``: each reply's first words as the model writes them,
    and the tools as they run."""
    out = line.out
    lead = "  assistant: "
    preview = max(10, out.width - len(lead) - len("..."))  # the whole line fits the console
    response, shown = None, 0
    async for update in rt.stream(cid, text):
        if update.kind == "text":
            if update.response != response or not line.open:
                line.start(lead)
                response, shown = update.response, 0
            piece = printable(update.text.replace("\n", " "))[: max(0, preview - shown)]
            out.print(Text(piece), end="")
            shown += len(piece)
            if piece and shown >= preview:
                out.print("...", end="")
        elif update.kind == "tool_started":
            line.start(f"  tool: {update.name}({clip(str(update.input), 40)})")
            response = response or -1
        elif update.kind == "done":
            line.end()
            return update.state
    raise CliError("the turn's updates ended without done", 1)


async def _crossing(runtime: Runtime, out: Console, state: ConversationState) -> None:
    """The figure that crossed the threshold, from the transition log: a restart or compaction
    completes within the turn, so the meter itself only shows the emptied context."""
    log = await runtime.store.transitions(state.id)
    record = next(r for r in reversed(log) if r.to_phase in ("awaiting_checkpoint", "compacting"))
    tokens, window = record.context_tokens or 0, state.context_window
    moved = f"{record.from_phase} -> {record.to_phase} ({record.reason})"
    say(out, f"  crossed at {tokens:,} / {window:,} ({tokens / window:.1%}): {moved}", "red")


async def _ending(
    rt: Runtime, out: Console, state: ConversationState, start: tuple[int, int], archives: Path
) -> None:
    """Show what the behaviour did at the limit; a demo that did not get there fails."""
    cid, behavior, failure = state.id, state.behavior, failure_of(state)
    exhausted = state.phase.kind == "context_exhausted"
    if behavior is Behavior.THRESHOLD_BASED_CONTINUATION and exhausted:
        summary = await last_text(rt, cid, "continuation")
        out.print(Panel(Text(printable(summary)), title="continuation summary", expand=False))
        try:
            await rt.send(cid, "One more question?")
        except ConversationExhaustedError as error:
            say(out, f"read-only: send() refused: {error}", "bold")
        else:
            raise CliError("an exhausted conversation accepted a message", 1)
        child = await rt.start_new_from(cid)
        say(out, f"child conversation {child.id} (parent {child.parent_id}), seeded", "bold")
        meter(out, "child", await rt.send(child.id, "Let us carry on where we left off."))
        entry(out, f"  assistant: {await last_text(rt, child.id)}")
    elif behavior is Behavior.INTENTIONALLY_UNHANDLED and failure is not None:
        say(
            out,
            f"typed failure: Failed(error_kind={failure.error_kind.name}): {failure.message}",
            "bold",
        )
        try:
            await rt.send(cid, "One more question?")
        except MessageRejectedError as error:
            say(out, f"send() refused: {error}")
        else:
            raise CliError("a failed conversation accepted a message", 1)
        say(out, "a parent agent would now spawn a replacement with a fresh window")
    elif behavior is Behavior.CHECKPOINT_PAUSE and state.phase.kind == "paused":
        snapshot = (await rt.store.snapshots(cid))[-1]
        out.print(Panel(Text(printable(snapshot.checkpoint)), title="checkpoint", expand=False))
        say(
            out,
            f"paused at the limit: snapshot v{snapshot.version} (trigger {snapshot.trigger}, "
            f"{snapshot.llm_calls} LLM calls, {snapshot.tool_calls} tool calls)",
            "bold",
        )
        resumed = await rt.resume(cid)
        say(out, f"an orchestrator resumes it: session {resumed.session}", "bold")
        meter(out, "resumed", resumed)
    elif failure is None and (state.session, state.generation) != start:
        restart = behavior is Behavior.CHECKPOINT_RESTART
        kind = "checkpoint" if restart else "summary"
        text = printable(await last_text(rt, cid, kind))
        out.print(Panel(Text(text), title=kind, expand=False))
        moved = (
            f"session {start[0]} -> {state.session}"
            if restart
            else (f"generation {start[1]} -> {state.generation} (archive in {archives})")
        )
        say(out, f"{moved}; continuations: {state.continuations}; still going", "bold")
    else:
        shown = f"{failure.error_kind.value}: {failure.message}" if failure else state.phase.kind
        raise CliError(f"the demo ended unexpectedly ({shown})", 1)


@app.command()
def demo(
    db: Annotated[
        Path | None,
        typer.Option(help="SQLite file to write and keep (default: none is kept)."),
    ] = None,
    behavior: BehaviorOption = Behavior.THRESHOLD_BASED_CONTINUATION,
    fast: Annotated[bool, typer.Option(help="No pause between turns.")] = False,
) -> None:
    """Offline demo: a long conversation against a scripted model, through the limit."""
    out = console()
    if db is not None:
        cid = run(_demo(db, behavior, fast, out))
        say(out, f"\ndatabase: {db}", "bold")
        say(out, f"inspect it: segue status {cid[:8]} --db {db} ; segue show {cid[:8]} --db {db}")
        return
    with tempfile.TemporaryDirectory(prefix="segue-demo-") as scratch:
        run(_demo(Path(scratch) / "segue.db", behavior, fast, out))
    say(out, "\nthe demo's store was temporary and is gone; `segue demo --db FILE` keeps it")
