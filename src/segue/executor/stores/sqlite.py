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
- **A usual step is three statements** (``sqlite_commits``): one guarded ``UPDATE ...
  RETURNING`` and the two inserts; a step of another shape, or whose guard does not hold, reads
  the row first and says why it is refused.
- **What each operation means is ``SqlStore``'s** (``_sql``), shared with ``PostgresStore``;
  this module gives it SQLite's statements and the runner they run on.
- **Private file.** The transcript is private: a missing directory is created 0700 and a new
  database file 0600 (``sqlite_schema``). The path comes from the caller; conversation ids
  never become paths here.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, TypeVar

from segue.executor.errors import (
    SegueError,
    StoreFullError,
    StoreLockedError,
    StoreUnavailableError,
)
from segue.executor.store_port import Commit, StoredConversation
from segue.executor.stores import _listing, _outbox, sqlite_data
from segue.executor.stores._rows import (
    LISTED_COLUMNS,
    LOAD_COLUMNS,
    NewConversation,
    RestoredRows,
    commit_rows,
)
from segue.executor.stores._shared import already_exists, not_found
from segue.executor.stores._sql import Deletion, Row, SqlStore, WholeRows
from segue.executor.stores.migrations import SCHEMA_VERSION
from segue.executor.stores.sqlite_commits import (
    INSERT_LANDMARK,
    INSERT_MESSAGE,
    STEP_PAGES,
    commit_step,
)
from segue.executor.stores.sqlite_runner import PAGE, Runner, is_locked
from segue.executor.stores.sqlite_schema import (
    KEY_SPAN,
    MEMORY,
    METADATA,
    SYSTEM,
    connect,
    connect_checkpointer,
    connect_read_only,
)

__all__ = ["SCHEMA_VERSION", "SqliteStore", "StoreLockedError"]
"""``StoreLockedError`` lives in ``errors`` (PostgresStore raises it too); re-exported for
callers that imported it from here."""

T = TypeVar("T")

_LOAD: Final = (
    f"SELECT {LOAD_COLUMNS.replace('system', SYSTEM).replace('metadata', METADATA)}"  # noqa: S608
    " FROM conversations WHERE id = ?"
)
_TRANSITIONS: Final = (
    "SELECT seq, event_kind, event, from_phase, to_phase, context_tokens, reason,"
    " effect_kinds, at, session FROM transitions WHERE rid > ? AND rid < ? ORDER BY rid"
)
_SNAPSHOTS: Final = "SELECT snapshot FROM snapshots WHERE conversation_id = ? ORDER BY version"
_LISTED_SQL: Final = LISTED_COLUMNS.replace("system", SYSTEM).replace("metadata", METADATA)
_LISTED: Final = f"SELECT {_LISTED_SQL} FROM conversations ORDER BY created_at, ordinal"  # noqa: S608


