"""``segue pause`` and ``segue resume``: an orchestrator's two verbs, over the same store; and
``segue redo-summary`` and ``segue undo-compaction``: a summary made again, a compaction taken
back (REQ-SEG-063, 064).

Both run the model (a pause asks it for a checkpoint; a resume runs the first turn of the new
session), Claude with ``ANTHROPIC_API_KEY`` or the offline model for the demo's conversations.
They drive only the conversation they are given and never recover anyone else's pending work.
A conversation whose turn another live process is running is paused through the store: that
process pauses it at the turn's next boundary (writing the checkpoint itself), and ``segue
pause`` waits for it (``--timeout`` bounds the wait). Work a crashed process left pending is
left for a ``segue serve`` or ``segue chat`` on the store to finish.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final

import typer
from rich.console import Console

from segue.cli._app import (
    BaseUrlOption,
    CliError,
    DbOption,
    HeaderOption,
    RepoOption,
    app,
    headers_of,
    run,
    seconds,
)
from segue.cli._models import model_for
from segue.cli._output import clip, console, last_text, meter, narrate, say
from segue.cli._stores import DatabaseUrlOption, StoreAt, existing_store, resolve
from segue.cli.inspection import IdArgument
from segue.executor.claims import default_owner
from segue.executor.model_port import LlmModel
from segue.executor.runtime import Runtime
from segue.executor.snapshots import git_context
from segue.executor.store_port import Store, StoredConversation
from segue.executor.turn_holder import turn_of
from segue.statemachine import WAITING_PHASES

OfflineOption = Annotated[
    bool, typer.Option(help="Answer with the offline scripted model instead of Claude.")
]
NOT_YET_TAKEN: Final = 3
"""``segue pause``'s exit code when the pause is requested but its turn had not ended yet."""


