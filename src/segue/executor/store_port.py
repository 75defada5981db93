"""The store port: what persisting conversations means, as a protocol and plain data.

Stores (``MemoryStore``, ``SqliteStore``, ``PostgresStore``) keep conversations, their
transcripts, event logs, outboxes and snapshots behind ``Store``; the runtime never talks to a
database any other way. ``Store`` is the union of narrow ports, one per kind of caller
(``LogReader``, ``ConversationLog``, ``Outbox``, ``Catalogue``, ``SnapshotStore``, ``Exports``),
and each part of the runtime is typed against the narrowest it uses. One ``Commit`` is one
transaction, and everything a store returns is the plain data below, so every store is held to
the same contract tests (``tests/test_stores.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeGuard, runtime_checkable

from segue.effects import Effect
from segue.executor.model_port import capable
from segue.statemachine import ConversationState, Message
from segue.statemachine.checkpoint import SessionSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredMessage:
    """A transcript entry as stored: the core's ``Message`` plus its position."""

    seq: int
    """1-based position in the conversation's transcript (append-only, never reused)."""
    message: Message

    @property
    def kind(self) -> str:
        """``user``, ``assistant``, ``tool_result``, ``continuation``, ``checkpoint``..."""
        return self.message.kind

    @property
    def text(self) -> str:
        """The message text."""
        return self.message.text