class SqliteStore(SqlStore):
    """A ``Store`` in one SQLite file (WAL mode), safe to share between processes.

    ``busy_timeout`` is how long (seconds) a call waits for another process's write lock before
    raising ``StoreLockedError``. The file is opened on first use, in the store's own thread.
    ``read_only=True`` opens an existing store without ever writing to it (an inspector): no
    file is created, no schema is added, and a file that is not a segue store is refused.
    Methods do what ``Store`` says; the notes here say only how.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout: float = 5.0, read_only: bool = False
    ) -> None:
        self._path = os.fspath(path)
        self._busy_timeout = busy_timeout
        self._read_only = read_only
        self._runner = self._new_runner()

    def _new_runner(self) -> Runner:
        """The connection's thread and its batches, opening the file on first use."""
        opener = connect_read_only if self._read_only else connect
        checkpoints = not self._read_only and self._path != MEMORY
        return Runner(
            lambda: opener(self._path, self._busy_timeout),
            busy_timeout=int(self._busy_timeout * 1000),
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
        if isinstance(error, sqlite3.DatabaseError) and _is_full(error):
            mapped = StoreFullError(
                f"the disk holding the SQLite store is full: nothing of this call was stored; "
                f"free space and call again ({error}): {self._path}"
            )
        elif isinstance(error, sqlite3.OperationalError) and is_locked(error):
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

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> Awaitable[T]:
        """Run ``work`` alone in the store thread (reads)."""
        return self._runner.read(work)

    def _run_step(
        self, step: Callable[[sqlite3.Connection], T], *, pages: int = 2, key: str | None = None
    ) -> Awaitable[T]:
        """Run the write ``step`` in a transaction it may share (see ``sqlite_runner``);
        ``key``: the conversation it writes to, when it is a step of its own."""
        return self._runner.write(step, pages=pages, key=key)

    def _read(
        self, conversation_id: str, work: Callable[[sqlite3.Connection, int], T]
    ) -> Awaitable[T]:
        """``work(conn, base)`` in one read transaction with the conversation's existence:
        ``base`` is ``ordinal * KEY_SPAN``, where its messages' and log lines' keys start."""

        def read(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN")
            result = work(conn, _ordinal(conn, conversation_id) * KEY_SPAN)
            conn.execute("COMMIT")
            return result

        return self._run(read)

    # ------------------------------------------------------------------ SqlStore's dialect

    def _insert(self, new: NewConversation) -> Awaitable[None]:
        row, seeds = new.row, new.seeds
        size = sum(len(text) for *_, text in seeds) + len(row[2]) + len(new.system or "")
        return self._run_step(self._insert_step(new), pages=STEP_PAGES + size // PAGE)

    @staticmethod
    def _insert_step(new: NewConversation) -> Callable[[sqlite3.Connection], None]:
        """The write that inserts a new conversation (``_insert``, ``_restore``)."""
        row, seeds = new.row, new.seeds
        conversation_id = row[0]

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
                raise already_exists(conversation_id) from None
            if new.system is not None:
                conn.execute("INSERT INTO prompts VALUES (?, ?)", (ordinal, new.system))
            base = ordinal * KEY_SPAN
            conn.executemany(INSERT_MESSAGE, ((base + seed[1], *seed) for seed in seeds))
            conn.executemany(INSERT_LANDMARK, [(base + seq, *mark) for seq, *mark in new.landmarks])
            sqlite_data.write_tags(conn, ordinal, new.metadata, row[6])

        return step

    def _load_row(self, conversation_id: str) -> Awaitable[Row | None]:
        def work(conn: sqlite3.Connection) -> Row | None:
            row: Row | None = conn.execute(_LOAD, (conversation_id,)).fetchone()
            return row

        return self._run(work)

    def _outbox_step(self, conversation_id: str, change: _outbox.Change[T]) -> Awaitable[T]:
        """Under SQLite's write lock: nobody else reads or writes the outbox in between."""

        def step(conn: sqlite3.Connection) -> T:
            row = conn.execute(
                "SELECT outbox FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
            if row is None:
                raise not_found(conversation_id)
            result, entries = _outbox.apply(row[0], change)
            if entries is not None:
                conn.execute(
                    "UPDATE conversations SET outbox = ?, pending_count = ? WHERE id = ?",
                    (_outbox.dump(entries), len(entries), conversation_id),
                )
            return result

        return self._run_step(step)

    def _message_rows(
        self, conversation_id: str, after_seq: int, before_seq: int | None
    ) -> Awaitable[Sequence[tuple[int, str]]]:
        before = KEY_SPAN if before_seq is None else min(max(before_seq, 0), KEY_SPAN)

        def work(conn: sqlite3.Connection, base: int) -> list[tuple[int, str]]:
            rows: list[tuple[int, str]] = conn.execute(
                "SELECT seq, message FROM messages WHERE rid > ? AND rid < ? ORDER BY rid",
                (base + after_seq, base + before),
            ).fetchall()
            return rows

        return self._read(conversation_id, work)

    def _start_seq(
        self, conversation_id: str, session: int | None, generation: int
    ) -> Awaitable[int | None]:
        # Backwards from the newest landmark: the one wanted is nearly always the last one.
        values: tuple[int, ...]
        if session is None:
            which, values = "start = 2 AND generation <= ?", (generation,)
        else:
            which = "start > 0 AND (session < ? OR (session = ? AND generation <= ?))"
            values = (session, session, generation)

        def work(conn: sqlite3.Connection, base: int) -> int | None:
            row = conn.execute(
                f"SELECT rid FROM landmarks WHERE rid > ? AND rid < ? AND {which}"  # noqa: S608
                " ORDER BY rid DESC LIMIT 1",
                (base, base + KEY_SPAN, *values),
            ).fetchone()
            return None if row is None else int(row[0]) - base

        return self._read(conversation_id, work)

    def _pinned_rows(
        self, conversation_id: str, before_seq: int
    ) -> Awaitable[Sequence[tuple[int, str]]]:
        before = min(max(before_seq, 0), KEY_SPAN)

        def work(conn: sqlite3.Connection, base: int) -> list[tuple[int, str]]:
            rows: list[tuple[int, str]] = conn.execute(
                "SELECT m.seq, m.message FROM landmarks AS l JOIN messages AS m ON m.rid = l.rid"
                " WHERE l.pinned AND l.rid > ? AND l.rid < ? ORDER BY l.rid",
                (base, base + before),
            ).fetchall()
            return rows

        return self._read(conversation_id, work)

    def _transition_rows(self, conversation_id: str, after_seq: int) -> Awaitable[Sequence[Row]]:
        def work(conn: sqlite3.Connection, base: int) -> list[Row]:
            span = (base + min(after_seq, KEY_SPAN), base + KEY_SPAN)  # a line's rid: base + seq
            rows: list[Row] = conn.execute(_TRANSITIONS, span).fetchall()
            return rows

        return self._read(conversation_id, work)

    def _snapshot_texts(self, conversation_id: str) -> Awaitable[Sequence[str]]:
        def work(conn: sqlite3.Connection, _base: int) -> list[str]:
            rows = conn.execute(_SNAPSHOTS, (conversation_id,)).fetchall()
            return [str(text) for (text,) in rows]

        return self._read(conversation_id, work)

    def _listed_rows(self) -> Awaitable[Sequence[Row]]:
        def work(conn: sqlite3.Connection) -> list[Row]:
            rows: list[Row] = conn.execute(_LISTED).fetchall()
            return rows

        return self._run(work)

    def _page_rows(
        self, pairs: Sequence[tuple[str, str]], limit: int, after: tuple[float, int] | None
    ) -> Awaitable[Sequence[Row]]:
        statement, values = _listing.page(sqlite_data.DIALECT, pairs, limit, after)

        def work(conn: sqlite3.Connection) -> list[Row]:
            rows: list[Row] = conn.execute(statement, values).fetchall()
            return rows

        return self._run(work)

    def _set_tags(self, conversation_id: str, metadata: dict[str, str]) -> Awaitable[Row | None]:
        def step(conn: sqlite3.Connection) -> Row | None:
            row = conn.execute(
                "SELECT ordinal, created_at FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
            if row is None:
                return None
            sqlite_data.write_tags(conn, row[0], metadata, row[1])
            loaded: Row | None = conn.execute(_LOAD, (conversation_id,)).fetchone()
            return loaded

        return self._run_step(step)

    def _inactive_ids(
        self, before: float, pairs: Sequence[tuple[str, str]]
    ) -> Awaitable[Sequence[str]]:
        statement, values = _listing.inactive(sqlite_data.DIALECT, before, pairs)

        def work(conn: sqlite3.Connection) -> list[str]:
            return [str(cid) for (cid,) in conn.execute(statement, values).fetchall()]

        return self._run(work)

    def _delete(self, deletion: Deletion) -> Awaitable[list[str] | None]:
        """Alone on the connection (``Runner.read``), in a transaction of its own that takes
        the write lock first (no step of another process commits until it is done, so a
        purge's condition holds where the rows go): the foreign keys' checks are off for it
        (each would scan the transcript and the log, which are keyed by rid, not by id: the
        rows go by their key range instead), and SQLite's ``secure_delete`` is on, so the freed
        pages are zeroed; then the WAL, which still holds the pages as they were, is
        checkpointed and emptied."""
        return self._run(lambda conn: sqlite_data.delete(conn, deletion))

    def _whole_rows(self, conversation_id: str) -> Awaitable[WholeRows]:
        """One read transaction: in WAL mode it reads one snapshot of the file throughout."""

        def read(conn: sqlite3.Connection) -> WholeRows:
            conn.execute("BEGIN")
            try:
                row: Row | None = conn.execute(_LOAD, (conversation_id,)).fetchone()
                if row is None:
                    return None, (), (), ()
                base = _ordinal(conn, conversation_id) * KEY_SPAN
                messages = conn.execute(
                    "SELECT seq, message FROM messages WHERE rid > ? AND rid < ? ORDER BY rid",
                    (base, base + KEY_SPAN),
                ).fetchall()
                lines = conn.execute(_TRANSITIONS, (base, base + KEY_SPAN)).fetchall()
                snapshots = conn.execute(_SNAPSHOTS, (conversation_id,)).fetchall()
                return row, messages, lines, [str(text) for (text,) in snapshots]
            finally:
                conn.execute("COMMIT")

        return self._run(read)

    def _restore(self, rows: RestoredRows) -> Awaitable[None]:
        new = rows.new

        def step(conn: sqlite3.Connection) -> None:
            self._insert_step(new)(conn)
            sqlite_data.restore(conn, rows)

        size = sum(len(text) for *_, text in new.seeds) + sum(len(t[2]) for t in rows.transitions)
        return self._run_step(step, pages=STEP_PAGES + size // PAGE)

    def _link_child(self, parent_id: str, child_id: str) -> Awaitable[str | None]:
        def step(conn: sqlite3.Connection) -> str | None:
            conn.execute(
                "UPDATE conversations SET child_id = ? WHERE id = ? AND child_id IS NULL",
                (child_id, parent_id),
            )
            row = conn.execute(
                "SELECT child_id FROM conversations WHERE id = ?", (parent_id,)
            ).fetchone()
            return None if row is None else str(row[0])

        return self._run_step(step)

    def _insert_snapshot(
        self, conversation_id: str, version: int, text: str
    ) -> Awaitable[str | None]:
        def step(conn: sqlite3.Connection) -> str | None:
            _ordinal(conn, conversation_id)
            row = conn.execute(
                "SELECT snapshot FROM snapshots WHERE conversation_id = ? AND version = ?",
                (conversation_id, version),
            ).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO snapshots (conversation_id, version, snapshot) VALUES (?, ?, ?)",
                    (conversation_id, version, text),
                )
            return None if row is None else str(row[0])

        return self._run_step(step, pages=STEP_PAGES + len(text) // PAGE)

    # ------------------------------------------------------------------ Store

    async def commit(self, commit: Commit) -> StoredConversation:
        """Apply ``commit`` as one step (``sqlite_commits``); the module docstring says how
        steps share transactions."""
        step, pages = commit_step(commit_rows(commit))
        result: StoredConversation = await self._run_step(
            step, pages=pages, key=commit.conversation_id
        )
        return result

    async def with_pending(self) -> list[str]:
        """A scan of the conversations (at startup): an index of those with pending work
        would cost every step a page."""

        def work(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute("SELECT id FROM conversations WHERE pending_count > 0").fetchall()
            return [str(row[0]) for row in rows]

        return await self._run(work)

    async def close(self) -> None:
        """Close the connection and stop the worker thread; later calls raise ``SegueError``
        until ``reopen()``."""
        await self._runner.close()

    async def reopen(self) -> None:
        """Use a closed store again (an application started again after its shutdown closed
        it): the file is opened on the next call. A no-op while the store is open."""
        if self._runner.closed:
            self._runner = self._new_runner()


def _is_full(error: sqlite3.DatabaseError) -> bool:
    """Whether SQLite failed for lack of space (``SQLITE_FULL``)."""
    code = getattr(error, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_FULL


def _ordinal(conn: sqlite3.Connection, conversation_id: str) -> int:
    """The conversation's ordinal (its rows' keys are ``ordinal * KEY_SPAN + seq``)."""
    row = conn.execute(
        "SELECT ordinal FROM conversations WHERE id = ?", (conversation_id,)
    ).fetchone()
    if row is None:
        raise not_found(conversation_id)
    return int(row[0])
