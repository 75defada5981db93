"""What the stores share, so that ``MemoryStore``, ``SqliteStore`` and ``PostgresStore`` keep
only what differs between them (driver, SQL dialect, locking, connection handling).

- **The contract's refusals**, worded once: an unknown id, a commit carrying another
  conversation's state, a version that moved, a snapshot saved again with other content.
- **The event log line** every store writes for a commit and reads back as a
  ``TransitionRecord``.
- **Rows for the two SQL stores**, whose tables have the same columns in the same order (each
  store's migrations say so in its own dialect): what ``create`` and ``commit`` write, encoded
  before the store takes its write lock so the lock is held for SQL only, and what ``load``,
  ``list_conversations`` and ``transitions`` read back. Column lists in the comments below are
  the order the rows must be bound or selected in.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from segue.executor.ports import (
    Commit,
    ConcurrentUpdateError,
    ConversationNotFoundError,
    InvalidTextError,
    PendingEffect,
    SegueError,
    StoredConversation,
    TransitionRecord,
)
from segue.executor.stores.codec import (
    dump_effect,
    dump_message,
    dump_state,
    load_effect,
    load_state,
)
from segue.statemachine import ConversationState, Message
from segue.statemachine.checkpoint import SessionSnapshot
from segue.statemachine.effects import AppendMessage, Effect

# --------------------------------------------------------------------------- refusals


def not_found(conversation_id: str) -> ConversationNotFoundError:
    return ConversationNotFoundError(f"no conversation {conversation_id!r} in this store")


def check_storable(state: ConversationState, system: str | None) -> None:
    """Refuse what PostgreSQL's text type cannot hold (a NUL), on every store alike, so a
    conversation that works in tests on SQLite does not fail in production. Message text is
    stored as JSON, where a NUL is an escape, so it round-trips everywhere."""
    config = state.config
    fields = {"id": config.id, "parent id": config.parent_id, "model": config.model}
    fields["system prompt"] = system
    for name, value in fields.items():
        if value is not None and "\x00" in value:
            msg = f"the conversation's {name} holds a NUL character, which no store can keep"
            raise InvalidTextError(msg)


def claimable(pending: PendingEffect, *, owner: str, now: float, take_from: str | None) -> bool:
    """Whether ``owner`` may claim ``pending``: nobody holds it, its lease is over, ``owner``
    holds it already, or its holder is ``take_from`` (known dead)."""
    holder = pending.owner
    if holder is None or holder in {owner, take_from}:
        return True
    return pending.lease_until is None or pending.lease_until < now


def check_commit_target(commit: Commit) -> None:
    """A commit must carry the state of the conversation it is for, and nothing a store
    cannot keep."""
    if commit.state.config.id != commit.conversation_id:
        msg = (
            f"commit for {commit.conversation_id!r} carries the state of {commit.state.config.id!r}"
        )
        raise SegueError(msg)
    check_storable(commit.state, None)
    key = commit.idempotency_key
    if key is not None and "\x00" in key:
        msg = "the idempotency key holds a NUL character, which no store can keep"
        raise InvalidTextError(msg)


def version_moved(conversation_id: str, version: int, expected: int) -> ConcurrentUpdateError:
    return ConcurrentUpdateError(
        f"conversation {conversation_id!r} is at version {version}, not {expected}: "
        "another writer committed first"
    )


def check_snapshot_unchanged(existing: SessionSnapshot, snapshot: SessionSnapshot) -> None:
    """Saving a snapshot again is harmless (a runtime finishing its outbox after a crash does
    it); saving a different one under a used version would overwrite history, so it is refused."""
    if existing != snapshot:
        msg = (
            f"snapshot v{snapshot.version} of conversation {snapshot.conversation_id!r} "
            "already exists with other content; snapshots are never overwritten"
        )
        raise SegueError(msg)


# --------------------------------------------------------------------------- the event log

LogLine = tuple[int, str, str, str, str, int | None, str, tuple[str, ...], float, int | None]
"""An event log line as written: the fields of a ``TransitionRecord`` in order (seq, event_kind,
event_json, from_phase, to_phase, context_tokens, reason, effect_kinds, at, session). A plain
tuple of strings and numbers holds no containers, so ``MemoryStore`` keeps a long log of them at
no cost to the cyclic GC and builds the record only for the (rare) reader."""


def log_line(commit: Commit, effect_kinds: tuple[str, ...]) -> LogLine:
    """The line ``commit`` adds to the log; its seq is the version it was committed on."""
    state = commit.state
    return (
        commit.expected_version,
        commit.event_kind,
        commit.event_json,
        commit.from_phase,
        state.phase.kind,
        state.context_tokens,
        commit.reason,
        effect_kinds,
        commit.at,
        commit.session,
    )


def transition_record(line: LogLine) -> TransitionRecord:
    seq, event_kind, event_json, from_phase, to_phase, tokens, reason, kinds, at, session = line
    return TransitionRecord(
        seq=seq,
        event_kind=event_kind,
        event_json=event_json,
        from_phase=from_phase,
        to_phase=to_phase,
        context_tokens=tokens,
        reason=reason,
        effect_kinds=kinds,
        at=at,
        session=session,
    )


def transition_from_row(row: Sequence[Any]) -> TransitionRecord:
    """A record from ``transitions`` (seq, event_kind, event, from_phase, to_phase,
    context_tokens, reason, effect_kinds, at, session); ``effect_kinds`` is stored as a JSON
    list."""
    seq, event_kind, event_json, from_phase, to_phase, tokens, reason, kinds, at, session = row
    return transition_record(
        (
            seq,
            event_kind,
            event_json,
            from_phase,
            to_phase,
            tokens,
            reason,
            tuple(json.loads(kinds)),
            at,
            session,
        )
    )


# --------------------------------------------------------------------------- SQL rows


def conversation_row(
    state: ConversationState, system: str | None, message_count: int, at: float
) -> tuple[Any, ...]:
    """A new ``conversations`` row at version 1: (id, parent_id, state, phase, system,
    message_count, created_at, updated_at)."""
    return (
        state.config.id,
        state.config.parent_id,
        dump_state(state),
        state.phase.kind,
        system,
        message_count,
        at,
        at,
    )


def message_rows(
    conversation_id: str, messages: Sequence[tuple[str, str]], first_seq: int
) -> list[tuple[str, int, str, str]]:
    """``messages`` rows (conversation_id, seq, kind, message) for encoded (kind, text) pairs."""
    return [
        (conversation_id, seq, kind, text) for seq, (kind, text) in enumerate(messages, first_seq)
    ]


def seed_rows(conversation_id: str, messages: Sequence[Message]) -> list[tuple[str, int, str, str]]:
    """``messages`` rows for a new conversation's seed messages (seqs 1..n)."""
    return message_rows(
        conversation_id, [(message.kind, dump_message(message)) for message in messages], 1
    )