@dataclass(frozen=True, slots=True, kw_only=True)
class TransitionRecord:
    """One line of a conversation's event log."""

    seq: int
    event_kind: str
    event_json: str
    from_phase: str
    to_phase: str
    context_tokens: int | None
    reason: str
    effect_kinds: tuple[str, ...]
    at: float
    """Unix time of the commit (the executor's clock, never the core's)."""
    session: int | None = None
    """The session the event happened in (before any new session it started); None in logs
    written before segue kept it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingEffect:
    """An effect committed to the outbox and not yet performed, and who has claimed it."""

    id: int
    """Unique within the conversation, increasing in commit order."""
    effect: Effect
    owner: str | None = None
    """The runtime that claimed it (only the claimer performs it), None while unclaimed."""
    lease_until: float | None = None
    """Unix time the claim lasts until unless renewed; past it, anyone may take the work over."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredConversation:
    """A conversation as loaded: state, version for optimistic concurrency, what is pending."""

    state: ConversationState
    version: int
    system: str | None
    pending: tuple[PendingEffect, ...] = ()
    child_id: str | None = None
    created_at: float = 0.0
    last_seq: int = 0
    """Seq of the transcript's last message when this was read (0: none), from the same read as
    ``state``. Seqs are never reused, so a reader holding messages up to ``last_seq`` holds the
    whole transcript that goes with ``state``; the runtime's view cache relies on it."""
    metadata: Mapping[str, str] = field(default_factory=dict)
    """The application's labels (``{"user": "u-17"}``), as ``load``, ``create``, listings and
    ``set_metadata`` read them. A commit's answer leaves them empty: a step never changes them,
    and reading them back would cost every step."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationPage:
    """One page of a listing, newest first, and where the next one starts."""

    conversations: tuple[StoredConversation, ...]
    next_cursor: str | None
    """Pass it as ``cursor`` for the next page; None when this is the last one. A keyset (the
    last conversation's creation time and place), so pages neither skip nor repeat while new
    conversations are created."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Commit:
    """One atomic step: the new state, the event that caused it, and what it asks for.

    A store applies it in ONE transaction: check ``expected_version``; write ``state`` with
    version + 1; append a ``TransitionRecord``; append every message of an ``AppendMessage``
    effect to the transcript (appending IS performing those effects, so they can be neither lost
    nor doubled); put every other effect in the outbox; delete ``completes`` (ids of outbox
    effects this step finished) from the outbox.
    """

    conversation_id: str
    expected_version: int
    state: ConversationState
    event_kind: str
    event_json: str
    from_phase: str
    reason: str
    effects: tuple[Effect, ...]
    completes: tuple[int, ...] = ()
    at: float = 0.0
    owner: str | None = None
    """Claims every effect this commit queues for ``owner`` until ``lease_until``: the runtime
    that committed a request performs it, without a second round trip to claim it."""
    lease_until: float | None = None
    idempotency_key: str | None = None
    """Recorded with the commit; a second commit with the same key for the conversation writes
    nothing and raises ``DuplicateMessageError``."""
    session: int | None = None
    """The session the event happened in (the state's before the event), for the log."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationRecord:
    """A whole conversation as an export carries it and ``Exports.restore`` writes it back."""

    state: ConversationState
    version: int
    system: str | None
    created_at: float
    updated_at: float
    metadata: Mapping[str, str]
    messages: tuple[Message, ...]
    transitions: tuple[TransitionRecord, ...]
    snapshots: tuple[SessionSnapshot, ...]
    pending: tuple[Effect, ...]
    """Work that was pending, restored unclaimed: ``recover()`` performs it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WholeConversation:
    """Everything a store holds of one conversation, read in one transaction (``Exports.whole``):
    the parts agree with one another (an export is one consistent picture, never a state of
    one step beside the log of the next)."""

    stored: StoredConversation
    """As ``load`` reads it, metadata and pending work (with their claims) included."""
    messages: tuple[StoredMessage, ...]
    transitions: tuple[TransitionRecord, ...]
    snapshots: tuple[SessionSnapshot, ...]


@runtime_checkable
class LogReader(Protocol):
    """Reading one conversation: its state and the log a step appends to (transcript, events).
    What a part that only looks needs (the view cache, a watcher, a lineage walk).

    **Transcript seqs** are 1, 2, 3... per conversation in append order, seed messages first,
    with no gaps and never reused; ``StoredConversation.last_seq`` is the last one.
    """

    async def load(self, conversation_id: str) -> StoredConversation:
        """The current state, version, ``last_seq`` and pending outbox, read together;
        ``ConversationNotFoundError`` if none."""
        ...

    async def messages(
        self, conversation_id: str, *, after_seq: int = 0, before_seq: int | None = None
    ) -> list[StoredMessage]:
        """The transcript in order, from ``after_seq`` + 1 (a reader that has the first
        ``after_seq`` messages fetches only what is new), up to ``before_seq`` - 1 if given."""
        ...

    async def generation_start(
        self, conversation_id: str, session: int | None, generation: int
    ) -> int:
        """Where the model's view of (``session``, ``generation``) may be folded from: the seq
        of the latest fresh start (a new session's or generation's first message) at or before
        it, 1 if there is none. With ``session=None``, the first message of ``generation``
        whatever its session (its summary; 1 for the first generation). Indexed: the cost does
        not grow with the generations before (``transcript``, ``cache``)."""
        ...

    async def pinned_messages(
        self, conversation_id: str, *, before_seq: int
    ) -> list[StoredMessage]:
        """The pinned messages before ``before_seq``, in order (what a view folded from there
        still sends first); indexed, like ``generation_start``."""
        ...

    async def transitions(
        self, conversation_id: str, *, after_seq: int = 0
    ) -> list[TransitionRecord]:
        """The event log in order; with ``after_seq``, only its lines after that seq (a
        watcher reads what is new, not the whole log again)."""
        ...


@runtime_checkable
class ConversationLog(LogReader, Protocol):
    """A conversation's log, read and written: created, stepped (one ``Commit`` a step), and
    linked to the child it continues in. What the drive loop's commits need.

    **Versions** start at 1 and grow by one per commit; ``Outbox.complete``, ``link_child`` and
    snapshots do not change them.
    """

    async def create(
        self,
        state: ConversationState,
        *,
        system: str | None,
        messages: Sequence[Message] = (),
        at: float = 0.0,
        metadata: Mapping[str, str] | None = None,
    ) -> StoredConversation:
        """Insert a new conversation (version 1) with optional seed messages (seqs 1..n) and
        metadata; raise ``ConversationExistsError`` if the id exists, ``InvalidMetadataError``
        for metadata out of bounds (nothing written)."""
        ...

    async def commit(self, commit: Commit) -> StoredConversation:
        """Apply ``commit`` atomically (see ``Commit``); ``ConcurrentUpdateError`` if the
        version moved. Returns the conversation as it now is (as ``load`` would return it), so
        a writer never needs to load again after committing."""
        ...

    async def link_child(self, parent_id: str, child_id: str) -> str:
        """Record ``child_id`` as THE child of ``parent_id`` unless one exists; return the
        child that is recorded (the existing one wins, so asking twice gives one child)."""
        ...


@runtime_checkable
class Outbox(Protocol):
    """The work a commit queued and nobody has performed yet, and who holds it.

    - **Outbox ids** are unique within a conversation and increase in commit order; an id is
      never handed out again, even after its effect was completed.
    - **Claims**: an outbox effect is performed by the runtime that claimed it (``claim``, or
      ``Commit.owner`` for what a commit queues); a claim lasts until its lease ends.
    """

    async def complete(self, conversation_id: str, effect_ids: Sequence[int]) -> None:
        """Remove performed effects that produced no event (notifications, archives); ids no
        longer pending are ignored (completing twice after a crash is harmless)."""
        ...

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
        """Claim a pending effect for ``owner`` until ``lease_until``, atomically, if nobody
        holds it, its lease ended before ``now``, ``owner`` holds it already, or it is held by
        ``take_from`` (an owner the caller knows is dead). Returns the effect as it now is (its
        ``owner`` says who holds it: the caller, or whoever kept it), None if it is no longer
        pending."""
        ...

    async def renew(
        self, conversation_id: str, effect_ids: Sequence[int], *, owner: str, lease_until: float
    ) -> bool:
        """Extend ``owner``'s claims; False if any of them is no longer ``owner``'s."""
        ...

    async def release(self, conversation_id: str, effect_ids: Sequence[int], *, owner: str) -> None:
        """Give up ``owner``'s claims (the next drive may take the work at once)."""
        ...

    async def with_pending(self) -> list[str]:
        """Ids of conversations with a non-empty outbox (to finish after a crash)."""
        ...


@runtime_checkable
class Catalogue(Protocol):
    """The conversations a store holds, as an application finds, labels and purges them."""

    async def list_conversations(self) -> list[StoredConversation]:
        """All conversations, oldest first (without their pending effects)."""
        ...

    async def list_page(
        self,
        *,
        metadata: Mapping[str, str] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> ConversationPage:
        """Conversations newest first (without their pending effects), those whose metadata
        holds every pair of ``metadata`` only; at most ``limit``, from ``cursor`` (a page's
        ``next_cursor``). Indexed: a page costs the same among a hundred or a million."""
        ...

    async def set_metadata(
        self, conversation_id: str, metadata: Mapping[str, str]
    ) -> StoredConversation:
        """Replace the conversation's metadata; the conversation as ``load`` now reads it."""
        ...

    async def inactive(
        self, *, before: float, metadata: Mapping[str, str] | None = None
    ) -> list[str]:
        """Ids of the conversations last written before ``before`` (Unix time) whose metadata
        holds every pair of ``metadata``, oldest first (what a retention purge deletes)."""
        ...

    async def delete(
        self,
        conversation_id: str,
        *,
        also: Sequence[str] = (),
        idle_before: float | None = None,
        metadata: Mapping[str, str] | None = None,
        files: Callable[[str], object] | None = None,
    ) -> list[str]:
        """Remove the conversation and every row of it (transcript, log, snapshots, metadata,
        outbox, keys), and the conversations ``also`` names (a chain), all in ONE transaction,
        so a reader sees them whole or not at all and a crash leaves every one of them whole;
        the ids deleted (``also``'s missing ones skipped). The conversations linked to one
        that goes and that stays lose the link both ways: the parent's ``child_id``, the
        child's ``parent_id`` column and its state's ``parent_id``.

        ``idle_before`` and ``metadata`` are a purge's conditions, checked where the rows are
        deleted with the conversation locked against writers: only if it was last written
        before ``idle_before`` and its metadata holds every pair of ``metadata``; otherwise
        nothing is deleted and the answer is ``[]``. ``files(id)`` is called for each one
        after it is locked and checked and before the transaction commits (to remove its
        files while nobody can write to it). Deleted text is not left readable in the store's
        files where the store can see to it (SQLite overwrites it and empties its WAL; on
        PostgreSQL it stays in dead tuples until ``Vacuumable.vacuum``).
        ``ConversationNotFoundError`` if ``conversation_id`` is not there."""
        ...


@runtime_checkable
class SnapshotStore(Protocol):
    """Pause snapshots. **Never overwritten**: saving the same snapshot again is a no-op (a
    runtime finishing its outbox after a crash does that), a different one under a used version
    raises ``SegueError``."""

    async def save_snapshot(self, snapshot: SessionSnapshot) -> None:
        """Store a pause snapshot (versions are per conversation, never overwritten)."""
        ...

    async def snapshots(self, conversation_id: str) -> list[SessionSnapshot]:
        """The conversation's snapshots, oldest first."""
        ...


@runtime_checkable
class Exports(Protocol):
    """A whole conversation at once, read or written in one transaction (export, import)."""

    async def whole(self, conversation_id: str) -> WholeConversation:
        """The conversation, its transcript, event log and snapshots, read in one transaction
        (one snapshot of the database: PostgreSQL's REPEATABLE READ, one SQLite read
        transaction); ``ConversationNotFoundError`` if none."""
        ...

    async def restore(self, record: ConversationRecord) -> StoredConversation:
        """Write a whole conversation as it was exported (``documents``), in one transaction:
        ``ConversationExistsError`` if its id is taken, nothing written then."""
        ...


@runtime_checkable
class Store(ConversationLog, Outbox, Catalogue, SnapshotStore, Exports, Protocol):
    """Persistence of conversations: every narrow port above, and ``close``. Every method is
    atomic on its own; the contract tests in ``tests/test_stores.py`` hold every store to what
    each port says.

    A part that needs less is typed against less (the view cache reads a ``LogReader``, the
    claims keep an ``Outbox``), so what a part can touch is read from its signature.

    Every call about an unknown id raises ``ConversationNotFoundError``; a lock held elsewhere
    for too long raises ``StoreLockedError``; a store that cannot be reached raises
    ``StoreUnavailableError``; an id, model or system prompt with a NUL raises
    ``InvalidTextError`` before anything is written.
    """

    async def close(self) -> None:
        """Release connections and files."""
        ...


@runtime_checkable
class ChangeNotifier(Protocol):
    """A store that can say when a conversation changed (PostgreSQL's LISTEN/NOTIFY), so a
    watcher of another process's turn wakes at once instead of reading on a timer."""

    async def wait_for_change(
        self,
        conversation_id: str,
        *,
        timeout: float,  # noqa: ASYNC109  # a wait bounded by the watcher's longest pause
    ) -> bool:
        """Wait until another process may have committed to the conversation (True) or
        ``timeout`` seconds pass (False); a wake-up with nothing new is harmless."""
        ...


def notifies_changes(store: object) -> TypeGuard[ChangeNotifier]:
    """Whether the store can say when a conversation changed (``ChangeNotifier``)."""
    return capable(store, ChangeNotifier)


@runtime_checkable
class Reopenable(Protocol):
    """A store that can be used again after ``close()`` (segue's own stores): an application
    whose lifespan closes its runtime, then starts again (one app under many test clients),
    reopens it."""

    async def reopen(self) -> None:
        """Open again what ``close()`` released; a store that is open stays as it is."""
        ...


def reopens(store: object) -> TypeGuard[Reopenable]:
    """Whether the store can be used again after ``close()`` (``Reopenable``)."""
    return capable(store, Reopenable)


@runtime_checkable
class Vacuumable(Protocol):
    """A store whose deleted rows stay in its files until it is told to rewrite them
    (PostgreSQL: a deleted row is a dead tuple, its text readable in the table's files until a
    VACUUM FULL rewrites them)."""

    async def vacuum(self) -> None:
        """Rewrite the store's tables so no deleted row's text is left in their files."""
        ...


def vacuums(store: object) -> TypeGuard[Vacuumable]:
    """Whether the store has deleted text to rewrite away (``Vacuumable``)."""
    return capable(store, Vacuumable)