def _must_be_still(stored: StoredConversation) -> None:
    """Refuse a conversation with a turn in flight (or work a crash left pending)."""
    phase = stored.state.phase.kind
    if stored.pending or phase not in WAITING_PHASES:
        msg = (
            f"conversation {stored.state.id} is {phase} with work in flight that no running "
            "process holds (left by one that stopped or crashed): segue serve or segue chat "
            "on this store finishes it"
        )
        raise CliError(msg, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reach:
    """Where a command finds the conversation and its model: the store, the git repository
    whose state a pause records, and how the model is reached."""

    where: StoreAt
    repo: Path | None
    offline: bool
    base_url: str | None
    headers: dict[str, str]

    @classmethod
    def of(
        cls,
        db: Path,
        database_url: str | None,
        repo: Path | None,
        offline: bool,
        base_url: str | None,
        header: list[str] | None,
    ) -> Reach:
        """What a command's options say (``NAME:VALUE`` headers read, or a usage error)."""
        return cls(
            where=StoreAt(db, database_url),
            repo=repo,
            offline=offline,
            base_url=base_url,
            headers=headers_of(header),
        )

    def runtime(self, store: Store, llm: LlmModel, owner: str | None = None) -> Runtime:
        """A runtime over ``store`` (not entered: it recovers no one else's work)."""
        context = git_context(self.repo or Path.cwd())
        return Runtime(store=store, llm=llm, snapshot_context=context, owner=owner)


async def _pause(given: str, reach: Reach, *, reason: str, wait_at_most: float | None) -> int:
    out = console()
    async with contextlib.AsyncExitStack() as stack:
        store = existing_store(reach.where, read_only=False)
        stack.push_async_callback(store.close)
        cid = await resolve(store, given)
        stored = await store.load(cid)
        phase = stored.state.phase.kind
        if phase == "paused":
            raise CliError(f"conversation {cid} is already paused", 1)
        owner = default_owner()  # the runtime's below, which drives nothing yet
        turn = turn_of(stored, owner=owner)
        if turn.where == "nobody":
            _must_be_still(stored)
            if phase != "idle":
                message = f"conversation {cid} is {phase}: only a live conversation pauses"
                raise CliError(message, 1)
        llm = await stack.enter_async_context(
            model_for(
                stored.state, offline=reach.offline, base_url=reach.base_url, headers=reach.headers
            )
        )
        runtime = reach.runtime(store, llm, owner)
        stack.push_async_callback(runtime.close)
        narrate(runtime, out)
        if turn.where == "elsewhere":
            say(out, f"conversation {cid} is {phase} in another process ({turn.holder}):")
            say(out, "  asking it to pause at its turn's next boundary; waiting for it")
        # The pause as the runtime and the server take it; at ``wait_at_most``, the request is
        # left standing (the process running the turn still pauses) rather than forced.
        request = await runtime.request_pause(cid, reason)
        state = await request.outcome(wait_at_most, force=False)
        if state.pause_requested and state.phase.kind != "paused":
            said = f"pause requested, not yet taken: conversation {cid} is still in its turn"
            say(out, said, "bold")
            say(out, "  the process running it pauses at the turn's next boundary")
            say(out, f"  (segue status {cid[:8]} shows when it is paused)")
            return NOT_YET_TAKEN
        if state.phase.kind != "paused":
            raise CliError(f"conversation {cid} did not pause: it is {state.phase.kind}", 1)
        snapshot = (await store.snapshots(cid))[-1]
        say(out, f"paused {cid}: snapshot v{snapshot.version} saved", "bold")
        say(out, f"checkpoint: {clip(snapshot.checkpoint, 200)}")
        meter(out, "context", state)
        return 0


@app.command()
def pause(
    conversation_id: IdArgument,
    reason: Annotated[str, typer.Option(help="Why (kept in the snapshot).")] = "",
    timeout: Annotated[
        float | None,
        typer.Option(
            parser=seconds(24 * 3_600),
            metavar="SECONDS",
            help="Seconds to wait for another process's turn to reach its boundary (default: "
            f"as long as it takes); exit {NOT_YET_TAKEN} if the pause is requested but not "
            "yet taken by then.",
        ),
    ] = None,
    db: DbOption = Path("segue.db"),
    database_url: DatabaseUrlOption = None,
    offline: OfflineOption = False,
    base_url: BaseUrlOption = None,
    header: HeaderOption = None,
    repo: RepoOption = None,
) -> None:
    """Pause a conversation: the model writes a checkpoint, kept as a snapshot (with the git
    state of the repository). One whose turn another process runs is paused by that process
    at the turn's next boundary."""
    reach = Reach.of(db, database_url, repo, offline, base_url, header)
    raise typer.Exit(run(_pause(conversation_id, reach, reason=reason, wait_at_most=timeout)))


@contextlib.asynccontextmanager
async def _still(
    given: str, reach: Reach, out: Console
) -> AsyncIterator[tuple[Runtime, Store, StoredConversation]]:
    """A runtime, narrating to ``out``, over the store ``reach`` names and a model for the
    conversation ``given`` (an id or its start), which must not be running a turn anywhere."""
    async with contextlib.AsyncExitStack() as stack:
        store = existing_store(reach.where, read_only=False)
        stack.push_async_callback(store.close)
        stored = await store.load(await resolve(store, given))
        _must_be_still(stored)
        llm = await stack.enter_async_context(
            model_for(
                stored.state, offline=reach.offline, base_url=reach.base_url, headers=reach.headers
            )
        )
        runtime = reach.runtime(store, llm)
        stack.push_async_callback(runtime.close)
        narrate(runtime, out)
        yield runtime, store, stored


async def _resume(given: str, reach: Reach, *, prompt: str | None) -> None:
    out = console()
    async with _still(given, reach, out) as (runtime, _store, stored):
        cid = stored.state.id
        state = await runtime.resume(cid, prompt)  # NotPausedError: one line, exit 1
        say(out, f"resumed {cid} in session {state.session}", "bold")
        say(out, f"assistant: {clip(await last_text(runtime, cid), 300)}")
        meter(out, "context", state)


@app.command()
def resume(
    conversation_id: IdArgument,
    prompt: Annotated[
        str | None, typer.Option(help="The new session's first message (default: carry on).")
    ] = None,
    db: DbOption = Path("segue.db"),
    database_url: DatabaseUrlOption = None,
    offline: OfflineOption = False,
    base_url: BaseUrlOption = None,
    header: HeaderOption = None,
    repo: RepoOption = None,
) -> None:
    """Resume a paused conversation in a new session, from its snapshot (the resume context
    says whether the repository's HEAD moved since)."""
    run(
        _resume(
            conversation_id,
            Reach.of(db, database_url, repo, offline, base_url, header),
            prompt=prompt,
        )
    )


async def _summary_again(given: str, reach: Reach, *, undo: bool, **asked: str | None) -> None:
    """Make the latest summary again (``asked``: its focus, prompt, model), or with ``undo``
    take the latest compaction back; a turn in flight anywhere refuses it (exit 1)."""
    out = console()
    async with _still(given, reach, out) as (runtime, store, stored):
        cid = stored.state.id
        before = stored.state.generation
        try:
            if undo:
                state = await runtime.undo_compaction(cid)
            else:
                state = await runtime.redo_summary(cid, **asked)
        except ValueError as error:  # a blank focus or prompt: the caller's mistake
            raise CliError(f"cannot ask for it: {error}".splitlines()[0], 2) from None
        if state.generation == before:
            raise CliError(f"conversation {cid}: the summary could not be made again", 1)
        if undo:
            say(out, f"compaction taken back: {cid} is in generation {state.generation}", "bold")
        else:
            summary = [m for m in await store.messages(cid) if m.message.kind == "summary"]
            say(out, f"summary made again: {cid} is in generation {state.generation}", "bold")
            say(out, f"summary: {clip(summary[-1].message.text, 300)}")
        meter(out, "context", state)


@app.command("redo-summary")
def redo_summary(
    conversation_id: IdArgument,
    focus: Annotated[
        str | None, typer.Option(help="What the new summary must keep above all.")
    ] = None,
    summary_prompt: Annotated[
        str | None,
        typer.Option(help="The instruction for this summary only (default: the conversation's)."),
    ] = None,
    summary_model: Annotated[
        str | None,
        typer.Option(help="The model that writes this summary only (default: the conversation's)."),
    ] = None,
    db: DbOption = Path("segue.db"),
    database_url: DatabaseUrlOption = None,
    offline: OfflineOption = False,
    base_url: BaseUrlOption = None,
    header: HeaderOption = None,
) -> None:
    """Make a compact_in_place conversation's latest summary again, from the history it
    replaced; the old summary stays in the transcript as a version."""
    reach = Reach.of(db, database_url, None, offline, base_url, header)
    asked = {"focus": focus, "summary_prompt": summary_prompt, "summary_model": summary_model}
    run(_summary_again(conversation_id, reach, undo=False, **asked))


@app.command("undo-compaction")
def undo_compaction(
    conversation_id: IdArgument,
    db: DbOption = Path("segue.db"),
    database_url: DatabaseUrlOption = None,
    offline: OfflineOption = False,
    base_url: BaseUrlOption = None,
    header: HeaderOption = None,
) -> None:
    """Take a conversation's latest compaction back, when the history before it fits the
    window now (else say by how much it does not); nothing is deleted."""
    reach = Reach.of(db, database_url, None, offline, base_url, header)
    run(_summary_again(conversation_id, reach, undo=True))
