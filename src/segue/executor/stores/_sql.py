"""``SqlStore``: what each ``Store`` operation means on SQL tables, written once for the dialects.

``SqliteStore`` and ``PostgresStore`` keep the same tables and the same JSON in them; they differ
in placeholders, upserts, locks, JSON casts and how a call reaches the database (a runner with
one connection and a thread, a pool of async connections), not in what an operation does. So,
as SQLAlchemy's dialects under one engine or LangGraph's savers under one base, every operation
is written here once: its checks (ids no store can hold, the contract's refusals), what it
encodes before the database is asked and what it decodes after. A dialect gives only the
primitives below, each one statement or one transaction of its own SQL, answering rows.

``commit`` stays the dialect's own: how a step is written (one guarded ``UPDATE`` and two
inserts on SQLite, one statement, or one for a whole turn of the loop, on PostgreSQL) is where
each store's speed comes from, and the meaning it shares (the rows, the new outbox, the stored
conversation it answers) is in ``_rows`` already.

The primitives return awaitables rather than being coroutines of their own where they can (a
dialect hands back its runner's or pool's), so the split costs no extra coroutine per call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

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
from segue.executor.stores import _outbox
from segue.executor.stores._rows import (
    NewConversation,
    RestoredRows,
    conversation_row,
    listed,
    loaded,
    restored_rows,
    seed_rows,
    transcript_landmarks,
)
from segue.executor.stores._shared import (
    PageRequest,
    check_snapshot_unchanged,
    check_storable,
    checked_metadata,
    holdable,
    not_found,
    require_holdable,
    transition_from_row,
)
from segue.executor.stores.codec import dump_snapshot, load_message, load_snapshot
from segue.statemachine import ConversationState, Message
from segue.statemachine.checkpoint import SessionSnapshot

T = TypeVar("T")
Row = Sequence[Any]
WholeRows = tuple[Row | None, Sequence[tuple[int, str]], Sequence[Row], Sequence[str]]
"""A conversation read whole in one transaction: its ``LOAD_COLUMNS`` row (None: not found),
its messages' (seq, JSON), its event log's rows and its snapshots' JSON."""


@dataclass(frozen=True, slots=True)
class Deletion:
    """What ``Store.delete`` was asked, checked: the ids (the first one must exist), a purge's
    conditions (``idle_before``, the metadata ``pairs``) and the files' remover."""

    ids: tuple[str, ...]
    idle_before: float | None
    pairs: Sequence[tuple[str, str]]
    files: Callable[[str], object] | None


