"""``SqliteStore``: the embedded default ``Store``, one SQLite file per deployment.

Why it is built this way:

- **One connection, used where it costs least** (``sqlite_runner``): a write runs on the
  caller's event loop, batched with the loop's other writes of the same iteration into one
  transaction, whenever that cannot block the loop (nothing queued for the store's thread, the
  write lock free at once); otherwise, and for reads, on the store's own thread. A write that
  returned is committed, wherever it ran.
- **WAL, ``synchronous=NORMAL``.** Readers never block the writer and a commit does not wait for
  an fsync (the WAL is synced at checkpoints, which run in the store's thread). A committed step
  survives a crash of the process; on power loss the last few steps may roll back, never half
  of one.
- **A step writes as few pages as it can.** Every page a transaction changes is a WAL frame the
  COMMIT writes and a checkpoint copies, the largest cost of a step. A step changes the
  conversation's row (its state, version, counters and outbox, a JSON array of what is pending:
  ``_outbox``), the messages it appends, and the line it adds to the event log (which carries the
  message's idempotency key, unique per conversation). Messages and log lines are keyed by their
  rowid, ``ordinal * KEY_SPAN + seq`` (the conversation's ordinal, kept on its row): one b-tree
  entry each, at the end of the conversation's range, with no index beside it. Keys come from
  counters kept on the conversation row (``message_count``, ``effect_count``): nothing scans the
  transcript, so a step costs the same at the ten-thousandth message as at the tenth. The
  system prompt, written once, is kept apart (``prompts``): SQLite writes an updated row anew,
  overflow pages and all, so a long prompt in the row was written again by every step. Steps
  batched together share one COMMIT, the most expensive statement of a step.
- **A usual step is three statements**: one guarded ``UPDATE ... RETURNING`` (the version, the
  outbox holding just what the step completes, the key unused) and the two inserts; a step of
  another shape, or whose guard does not hold, reads the row first and says why it is refused.
- **Private file.** The transcript is private: a missing directory is created 0700 and a new
  database file 0600 (``sqlite_schema``). The path comes from the caller; conversation ids
  never become paths here.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from segue.executor.errors import (
    ConversationExistsError,
    DuplicateMessageError,
    SegueError,
    StoreLockedError,
    StoreUnavailableError,
)
from segue.executor.store_port import (
    Commit,
    PendingEffect,
    StoredConversation,
    StoredMessage,
    TransitionRecord,
)
from segue.executor.stores import _outbox
from segue.executor.stores._rows import (
    LOAD_COLUMNS,
    CommitRows,
    Counters,
    commit_rows,
    conversation_row,
    listed,
    loaded,
    seed_rows,
)
from segue.executor.stores._shared import (
    check_snapshot_unchanged,
    check_storable,
    not_found,
    require_holdable,
    transition_from_row,
    version_moved,
)
from segue.executor.stores.codec import dump_snapshot, load_message, load_snapshot
from segue.executor.stores.sqlite_runner import PAGE, Runner, is_locked
from segue.executor.stores.sqlite_schema import (
    KEY_SPAN,
    MEMORY,
    SCHEMA_VERSION,
    connect,
    connect_checkpointer,
    connect_read_only,
)
from segue.statemachine import ConversationState, Message
from segue.statemachine.checkpoint import SessionSnapshot

__all__ = ["SCHEMA_VERSION", "SqliteStore", "StoreLockedError"]
"""``StoreLockedError`` lives in ports (PostgresStore raises it too); re-exported for callers
that imported it from here."""

T = TypeVar("T")

_STEP_PAGES: Final = 4
"""Pages a step writes besides its documents (the conversation's row, a message, a log line and
now and then the key index or a new page), for ``Runner``'s checkpoint count."""