def outbox_keys(conversation_id: str, effect_ids: Sequence[int]) -> list[tuple[str, int]]:
    """(conversation_id, id) keys of ``outbox`` rows to delete."""
    return [(conversation_id, effect_id) for effect_id in effect_ids]


def pending_effect(row: Sequence[Any], effect: Effect | None = None) -> PendingEffect:
    """An outbox row (id, effect, owner, lease_until) as a ``PendingEffect``; ``effect`` when
    the caller still holds it as an object (no need to decode it)."""
    effect_id, text, owner, lease_until = row
    return PendingEffect(
        id=effect_id,
        effect=effect if effect is not None else load_effect(text),
        owner=owner,
        lease_until=lease_until,
    )


def loaded(conversation_id: str, rows: Sequence[Sequence[Any]]) -> StoredConversation:
    """The conversation from ``load``'s one statement: its row joined with its outbox, one row
    per pending effect (state, version, system, child_id, created_at, message_count, outbox id,
    effect, owner, lease_until), or one row with a NULL id when nothing is pending."""
    if not rows:
        raise not_found(conversation_id)
    state, version, system, child_id, created_at, last_seq, first_id, *_ = rows[0]
    pending = () if first_id is None else tuple(pending_effect(row[6:]) for row in rows)
    return StoredConversation(
        state=load_state(state),
        version=version,
        system=system,
        pending=pending,
        child_id=child_id,
        created_at=created_at,
        last_seq=last_seq,
    )


