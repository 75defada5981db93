"""``segue chat``: a conversation with Claude or an OpenAI model (offline with the scripted model
when there is no key), one stdin line per message, with slash commands for what a chat UI's
buttons do (continue now, pause, resume, status, a new conversation).

A conversation is stored with its first message, not before (quitting an empty chat leaves
nothing behind). A line starting with ``/`` is a command, never sent to the model; ``//`` sends
a line that starts with a slash. Input that is not UTF-8 is refused with a line. A turn that
Ctrl-C interrupted is finished by the next run, which prints its reply.
"""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Final

import typer
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

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
    run,
    window_tokens,
)
from segue.cli._models import (
    DEFAULT_MODELS,
    Provider,
    api_key,
    connect,
    offline_line,
    provider_for,
)
from segue.cli._opening import refuse_unsupported, say_window
from segue.cli._output import (
    console,
    last_text,
    meter,
    narrate,
    printable,
    say,
)
from segue.cli._stores import DatabaseUrlOption, StoreAt, existing_store, resolve, writable_store
from segue.cli._terminal import StdinLines, interruptible
from segue.cli.inspection import print_status
from segue.executor.errors import (
    ConversationExhaustedError,
    MessageRejectedError,
    NotPausedError,
    SegueError,
)
from segue.executor.inputs import failure_of
from segue.executor.model_port import LlmModel
from segue.executor.models.offline import OfflineModel
from segue.executor.runtime import Runtime
from segue.executor.snapshots import git_context
from segue.executor.store_port import Store
from segue.executor.updates import ContextEditedUpdate, DoneUpdate
from segue.statemachine import ContextExhaustionBehavior as Behavior
from segue.statemachine import ConversationState, continues_in_new
from segue.statemachine.options import ConversationOptions

NEW_HINT: Final = "type /new to continue in a new conversation seeded with its summary"
HELP: Final = (
    ("/help", "this list"),
    ("/status", "phase, meter, snapshots, parent and child"),
    (
        "/continue [focus]",
        "take the path at the limit now: continue in a new conversation (or compact, or "
        "restart from a checkpoint); the summary keeps the focus above all",
    ),
    ("/pin text", "send a pinned message: never summarised away"),
    ("/pause [reason]", "pause: the model writes a checkpoint, kept as a snapshot"),
    ("/resume", "resume a paused conversation in a new session"),
    (
        "/new [--no-seed]",
        "a new conversation (from an exhausted one: its child, seeded with the summary "
        "unless --no-seed)",
    ),
    ("/quit", "end (also /exit, or end of input)"),
    ("//text", "send a message that starts with a slash"),
)
"""The slash commands and what each does, as ``/help`` lists them."""
_HELP_COLUMN: Final = 2 + max(len(command) for command, _ in HELP) + 2


def print_help(out: Console) -> None:
    """The slash commands, each description wrapped to the console beside its command (it
    once ran past 80 columns, the lines cut by hand for a wider screen)."""
    say(out, "commands:")
    width = max(20, out.width - _HELP_COLUMN)
    for command, does in HELP:
        lines = textwrap.wrap(does, width) or [""]
        say(out, f"  {command:<{_HELP_COLUMN - 4}}  {lines[0]}")
        for line in lines[1:]:
            say(out, " " * _HELP_COLUMN + line)


_REFUSED_HINTS: Final = {
    "paused": "type /resume to carry on in a new session",
    "failed": "type /new to continue in a new conversation",
    "busy": "wait for the turn to end and send again",
    "too_large": "shorten it, or split it into several messages",
}


def refusal(error: ConversationExhaustedError | MessageRejectedError, cid: str) -> str:
    """Why a message was not sent, and what to type: the chat's own words, never the
    library's (whose messages name Python calls)."""
    if isinstance(error, ConversationExhaustedError):
        return f"conversation {cid} is read-only (its context window is full): {NEW_HINT}"
    hint = _REFUSED_HINTS.get(error.cause)
    said = f"not sent: {error.reason.rstrip('.')}"
    return f"{said}; {hint}" if hint else said