class SqlStore(ABC):
    """The ``Store`` operations over a dialect's primitives (the abstract methods)."""

    # ------------------------------------------------------------------ the dialect

    @abstractmethod
    def _insert(self, new: NewConversation) -> Awaitable[None]:
        """Insert a conversation's row (``_rows.conversation_row``), its system prompt, its
        seed messages (``_rows.seed_rows``) with their landmarks, and its metadata, in one
        transaction; ``already_exists`` if the id is taken."""

    @abstractmethod
    def _load_row(self, conversation_id: str) -> Awaitable[Row | None]:
        """The conversation's ``_rows.LOAD_COLUMNS`` (JSON as text), None if there is none."""

    @abstractmethod
    def _outbox_step(self, conversation_id: str, change: _outbox.Change[T]) -> Awaitable[T]:
        """Read the conversation's outbox with nobody else able to write it until this ends
        (the dialect's lock), ``_outbox.apply`` the change, write back what it says to write
        (in the same transaction) and answer what the change answered; ``not_found`` if there
        is no such conversation."""

    @abstractmethod
    def _message_rows(
        self, conversation_id: str, after_seq: int, before_seq: int | None
    ) -> Awaitable[Sequence[tuple[int, str]]]:
        """(seq, message JSON) of the transcript after ``after_seq`` (and before
        ``before_seq``), in order, read with the conversation's existence (``not_found``)."""

    @abstractmethod
    def _start_seq(
        self, conversation_id: str, session: int | None, generation: int
    ) -> Awaitable[int | None]:
        """From ``landmarks``: the seq of the latest start (``START_SESSION`` or
        ``START_GENERATION``) whose (session, generation) is at or before the one given; with
        ``session=None``, of the latest ``START_GENERATION`` of a generation at or before
        ``generation``. None when there is none (``not_found``)."""

    @abstractmethod
    def _pinned_rows(
        self, conversation_id: str, before_seq: int
    ) -> Awaitable[Sequence[tuple[int, str]]]:
        """(seq, message JSON) of the pinned messages before ``before_seq``, in order
        (``not_found``)."""

    @abstractmethod
    def _transition_rows(self, conversation_id: str, after_seq: int) -> Awaitable[Sequence[Row]]:
        """The event log's rows after ``after_seq`` as ``_shared.transition_from_row`` takes
        them, in order (``not_found``)."""

    @abstractmethod
    def _snapshot_texts(self, conversation_id: str) -> Awaitable[Sequence[str]]:
        """The snapshots' JSON, oldest first (``not_found``)."""

    @abstractmethod
    def _listed_rows(self) -> Awaitable[Sequence[Row]]:
        """Every conversation as ``_rows.listed`` takes it, oldest first."""

    @abstractmethod
    def _page_rows(
        self, pairs: Sequence[tuple[str, str]], limit: int, after: tuple[float, int] | None
    ) -> Awaitable[Sequence[Row]]:
        """Up to ``limit`` conversations as ``_rows.listed`` takes them, then their place
        (``ordinal``), newest first (by creation time, then place), after the keyset ``after``,
        whose metadata holds every pair; through the index on the first pair's value and age
        (or on age alone)."""

    @abstractmethod
    def _set_tags(self, conversation_id: str, metadata: dict[str, str]) -> Awaitable[Row | None]:
        """Replace the conversation's metadata; its ``LOAD_COLUMNS`` then (None: not found)."""

    @abstractmethod
    def _inactive_ids(
        self, before: float, pairs: Sequence[tuple[str, str]]
    ) -> Awaitable[Sequence[str]]:
        """Ids of the conversations last written before ``before`` whose metadata holds every
        pair, oldest first."""

    @abstractmethod
    def _delete(self, deletion: Deletion) -> Awaitable[list[str] | None]:
        """Remove the conversations' every row in one transaction with the first one locked
        (and checked against ``idle_before`` and ``pairs``), unlink their neighbours, call
        ``files`` for each before committing; the ids deleted ([] when a condition no longer
        holds), None when the first one is not there."""

    @abstractmethod
    def _whole_rows(self, conversation_id: str) -> Awaitable[WholeRows]:
        """The conversation's rows read in one transaction (one snapshot of the database)."""

    @abstractmethod
    def _restore(self, rows: RestoredRows) -> Awaitable[None]:
        """Write a whole conversation in one transaction (``already_exists`` if taken)."""

    @abstractmethod
    def _link_child(self, parent_id: str, child_id: str) -> Awaitable[str | None]:
        """Set the parent's child unless it has one; the child it has then (None: no such
        parent)."""

    @abstractmethod
    def _insert_snapshot(
        self, conversation_id: str, version: int, text: str
    ) -> Awaitable[str | None]:
        """Insert the snapshot unless its version is taken; the one kept under it then (None
        when this one was inserted; ``not_found``)."""

    @abstractmethod
    async def commit(self, commit: Commit) -> StoredConversation:
        """See ``Store.commit``."""

    @abstractmethod
    async def with_pending(self) -> list[str]:
        """See ``Store.with_pending``."""

    @abstractmethod
    async def close(self) -> None:
        """See ``Store.close``."""

    # ------------------------------------------------------------------ Store

    async def create(
        self,
        state: ConversationState,
        *,
        system: str | None,
        messages: Sequence[Message] = (),
        at: float = 0.0,
        metadata: Mapping[str, str] | None = None,
    ) -> StoredConversation:
        check_storable(state, system)
        tags = checked_metadata(metadata)
        new = NewConversation(
            row=conversation_row(state, system, len(messages), at),
            seeds=seed_rows(state.config.id, messages),
            landmarks=transcript_landmarks(messages),
            system=system,
            metadata=tags,
        )
        await self._insert(new)
        return StoredConversation(
            state=state,
            version=1,
            system=system,
            created_at=at,
            last_seq=len(messages),
            metadata=tags,
        )

    async def load(self, conversation_id: str) -> StoredConversation:
        """The conversation's row: state, version, ``last_seq`` and outbox, read together."""
        require_holdable(conversation_id)
        return loaded(conversation_id, await self._load_row(conversation_id))

    async def complete(self, conversation_id: str, effect_ids: Sequence[int]) -> None:
        done = frozenset(effect_ids)

        def change(entries: list[_outbox.Entry]) -> tuple[None, bool]:
            kept = _outbox.without(entries, done)
            changed = len(kept) != len(entries)
            entries[:] = kept
            return None, changed

        require_holdable(conversation_id)
        await self._outbox_step(conversation_id, change)

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
        """Read and claim under the dialect's lock: two runtimes claiming at once cannot both
        win; the loser reads who holds it."""

        def change(entries: list[_outbox.Entry]) -> tuple[_outbox.Entry | None, bool]:
            return _outbox.claim(
                entries,
                effect_id,
                owner=owner,
                lease_until=lease_until,
                now=now,
                take_from=take_from,
            )

        require_holdable(conversation_id)
        entry = await self._outbox_step(conversation_id, change)
        return None if entry is None else _outbox.pending(entry)

    async def renew(
        self, conversation_id: str, effect_ids: Sequence[int], *, owner: str, lease_until: float
    ) -> bool:
        wanted = frozenset(effect_ids)

        def change(entries: list[_outbox.Entry]) -> tuple[bool, bool]:
            renewed = _outbox.renew(entries, wanted, owner=owner, lease=lease_until)
            return renewed == len(wanted), renewed > 0

        require_holdable(conversation_id)
        return await self._outbox_step(conversation_id, change)

    async def release(self, conversation_id: str, effect_ids: Sequence[int], *, owner: str) -> None:
        wanted = frozenset(effect_ids)

        def change(entries: list[_outbox.Entry]) -> tuple[None, bool]:
            return None, _outbox.release(entries, wanted, owner=owner)

        require_holdable(conversation_id)
        await self._outbox_step(conversation_id, change)

    async def messages(
        self, conversation_id: str, *, after_seq: int = 0, before_seq: int | None = None
    ) -> list[StoredMessage]:
        require_holdable(conversation_id)
        rows = await self._message_rows(conversation_id, max(after_seq, 0), before_seq)
        return [StoredMessage(seq=seq, message=load_message(text)) for seq, text in rows]

    async def generation_start(
        self, conversation_id: str, session: int | None, generation: int
    ) -> int:
        require_holdable(conversation_id)
        start = await self._start_seq(conversation_id, session, generation)
        return 1 if start is None else start

    async def pinned_messages(
        self, conversation_id: str, *, before_seq: int
    ) -> list[StoredMessage]:
        require_holdable(conversation_id)
        rows = await self._pinned_rows(conversation_id, before_seq)
        return [StoredMessage(seq=seq, message=load_message(text)) for seq, text in rows]

    async def transitions(
        self, conversation_id: str, *, after_seq: int = 0
    ) -> list[TransitionRecord]:
        require_holdable(conversation_id)
        rows = await self._transition_rows(conversation_id, max(0, after_seq))
        return [transition_from_row(row) for row in rows]

    async def list_conversations(self) -> list[StoredConversation]:
        return [listed(row) for row in await self._listed_rows()]

    async def list_page(
        self,
        *,
        metadata: Mapping[str, str] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> ConversationPage:
        request = PageRequest.of(metadata, limit, cursor)
        rows = await self._page_rows(request.pairs, request.limit + 1, request.after)
        return request.page(rows, listed, lambda row: (row[4], row[-1]))

    async def set_metadata(
        self, conversation_id: str, metadata: Mapping[str, str]
    ) -> StoredConversation:
        tags = checked_metadata(metadata)
        require_holdable(conversation_id)
        return loaded(conversation_id, await self._set_tags(conversation_id, tags))

    async def inactive(
        self, *, before: float, metadata: Mapping[str, str] | None = None
    ) -> list[str]:
        pairs = sorted(checked_metadata(metadata).items())
        return list(await self._inactive_ids(before, pairs))

    async def delete(
        self,
        conversation_id: str,
        *,
        also: Sequence[str] = (),
        idle_before: float | None = None,
        metadata: Mapping[str, str] | None = None,
        files: Callable[[str], object] | None = None,
    ) -> list[str]:
        require_holdable(conversation_id)
        pairs = sorted(checked_metadata(metadata).items())
        others = tuple(cid for cid in dict.fromkeys(also) if cid != conversation_id)
        ids = (conversation_id, *(cid for cid in others if holdable(cid)))
        deleted = await self._delete(Deletion(ids, idle_before, pairs, files))
        if deleted is None:
            raise not_found(conversation_id)
        return deleted

    async def whole(self, conversation_id: str) -> WholeConversation:
        require_holdable(conversation_id)
        row, messages, transitions, snapshots = await self._whole_rows(conversation_id)
        return WholeConversation(
            stored=loaded(conversation_id, row),
            messages=tuple(
                StoredMessage(seq=seq, message=load_message(text)) for seq, text in messages
            ),
            transitions=tuple(transition_from_row(line) for line in transitions),
            snapshots=tuple(load_snapshot(text) for text in snapshots),
        )

    async def restore(self, record: ConversationRecord) -> StoredConversation:
        check_storable(record.state, record.system)
        await self._restore(restored_rows(record))
        return await self.load(record.state.id)

    async def link_child(self, parent_id: str, child_id: str) -> str:
        require_holdable(parent_id)
        linked = await self._link_child(parent_id, child_id)
        if linked is None:
            raise not_found(parent_id)
        return linked

    async def save_snapshot(self, snapshot: SessionSnapshot) -> None:
        conversation_id = snapshot.conversation_id
        require_holdable(conversation_id)
        existing = await self._insert_snapshot(
            conversation_id, snapshot.version, dump_snapshot(snapshot)
        )
        if existing is not None:
            check_snapshot_unchanged(load_snapshot(existing), snapshot)

    async def snapshots(self, conversation_id: str) -> list[SessionSnapshot]:
        require_holdable(conversation_id)
        return [load_snapshot(text) for text in await self._snapshot_texts(conversation_id)]
