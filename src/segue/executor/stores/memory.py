"""``MemoryStore``: the ``Store`` contract held in a process's memory.

It exists for tests and for measuring the runtime's own per-event overhead, so it is built to
cost as little as possible per commit: states, messages and effects are kept as the live,
immutable objects the core made (nothing is JSON-encoded), every per-conversation record is an
append-only list, and an event log line is a tuple until someone reads it. A commit therefore
costs the same at the ten-thousandth message as at the tenth.

Atomicity comes from asyncio itself: no method awaits between checking and writing, so each one
runs to completion before another coroutine can look. Writers of one conversation are
serialised by the version check, exactly as in the persistent stores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from segue.effects import AppendMessage, StartGeneration, StartSession
from segue.executor.errors import DuplicateMessageError
from segue.executor.store_port import (
    Commit,
    ConversationPage,
    ConversationRecord,
    PendingEffect,
    StoredConversation,
    StoredMessage,
    TransitionRecord,
    WholeConversation,
)
from segue.executor.stores._rows import (
    START_GENERATION,
    START_NONE,
    Landmark,
    landmark,
    transcript_landmarks,
)
from segue.executor.stores._shared import (
    LogLine,
    PageRequest,
    already_exists,
    check_commit_target,
    check_snapshot_unchanged,
    check_storable,
    checked_metadata,
    claimable,
    line_of,
    log_line,
    not_found,
    transition_record,
    version_moved,
)
from segue.statemachine import ConversationState, Message
from segue.statemachine.checkpoint import SessionSnapshot


@dataclass(slots=True)
class _Conversation:
    """One conversation's mutable record; every list only ever grows (the outbox aside)."""

    state: ConversationState
    version: int
    system: str | None
    created_at: float
    order: int
    """Insertion order, to break ties between equal ``created_at``."""
    updated_at: float
    child_id: str | None = None
    messages: list[StoredMessage] = field(default_factory=list)
    log: list[LogLine] = field(default_factory=list)
    outbox: dict[int, PendingEffect] = field(default_factory=dict)
    effect_count: int = 0
    """Ids handed out so far: an outbox id is never reused, even after it is completed."""
    snapshots: dict[int, SessionSnapshot] = field(default_factory=dict)
    keys: set[str] = field(default_factory=set)
    """Idempotency keys of the commits that carried one."""
    landmarks: list[Landmark] = field(default_factory=list)
    """The messages that start a session or a generation, or are pinned (``_rows.landmark``),
    by seq: what the SQL stores index."""
    metadata: dict[str, str] = field(default_factory=dict)

    def stored(self, *, with_pending: bool = True, metadata: bool = True) -> StoredConversation:
        return StoredConversation(
            state=self.state,
            version=self.version,
            system=self.system,
            pending=tuple(self.outbox.values()) if with_pending else (),
            child_id=self.child_id,
            created_at=self.created_at,
            last_seq=len(self.messages),
            metadata=dict(self.metadata) if metadata else {},
        )

    def matches(self, pairs: Sequence[tuple[str, str]]) -> bool:
        """Whether the metadata holds every pair."""
        return all(self.metadata.get(key) == value for key, value in pairs)