@dataclass(slots=True, kw_only=True)
class _Chat:
    """The loop's state: the runtime, what a new conversation is created with, the current
    conversation (None until the first message), and whether the last message was refused."""

    runtime: Runtime
    out: Console
    where: StoreAt
    options: ConversationOptions
    state: ConversationState | None = None
    refused: bool = field(default=False)

    def _current(self) -> ConversationState:
        if self.state is None:  # ``command`` answers before asking for it
            raise CliError("no conversation yet", 1)
        return self.state

    async def message(self, text: str, *, pinned: bool = False) -> None:
        if self.state is None:
            self.state = await self.runtime.create_conversation(self.options)
            model, behavior = self.options.model, self.options.behavior.name
            say(self.out, f"conversation {self.state.id} ({model}, {behavior})")
        cid = self.state.id
        try:
            self.state = await self._turn(cid, text, pinned=pinned)
        except (ConversationExhaustedError, MessageRejectedError) as error:
            typer.echo(f"error: {printable(refusal(error, cid))}", err=True)
            self.refused = True
            return
        if (failure := failure_of(self.state)) is not None:
            raise CliError(f"{failure.message} ({failure.error_kind.value})", 1)
        self.refused = False
        say(self.out, await last_text(self.runtime, cid))
        await self._after_turn()

    async def _turn(self, cid: str, text: str, *, pinned: bool) -> ConversationState:
        """The turn, told as it goes where the runtime's narration cannot: what the provider
        cleared from the context (an update of the turn's stream, no effect of the core)."""
        state = self._current()
        async for update in self.runtime.stream(cid, text, pinned=pinned):
            if isinstance(update, ContextEditedUpdate):
                say(self.out, f"  {edited_words(update)}", "cyan")
            elif isinstance(update, DoneUpdate):
                state = update.state
        return state

    async def _after_turn(self) -> None:
        state = self._current()
        meter(self.out, "context", state)
        if state.phase.kind == "context_exhausted":
            summary = await last_text(self.runtime, state.id, "continuation")
            if summary:
                self.out.print(Panel(Text(printable(summary)), title="summary", expand=False))
            say(self.out, f"this conversation is read-only now: {NEW_HINT}", "bold")

    async def command(self, line: str) -> bool:
        """Run a slash command; False ends the chat."""
        name, _, argument = line.partition(" ")
        argument = argument.strip()
        if name in ("/quit", "/exit"):
            return False
        if name == "/help":
            print_help(self.out)
        elif name == "/pin":
            if argument:
                await self.message(argument, pinned=True)
            else:
                say(self.out, "/pin takes the message to pin: /pin Never touch the migrations")
        elif name == "/new":
            await self._new(argument)
        elif self.state is None and name in ("/status", "/continue", "/pause", "/resume"):
            say(self.out, "no conversation yet: your next message starts one")
        elif name == "/status":
            await self._status()
        elif name == "/continue":
            await self._continue(argument or None)
        elif name == "/pause":
            await self._pause(argument)
        elif name == "/resume":
            await self._resume()
        else:
            say(self.out, f"unknown command {name} (nothing was sent)")
            print_help(self.out)
        return True

    async def _continue(self, focus: str | None) -> None:
        before = self._current()
        self.state = await self.runtime.continue_manually(before.id, focus=focus)
        after = self.state
        if after.phase.kind == "context_exhausted":
            await self._after_turn()
        elif after.generation != before.generation:
            say(self.out, f"compacted: older messages summarised (generation {after.generation})")
            meter(self.out, "context", after)
        elif after.session != before.session:
            say(self.out, f"restarted from a checkpoint in session {after.session}")
            meter(self.out, "context", after)
        elif (failure := failure_of(after)) is not None:
            say(
                self.out,
                f"it failed ({failure.error_kind.value}): {printable(failure.message)}",
                "bold",
            )
        else:
            say(self.out, f"not now: the conversation is {after.phase.kind}")

    async def _new(self, argument: str) -> None:
        if argument not in ("", "--no-seed"):
            say(self.out, f"/new takes --no-seed or nothing, not {argument!r}")
            print_help(self.out)
            return
        state = self.state
        if state is not None and continues_in_new(state):
            try:
                child = await self.runtime.start_new_from(
                    state.id, seed_with_summary=argument != "--no-seed"
                )
            except SegueError:
                child = None  # a failure that left nothing to carry on from: start afresh
            if child is not None:
                self.state, self.refused = child, False
                say(self.out, f"continuing in conversation {child.id} (parent {state.id})")
                return
        self.state, self.refused = None, False
        say(self.out, "a new conversation starts with your next message")

    async def _status(self) -> None:
        cid = self._current().id
        stored = await self.runtime.conversation(cid)
        chain = [(link.id, link.label) for link in await self.runtime.lineage(cid)]
        print_status(self.out, stored, await self.runtime.store.snapshots(cid), chain)

    async def _pause(self, reason: str) -> None:
        self.state = await self.runtime.pause(self._current().id, reason)
        if self.state.phase.kind != "paused":
            say(self.out, f"not paused: the conversation is {self.state.phase.kind}")
            return
        say(self.out, "paused: /resume carries on in a new session from the snapshot")

    async def _resume(self) -> None:
        state = self._current()
        try:
            self.state = await self.runtime.resume(state.id)
        except NotPausedError as error:
            say(self.out, f"not resumed: {error}")
            return
        say(self.out, await last_text(self.runtime, self.state.id))
        await self._after_turn()