def listed(row: Sequence[Any]) -> StoredConversation:
    """A conversation from ``list_conversations`` (state, version, system, child_id,
    created_at), without its pending effects."""
    state, version, system, child_id, created_at = row
    return StoredConversation(
        state=load_state(state),
        version=version,
        system=system,
        child_id=child_id,
        created_at=created_at,
    )


@dataclass(frozen=True, slots=True)
class CommitRows:
    """A ``Commit`` encoded for the SQL tables (build it with ``commit_rows``)."""

    commit: Commit
    appended: list[tuple[str, str]]
    """(kind, message JSON) of every ``AppendMessage``, in order."""
    queued: list[tuple[Effect, str]]
    """Every other effect with its JSON, in order: the new outbox entries."""
    update: tuple[Any, ...]
    """Parameters of the version-guarded ``UPDATE conversations``: (state, phase, messages
    added, effects added, updated_at, id, expected version)."""
    transition: tuple[Any, ...]
    """The ``transitions`` row: (conversation_id, *the log line with the effect kinds as
    JSON)."""
    completes: list[tuple[str, int]]
    """Keys of the outbox rows this step finished."""

    def messages(self, message_count: int) -> list[tuple[str, int, str, str]]:
        """The ``messages`` rows, given ``message_count`` as the UPDATE left it."""
        conversation_id = self.commit.conversation_id
        return message_rows(conversation_id, self.appended, message_count - len(self.appended) + 1)

    def outbox(self, effect_count: int) -> list[tuple[str, int, str, str | None, float | None]]:
        """The ``outbox`` rows (conversation_id, id, effect, owner, lease_until), given
        ``effect_count`` as the UPDATE left it: claimed by the commit's owner, if any."""
        commit = self.commit
        conversation_id, owner, lease = commit.conversation_id, commit.owner, commit.lease_until
        first_id = effect_count - len(self.queued) + 1
        return [
            (conversation_id, effect_id, text, owner, lease)
            for effect_id, (_, text) in enumerate(self.queued, first_id)
        ]

    def stored(
        self, counters: Sequence[Any], pending_rows: Sequence[Sequence[Any]]
    ) -> StoredConversation:
        """The conversation as committed, from the row the UPDATE left (message_count,
        effect_count, system, child_id, created_at) and the outbox read after it (id, effect,
        owner, lease_until). Effects queued by this step are still live objects; only older
        ones are decoded."""
        message_count, effect_count, system, child_id, created_at = counters
        queued = self.queued
        first_id = effect_count - len(queued) + 1
        pending = tuple(
            pending_effect(row, queued[row[0] - first_id][0] if row[0] >= first_id else None)
            for row in pending_rows
        )
        return StoredConversation(
            state=self.commit.state,
            version=self.commit.expected_version + 1,
            system=system,
            pending=pending,
            child_id=child_id,
            created_at=created_at,
            last_seq=message_count,
        )


def commit_rows(commit: Commit) -> CommitRows:
    """Check ``commit`` is for its own conversation and encode everything it writes."""
    check_commit_target(commit)
    conversation_id = commit.conversation_id
    state = commit.state
    appended: list[tuple[str, str]] = []
    queued: list[tuple[Effect, str]] = []
    for effect in commit.effects:
        if isinstance(effect, AppendMessage):
            appended.append((effect.message.kind, dump_message(effect.message)))
        else:
            queued.append((effect, dump_effect(effect)))
    *line, kinds, at, session = log_line(commit, tuple(effect.kind for effect in commit.effects))
    return CommitRows(
        commit=commit,
        appended=appended,
        queued=queued,
        update=(
            dump_state(state),
            state.phase.kind,
            len(appended),
            len(queued),
            commit.at,
            conversation_id,
            commit.expected_version,
        ),
        transition=(conversation_id, *line, json.dumps(kinds), at, session),
        completes=outbox_keys(conversation_id, commit.completes),
    )
