"""``segue chat``: a conversation with Claude, one stdin line per message, with slash commands
for what a chat UI's buttons do (continue now, pause, resume, status, a new conversation).

A conversation is stored with its first message, not before (quitting an empty chat leaves
nothing behind). A line starting with ``/`` is a command, never sent to the model; ``//`` sends
a line that starts with a slash. Input that is not UTF-8 is refused with a line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Final

import typer
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from segue.cli._app import (
    MIN_WINDOW,
    BaseUrlOption,
    BehaviorOption,
    CliError,
    DbOption,
    HeaderOption,
    app,
    fail,
    headers_of,
    run,
)
from segue.cli._models import DEFAULT_MODELS, Provider, api_key, connect, provider_for
from segue.cli._output import (
    console,
    existing_store,
    last_text,
    meter,
    narrate,
    printable,
    resolve,
    say,
)
from segue.cli.inspection import print_status
from segue.executor.errors import (
    ConversationExhaustedError,
    MessageRejectedError,
    NotPausedError,
    SegueError,
)
from segue.executor.inputs import failure_of
from segue.executor.runtime import Runtime
from segue.executor.stores.sqlite import SqliteStore
from segue.statemachine import ContextExhaustionBehavior as Behavior
from segue.statemachine import ConversationState, continues_in_new

NEW_HINT: Final = "type /new to continue in a new conversation seeded with its summary"
HELP: Final = """commands:
  /help              this list
  /status            phase, meter, snapshots, parent and child
  /continue [focus]  take the path at the limit now: continue in a new conversation (or
                     compact, or restart from a checkpoint); the summary keeps the focus
                     above all
  /pin text          send a pinned message: never summarised away
  /pause [reason]    pause: the model writes a checkpoint, kept as a snapshot
  /resume            resume a paused conversation in a new session
  /new [--no-seed]   a new conversation (from an exhausted one: its child, seeded with the
                     summary unless --no-seed)
  /quit              end (also /exit, or end of input)
  //text             send a message that starts with a slash"""


@dataclass(slots=True, kw_only=True)
class _Chat:
    """The loop's state: the runtime, what a new conversation is created with, the current
    conversation (None until the first message), and whether the last message was refused."""

    runtime: Runtime
    out: Console
    db: Path
    model: str
    behavior: Behavior
    context_window: int | None
    state: ConversationState | None = None
    refused: bool = field(default=False)

    def _current(self) -> ConversationState:
        if self.state is None:  # ``command`` answers before asking for it
            raise CliError("no conversation yet", 1)
        return self.state

    async def message(self, text: str, *, pinned: bool = False) -> None:
        if self.state is None:
            self.state = await self.runtime.create_conversation(
                model=self.model, behavior=self.behavior, context_window=self.context_window
            )
            say(self.out, f"conversation {self.state.id} ({self.model}, {self.behavior.name})")
        cid = self.state.id
        try:
            self.state = await self.runtime.send(cid, text, pinned=pinned)
        except (ConversationExhaustedError, MessageRejectedError) as error:
            exhausted = isinstance(error, ConversationExhaustedError)
            paused = isinstance(error, MessageRejectedError) and error.cause == "paused"
            hint = f" Hint: {NEW_HINT}." if exhausted else " Hint: type /resume." if paused else ""
            typer.echo(f"error: {printable(str(error))}{hint}", err=True)
            self.refused = True
            return
        if (failure := failure_of(self.state)) is not None:
            raise CliError(f"{failure.message} ({failure.error_kind.value})", 1)
        self.refused = False
        self.out.print(Text(printable(await last_text(self.runtime, cid))))
        await self._after_turn()

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
            say(self.out, HELP)
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
            say(self.out, f"unknown command {name} (nothing was sent)\n{HELP}")
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
            say(self.out, f"/new takes --no-seed or nothing, not {argument!r}\n{HELP}")
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
        self.out.print(Text(printable(await last_text(self.runtime, self.state.id))))
        await self._after_turn()