def edited_words(update: ContextEditedUpdate) -> str:
    """What the provider cleared, as a person reads it."""
    what = {
        "clear_tool_uses_20250919": "old tool results",
        "clear_thinking_20251015": "old thinking",
    }.get(update.strategy, update.strategy)
    return (
        f"the provider cleared {what} ({update.cleared:,}) from the context: "
        f"{update.cleared_input_tokens:,} tokens"
    )


async def _converse(chat: _Chat) -> int:
    """The read-send-print loop: 1 if the last message was refused, else 0."""
    out = chat.out
    if chat.state is not None:
        state = chat.state
        say(out, f"conversation {state.id} ({state.model}, {state.behavior.name}); {chat.where}")
        meter(out, "context", state)
    say(out, "type a message; /help lists the commands; /quit ends; Ctrl-C stops")
    lines = StdinLines(out)
    while (line := await lines.next()) is not None:
        if isinstance(line, bytes):
            typer.echo("error: that line is not valid UTF-8; nothing was sent", err=True)
            continue
        text = line.strip()
        if text.startswith("//"):
            await chat.message(text[1:])
        elif text.startswith("/"):
            if not await chat.command(text):
                break
        elif text:
            await chat.message(text)
    return 1 if chat.refused else 0


async def _interruptibly(chatting: Awaitable[int]) -> int:
    with interruptible():  # around the closing too: a second Ctrl-C ends a close that hangs
        return await chatting


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatOptions:
    """What ``segue chat`` was told, as parsed."""

    provider: Provider
    key: str | None
    """The provider's key; None: offline, the scripted model answers."""
    options: ConversationOptions
    """What a new conversation is created with."""
    base_url: str | None
    headers: dict[str, str]
    where: StoreAt
    resume: str | None
    repo: Path | None


async def _finish_interrupted(runtime: Runtime, out: Console, interrupted: list[str]) -> None:
    """Print the reply of each turn a stop interrupted (Ctrl-C, a crash) that entering the
    runtime has just finished."""
    for cid in interrupted:
        state = await runtime.state(cid)
        say(out, f"finished the turn interrupted in conversation {cid}:", "bold")
        if (failure := failure_of(state)) is not None:
            say(out, f"  it failed ({failure.error_kind.value}): {failure.message}")
        else:
            say(out, await last_text(runtime, cid))
        meter(out, "context", state)


