"""``SqliteStore``: the embedded default ``Store``, one SQLite file per deployment.

Why it is built this way:

- **One connection on one dedicated thread.** SQLite admits one writer at a time, so a pool of
  connections buys nothing for writes and costs a connection (and a cold statement cache) per
  thread. Every call is handed to the store's own thread, which owns the connection: the event
  loop never blocks on disk, calls from one process are serialised without a lock, and prepared
  statements stay cached. The hand-over is a ``queue.SimpleQueue`` in and
  ``call_soon_threadsafe`` out: measured on the reference VM, a round trip costs ~40 us, against
  ~115 us through ``run_in_executor``/``asyncio.to_thread`` (whose ``concurrent.futures``
  machinery adds locks and callbacks), and the hop is the largest cost of a commit. The thread
  takes every job waiting when it wakes, and hands their outcomes back to each event loop in
  one call (one wake-up of the loop for the lot).
- **WAL, ``synchronous=NORMAL``.** Readers never block the writer and a commit does not wait for
  an fsync (the WAL is synced at checkpoints). A committed step survives a crash of the process;
  on power loss the last few steps may roll back, never half of one.
- **Append-only steps, committed in groups.** A step is an ``UPDATE`` guarded by the expected
  version (``RETURNING`` the row's counters), and inserts keyed by counters kept on the
  conversation row (``message_count``, ``effect_count``): nothing scans the transcript, so a step
  costs the same at the ten-thousandth message as at the tenth. ``pending_count`` says how many
  effects are pending, so when the only ones are those the step queued (nearly always), the
  outbox is known without reading it back. Steps queued for the store thread together (several
  conversations committing at once) are written in one ``BEGIN IMMEDIATE ... COMMIT``, each
  inside a savepoint: a step that fails (a version that moved) rolls back alone, and COMMIT, the
  most expensive statement of a step, is paid once per group. No caller hears of its step
  before the COMMIT that carries it, so a step that returned is as durable as before.
- **Private file.** The transcript is private: a missing directory is created 0700 and a new
  database file 0600 (SQLite gives its ``-wal`` and ``-shm`` files the database file's mode).
  The path comes from the caller; conversation ids never become paths here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sqlite3
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeVar

from segue.executor.ports import (
    Commit,
    ConversationExistsError,
    DuplicateMessageError,
    PendingEffect,
    SegueError,
    StoredConversation,
    StoredMessage,
    StoreLockedError,
    StoreUnavailableError,
    TransitionRecord,
)
from segue.executor.stores._shared import (
    check_snapshot_unchanged,
    check_storable,
    claimable,
    commit_rows,
    conversation_row,
    listed,
    loaded,
    not_found,
    outbox_keys,
    pending_effect,
    seed_rows,
    transition_from_row,
    version_moved,
)
from segue.executor.stores.codec import dump_snapshot, load_message, load_snapshot
from segue.statemachine import ConversationState, Message
from segue.statemachine.checkpoint import SessionSnapshot

__all__ = ["SCHEMA_VERSION", "SqliteStore", "StoreLockedError"]
"""``StoreLockedError`` lives in ports (PostgresStore raises it too); re-exported for callers
that imported it from here."""

T = TypeVar("T")

SCHEMA_VERSION: Final = 4
"""What ``PRAGMA user_version`` says once every migration below has run."""

_MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    # 0 -> 1: the first schema.
    (
        """CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            parent_id TEXT,
            state TEXT NOT NULL,
            phase TEXT NOT NULL,
            version INTEGER NOT NULL CHECK (version >= 1),
            system TEXT,
            child_id TEXT,
            message_count INTEGER NOT NULL DEFAULT 0 CHECK (message_count >= 0),
            effect_count INTEGER NOT NULL DEFAULT 0 CHECK (effect_count >= 0),
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX conversations_by_age ON conversations (created_at)",
        """CREATE TABLE messages (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq INTEGER NOT NULL CHECK (seq >= 1),
            kind TEXT NOT NULL,
            message TEXT NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )""",
        """CREATE TABLE transitions (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq INTEGER NOT NULL CHECK (seq >= 1),
            event_kind TEXT NOT NULL,
            event TEXT NOT NULL,
            from_phase TEXT NOT NULL,
            to_phase TEXT NOT NULL,
            context_tokens INTEGER,
            reason TEXT NOT NULL,
            effect_kinds TEXT NOT NULL,
            at REAL NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )""",
        """CREATE TABLE outbox (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            id INTEGER NOT NULL CHECK (id >= 1),
            effect TEXT NOT NULL,
            PRIMARY KEY (conversation_id, id)
        ) WITHOUT ROWID""",  # one b-tree, not two: its rows are few, small and short-lived
        """CREATE TABLE snapshots (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            version INTEGER NOT NULL CHECK (version >= 1),
            snapshot TEXT NOT NULL,
            PRIMARY KEY (conversation_id, version)
        )""",
    ),
    # 1 -> 2: claims on outbox effects (who performs one, until when), idempotency keys.
    (
        "ALTER TABLE outbox ADD COLUMN owner TEXT",
        "ALTER TABLE outbox ADD COLUMN lease_until REAL",
        """CREATE TABLE idempotency (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            key TEXT NOT NULL,
            version INTEGER NOT NULL,
            PRIMARY KEY (conversation_id, key)
        ) WITHOUT ROWID""",
    ),
    # 2 -> 3: how many effects each conversation has pending (a commit knows its outbox).
    (
        "ALTER TABLE conversations ADD COLUMN pending_count INTEGER NOT NULL DEFAULT 0"
        " CHECK (pending_count >= 0)",
        "UPDATE conversations SET pending_count ="
        " (SELECT count(*) FROM outbox WHERE outbox.conversation_id = conversations.id)",
    ),
    # 3 -> 4: the session each logged event happened in (NULL for events logged before).
    ("ALTER TABLE transitions ADD COLUMN session INTEGER",),
)

