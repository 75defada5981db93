"""What the runtime adds to a snapshot before it stores it, and the built-in git capture.

The core takes a snapshot with what it knows: the checkpoint, its sections and the decisions it
states. The rest is in the store or the world, so the runtime adds it when it performs
``SaveSnapshot``: when it was saved; what the session did (its LLM calls, tool calls, their
token cost and the errors it met, read from the transcript and the event log since the session
began); the decisions the session's replies state; and the application's own context from a
``snapshot_context`` callable (task state, test state, the git state ``git_context`` captures).
On resume the same callable says what the context is now, so a HEAD that moved is stated.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from segue.executor._log import get_logger
from segue.executor.store_port import LogReader, StoredMessage, TransitionRecord
from segue.statemachine import Usage
from segue.statemachine.checkpoint import (
    ERROR_CHARS,
    MAX_ERRORS,
    SessionSnapshot,
    extract_decisions,
    shortened,
)

SnapshotContext = Callable[[str], Mapping[str, Any] | Awaitable[Mapping[str, Any] | None] | None]
"""Called with a conversation id; returns JSON-serialisable application context (or None)."""

_log = get_logger("segue.runtime")
_ANSWERS: Final = frozenset(
    {
        "llm_response",
        "continuation_response",
        "checkpoint_response",
        "compaction_response",
    }
)
_FAILURES: Final = frozenset(
    {"llm_error", "continuation_failed", "checkpoint_failed", "compaction_failed"}
)
_COSTED: Final = frozenset({"assistant", "continuation", "checkpoint", "summary"})
"""Message kinds that carry the usage of the request that produced them."""
_GIT_TIMEOUT: Final = 10.0


async def context_of(source: SnapshotContext | None, conversation_id: str) -> dict[str, Any] | None:
    """What ``source`` says the application's context is now, as JSON data; None if there is no
    source, it has nothing, or it fails (a failure is logged: a pause must not fail for it)."""
    if source is None:
        return None
    try:
        found = source(conversation_id)
        if inspect.isawaitable(found):
            found = await found
        if found is None:
            return None
        data = json.loads(json.dumps(dict(found), default=str))
    except Exception as error:  # noqa: BLE001  # the host's callable: report, never propagate
        _log.warning(
            "snapshot_context_failed",
            conversation_id=conversation_id,
            error_type=type(error).__name__,
        )
        return None
    return data if isinstance(data, dict) else None


def enriched(
    snapshot: SessionSnapshot,
    messages: Sequence[StoredMessage],
    log: Sequence[TransitionRecord],
    *,
    saved_at: float,
    context: dict[str, Any] | None,
) -> SessionSnapshot:
    """``snapshot`` with what the session did, when it was saved and the application context.

    ``messages`` and ``log`` are the conversation's transcript and event log; only the part of
    the snapshot's session counts (the log since the last ``start_session``)."""
    session = [m.message for m in messages if m.message.session == snapshot.session]
    since = _since_session_start(log)
    answered = [r for r in since if r.event_kind in _ANSWERS and _acted(r)]
    failed = [r for r in since if r.event_kind in _FAILURES and _acted(r)]
    tools = [r for r in since if r.event_kind == "tool_result" and _acted(r)]
    usages = [m.usage for m in session if m.kind in _COSTED and m.usage is not None]
    errors = tuple(shortened(_error_text(r), ERROR_CHARS) for r in failed)[-MAX_ERRORS:]
    replies = [m.text for m in session if m.kind == "assistant" and m.text]
    started = _session_started_at(log)
    return snapshot.model_copy(
        update={
            "created_at": saved_at,
            "session_seconds": None if started is None else max(0.0, saved_at - started),
            "llm_calls": len(answered) + len(failed),
            "tool_calls": len(tools),
            "usage": _total(usages) if usages else None,
            "errors": errors,
            "decisions": extract_decisions(snapshot.checkpoint, replies),
            "context": context,
        }
    )


def _since_session_start(log: Sequence[TransitionRecord]) -> Sequence[TransitionRecord]:
    for index in range(len(log) - 1, -1, -1):
        if "start_session" in log[index].effect_kinds:
            return log[index + 1 :]
    return log


def _session_started_at(log: Sequence[TransitionRecord]) -> float | None:
    """When the current session began: the commit that started it, or the conversation's first
    commit for its first session."""
    for record in reversed(log):
        if "start_session" in record.effect_kinds:
            return record.at
    return log[0].at if log else None


def _acted(record: TransitionRecord) -> bool:
    """Whether the event was taken (a stale answer changes nothing and asks for nothing)."""
    return bool(record.effect_kinds) or record.from_phase != record.to_phase


def _error_text(record: TransitionRecord) -> str:
    try:
        event = json.loads(record.event_json)
    except ValueError:
        return record.event_kind
    text = event.get("message") or event.get("error") or record.event_kind
    return str(text)


def _total(usages: Sequence[Usage]) -> Usage:
    return Usage(
        input_tokens=sum(u.input_tokens for u in usages),
        output_tokens=sum(u.output_tokens for u in usages),
        cache_creation_input_tokens=sum(u.cache_creation_input_tokens for u in usages),
        cache_read_input_tokens=sum(u.cache_read_input_tokens for u in usages),
    )


async def stored_snapshot(
    store: LogReader,
    snapshot: SessionSnapshot,
    *,
    saved_at: float,
    context: dict[str, Any] | None,
) -> SessionSnapshot:
    """The snapshot as it is stored: ``enriched`` from the store's own record."""
    conversation_id = snapshot.conversation_id
    messages = await store.messages(conversation_id)
    log = await store.transitions(conversation_id)
    return enriched(snapshot, messages, log, saved_at=saved_at, context=context)


# --------------------------------------------------------------------------- git


def git_context(directory: str | Path) -> SnapshotContext:
    """A ``snapshot_context`` that captures the git state of ``directory``: branch, HEAD and
    the files with changes, as ``{"git": {"branch", "head", "dirty"}}`` (nothing outside a
    repository, or without git). On resume, a HEAD that moved is stated in the resume context.
    """
    root = Path(directory)

    async def capture(_conversation_id: str) -> Mapping[str, Any] | None:
        return await asyncio.to_thread(_git_state, root)

    return capture


def _git_state(root: Path) -> dict[str, Any] | None:
    git = shutil.which("git")
    if git is None or not root.is_dir():
        return None

    def run(*args: str) -> str | None:
        try:
            done = subprocess.run(  # noqa: S603  # git, found on PATH, with fixed arguments
                [git, "-C", str(root), *args],
                capture_output=True,
                text=True,
                timeout=_GIT_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    head = run("rev-parse", "HEAD")
    if head is None:
        return None
    branch = run("rev-parse", "--abbrev-ref", "HEAD") or ""
    status = run("status", "--porcelain") or ""
    dirty = sorted(line[3:] for line in status.splitlines() if len(line) > 3)
    return {"git": {"branch": branch.strip(), "head": head.strip(), "dirty": dirty}}