async def _chatting(asked: ChatOptions, out: Console) -> int:
    async with contextlib.AsyncExitStack() as stack:
        state = None
        store: Store
        if asked.resume is not None:
            store = existing_store(asked.where, read_only=False)
            stack.push_async_callback(store.close)
            state = (await store.load(await resolve(store, asked.resume))).state
        else:
            store = writable_store(asked.where)  # created with the first message's conversation
            stack.push_async_callback(store.close)
        interrupted = await store.with_pending()
        llm: LlmModel
        if asked.key is None:
            llm = OfflineModel()
        else:
            options = asked.options
            check = None if options.context_window is not None else options.model
            client, llm = await connect(
                asked.provider,
                asked.key,
                base_url=asked.base_url,
                headers=asked.headers,
                check_model=check if state is None else state.model,
            )
            stack.push_async_callback(client.close)
        await say_window(out, llm, asked.options, state, offline=asked.key is None)
        if state is None:
            refuse_unsupported(llm, asked.options)
        if asked.key is None:
            say(out, offline_line(asked.provider, asked.base_url))
        runtime = Runtime(
            store=store, llm=llm, snapshot_context=git_context(asked.repo or Path.cwd())
        )
        narrate(runtime, out)
        await stack.enter_async_context(runtime)  # finishes what a stop left pending
        await _finish_interrupted(runtime, out, interrupted)
        if state is not None:
            state = await runtime.state(state.id)
        chat = _Chat(runtime=runtime, out=out, where=asked.where, options=asked.options)
        chat.state = state
        return await _converse(chat)


@app.command()
def chat(
    model: Annotated[
        str | None, typer.Option(help="Model id (default: claude-sonnet-4-6, or gpt-4o).")
    ] = None,
    provider: Annotated[
        str | None,
        typer.Option(help="anthropic or openai (default: told by --model, else anthropic)."),
    ] = None,
    behavior: BehaviorOption = Behavior.THRESHOLD_BASED_CONTINUATION,
    base_url: BaseUrlOption = None,
    db: DbOption = Path("segue.db"),
    database_url: DatabaseUrlOption = None,
    conversation: Annotated[
        str | None, typer.Option(help="Continue this stored conversation (id or its start).")
    ] = None,
    context_window: Annotated[
        int | None,
        typer.Option(
            parser=window_tokens,
            metavar="N",
            help="The model's window in tokens, for a server that cannot say it "
            "(default: asked from the API).",
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
    compaction: CompactionOption = "segue",
    context_edits: ContextEditsOption = None,
    summary_request: SummaryRequestOption = "tool_less",
) -> None:
    """Chat with Claude (ANTHROPIC_API_KEY) or an OpenAI model (OPENAI_API_KEY), one stdin line
    per message; without the key, offline with the scripted model. /help for commands.
    \f
    Nineteen parameters, over the bound of ten, and as many declarations, over sixty lines,
    because typer makes each option of a command a parameter of its function and has no way to
    group them; they become one ``ChatOptions`` here, which the work takes.
    """
    try:
        chosen = provider_for(provider, model)
    except CliError as error:
        fail(error.message, error.code)
    limits = limits_of(
        max_continuations,
        max_attempts,
        max_tool_rounds,
        retry_base_delay,
        retry_max_delay,
        pause_after_turns=pause_after_turns,
        pause_after_seconds=pause_after_seconds,
    )
    try:
        options = options_of(
            {
                "model": model or DEFAULT_MODELS[chosen],
                "behavior": behavior,
                "context_window": context_window,
                "compaction": compaction,
                "context_edits": context_edits_of(context_edits),
                "summary_request": summary_request,
                **limits,
            }
        )
    except CliError as error:
        fail(error.message, error.code)
    asked = ChatOptions(
        provider=chosen,
        key=api_key(chosen),
        options=options,
        base_url=base_url,
        headers=headers_of(header),
        where=StoreAt(db, database_url),
        resume=conversation,
        repo=repo,
    )
    raise typer.Exit(run(_interruptibly(_chatting(asked, console()))))