_SQLITE_BUSY: Final = 5
_SQLITE_LOCKED: Final = 6
_MEMORY: Final = ":memory:"


def _is_locked(error: sqlite3.OperationalError) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    return "locked" in str(error) or "busy" in str(error)


Outcome = tuple[Any, BaseException | None]
"""What a job gave: its result, or the error it raised."""
Told = dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, Any]]]
"""Finished jobs' futures and outcomes, by the event loop that awaits them."""
Step = Callable[[sqlite3.Connection], Any]
"""A write that runs inside a transaction the store thread opens (and may share)."""


class _Job(NamedTuple):
    """Work for the store thread and whom to tell. Without ``group``, ``work`` runs alone
    (``work()``: a read); with it, ``work`` is a write ``Step`` that ``group`` runs with the
    steps of the same group queued next to it."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    work: Callable[..., Any]
    group: Callable[[Sequence[Step]], list[Outcome]] | None = None


def _settle(outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    """Hand each job's outcome to its caller (in the caller's loop, one call for them all)."""
    for future, result, error in outcomes:
        if future.cancelled():
            continue  # the caller gave up waiting; the work itself has run (or failed) regardless
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


def _attempt(work: Callable[[], Any]) -> Outcome:
    try:
        return work(), None
    except BaseException as caught:  # noqa: BLE001  # delivered to the awaiting caller
        return None, caught


def _take_waiting(jobs: queue.SimpleQueue[_Job | None], first: _Job) -> tuple[list[_Job], bool]:
    """``first`` and every job queued behind it; True if the store was closed meanwhile."""
    batch = [first]
    while True:
        try:
            job = jobs.get_nowait()
        except queue.Empty:
            return batch, False
        if job is None:
            return batch, True
        batch.append(job)


def _run_batch(batch: list[_Job]) -> Told:
    """Run ``batch`` in order, consecutive write steps of one store together; the outcomes,
    by the loop to tell them to."""
    told: Told = {}
    index = 0
    while index < len(batch):
        job = batch[index]
        group = job.group
        if group is None:
            done = [job]
            outcomes = [_attempt(job.work)]
        else:
            end = index + 1
            while end < len(batch) and batch[end].group == group:
                end += 1
            done = batch[index:end]
            outcomes = group([j.work for j in done])
        for finished, (result, error) in zip(done, outcomes, strict=True):
            told.setdefault(finished.loop, []).append((finished.future, result, error))
        index += len(done)
    return told


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    """The store thread: take every waiting job, run them (``_run_batch``), then tell each
    loop the outcomes in one call, until ``None`` (the store closed or was dropped)."""
    closed = False
    while not closed and (first := jobs.get()) is not None:
        batch, closed = _take_waiting(jobs, first)
        _tell(_run_batch(batch))
        del batch, first  # hold nothing of finished jobs while waiting for the next


def _tell(told: Told) -> None:
    for loop, settled in told.items():
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody to tell
            loop.call_soon_threadsafe(_settle, settled)


def _prepare_file(path: Path) -> None:
    """Create missing directories 0700 and a missing database file 0600, before SQLite opens it
    (SQLite would create the file with the process umask, often world-readable)."""
    missing: list[Path] = []
    directory = path.parent
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue  # created meanwhile by someone else: theirs to set up
        directory.chmod(0o700)  # the umask may have taken bits mkdir was given
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # an existing database keeps the mode its owner gave it
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


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
        self._read_only = read_only
        self._conn: sqlite3.Connection | None = None
        self._jobs: queue.SimpleQueue[_Job | None] | None = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stop: Callable[[], object] = lambda: None

    @property
    def path(self) -> str:
        """The database file as the caller named it."""
        return self._path

    # ------------------------------------------------------------------ plumbing (worker thread)

    def _connect(self) -> sqlite3.Connection:
        if self._read_only:
            return self._connect_read_only()
        if self._path != _MEMORY:
            _prepare_file(Path(self._path))
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout,
            isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE ... COMMIT
            cached_statements=64,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _connect_read_only(self) -> sqlite3.Connection:
        """SQLite's read-only mode (``mode=ro``: it neither creates the file nor writes to it),
        on a file whose schema is this segue's."""
        if not Path(self._path).is_file():
            msg = f"{self._path} does not exist (a read-only store is never created)"
            raise SegueError(msg)
        uri = f"{Path(self._path).resolve().as_uri()}?mode=ro"
        conn = sqlite3.connect(
            uri, uri=True, timeout=self._busy_timeout, isolation_level=None, cached_statements=64
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version != SCHEMA_VERSION:
                problem = (
                    "is not a segue store"
                    if version == 0
                    else f"has schema version {version}, not this segue's ({SCHEMA_VERSION})"
                )
                if 0 < version < SCHEMA_VERSION:
                    problem += "; open it once for writing to upgrade it"
                msg = f"{self._path} {problem}"
                raise SegueError(msg)
        except BaseException:
            conn.close()
            raise
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Bring the schema to ``SCHEMA_VERSION``, one numbered step at a time, atomically.

        An up-to-date file is only read; the write lock is taken (and the version read again
        under it) only when there is something to do, so two processes can migrate at once.
        """
        if int(conn.execute("PRAGMA user_version").fetchone()[0]) == SCHEMA_VERSION:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if current > SCHEMA_VERSION:
                msg = (
                    f"{self._path} has schema version {current}, newer than this segue "
                    f"understands ({SCHEMA_VERSION}); upgrade segue to open it"
                )
                raise SegueError(msg)
            for step in _MIGRATIONS[current:]:
                for statement in step:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.rollback()
            raise

    def _connection(self) -> sqlite3.Connection:
        conn = self._conn
        if conn is None:
            conn = self._conn = self._connect()
        return conn

    def _segue_error(self, error: BaseException) -> BaseException:
        """The error a caller gets for ``error``: the driver's become segue's."""
        mapped: SegueError
        if isinstance(error, sqlite3.OperationalError) and _is_locked(error):
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

    def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` on the connection; roll back whatever it left open if it raised."""
        conn = self._conn
        try:
            conn = self._connection()
            return work(conn)
        except BaseException as error:
            if conn is not None and conn.in_transaction:
                conn.rollback()
            mapped = self._segue_error(error)
            if mapped is error:
                raise
            raise mapped from error

    def _write(self, steps: Sequence[Step]) -> list[Outcome]:
        """Run write ``steps`` in one ``BEGIN IMMEDIATE ... COMMIT`` (in the store thread).

        Alone, a step is the transaction. Together, each runs in a savepoint: one that raises
        (a version that moved, a duplicate key) is rolled back alone and its caller gets the
        error; the others are committed together. If the transaction itself fails (the lock
        not taken in time, COMMIT refused), every step's caller gets that error.
        """
        if len(steps) == 1:
            step = steps[0]

            def alone(conn: sqlite3.Connection) -> Any:
                conn.execute("BEGIN IMMEDIATE")
                result = step(conn)
                conn.execute("COMMIT")
                return result

            return [_attempt(lambda: self._call(alone))]

        def together(conn: sqlite3.Connection) -> list[Outcome]:
            conn.execute("BEGIN IMMEDIATE")
            outcomes: list[Outcome] = []
            for step in steps:
                conn.execute("SAVEPOINT step")
                try:
                    outcomes.append((step(conn), None))
                except Exception as error:  # noqa: BLE001  # this step's caller gets it
                    conn.execute("ROLLBACK TO step")
                    outcomes.append((None, self._segue_error(error)))
                conn.execute("RELEASE step")
            conn.execute("COMMIT")
            return outcomes

        try:
            return self._call(together)
        except BaseException as error:  # noqa: BLE001  # every step's caller gets it
            return [(None, error)] * len(steps)

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` alone in the store thread (reads)."""
        result: T = await self._submit(lambda: self._call(work))
        return result

    async def _run_step(self, step: Callable[[sqlite3.Connection], T]) -> T:
        """Run the write ``step`` in the store thread, in a transaction it may share."""
        result: T = await self._submit(step, group=self._write)
        return result

    def _submit(
        self,
        work: Callable[..., Any],
        *,
        group: Callable[[Sequence[Step]], list[Outcome]] | None = None,
    ) -> asyncio.Future[Any]:
        """Queue a job for the store thread (started on first use) and return its future."""
        jobs = self._jobs
        if jobs is None:
            msg = f"the store for {self._path} is closed"
            raise SegueError(msg)
        if self._thread is None:
            self._thread = threading.Thread(
                target=_serve, args=(jobs,), name="segue-sqlite", daemon=True
            )
            self._thread.start()
            # A store dropped without close() must not leave its thread waiting forever.
            self._stop = weakref.finalize(self, jobs.put, None)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        jobs.put(_Job(loop, future, work, group))
        return future

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
                conn.execute(
                    "INSERT INTO conversations (id, parent_id, state, phase, version, system,"
                    " message_count, created_at, updated_at) VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?)",
                    row,
                )
            except sqlite3.IntegrityError:
                msg = f"conversation {conversation_id!r} already exists"
                raise ConversationExistsError(msg) from None
            conn.executemany(
                "INSERT INTO messages (conversation_id, seq, kind, message) VALUES (?, ?, ?, ?)",
                seeds,
            )

        await self._run_step(step)
        return StoredConversation(
            state=state, version=1, system=system, created_at=at, last_seq=len(messages)
        )

    async def load(self, conversation_id: str) -> StoredConversation:
        """The current state, version, ``last_seq`` and pending outbox, read by one statement
        (one statement reads one snapshot, so no explicit transaction is needed)."""

        def work(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = conn.execute(
                "SELECT c.state, c.version, c.system, c.child_id, c.created_at, c.message_count,"
                " o.id, o.effect, o.owner, o.lease_until FROM conversations AS c"
                " LEFT JOIN outbox AS o ON o.conversation_id = c.id"
                " WHERE c.id = ? ORDER BY o.id",
                (conversation_id,),
            ).fetchall()
            return rows

        return loaded(conversation_id, await self._run(work))

    async def commit(self, commit: Commit) -> StoredConversation:
        """Apply ``commit`` as one step (see ``Commit``; the module docstring says how steps
        share transactions). The outbox is read back only when something other than what this
        step queued is pending."""
        conversation_id = commit.conversation_id
        rows = commit_rows(commit)  # encoded before taking the write lock: it is held for SQL only
        key = commit.idempotency_key
        state, phase, appended, queued, at, _, expected = rows.update

        def step(conn: sqlite3.Connection) -> StoredConversation:
            if (
                key is not None
                and conn.execute(
                    "SELECT 1 FROM idempotency WHERE conversation_id = ? AND key = ?",
                    (conversation_id, key),
                ).fetchone()
            ):
                raise DuplicateMessageError(conversation_id, key)
            completed = (
                conn.executemany(
                    "DELETE FROM outbox WHERE conversation_id = ? AND id = ?", rows.completes
                ).rowcount
                if rows.completes
                else 0
            )
            after = conn.execute(
                "UPDATE conversations SET state = ?, phase = ?, version = version + 1,"
                " message_count = message_count + ?, effect_count = effect_count + ?,"
                " pending_count = pending_count + ?, updated_at = ? WHERE id = ? AND version = ?"
                " RETURNING message_count, effect_count, system, child_id, created_at,"
                " pending_count",
                (state, phase, appended, queued, queued - completed, at, conversation_id, expected),
            ).fetchone()
            if after is None:
                raise _version_moved(conn, conversation_id, commit.expected_version)
            counters, pending_count = after[:5], after[5]
            if rows.appended:
                conn.executemany(
                    "INSERT INTO messages (conversation_id, seq, kind, message)"
                    " VALUES (?, ?, ?, ?)",
                    rows.messages(counters[0]),
                )
            queued_rows = rows.outbox(counters[1])
            if queued_rows:
                conn.executemany(
                    "INSERT INTO outbox (conversation_id, id, effect, owner, lease_until)"
                    " VALUES (?, ?, ?, ?, ?)",
                    queued_rows,
                )
            conn.execute(
                "INSERT INTO transitions (conversation_id, seq, event_kind, event, from_phase,"
                " to_phase, context_tokens, reason, effect_kinds, at, session)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows.transition,
            )
            if key is not None:
                conn.execute(
                    "INSERT INTO idempotency (conversation_id, key, version) VALUES (?, ?, ?)",
                    (conversation_id, key, commit.expected_version + 1),
                )
            if pending_count == len(queued_rows):
                pending_rows: list[Any] = [row[1:] for row in queued_rows]
            else:
                pending_rows = conn.execute(
                    "SELECT id, effect, owner, lease_until FROM outbox WHERE conversation_id = ?"
                    " ORDER BY id",
                    (conversation_id,),
                ).fetchall()
            return rows.stored(counters, pending_rows)

        result: StoredConversation = await self._run_step(step)
        return result

    async def complete(self, conversation_id: str, effect_ids: Sequence[int]) -> None:
        rows = outbox_keys(conversation_id, effect_ids)

        def step(conn: sqlite3.Connection) -> None:
            _require(conn, conversation_id)
            completed = conn.executemany(
                "DELETE FROM outbox WHERE conversation_id = ? AND id = ?", rows
            ).rowcount
            if completed:
                conn.execute(
                    "UPDATE conversations SET pending_count = pending_count - ? WHERE id = ?",
                    (completed, conversation_id),
                )

        await self._run_step(step)

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
        """Read and claim under SQLite's write lock (a write step): nobody else can claim the
        same effect between the two."""

        def step(conn: sqlite3.Connection) -> PendingEffect | None:
            row = conn.execute(
                "SELECT id, effect, owner, lease_until FROM outbox"
                " WHERE conversation_id = ? AND id = ?",
                (conversation_id, effect_id),
            ).fetchone()
            if row is None:
                _require(conn, conversation_id)
                return None
            pending = pending_effect(row)
            if claimable(pending, owner=owner, now=now, take_from=take_from):
                conn.execute(
                    "UPDATE outbox SET owner = ?, lease_until = ?"
                    " WHERE conversation_id = ? AND id = ?",
                    (owner, lease_until, conversation_id, effect_id),
                )
                pending = PendingEffect(
                    id=effect_id, effect=pending.effect, owner=owner, lease_until=lease_until
                )
            return pending

        result: PendingEffect | None = await self._run_step(step)
        return result

    async def renew(
        self, conversation_id: str, effect_ids: Sequence[int], *, owner: str, lease_until: float
    ) -> bool:
        rows = [(lease_until, conversation_id, effect_id, owner) for effect_id in effect_ids]

        def step(conn: sqlite3.Connection) -> bool:
            _require(conn, conversation_id)
            renewed = sum(
                conn.execute(
                    "UPDATE outbox SET lease_until = ?"
                    " WHERE conversation_id = ? AND id = ? AND owner = ?",
                    row,
                ).rowcount
                for row in rows
            )
            return renewed == len(rows)

        result: bool = await self._run_step(step)
        return result

    async def release(self, conversation_id: str, effect_ids: Sequence[int], *, owner: str) -> None:
        rows = [(conversation_id, effect_id, owner) for effect_id in effect_ids]

        def step(conn: sqlite3.Connection) -> None:
            _require(conn, conversation_id)
            conn.executemany(
                "UPDATE outbox SET owner = NULL, lease_until = NULL"
                " WHERE conversation_id = ? AND id = ? AND owner = ?",
                rows,
            )

        await self._run_step(step)

    async def messages(self, conversation_id: str, *, after_seq: int = 0) -> list[StoredMessage]:
        def work(conn: sqlite3.Connection) -> list[tuple[int, str]]:
            conn.execute("BEGIN")
            _require(conn, conversation_id)
            rows: list[tuple[int, str]] = conn.execute(
                "SELECT seq, message FROM messages WHERE conversation_id = ? AND seq > ?"
                " ORDER BY seq",
                (conversation_id, after_seq),
            ).fetchall()
            conn.execute("COMMIT")
            return rows

        rows = await self._run(work)
        return [StoredMessage(seq=seq, message=load_message(text)) for seq, text in rows]

    async def transitions(self, conversation_id: str) -> list[TransitionRecord]:
        def work(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            conn.execute("BEGIN")
            _require(conn, conversation_id)
            rows: list[tuple[Any, ...]] = conn.execute(
                "SELECT seq, event_kind, event, from_phase, to_phase, context_tokens, reason,"
                " effect_kinds, at, session FROM transitions WHERE conversation_id = ?"
                " ORDER BY seq",
                (conversation_id,),
            ).fetchall()
            conn.execute("COMMIT")
            return rows

        return [transition_from_row(row) for row in await self._run(work)]

    async def list_conversations(self) -> list[StoredConversation]:
        def work(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return conn.execute(
                "SELECT state, version, system, child_id, created_at FROM conversations"
                " ORDER BY created_at, rowid"
            ).fetchall()

        return [listed(row) for row in await self._run(work)]

    async def with_pending(self) -> list[str]:
        """Read from the outbox's key index alone."""

        def work(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute("SELECT DISTINCT conversation_id FROM outbox").fetchall()
            return [str(row[0]) for row in rows]

        return await self._run(work)

    async def link_child(self, parent_id: str, child_id: str) -> str:
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

        existing: str | None = await self._run_step(step)
        if existing is not None:
            check_snapshot_unchanged(load_snapshot(existing), snapshot)

    async def snapshots(self, conversation_id: str) -> list[SessionSnapshot]:
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
        jobs = self._jobs
        if jobs is None:
            return

        def work() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        try:
            if self._thread is not None:
                await self._submit(work)
        finally:
            self._jobs = None
            self._stop()  # queued after the close job: the thread finishes it, then ends


def _require(conn: sqlite3.Connection, conversation_id: str) -> None:
    if conn.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone():
        return
    raise not_found(conversation_id)


def _version_moved(conn: sqlite3.Connection, conversation_id: str, expected: int) -> SegueError:
    row = conn.execute(
        "SELECT version FROM conversations WHERE id = ?", (conversation_id,)
    ).fetchone()
    if row is None:
        return not_found(conversation_id)
    return version_moved(conversation_id, row[0], expected)