class _Lines:
    """Stdin's lines for the event loop, each read when asked for by a daemon thread.

    Not ``asyncio.to_thread``: its worker is joined when the loop and the interpreter shut
    down, so a Ctrl-C at the prompt waited for Enter while that worker sat in ``readline``. A
    daemon thread is left behind instead, and the process ends at once. It reads the file
    descriptor itself (``os.read``), never ``sys.stdin``'s buffer, whose lock a daemon thread
    must not hold while the interpreter shuts down."""

    def __init__(self, out: Console) -> None:
        self._out = out
        self._loop = asyncio.get_running_loop()
        self._lines: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self._wanted = threading.Semaphore(0)
        try:
            self._fd: int | None = sys.stdin.fileno()
        except (AttributeError, OSError, ValueError):  # no descriptor (a test's stdin)
            self._fd = None
        thread = threading.Thread(target=self._read, name="segue-chat-stdin", daemon=True)
        thread.start()

    def _raw_lines(self) -> Iterator[bytes]:
        """Stdin's lines as bytes, each with its newline (the last one may have none)."""
        if self._fd is None:
            yield from iter(sys.stdin.buffer.readline, b"")
            return
        pending = b""
        while chunk := os.read(self._fd, 65536):
            pending += chunk
            while (end := pending.find(b"\n")) >= 0:
                yield pending[: end + 1]
                pending = pending[end + 1 :]
        if pending:
            yield pending

    def _read(self) -> None:
        raw_lines = self._raw_lines()
        while True:
            self._wanted.acquire()
            raw = next(raw_lines, b"")
            line: str | bytes | None
            try:
                line = raw.decode("utf-8") if raw else None
            except UnicodeDecodeError:
                line = raw
            try:
                self._loop.call_soon_threadsafe(self._lines.put_nowait, line)
            except RuntimeError:  # the chat is over and its loop closed
                return
            if line is None:
                return

    async def next(self) -> str | bytes | None:
        """The next line (None at the end of input), as text, or bytes if it is not UTF-8."""
        if sys.stdin.isatty():
            self._out.print("you> ", end="")
        self._wanted.release()
        return await self._lines.get()


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C ends the chat at once, from the prompt or mid-turn (what the turn left pending is
    finished by the next run, as after any stop); a second Ctrl-C while it closes (the store
    waiting on a lock, say) ends the process there and then."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    interrupts = 0

    def on_interrupt() -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1:
            os.write(2, b"\nstopped at once\n")
            os._exit(130)
        typer.echo("\nstopping (Ctrl-C again stops at once)", err=True)
        if task is not None:
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, on_interrupt)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
        yield
        return
    try:
        yield
    except asyncio.CancelledError:
        if interrupts:
            raise KeyboardInterrupt from None  # ``run`` says "interrupted", exit 130
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def _converse(chat: _Chat) -> int:
    """The read-send-print loop: 1 if the last message was refused, else 0."""
    out = chat.out
    narrate(chat.runtime, out)
    if chat.state is not None:
        state = chat.state
        say(out, f"conversation {state.id} ({state.model}, {state.behavior.name}); db {chat.db}")
        meter(out, "context", state)
    say(out, "type a message; /help lists the commands; /quit ends; Ctrl-C stops")
    lines = _Lines(out)
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
    with _interruptible():  # around the closing too: a second Ctrl-C ends a close that hangs
        return await chatting


async def _chatting(
    *,
    provider: Provider,
    key: str,
    model: str,
    behavior: Behavior,
    base_url: str | None,
    headers: dict[str, str],
    context_window: int | None,
    db: Path,
    resume: str | None,
) -> int:
    async with contextlib.AsyncExitStack() as stack:
        state = None
        if resume is not None:
            store = existing_store(db, read_only=False)
            stack.push_async_callback(store.close)
            state = (await store.load(await resolve(store, resume))).state
            model = state.model
        else:
            store = SqliteStore(db)  # created with the first message's conversation
            stack.push_async_callback(store.close)
        check = None if context_window is not None else model  # no models endpoint needed
        client, llm = await connect(
            provider, key, base_url=base_url, headers=headers, check_model=check
        )
        stack.push_async_callback(client.close)
        runtime = await stack.enter_async_context(Runtime(store=store, llm=llm))
        chat = _Chat(
            runtime=runtime,
            out=console(),
            db=db,
            model=model,
            behavior=behavior,
            context_window=context_window,
            state=state,
        )
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
    conversation: Annotated[
        str | None, typer.Option(help="Continue this stored conversation (id or its start).")
    ] = None,
    context_window: Annotated[
        int | None,
        typer.Option(
            min=MIN_WINDOW,
            help="The model's window in tokens, for a server that cannot say it "
            "(default: asked from the API).",
        ),
    ] = None,
    header: HeaderOption = None,
) -> None:
    """Chat with Claude (ANTHROPIC_API_KEY) or an OpenAI model (OPENAI_API_KEY), one stdin line
    per message; /help for commands."""
    headers = headers_of(header)
    try:
        chosen = provider_for(provider, model)
        key = api_key(chosen)
    except CliError as error:
        fail(error.message, error.code)
    chatting = _chatting(
        provider=chosen,
        key=key,
        model=model or DEFAULT_MODELS[chosen],
        behavior=behavior,
        base_url=base_url,
        headers=headers,
        context_window=context_window,
        db=db,
        resume=conversation,
    )
    raise typer.Exit(run(_interruptibly(chatting)))