_INSERT_MESSAGE: Final = (
    "INSERT INTO messages (rid, conversation_id, seq, kind, message) VALUES (?, ?, ?, ?, ?)"
)
_INSERT_TRANSITION: Final = (
    "INSERT INTO transitions (rid, conversation_id, seq, event_kind, event, from_phase,"
    " to_phase, context_tokens, reason, effect_kinds, at, session, idempotency_key)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class SqliteStore:
    """A ``Store`` in one SQLite file (WAL mode), safe to share between processes.

    ``busy_timeout`` is how long (seconds) a call waits for another process's write lock before
    raising ``StoreLockedError``. The file is opened on first use, in the store's own thread.
    ``read_only=True`` opens an existing store without ever writing to it (an inspector): no
    file is created, no schema is added, and a file that is not a segue store is refused.
    Methods do what ``Store`` (in ``ports``) says; their notes here say only how.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout: float = 5.0, read_only: bool = False
    ) -> None:
        self._path = os.fspath(path)
        self._busy_timeout = busy_timeout
        opener = connect_read_only if read_only else connect
        checkpoints = not read_only and self._path != MEMORY
        self._runner = Runner(
            lambda: opener(self._path, busy_timeout),
            busy_timeout=int(busy_timeout * 1000),
            map_error=self._segue_error,
            closed_message=f"the store for {self._path} is closed",
            checkpointer=(lambda: connect_checkpointer(self._path)) if checkpoints else None,
        )

    @property
    def path(self) -> str:
        """The database file as the caller named it."""
        return self._path

    def _segue_error(self, error: BaseException) -> BaseException:
        """The error a caller gets for ``error``: the driver's become segue's."""
        mapped: SegueError
        if isinstance(error, sqlite3.OperationalError) and is_locked(error):
            mapped = StoreLockedError(
                f"database is locked: another process holds it for longer than "
                f"busy_timeout ({self._busy_timeout:g}s): {self._path}"
            )
        elif isinstance(error, sqlite3.DatabaseError) and not isinstance(
            error, sqlite3.IntegrityError
        ):
            # A disk error, a file that went away, a database that went read-only: the
            # caller learns it as segue's error (the driver's is the cause) and may retry.
            mapped = StoreUnavailableError(
                f"the SQLite store cannot be used: {error}: {self._path}"
            )
        else:
            return error
        mapped.__cause__ = error
        return mapped

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` alone in the store thread (reads)."""
        return await self._runner.read(work)

    async def _run_step(
        self, step: Callable[[sqlite3.Connection], T], *, pages: int = 2, key: str | None = None
    ) -> T:
        """Run the write ``step`` in a transaction it may share (see ``sqlite_runner``);
        ``key``: the conversation it writes to, when it is a step of its own."""
        return await self._runner.write(step, pages=pages, key=key)

    # ------------------------------------------------------------------ Store

    async def create(
        self,
        state: ConversationState,
        *,
        system: str | None,
        messages: Sequence[Message] = (),
        at: float = 0.0,
    ) -> StoredConversation:
        conversation_id = state.config.id
        check_storable(state, system)
        row = conversation_row(state, system, len(messages), at)
        seeds = seed_rows(conversation_id, messages)

        def step(conn: sqlite3.Connection) -> None:
            try:
                (ordinal,) = conn.execute(
                    "INSERT INTO conversations (id, parent_id, state, phase, version, system,"
                    " message_count, created_at, updated_at, ordinal)"
                    " VALUES (?, ?, ?, ?, 1, NULL, ?, ?, ?,"
                    " (SELECT coalesce(max(ordinal), 0) + 1 FROM conversations))"
                    " RETURNING ordinal",
                    (*row[:4], *row[5:]),
                ).fetchone()
            except sqlite3.IntegrityError:
                msg = f"conversation {conversation_id!r} already exists"
                raise ConversationExistsError(msg) from None
            if system is not None:
                conn.execute("INSERT INTO prompts VALUES (?, ?)", (ordinal, system))
            base = ordinal * KEY_SPAN
            conn.executemany(_INSERT_MESSAGE, [(base + seed[1], *seed) for seed in seeds])

        size = sum(len(text) for *_, text in seeds) + len(row[2]) + len(system or "")
        await self._run_step(step, pages=_STEP_PAGES + size // PAGE)
        return StoredConversation(
            state=state, version=1, system=system, created_at=at, last_seq=len(messages)
        )

    async def load(self, conversation_id: str) -> StoredConversation:
        """The conversation's row: state, version, ``last_seq`` and outbox, read together."""
        require_holdable(conversation_id)

        def work(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = conn.execute(
                f"SELECT {_LOAD_COLUMNS} FROM conversations WHERE id = ?",  # noqa: S608
                (conversation_id,),
            ).fetchone()
            return row

        return loaded(conversation_id, await self._run(work))

    async def commit(self, commit: Commit) -> StoredConversation:
        """Apply ``commit`` as one step (see ``Commit``). A step of the usual shape (an outbox
        that holds what it completes, at most one effect queued) is one guarded ``UPDATE ...
        RETURNING`` (``_fast_update``) and its inserts; otherwise, or when that guard does not
        hold, the step reads the conversation's row, checks the version and the key, and
        writes the row with its new outbox, the messages and the log line. The module
        docstring says how steps share transactions."""
        conversation_id = commit.conversation_id
        rows = commit_rows(commit)  # encoded before taking the write lock: it is held for SQL only
        key = commit.idempotency_key
        expected = commit.expected_version
        phase = commit.state.phase.kind
        fast = _fast(rows, phase)

        def step(conn: sqlite3.Connection) -> StoredConversation:
            if fast is not None:
                landed = conn.execute(*fast).fetchall()
                if landed:
                    message_count, effect_count, system, child_id, created_at, ordinal = landed[0]
                    counters = Counters(message_count, effect_count, system, child_id, created_at)
                    _append(conn, rows, ordinal, counters)
                    return rows.stored(counters, [])
            if (
                key is not None
                and conn.execute(
                    "SELECT 1 FROM transitions WHERE conversation_id = ? AND idempotency_key = ?",
                    (conversation_id, key),
                ).fetchone()
            ):
                raise DuplicateMessageError(conversation_id, key)
            row = conn.execute(
                f"SELECT version, message_count, effect_count, outbox, {_SYSTEM}, child_id,"  # noqa: S608
                " created_at, ordinal, pending_count FROM conversations WHERE id = ?",
                (conversation_id,),
            ).fetchone()
            if row is None:
                raise not_found(conversation_id)
            (
                version,
                message_count,
                effect_count,
                current,
                system,
                child_id,
                created_at,
                ordinal,
                pending_count,
            ) = row
            if version != expected:
                raise version_moved(conversation_id, version, expected)
            outbox, kept = rows.outbox(current, effect_count, pending_count)
            counters = Counters(
                message_count=message_count + len(rows.appended),
                effect_count=effect_count + len(rows.queued),
                system=system,
                child_id=child_id,
                created_at=created_at,
            )
            conn.execute(
                "UPDATE conversations SET state = ?, phase = ?, version = ?, message_count = ?,"
                " effect_count = ?, pending_count = ?, outbox = ?, updated_at = ? WHERE id = ?",
                (
                    rows.state,
                    phase,
                    expected + 1,
                    counters.message_count,
                    counters.effect_count,
                    len(kept) + len(rows.queued),
                    outbox,
                    commit.at,
                    conversation_id,
                ),
            )
            _append(conn, rows, ordinal, counters)
            return rows.stored(counters, kept)

        size = sum(len(text) for _, text in rows.appended) + len(rows.transition[3])
        result: StoredConversation = await self._run_step(
            step, pages=_STEP_PAGES + size // PAGE, key=conversation_id
        )
        return result

    async def _outbox_step(
        self, conversation_id: str, change: Callable[[list[_outbox.Entry]], tuple[T, bool]]
    ) -> T:
        """Read the conversation's outbox, ``change`` it (in place; it says what to return and
        whether it changed anything), and write it back if it changed. Under SQLite's write
        lock: nobody else reads or writes the outbox in between."""
        require_holdable(conversation_id)

        def step(conn: sqlite3.Connection) -> T:
            row = conn.execute(
                "SELECT outbox FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
            if row is None:
                raise not_found(conversation_id)
            entries = _outbox.parse(row[0])
            result, changed = change(entries)
            if changed:
                conn.execute(
                    "UPDATE conversations SET outbox = ?, pending_count = ? WHERE id = ?",
                    (_outbox.dump(entries), len(entries), conversation_id),
                )
            return result

        return await self._run_step(step)

    async def complete(self, conversation_id: str, effect_ids: Sequence[int]) -> None:
        done = frozenset(effect_ids)

        def change(entries: list[_outbox.Entry]) -> tuple[None, bool]:
            kept = _outbox.without(entries, done)
            changed = len(kept) != len(entries)
            entries[:] = kept
            return None, changed

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
        def change(entries: list[_outbox.Entry]) -> tuple[_outbox.Entry | None, bool]:
            entry, claimed = _outbox.claim(
                entries,
                effect_id,
                owner=owner,
                lease_until=lease_until,
                now=now,
                take_from=take_from,
            )
            return entry, claimed

        entry = await self._outbox_step(conversation_id, change)
        return None if entry is None else _outbox.pending(entry)

    async def renew(
        self, conversation_id: str, effect_ids: Sequence[int], *, owner: str, lease_until: float
    ) -> bool:
        wanted = frozenset(effect_ids)

        def change(entries: list[_outbox.Entry]) -> tuple[bool, bool]:
            renewed = _outbox.renew(entries, wanted, owner=owner, lease=lease_until)
            return renewed == len(wanted), renewed > 0

        return await self._outbox_step(conversation_id, change)

    async def release(self, conversation_id: str, effect_ids: Sequence[int], *, owner: str) -> None:
        wanted = frozenset(effect_ids)

        def change(entries: list[_outbox.Entry]) -> tuple[None, bool]:
            return None, _outbox.release(entries, wanted, owner=owner)

        await self._outbox_step(conversation_id, change)

    async def messages(self, conversation_id: str, *, after_seq: int = 0) -> list[StoredMessage]:
        require_holdable(conversation_id)

        def work(conn: sqlite3.Connection) -> list[tuple[int, str]]:
            conn.execute("BEGIN")
            base = _require(conn, conversation_id) * KEY_SPAN
            rows: list[tuple[int, str]] = conn.execute(
                "SELECT seq, message FROM messages WHERE rid > ? AND rid < ? ORDER BY rid",
                (base + max(after_seq, 0), base + KEY_SPAN),
            ).fetchall()
            conn.execute("COMMIT")
            return rows

        rows = await self._run(work)
        return [StoredMessage(seq=seq, message=load_message(text)) for seq, text in rows]

    async def transitions(self, conversation_id: str) -> list[TransitionRecord]:
        require_holdable(conversation_id)

        def work(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            conn.execute("BEGIN")
            base = _require(conn, conversation_id) * KEY_SPAN
            rows: list[tuple[Any, ...]] = conn.execute(
                "SELECT seq, event_kind, event, from_phase, to_phase, context_tokens, reason,"
                " effect_kinds, at, session FROM transitions WHERE rid > ? AND rid < ?"
                " ORDER BY rid",
                (base, base + KEY_SPAN),
            ).fetchall()
            conn.execute("COMMIT")
            return rows

        return [transition_from_row(row) for row in await self._run(work)]

    async def list_conversations(self) -> list[StoredConversation]:
        def work(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return conn.execute(
                f"SELECT state, version, {_SYSTEM}, child_id, created_at"  # noqa: S608
                " FROM conversations ORDER BY created_at, rowid"
            ).fetchall()

        return [listed(row) for row in await self._run(work)]

    async def with_pending(self) -> list[str]:
        """A scan of the conversations (at startup): an index of those with pending work
        would cost every step a page."""

        def work(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute("SELECT id FROM conversations WHERE pending_count > 0").fetchall()
            return [str(row[0]) for row in rows]

        return await self._run(work)

    async def link_child(self, parent_id: str, child_id: str) -> str:
        require_holdable(parent_id)

        def step(conn: sqlite3.Connection) -> str:
            conn.execute(
                "UPDATE conversations SET child_id = ? WHERE id = ? AND child_id IS NULL",
                (child_id, parent_id),
            )
            row = conn.execute(
                "SELECT child_id FROM conversations WHERE id = ?", (parent_id,)
            ).fetchone()
            if row is None:
                raise not_found(parent_id)
            return str(row[0])

        result: str = await self._run_step(step)
        return result

    async def save_snapshot(self, snapshot: SessionSnapshot) -> None:
        conversation_id = snapshot.conversation_id
        require_holdable(conversation_id)
        text = dump_snapshot(snapshot)

        def step(conn: sqlite3.Connection) -> str | None:
            _require(conn, conversation_id)
            row = conn.execute(
                "SELECT snapshot FROM snapshots WHERE conversation_id = ? AND version = ?",
                (conversation_id, snapshot.version),
            ).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO snapshots (conversation_id, version, snapshot) VALUES (?, ?, ?)",
                    (conversation_id, snapshot.version, text),
                )
            return None if row is None else str(row[0])

        existing: str | None = await self._run_step(step, pages=_STEP_PAGES + len(text) // PAGE)
        if existing is not None:
            check_snapshot_unchanged(load_snapshot(existing), snapshot)

    async def snapshots(self, conversation_id: str) -> list[SessionSnapshot]:
        require_holdable(conversation_id)

        def work(conn: sqlite3.Connection) -> list[tuple[str]]:
            conn.execute("BEGIN")
            _require(conn, conversation_id)
            rows: list[tuple[str]] = conn.execute(
                "SELECT snapshot FROM snapshots WHERE conversation_id = ? ORDER BY version",
                (conversation_id,),
            ).fetchall()
            conn.execute("COMMIT")
            return rows

        return [load_snapshot(text) for (text,) in await self._run(work)]

    async def close(self) -> None:
        """Close the connection and stop the worker thread; later calls raise ``SegueError``."""
        await self._runner.close()


_SYSTEM: Final = "(SELECT system FROM prompts WHERE prompts.ordinal = conversations.ordinal)"
"""The conversation's system prompt, kept apart from its row (``sqlite_schema``, version 6)."""
_LOAD_COLUMNS: Final = LOAD_COLUMNS.replace("system", _SYSTEM)


@functools.lru_cache(maxsize=4)
def _fast_update(queued: bool, keyed: bool) -> str:
    """The guarded UPDATE of a step of the usual shape: the row at the expected version, its
    outbox holding exactly what the step completes (``pending_count`` entries, the first one
    with the id the step completes: ``_outbox.head``), its message's key not used yet. The new
    outbox is what the step queues, whose id SQL knows (``effect_count + 1``)."""
    outbox = """'[{"id":' || (effect_count + 1) || ?""" if queued else "'[]'"
    unused = (
        " AND NOT EXISTS (SELECT 1 FROM transitions"
        " WHERE conversation_id = ? AND idempotency_key = ?)"
        if keyed
        else ""
    )
    return (  # literal fragments only, every value a parameter
        "UPDATE conversations SET state = ?, phase = ?, version = ?,"  # noqa: S608
        " message_count = message_count + ?, effect_count = effect_count + ?,"
        f" pending_count = ?, outbox = {outbox}, updated_at = ?"
        " WHERE id = ? AND version = ? AND pending_count = ? AND substr(outbox, 1, ?) = ?"
        f"{unused} RETURNING message_count, effect_count, {_SYSTEM}, child_id, created_at, ordinal"
    )


def _fast(rows: CommitRows, phase: str) -> tuple[str, tuple[Any, ...]] | None:
    """``_fast_update`` and its parameters for ``rows``, when the step has the usual shape."""
    commit = rows.commit
    head = _outbox.head(rows.completes)
    if head is None or len(rows.queued) > 1:
        return None
    queued = len(rows.queued)
    key = commit.idempotency_key
    tail = (
        (_outbox.entry_tail(rows.queued[0][1], commit.owner, commit.lease_until) + "]",)
        if queued
        else ()
    )
    values = (
        rows.state,
        phase,
        commit.expected_version + 1,
        len(rows.appended),
        queued,
        queued,
        *tail,
        commit.at,
        commit.conversation_id,
        commit.expected_version,
        len(rows.completes),
        len(head),
        head,
        *(() if key is None else (commit.conversation_id, key)),
    )
    return _fast_update(bool(queued), key is not None), values


def _append(conn: sqlite3.Connection, rows: CommitRows, ordinal: int, counters: Counters) -> None:
    """Insert the step's messages and its log line (``counters`` as the step left them)."""
    base = ordinal * KEY_SPAN
    appended = rows.messages(counters.message_count)
    if len(appended) == 1:
        conn.execute(_INSERT_MESSAGE, (base + appended[0][1], *appended[0]))
    elif appended:
        conn.executemany(_INSERT_MESSAGE, [(base + m[1], *m) for m in appended])
    conn.execute(_INSERT_TRANSITION, (base + rows.commit.expected_version, *rows.transition))


def _require(conn: sqlite3.Connection, conversation_id: str) -> int:
    """The conversation's ordinal (its rows' keys are ``ordinal * KEY_SPAN + seq``)."""
    row = conn.execute(
        "SELECT ordinal FROM conversations WHERE id = ?", (conversation_id,)
    ).fetchone()
    if row is None:
        raise not_found(conversation_id)
    return int(row[0])
