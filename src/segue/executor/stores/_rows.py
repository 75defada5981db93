"""Rows for the two SQL stores, whose tables have the same columns (each store's migrations say
so in its own dialect): what ``create`` and ``commit`` write, encoded before the store takes its
write lock so that the lock is held for SQL only, and what ``load`` and ``list_conversations``
read back. Column lists in the docstrings below are the order the rows are bound or selected in.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from segue.effects import AppendMessage, Effect, StartGeneration, StartSession
from segue.executor.store_port import (
    Commit,
    ConversationRecord,
    PendingEffect,
    StoredConversation,
)
from segue.executor.stores import _outbox
from segue.executor.stores._outbox import Entry
from segue.executor.stores._shared import check_commit_target, line_of, log_line, not_found
from segue.executor.stores.codec import (
    dump_effect,
    dump_message,
    dump_snapshot,
    dump_state,
    load_state,
)
from segue.statemachine import ConversationState, Message


def conversation_row(
    state: ConversationState, system: str | None, message_count: int, at: float
) -> tuple[Any, ...]:
    """A new ``conversations`` row at version 1, its outbox empty: (id, parent_id, state,
    phase, system, message_count, created_at, updated_at)."""
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


class EncodedMessages(Sequence[tuple[str, int, str, str]]):
    """An import's ``messages`` rows (seqs 1..n), each encoded as it is read: a transcript of
    many megabytes is never held twice (once as messages, again as their JSON)."""

    def __init__(self, conversation_id: str, messages: Sequence[Message]) -> None:
        self._id, self._messages = conversation_id, messages

    def __len__(self) -> int:
        return len(self._messages)

    @overload
    def __getitem__(self, index: int) -> tuple[str, int, str, str]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, int, str, str]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> tuple[str, int, str, str] | list[tuple[str, int, str, str]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        place = range(len(self._messages))[index]
        message = self._messages[place]
        return (self._id, place + 1, message.kind, dump_message(message))

    def __iter__(self) -> Iterator[tuple[str, int, str, str]]:
        for seq, message in enumerate(self._messages, 1):
            yield (self._id, seq, message.kind, dump_message(message))


Landmark = tuple[int, int, int, int, bool]
"""A message worth finding without reading the transcript: (its seq, or its place among what a
step appends, from 1; session; generation; ``START_*``; pinned)."""
START_NONE, START_SESSION, START_GENERATION = 0, 1, 2
"""What a landmark starts: nothing (a pinned message), a session, a generation (a summary)."""


def landmark(place: int, message: Message, opening: bool) -> Landmark | None:
    """``message`` as a landmark, if it is one: a summary (it starts a generation), the first
    message after a ``StartSession`` or ``StartGeneration`` (``opening``), or a pinned one."""
    if message.kind == "summary":
        start = START_GENERATION
    elif opening:
        start = START_SESSION
    elif not message.pinned:
        return None
    else:
        start = START_NONE
    return (place, message.session, message.generation, start, message.pinned)


@dataclass(frozen=True, slots=True)
class NewConversation:
    """What ``create`` writes, encoded: the row, the seed messages and their landmarks, the
    system prompt and the metadata."""

    row: tuple[Any, ...]
    seeds: Sequence[tuple[str, int, str, str]]
    """Rows to write in order (an import's are ``EncodedMessages``: encoded as written)."""
    landmarks: list[Landmark]
    system: str | None
    metadata: dict[str, str]


@dataclass(frozen=True, slots=True)
class RestoredRows:
    """A ``ConversationRecord`` encoded for the SQL tables (``restored_rows``)."""

    new: NewConversation
    """The conversation's row (at version 1 and its creation time: ``version`` and
    ``updated_at`` say what to write instead), its transcript with landmarks, its metadata."""
    version: int
    updated_at: float
    effect_count: int
    outbox: str
    """The pending work, unclaimed, ids 1..``effect_count``."""
    transitions: list[tuple[Any, ...]]
    """``transitions`` rows (seq, event_kind, event, from_phase, to_phase, context_tokens,
    reason, effect_kinds as JSON, at, session)."""
    snapshots: list[tuple[int, str]]
    """(version, JSON) of each snapshot."""


def restored_rows(record: ConversationRecord) -> RestoredRows:
    """Everything ``Store.restore`` writes, encoded before the write lock is taken."""
    state = record.state
    messages = record.messages
    texts = [dump_effect(effect) for effect in record.pending]
    return RestoredRows(
        new=NewConversation(
            row=conversation_row(state, record.system, len(messages), record.created_at),
            seeds=EncodedMessages(state.config.id, messages),
            landmarks=transcript_landmarks(messages),
            system=record.system,
            metadata=dict(record.metadata),
        ),
        version=record.version,
        updated_at=record.updated_at,
        effect_count=len(texts),
        outbox=_outbox.dump(
            [], [_outbox.entry_text(n, t, None, None) for n, t in enumerate(texts, 1)]
        ),
        transitions=[
            (*head, json.dumps(list(kinds)), at, session)
            for *head, kinds, at, session in map(line_of, record.transitions)
        ],
        snapshots=[(snapshot.version, dump_snapshot(snapshot)) for snapshot in record.snapshots],
    )


def transcript_landmarks(messages: Sequence[Message]) -> list[Landmark]:
    """The landmarks of a whole transcript (a new conversation's seed, an import): each message
    whose (session, generation) differs from the one before it starts one."""
    marks: list[Landmark] = []
    before: tuple[int, int] | None = None
    for seq, message in enumerate(messages, 1):
        now = (message.session, message.generation)
        mark = landmark(seq, message, now != before)
        before = now
        if mark is not None:
            marks.append(mark)
    return marks


_KINDS_SEPARATOR = '","'
"""Effect kinds are plain words (``append_message``): their JSON list is a join, not a
``json.dumps`` (which cost as much as a step's SQL UPDATE)."""

LOAD_COLUMNS = "state, version, system, child_id, created_at, message_count, outbox, metadata"
"""What ``loaded`` reads, in order (PostgreSQL casts the JSON columns to text; ``metadata`` is
each store's expression for the conversation's tags as a JSON object)."""
LISTED_COLUMNS = "state, version, system, child_id, created_at, metadata"
"""What ``listed`` reads, in order."""


def tags_of(text: str | None) -> dict[str, str]:
    """Metadata from the JSON object a store aggregated (None or ``{}``: none)."""
    if not text or text == "{}":
        return {}
    tags: dict[str, str] = json.loads(text)
    return tags


def loaded(conversation_id: str, row: Sequence[Any] | None) -> StoredConversation:
    """The conversation from its row (``LOAD_COLUMNS``), outbox included."""
    if row is None:
        raise not_found(conversation_id)
    state, version, system, child_id, created_at, last_seq, outbox, metadata = row
    return StoredConversation(
        state=load_state(state),
        version=version,
        system=system,
        pending=_outbox.pending_all(outbox),
        child_id=child_id,
        created_at=created_at,
        last_seq=last_seq,
        metadata=tags_of(metadata),
    )


def without_parent(state_text: str | bytes, parent_id: str) -> str | None:
    """The state JSON of a child whose parent ``parent_id`` is being deleted alone, its
    ``parent_id`` cleared (no link to a conversation that is gone); None when it names another
    parent (nothing to change)."""
    state = load_state(state_text)
    if state.config.parent_id != parent_id:
        return None
    config = state.config.model_copy(update={"parent_id": None})
    return dump_state(state.model_copy(update={"config": config}))


def listed(row: Sequence[Any]) -> StoredConversation:
    """A conversation from a listing (``LISTED_COLUMNS``), without its pending effects."""
    state, version, system, child_id, created_at, metadata = row[:6]
    return StoredConversation(
        state=load_state(state),
        version=version,
        system=system,
        child_id=child_id,
        created_at=created_at,
        metadata=tags_of(metadata),
    )


@dataclass(frozen=True, slots=True)
class Counters:
    """What a step reads back from the conversation's row once it is written."""

    message_count: int
    effect_count: int
    system: str | None
    child_id: str | None
    created_at: float


@dataclass(frozen=True, slots=True)
class CommitRows:
    """A ``Commit`` encoded for the SQL tables (build it with ``commit_rows``)."""

    commit: Commit
    state: str
    """The new state as JSON."""
    appended: list[tuple[str, str]]
    """(kind, message JSON) of every ``AppendMessage``, in order."""
    queued: list[tuple[Effect, str]]
    """Every other effect with its JSON, in order: the new outbox entries."""
    transition: tuple[Any, ...]
    """The ``transitions`` row: (conversation_id, seq, event_kind, event, from_phase, to_phase,
    context_tokens, reason, effect_kinds as JSON, at, session, idempotency_key)."""
    completes: frozenset[int]
    """Ids of the outbox entries this step finished."""
    landmarks: list[Landmark]
    """The appended messages that start a session or a generation, or are pinned (their place
    among ``appended``, from 1): rare, so a usual step writes none."""

    def messages(self, message_count: int) -> list[tuple[str, int, str, str]]:
        """The ``messages`` rows, given ``message_count`` once the step is written."""
        conversation_id = self.commit.conversation_id
        return message_rows(conversation_id, self.appended, message_count - len(self.appended) + 1)

    def entries(self, effect_count: int) -> list[str]:
        """The new outbox entries (JSON texts), given ``effect_count`` before the step: claimed
        by the commit's owner, if any."""
        commit = self.commit
        return [
            _outbox.entry_text(effect_id, text, commit.owner, commit.lease_until)
            for effect_id, (_, text) in enumerate(self.queued, effect_count + 1)
        ]

    def outbox(
        self, current: str, effect_count: int, pending: int | None = None
    ) -> tuple[str, list[Entry]]:
        """The outbox once the step is written, from ``current``, ``effect_count`` and (if
        known) the number of entries before it; and the entries kept from before (usually
        none: a step completes what was pending, so ``current`` need not be decoded)."""
        if pending is not None and _outbox.only(current, pending) <= self.completes:
            kept: list[Entry] = []
        else:
            kept = _outbox.without(_outbox.parse(current), self.completes)
        return _outbox.dump(kept, self.entries(effect_count)), kept

    def stored(self, counters: Counters, older: Sequence[Entry]) -> StoredConversation:
        """The conversation as committed: ``counters`` as the step left them, the outbox as
        ``older`` (entries from before the step, decoded) and then what the step queued (still
        live objects, never decoded)."""
        commit = self.commit
        owner, lease = commit.owner, commit.lease_until
        first_id = counters.effect_count - len(self.queued) + 1
        pending = tuple(_outbox.pending(entry) for entry in older) + tuple(
            PendingEffect(id=effect_id, effect=effect, owner=owner, lease_until=lease)
            for effect_id, (effect, _) in enumerate(self.queued, first_id)
        )
        return StoredConversation(
            state=commit.state,
            version=commit.expected_version + 1,
            system=counters.system,
            pending=pending,
            child_id=counters.child_id,
            created_at=counters.created_at,
            last_seq=counters.message_count,
        )


def commit_rows(commit: Commit) -> CommitRows:
    """Check ``commit`` is for its own conversation and encode everything it writes."""
    check_commit_target(commit)
    conversation_id = commit.conversation_id
    appended: list[tuple[str, str]] = []
    queued: list[tuple[Effect, str]] = []
    marks: list[Landmark] = []
    opening = False
    for effect in commit.effects:
        if isinstance(effect, AppendMessage):
            message = effect.message
            appended.append((message.kind, dump_message(message)))
            mark = landmark(len(appended), message, opening)
            if mark is not None:
                marks.append(mark)
            opening = False
        else:
            queued.append((effect, dump_effect(effect)))
            opening = opening or isinstance(effect, StartSession | StartGeneration)
    *line, kinds, at, session = log_line(commit, tuple(effect.kind for effect in commit.effects))
    return CommitRows(
        commit=commit,
        state=dump_state(commit.state),
        appended=appended,
        queued=queued,
        transition=(
            conversation_id,
            *line,
            f'["{_KINDS_SEPARATOR.join(kinds)}"]' if kinds else "[]",
            at,
            session,
            commit.idempotency_key,
        ),
        completes=frozenset(commit.completes),
        landmarks=marks,
    )
