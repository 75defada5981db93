"""How ``SqliteStore`` uses its one connection: writes on the caller's event loop when nothing
stands in their way, everything else on the store's own thread.

Why:

- **One connection.** SQLite admits one writer at a time, so more connections buy nothing for
  writes and cost a cold statement cache each. The connection belongs to whoever holds
  ``Runner``'s lock: the store's thread, or for a moment the event loop.
- **Writes on the loop, once per loop iteration.** A write hands its step to the loop's batch
  and waits; the batch is written at the end of the loop iteration (``call_soon``), every step
  that came in meanwhile in one ``BEGIN IMMEDIATE ... COMMIT``, on the loop's own thread: no
  hand-off to another thread and back, which cost as much as the SQL of a step. (A
  conversation writing alone, step after step, is written at once: see ``Runner.write``.) It
  runs there only when it cannot block the loop: nothing is queued for the thread, the thread
  is not using the connection, the write lock is free at once (a lock held by another process
  would otherwise stall every coroutine of the loop for up to ``busy_timeout``), and no step
  of the batch is large (``INLINE_PAGES``). When any of that fails, the batch goes to the
  thread, which waits for the lock as long as the store allows.
- **Waiting for a lock is the thread's own loop.** The connection's busy timeout is 0, so that
  nothing on the loop ever waits (switching it per write cost two statements, as much as an
  empty transaction); the thread tries again after a growing pause (as SQLite's busy handler
  does) until ``busy_timeout`` has passed.
- **Checkpoints beside the writes.** SQLite's automatic checkpoint runs inside the COMMIT that
  crosses its threshold, and syncs and copies the WAL: ~10 ms every few hundred steps, which
  every write waited for. It is off; instead, after about ``CHECKPOINT_PAGES`` pages of writes
  (estimated from what the steps wrote), a thread of their own checkpoints on a connection of
  its own while writes go on (``sqlite_checkpoints``).
- **Reads on the thread.** A read of a long transcript takes time the loop must not lose, and
  readers never wait for the writer in WAL mode, so reads stay where they never block anyone.
- **The thread's hand-over**, for what runs there: a ``queue.SimpleQueue`` in and
  ``call_soon_threadsafe`` out (``sqlite_thread``).

No caller hears of its write before the COMMIT that carries it, wherever it ran: a write that
returned is durable (WAL with ``synchronous=NORMAL``: it survives a crash of the process).
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from segue.executor.errors import SegueError
from segue.executor.stores.sqlite_checkpoints import Checkpoints
from segue.executor.stores.sqlite_thread import Job, Outcome, Step, serve, settle

T = TypeVar("T")

CHECKPOINT_PAGES: Final = 4_000
"""Pages written (as the steps estimate them) between two checkpoints. Four times SQLite's own
default for its automatic one: each checkpoint copies the pages steps keep rewriting (the
conversations' rows, the ends of the b-trees) once more, and its restarting part sends the
writes of the moment to the thread; with 100 conversations at once beside two CPU-bound
processes, 4,000 gave 15-20% more steps per second than 1,000 (8% on an idle machine), for a
WAL file of 22 MB instead of 9 (written over from its start after each checkpoint)."""
PAGE: Final = 4_096
INLINE_PAGES: Final = 64
"""A write of more pages than this (a quarter of a megabyte: a tool's large output, a long
document) goes to the thread, with the loop's other writes of the moment: copying it in would
hold up the loop for longer than a step takes."""
_PAUSES: Final = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.025, 0.025, 0.05, 0.05, 0.1)
"""Seconds between tries of a lock another connection holds (SQLite's busy handler's)."""

_SQLITE_BUSY: Final = 5
_SQLITE_LOCKED: Final = 6


def is_locked(error: sqlite3.OperationalError) -> bool:
    """Whether ``error`` says another connection holds a lock (SQLITE_BUSY or _LOCKED)."""
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    return "locked" in str(error) or "busy" in str(error)


def _stop_threads(jobs: queue.SimpleQueue[Job | None], checkpoints: Checkpoints | None) -> None:
    jobs.put(None)
    if checkpoints is not None:
        checkpoints.stop()


def _begin(conn: sqlite3.Connection) -> sqlite3.Connection:
    conn.execute("BEGIN IMMEDIATE")
    return conn


class Runner:
    """One SQLite connection, opened by ``connect`` on first use (in the thread), and where
    each call runs (see the module docstring). ``map_error`` turns a driver error into the one
    the caller gets; ``busy_timeout`` (ms) is how long the thread waits for the write lock."""

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        *,
        busy_timeout: int,
        map_error: Callable[[BaseException], BaseException],
        closed_message: str,
        checkpointer: Callable[[], sqlite3.Connection] | None = None,
    ) -> None:
        self._connect = connect
        self._checkpoints = None if checkpointer is None else Checkpoints(checkpointer)
        """None: a store that never checkpoints (read-only, or in memory)."""
        self._busy_timeout = busy_timeout
        self._map_error = map_error
        self._closed_message = closed_message
        self._conn: sqlite3.Connection | None = None
        self._let_go = False
        """Set once close() closed the connection: it is never opened again."""
        self._using = threading.Lock()
        """Held by whoever uses the connection: the thread for a batch, or the loop inline."""
        self._jobs: queue.SimpleQueue[Job | None] | None = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stop: Callable[[], object] = lambda: None
        self._batches: dict[asyncio.AbstractEventLoop, list[tuple[Step, asyncio.Future[Any]]]] = {}
        self._heavy: set[asyncio.AbstractEventLoop] = set()
        """Loops whose batch writes more than ``INLINE_PAGES``: it goes to the thread."""
        self._last: tuple[asyncio.AbstractEventLoop, object] | None = None
        """The loop that wrote last, and whose write it was (see ``write``)."""
        self._pages = 0
        """Pages written (estimated) since the last checkpoint."""

    @property
    def closed(self) -> bool:
        """Whether ``close()`` ran: the runner never opens the file again."""
        return self._jobs is None

    # ------------------------------------------------------------------ the connection

    def _connection(self) -> sqlite3.Connection:
        conn = self._conn
        if conn is None:
            if self._let_go:
                # A job queued behind close()'s: opening the file again would leave a connection
                # nobody closes, holding the database for the life of the process.
                raise SegueError(self._closed_message)
            conn = self._conn = self._connect()
        return conn

    def _patiently(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work(conn)``, tried again while another connection holds a lock it needs, until
        the busy timeout has passed (the connection itself never waits). ``work`` must leave
        nothing behind when it fails (a read, a BEGIN)."""
        deadline = time.monotonic() + self._busy_timeout / 1000
        pauses = iter(_PAUSES)
        while True:
            conn = self._conn
            try:
                # Opening is patient too: on a new file, ``PRAGMA journal_mode = WAL`` needs the
                # file to itself, and SQLite answers "locked" at once (no busy handler) while
                # another process migrates it.
                conn = self._connection()
                return work(conn)
            except sqlite3.OperationalError as error:
                if conn is not None and conn.in_transaction:
                    conn.rollback()
                pause = next(pauses, _PAUSES[-1])
                if not is_locked(error) or time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)

    def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` on the connection (again while it finds a lock taken); roll back
        whatever it left open if it raised."""
        try:
            return self._patiently(work)
        except BaseException as error:
            conn = self._conn
            if conn is not None and conn.in_transaction:
                conn.rollback()
            mapped = self._map_error(error)
            if mapped is error:
                raise
            raise mapped from error

    def _committed(
        self,
        conn: sqlite3.Connection,
        steps: Sequence[Step],
        run: Callable[[sqlite3.Connection, Sequence[Step]], list[Outcome] | None],
    ) -> list[Outcome] | None:
        """``run`` the steps in the transaction just begun, then COMMIT what it left open (a
        run that rolled back answers for itself); if either raises, every step's caller gets
        that error."""
        try:
            outcomes = run(conn, steps)
            if conn.in_transaction:
                conn.execute("COMMIT")
        except BaseException as error:  # noqa: BLE001  # every step's caller gets it
            if conn.in_transaction:
                conn.rollback()
            return [(None, self._map_error(error))] * len(steps)
        return outcomes

    def _steps(self, conn: sqlite3.Connection, steps: Sequence[Step]) -> list[Outcome]:
        """Run ``steps`` in the transaction just begun, then COMMIT (or roll back).

        Alone, a step is the transaction. Together, each runs in a savepoint: one that raises
        (a version that moved, a duplicate key) is rolled back alone and its caller gets the
        error; the others are committed together. If the transaction itself fails (COMMIT
        refused), every step's caller gets that error.
        """
        outcomes = self._committed(conn, steps, self._each_in_savepoint)
        assert outcomes is not None  # noqa: S101  # a run with savepoints always answers
        return outcomes

    def _each_in_savepoint(
        self, conn: sqlite3.Connection, steps: Sequence[Step]
    ) -> list[Outcome] | None:
        together = len(steps) > 1
        outcomes: list[Outcome] = []
        for step in steps:
            if together:
                conn.execute("SAVEPOINT step")
            try:
                outcomes.append((step(conn), None))
            except Exception as error:  # noqa: BLE001  # this step's caller gets it
                if not together:
                    conn.rollback()
                    return [(None, self._map_error(error))]
                conn.execute("ROLLBACK TO step")
                outcomes.append((None, self._map_error(error)))
            if together:
                conn.execute("RELEASE step")
        return outcomes

    def _steps_unguarded(
        self, conn: sqlite3.Connection, steps: Sequence[Step]
    ) -> list[Outcome] | None:
        """``_steps`` without its savepoints, two statements per step saved: a step that
        raises before it wrote anything (a version that moved, a duplicate key: what a commit
        checks first) leaves nothing to roll back. One that raises after writing (rare: a row
        in the way) rolls back the whole transaction, and None says to run the steps again,
        with savepoints."""
        if len(steps) == 1:
            return self._steps(conn, steps)
        return self._committed(conn, steps, self._each_unguarded)

    def _each_unguarded(
        self, conn: sqlite3.Connection, steps: Sequence[Step]
    ) -> list[Outcome] | None:
        outcomes: list[Outcome] = []
        for step in steps:
            changes = conn.total_changes
            try:
                outcomes.append((step(conn), None))
            except Exception as error:  # noqa: BLE001  # this step's caller gets it
                if conn.total_changes != changes:
                    conn.rollback()
                    return None
                outcomes.append((None, self._map_error(error)))
        return outcomes

    def _write(self, steps: Sequence[Step]) -> list[Outcome]:
        """Run write ``steps`` in one transaction, in the thread (waiting for the lock)."""
        try:
            conn = self._patiently(_begin)
        except BaseException as error:  # noqa: BLE001  # every step's caller gets it
            return [(None, self._map_error(error))] * len(steps)
        outcomes = self._steps(conn, steps)
        self._after_commit()
        return outcomes

    def _after_commit(self) -> None:
        """Once enough pages were written, ask for a checkpoint."""
        checkpoints = self._checkpoints
        if self._pages >= CHECKPOINT_PAGES and checkpoints is not None:
            self._pages = 0
            checkpoints.ask()

    # ------------------------------------------------------------------ the loop

    def _inline(self, steps: Sequence[Step]) -> list[Outcome] | None:
        """Write ``steps`` on the calling thread if that cannot block it; None when it could
        (the thread has work or the connection, or another connection holds the lock)."""
        jobs = self._jobs
        if self._conn is None or jobs is None or not jobs.empty():
            return None
        if not self._using.acquire(blocking=False):
            return None
        try:
            conn = self._conn
            if conn is None:  # closed meanwhile
                return None
            try:
                conn.execute("BEGIN IMMEDIATE")  # never waits: the busy timeout is 0
            except sqlite3.OperationalError as error:
                if is_locked(error):
                    return None
                return [(None, self._map_error(error))] * len(steps)
            # None (a step failed after writing: all rolled back): the thread does it again,
            # with savepoints.
            return self._steps_unguarded(conn, steps)
        finally:
            self._using.release()

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Write the loop's batch: inline if it cannot block, else by the thread."""
        batch = self._batches.pop(loop, [])
        if not batch:
            return
        heavy = loop in self._heavy
        self._heavy.discard(loop)
        try:
            outcomes = None if heavy else self._inline([step for step, _ in batch])
        except BaseException as error:  # noqa: BLE001  # a callback must not raise: tell them
            outcomes = [(None, self._map_error(error))] * len(batch)
        if outcomes is not None:
            settle(
                [(future, *outcome) for (_, future), outcome in zip(batch, outcomes, strict=True)]
            )
            self._after_commit()
            return
        if self._jobs is None:
            closed = SegueError(self._closed_message)
            settle([(future, None, closed) for _, future in batch])
            return
        jobs = self._start()
        for step, future in batch:
            jobs.put(Job(loop, future, step, self._write))

    async def write(
        self,
        step: Callable[[sqlite3.Connection], T],
        *,
        pages: int = 2,
        key: object = None,
    ) -> T:
        """Run the write ``step`` in a transaction it may share with the loop's other writes of
        this iteration; ``pages`` estimates what it writes (for the next checkpoint).

        ``key`` says whose write it is (a conversation's id). A write whose key is the one the
        loop wrote for last, with no batch waiting, is written at once, without waiting for the
        end of the iteration: a conversation writing alone (one turn after another) does not
        pay a turn of the loop per step, while conversations writing side by side (their keys
        taking turns) still share transactions."""
        if self._jobs is None:
            raise SegueError(self._closed_message)
        loop = asyncio.get_running_loop()
        batch = self._batches.get(loop)
        if (
            batch is None
            and key is not None
            and self._last == (loop, key)
            and pages <= INLINE_PAGES
        ):
            outcomes = self._inline([step])
            if outcomes is not None:
                self._pages += pages
                self._after_commit()
                result, error = outcomes[0]
                if error is not None:
                    raise error
                written: T = result
                return written
        self._last = (loop, key)
        future: asyncio.Future[T] = loop.create_future()
        if batch is None:
            batch = self._batches[loop] = []
            loop.call_soon(self._flush, loop)
        batch.append((step, future))
        self._pages += pages
        if pages > INLINE_PAGES:
            self._heavy.add(loop)
        return await future

    async def read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` alone in the thread."""
        result: T = await self.submit(lambda: self._call(work))
        return result

    # ------------------------------------------------------------------ the thread

    def _start(self) -> queue.SimpleQueue[Job | None]:
        jobs = self._jobs
        if jobs is None:
            raise SegueError(self._closed_message)
        if self._thread is None:
            self._thread = threading.Thread(
                target=serve, args=(jobs, self._using), name="segue-sqlite", daemon=True
            )
            self._thread.start()
            # A store dropped without close() must not leave its threads waiting forever.
            self._stop = weakref.finalize(self, _stop_threads, jobs, self._checkpoints)
        return jobs

    def submit(self, work: Callable[[], Any]) -> asyncio.Future[Any]:
        """Queue ``work`` for the thread (started on first use) and return its future."""
        jobs = self._start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        jobs.put(Job(loop, future, work))
        return future

    async def close(self) -> None:
        """Write what is batched, close the connection and stop the thread; later calls raise
        ``SegueError``."""
        if self._jobs is None:
            return
        for loop in list(self._batches):
            if loop is asyncio.get_running_loop():
                self._flush(loop)

        def work() -> None:
            self._let_go = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        checkpoints = self._checkpoints
        try:
            if self._thread is not None or self._conn is not None:
                await self.submit(work)
        finally:
            self._jobs = None
            self._stop()  # queued after the close job: the thread finishes it, then ends
            if checkpoints is not None:
                checkpoints.stop()
                if checkpoints.thread is not None:  # the file is let go of when close() returns
                    await asyncio.to_thread(checkpoints.thread.join)