class MemoryStore:
    """A ``Store`` in memory: fast, private to one process, gone when the process ends.

    Methods do what ``Store`` (in ``store_port``) says; their notes here say only how.
    """

    def __init__(self) -> None:
        self._conversations: dict[str, _Conversation] = {}
        self._created = 0
        """Conversations created so far: each one's ``order`` (never reused after a delete)."""

    def _get(self, conversation_id: str) -> _Conversation:
        try:
            return self._conversations[conversation_id]
        except KeyError:
            raise not_found(conversation_id) from None

    async def create(
        self,
        state: ConversationState,
        *,
        system: str | None,
        messages: Sequence[Message] = (),
        at: float = 0.0,
        metadata: Mapping[str, str] | None = None,
    ) -> StoredConversation:
        conversation_id = state.config.id
        check_storable(state, system)
        tags = checked_metadata(metadata)
        if conversation_id in self._conversations:
            raise already_exists(conversation_id)
        record = _Conversation(
            state=state,
            version=1,
            system=system,
            created_at=at,
            order=self._created,
            updated_at=at,
            metadata=tags,
        )
        self._created += 1
        record.messages.extend(
            StoredMessage(seq=seq, message=message) for seq, message in enumerate(messages, 1)
        )
        record.landmarks.extend(transcript_landmarks(messages))
        self._conversations[conversation_id] = record
        return record.stored()

    async def load(self, conversation_id: str) -> StoredConversation:
        return self._get(conversation_id).stored()

    async def commit(self, commit: Commit) -> StoredConversation:
        """Apply ``commit``: everything is checked before the first write, so a refused commit
        leaves nothing behind."""
        record = self._get(commit.conversation_id)
        check_commit_target(commit)
        key = commit.idempotency_key
        if key is not None and key in record.keys:
            raise DuplicateMessageError(commit.conversation_id, key)
        if record.version != commit.expected_version:
            raise version_moved(commit.conversation_id, record.version, commit.expected_version)
        messages = record.messages
        outbox = record.outbox
        kinds: list[str] = []
        owner, lease = commit.owner, commit.lease_until
        opening = False
        for effect in commit.effects:
            kinds.append(effect.kind)
            if isinstance(effect, AppendMessage):
                messages.append(StoredMessage(seq=len(messages) + 1, message=effect.message))
                mark = landmark(len(messages), effect.message, opening)
                if mark is not None:
                    record.landmarks.append(mark)
                opening = False
            else:
                opening = opening or isinstance(effect, StartSession | StartGeneration)
                record.effect_count += 1
                outbox[record.effect_count] = PendingEffect(
                    id=record.effect_count, effect=effect, owner=owner, lease_until=lease
                )
        for effect_id in commit.completes:
            outbox.pop(effect_id, None)
        if key is not None:
            record.keys.add(key)
        record.log.append(log_line(commit, tuple(kinds)))
        record.version += 1
        record.state = commit.state
        record.updated_at = commit.at
        return record.stored(metadata=False)

    async def complete(self, conversation_id: str, effect_ids: Sequence[int]) -> None:
        outbox = self._get(conversation_id).outbox
        for effect_id in effect_ids:
            outbox.pop(effect_id, None)

    async def claim(
        self,
        conversation_id: str,
        effect_id: int,
        *,
        owner: str,
        lease_until: float,
        now: float,
        take_from: str | None = None,
    ) -> PendingEffect | None:
        outbox = self._get(conversation_id).outbox
        pending = outbox.get(effect_id)
        if pending is None or not claimable(pending, owner=owner, now=now, take_from=take_from):
            return pending
        claimed = dataclasses.replace(pending, owner=owner, lease_until=lease_until)
        outbox[effect_id] = claimed
        return claimed

    async def renew(
        self, conversation_id: str, effect_ids: Sequence[int], *, owner: str, lease_until: float
    ) -> bool:
        outbox = self._get(conversation_id).outbox
        held = [outbox.get(effect_id) for effect_id in effect_ids]
        mine = [pending for pending in held if pending is not None and pending.owner == owner]
        for pending in mine:
            outbox[pending.id] = dataclasses.replace(pending, lease_until=lease_until)
        return len(mine) == len(held)

    async def release(self, conversation_id: str, effect_ids: Sequence[int], *, owner: str) -> None:
        outbox = self._get(conversation_id).outbox
        for effect_id in effect_ids:
            pending = outbox.get(effect_id)
            if pending is not None and pending.owner == owner:
                outbox[effect_id] = dataclasses.replace(pending, owner=None, lease_until=None)

    async def messages(
        self, conversation_id: str, *, after_seq: int = 0, before_seq: int | None = None
    ) -> list[StoredMessage]:
        # seq N sits at index N - 1
        end = None if before_seq is None else max(before_seq - 1, 0)
        return self._get(conversation_id).messages[max(after_seq, 0) : end]

    async def generation_start(
        self, conversation_id: str, session: int | None, generation: int
    ) -> int:
        for seq, mark_session, mark_generation, start, _ in reversed(
            self._get(conversation_id).landmarks
        ):
            if session is None:
                if start == START_GENERATION and mark_generation <= generation:
                    return seq
            elif start != START_NONE and (mark_session, mark_generation) <= (session, generation):
                return seq
        return 1

    async def pinned_messages(
        self, conversation_id: str, *, before_seq: int
    ) -> list[StoredMessage]:
        record = self._get(conversation_id)
        return [
            record.messages[seq - 1]
            for seq, *_, pinned in record.landmarks
            if pinned and seq < before_seq
        ]

    async def transitions(
        self, conversation_id: str, *, after_seq: int = 0
    ) -> list[TransitionRecord]:
        log = self._get(conversation_id).log
        return [transition_record(line) for line in log[max(0, after_seq) :]]

    async def list_conversations(self) -> list[StoredConversation]:
        records = sorted(self._conversations.values(), key=lambda r: (r.created_at, r.order))
        return [record.stored(with_pending=False) for record in records]

    async def with_pending(self) -> list[str]:
        return [cid for cid, record in self._conversations.items() if record.outbox]

    async def list_page(
        self,
        *,
        metadata: Mapping[str, str] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> ConversationPage:
        """A sort of every conversation: memory holds few, and none of them for long."""
        request = PageRequest.of(metadata, limit, cursor)
        after = request.after
        records = sorted(
            (
                record
                for record in self._conversations.values()
                if record.matches(request.pairs)
                and (after is None or (record.created_at, record.order) < after)
            ),
            key=lambda record: (record.created_at, record.order),
            reverse=True,
        )
        return request.page(
            records[: request.limit + 1],
            lambda record: record.stored(with_pending=False),
            lambda record: (record.created_at, record.order),
        )

    async def set_metadata(
        self, conversation_id: str, metadata: Mapping[str, str]
    ) -> StoredConversation:
        tags = checked_metadata(metadata)
        record = self._get(conversation_id)
        record.metadata = tags
        return record.stored()

    async def inactive(
        self, *, before: float, metadata: Mapping[str, str] | None = None
    ) -> list[str]:
        pairs = sorted(checked_metadata(metadata).items())
        found = [
            record
            for record in self._conversations.values()
            if record.updated_at < before and record.matches(pairs)
        ]
        found.sort(key=lambda record: (record.updated_at, record.order))
        return [record.state.id for record in found]

    async def delete(
        self,
        conversation_id: str,
        *,
        also: Sequence[str] = (),
        idle_before: float | None = None,
        metadata: Mapping[str, str] | None = None,
        files: Callable[[str], object] | None = None,
    ) -> list[str]:
        """No await between the check and the last deletion: nothing else runs meanwhile."""
        record = self._get(conversation_id)
        pairs = sorted(checked_metadata(metadata).items())
        if (idle_before is not None and record.updated_at >= idle_before) or not record.matches(
            pairs
        ):
            return []
        ids = [conversation_id, *(c for c in dict.fromkeys(also) if c != conversation_id)]
        present = [cid for cid in ids if cid in self._conversations]
        for cid in present:
            if files is not None:
                files(cid)
        for cid in present:
            self._unlink(self._conversations.pop(cid))
        return present

    def _unlink(self, gone: _Conversation) -> None:
        """Its neighbours name it nowhere: the parent's child, the child's parent."""
        conversation_id = gone.state.id
        parent_id = gone.state.parent_id
        parent = None if parent_id is None else self._conversations.get(parent_id)
        if parent is not None and parent.child_id == conversation_id:
            parent.child_id = None
        child = None if gone.child_id is None else self._conversations.get(gone.child_id)
        if child is not None and child.state.parent_id == conversation_id:
            config = child.state.config.model_copy(update={"parent_id": None})
            child.state = child.state.model_copy(update={"config": config})

    async def whole(self, conversation_id: str) -> WholeConversation:
        record = self._get(conversation_id)
        return WholeConversation(
            stored=record.stored(),
            messages=tuple(record.messages),
            transitions=tuple(transition_record(line) for line in record.log),
            snapshots=tuple(record.snapshots[version] for version in sorted(record.snapshots)),
        )

    async def restore(self, record: ConversationRecord) -> StoredConversation:
        state = record.state
        conversation_id = state.config.id
        check_storable(state, record.system)
        tags = checked_metadata(record.metadata)
        if conversation_id in self._conversations:
            raise already_exists(conversation_id)
        restored = _Conversation(
            state=state,
            version=record.version,
            system=record.system,
            created_at=record.created_at,
            order=self._created,
            updated_at=record.updated_at,
            metadata=tags,
        )
        self._created += 1
        restored.messages.extend(
            StoredMessage(seq=seq, message=message)
            for seq, message in enumerate(record.messages, 1)
        )
        restored.landmarks.extend(transcript_landmarks(record.messages))
        restored.log.extend(line_of(line) for line in record.transitions)
        for effect_id, effect in enumerate(record.pending, 1):
            restored.outbox[effect_id] = PendingEffect(id=effect_id, effect=effect)
        restored.effect_count = len(record.pending)
        restored.snapshots.update({snapshot.version: snapshot for snapshot in record.snapshots})
        self._conversations[conversation_id] = restored
        return restored.stored()

    async def link_child(self, parent_id: str, child_id: str) -> str:
        record = self._get(parent_id)
        if record.child_id is None:
            record.child_id = child_id
        return record.child_id

    async def save_snapshot(self, snapshot: SessionSnapshot) -> None:
        snapshots = self._get(snapshot.conversation_id).snapshots
        existing = snapshots.get(snapshot.version)
        if existing is not None:
            check_snapshot_unchanged(existing, snapshot)
            return
        snapshots[snapshot.version] = snapshot

    async def snapshots(self, conversation_id: str) -> list[SessionSnapshot]:
        snapshots = self._get(conversation_id).snapshots
        return [snapshots[version] for version in sorted(snapshots)]

    async def close(self) -> None:
        """Nothing to release; the data stays readable until the store is dropped."""

    async def reopen(self) -> None:
        """Nothing to open again (``close()`` released nothing)."""
