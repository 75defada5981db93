"""``PostgresStore.wait_for_change``: LISTEN/NOTIFY for watchers of conversations that another
process drives (``executor/feed.py`` reads them back; without this it polls).

Why it is built this way:

- **A NOTIFY only where someone listens.** PostgreSQL queues every notification of a committing
  transaction and, to keep the queue in commit order, holds a database-wide lock from then until
  the commit is done: a NOTIFY in every step would serialise the commits of every process on the
  database. So a listener registers each conversation it waits for in ``segue_watches`` (the
  conversation and the listening session's pid), and a step notifies only when its conversation
  has a row there (``postgres_schema.COMMIT``: one look-up in an index of an empty table, for a
  conversation nobody watches).
- **One connection per store, opened by the first wait**, kept for LISTEN alone (a pooled one
  would be taken from the commits); registrations go through the pool, since the listening
  connection is busy waiting. A registration is dropped once nobody has waited for that
  conversation for ``FORGET`` seconds, its session's rows when the store closes, and the rows of
  sessions that ended without a word (a killed process) when a listener starts.
- **Nothing is missed between two waits.** A notification sets the conversation's flag, which the
  next wait takes, however late. The first wait for a conversation returns as soon as its
  registration is in place, so the caller reads once more: what changed before anyone was
  notified is seen then.
- **A lost connection costs latency, not correctness.** The waits wake, time out as they would
  have while polling, and a new connection is tried after ``RETRY`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Final

import psycopg

from segue.executor._log import get_logger
from segue.executor.errors import SegueError

CHANNEL: Final = "segue_changes"
FORGET: Final = 30.0
"""Seconds without a wait after which a conversation's registration is dropped."""
RETRY: Final = 1.0
"""Seconds after a failed listening connection before another is tried."""
_log = get_logger("segue.store")

Connection = psycopg.AsyncConnection[tuple[Any, ...]]
Register = Callable[[str, tuple[Any, ...]], Awaitable[None]]
"""Runs a statement (with its parameters) on a pooled connection of the store."""


@dataclasses.dataclass(slots=True)
class _Interest:
    """One conversation waited for: its flag, whether it is registered, when it was waited for."""

    changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    registered: bool = False
    used: float = 0.0


class Watches:
    """The store's LISTEN connection and the conversations it waits for."""

    def __init__(self, conninfo: str, execute: Register) -> None:
        self._conninfo = conninfo
        self._execute = execute
        self._interests: dict[str, _Interest] = {}
        self._conn: Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._starting: asyncio.Lock | None = None
        self._failed_at: float | None = None

    async def wait(self, conversation_id: str, timeout: float) -> bool:  # noqa: ASYNC109
        """Whether the conversation changed (True) or ``timeout`` seconds passed (False)."""
        loop = asyncio.get_running_loop()
        interest = self._interests.get(conversation_id)
        if interest is None:
            interest = self._interests[conversation_id] = _Interest()
        interest.used = loop.time()
        pid = await self._listening()
        if pid is None:  # no listening connection: a plain pause, as when polling
            await asyncio.sleep(timeout)
            return False
        if not interest.registered:
            await self._execute(
                "INSERT INTO segue_watches (conversation_id, pid) VALUES (%s, %s)"
                " ON CONFLICT DO NOTHING",
                (conversation_id, pid),
            )
            interest.registered = True
            interest.changed.clear()
            return True  # read now: a change made before the registration notified nobody
        if not interest.changed.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await interest.changed.wait()
            except TimeoutError:
                return False
        interest.changed.clear()
        return True

    async def _listening(self) -> int | None:
        """The listening session's pid, the connection opened first if need be (None when it
        cannot be, for ``RETRY`` seconds after a failure)."""
        if self._conn is not None and self._task is not None and not self._task.done():
            return self._conn.info.backend_pid
        loop = asyncio.get_running_loop()
        if self._failed_at is not None and loop.time() - self._failed_at < RETRY:
            return None
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._conn is not None and self._task is not None and not self._task.done():
                return self._conn.info.backend_pid
            try:
                conn = await Connection.connect(self._conninfo, autocommit=True)
                try:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    # Sessions that ended without unregistering (a killed process).
                    await conn.execute(
                        "DELETE FROM segue_watches AS w WHERE NOT EXISTS"
                        " (SELECT FROM pg_stat_activity AS a WHERE a.pid = w.pid)"
                    )
                except BaseException:
                    await conn.close()
                    raise
            except psycopg.Error as error:
                self._failed_at = loop.time()
                _log.warning("listen_failed", error=type(error).__name__)
                return None
            self._conn, self._failed_at = conn, None
            for interest in self._interests.values():
                interest.registered = False  # a new session: registered again by pid
            self._task = loop.create_task(self._listen(conn), name="segue-pg-listen")
            return conn.info.backend_pid

    async def _listen(self, conn: Connection) -> None:
        """Set the flag of each conversation notified; now and then, forget the conversations
        nobody waits for any longer."""
        try:
            while True:
                async for notify in conn.notifies(timeout=FORGET / 2):
                    interest = self._interests.get(notify.payload)
                    if interest is not None:
                        interest.changed.set()
                await self._forget(conn.info.backend_pid)
        except (psycopg.Error, SegueError) as error:
            _log.warning("listen_lost", error=type(error).__name__)
            self._failed_at = asyncio.get_running_loop().time()
            self._conn = None
            for interest in self._interests.values():
                interest.changed.set()  # wake the waiters: they read, then wait again
            with contextlib.suppress(psycopg.Error):
                await conn.close()

    async def _forget(self, pid: int) -> None:
        now = asyncio.get_running_loop().time()
        stale = [cid for cid, i in self._interests.items() if now - i.used > FORGET]
        if not stale:
            return
        for cid in stale:
            del self._interests[cid]
        await self._execute(
            "DELETE FROM segue_watches WHERE pid = %s AND conversation_id = ANY(%s)",
            (pid, stale),
        )

    async def close(self) -> None:
        """Stop listening and drop this session's registrations (before the pool closes)."""
        task, conn = self._task, self._conn
        self._task = self._conn = None
        self._interests.clear()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, psycopg.Error):
                await task
        if conn is not None:
            with contextlib.suppress(psycopg.Error, SegueError):
                await self._execute(
                    "DELETE FROM segue_watches WHERE pid = %s", (conn.info.backend_pid,)
                )
            with contextlib.suppress(psycopg.Error):
                await conn.close()

    def abandon(self) -> None:
        """Let go of the connection once its event loop has ended (libpq closes it without
        one); the registrations are dropped by the next listener that starts."""
        conn = self._conn
        self._task = self._conn = self._starting = None
        self._interests.clear()
        if conn is not None:
            conn.pgconn.finish()
