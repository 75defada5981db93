"""``segue pause`` and ``segue resume``: an orchestrator's two verbs, over the same store.

Both run the model (a pause asks it for a checkpoint; a resume runs the first turn of the new
session), Claude with ``ANTHROPIC_API_KEY`` or the offline model for the demo's conversations.
They drive only the conversation they are given and never recover anyone else's pending work;
a conversation in the middle of a turn belongs to the process running that turn, so it is
paused there (``POST /api/conversations/{id}/pause``), not from here.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from segue.cli._app import BaseUrlOption, CliError, DbOption, HeaderOption, app, headers_of, run
from segue.cli._models import model_for
from segue.cli._output import clip, console, existing_store, last_text, meter, narrate, resolve, say
from segue.cli.inspection import IdArgument
from segue.executor.ports import StoredConversation
from segue.executor.runtime import Runtime

OfflineOption = Annotated[
    bool, typer.Option(help="Answer with the offline scripted model instead of Claude.")
]


def _must_be_still(stored: StoredConversation) -> None:
    """Refuse a conversation with a turn in flight (or work a crash left pending)."""
    phase = stored.state.phase.kind
    if stored.pending or phase not in ("idle", "paused", "context_exhausted", "failed"):
        msg = (
            f"conversation {stored.state.id} is {phase} with work in flight: pause it in "
            "the process running it (segue serve: POST /api/conversations/ID/pause)"
        )
        raise CliError(msg, 1)


async def _pause(
    given: str,
    db: Path,
    *,
    reason: str,
    offline: bool,
    base_url: str | None,
    headers: dict[str, str],
) -> None:
    out = console()
    async with contextlib.AsyncExitStack() as stack:
        store = existing_store(db, read_only=False)
        stack.push_async_callback(store.close)
        cid = await resolve(store, given)
        stored = await store.load(cid)
        phase = stored.state.phase.kind
        if phase == "paused":
            raise CliError(f"conversation {cid} is already paused", 1)
        _must_be_still(stored)
        if phase != "idle":
            raise CliError(f"conversation {cid} is {phase}: only a live conversation pauses", 1)
        llm = await stack.enter_async_context(
            model_for(stored.state, offline=offline, base_url=base_url, headers=headers)
        )
        runtime = Runtime(store=store, llm=llm)  # not entered: recovers no one else's work
        stack.push_async_callback(runtime.close)
        narrate(runtime, out)
        state = await runtime.pause(cid, reason)
        if state.phase.kind != "paused":
            raise CliError(f"conversation {cid} did not pause: it is {state.phase.kind}", 1)
        snapshot = (await store.snapshots(cid))[-1]
        say(out, f"paused {cid}: snapshot v{snapshot.version} saved", "bold")
        say(out, f"checkpoint: {clip(snapshot.checkpoint, 200)}")
        meter(out, "context", state)


@app.command()
def pause(
    conversation_id: IdArgument,
    reason: Annotated[str, typer.Option(help="Why (kept in the snapshot).")] = "",
    db: DbOption = Path("segue.db"),
    offline: OfflineOption = False,
    base_url: BaseUrlOption = None,
    header: HeaderOption = None,
) -> None:
    """Pause an idle conversation: the model writes a checkpoint, kept as a snapshot."""
    headers = headers_of(header)
    run(
        _pause(
            conversation_id, db, reason=reason, offline=offline, base_url=base_url, headers=headers
        )
    )


async def _resume(
    given: str,
    db: Path,
    *,
    prompt: str | None,
    offline: bool,
    base_url: str | None,
    headers: dict[str, str],
) -> None:
    out = console()
    async with contextlib.AsyncExitStack() as stack:
        store = existing_store(db, read_only=False)
        stack.push_async_callback(store.close)
        cid = await resolve(store, given)
        stored = await store.load(cid)
        if stored.state.phase.kind != "paused":
            raise CliError(f"conversation {cid} is {stored.state.phase.kind}, not paused", 1)
        _must_be_still(stored)
        llm = await stack.enter_async_context(
            model_for(stored.state, offline=offline, base_url=base_url, headers=headers)
        )
        runtime = Runtime(store=store, llm=llm)
        stack.push_async_callback(runtime.close)
        narrate(runtime, out)
        state = await runtime.resume(cid, prompt)
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
    offline: OfflineOption = False,
    base_url: BaseUrlOption = None,
    header: HeaderOption = None,
) -> None:
    """Resume a paused conversation in a new session, from its snapshot."""
    headers = headers_of(header)
    run(
        _resume(
            conversation_id, db, prompt=prompt, offline=offline, base_url=base_url, headers=headers
        )
    )
