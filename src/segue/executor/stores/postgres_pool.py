"""``PostgresStore``'s connections: a pool opened on first use, in the event loop that uses it,
with the schema migrated then, and the driver's errors made segue's.

A pool belongs to the event loop it was opened in (its worker tasks and connections live
there). ``asyncio.run`` may end that loop with the store still open: a guard task closes the
pool then, and a later call from a new loop opens a new pool after closing what is left of the
old one's connections without a loop. Every connection runs with ``lock_timeout`` set, so a
call waits a bounded time for another session's lock (``StoreLockedError``); a dropped session
or a server that is gone is ``StoreUnavailableError``, with the pool's idle connections checked
at once rather than failing the next calls one by one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import psycopg
from psycopg import errors
from psycopg_pool import AsyncConnectionPool

from segue.executor.errors import (
    SegueError,
    StoreFullError,
    StoreLockedError,
    StoreUnavailableError,
)
from segue.executor.stores._shared import newer_schema
from segue.executor.stores.migrations import SCHEMA_VERSION
from segue.executor.stores.postgres_schema import MIGRATION_LOCK, MIGRATIONS

T = TypeVar("T")
_RETRY_PAUSES: Final = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
"""Pauses between the tries of work that may run again (``Pool.run``): 6.35 s in all (tries
included), the time a fast restart of a server takes, with room."""
Connection = psycopg.AsyncConnection[tuple[Any, ...]]


class Pool:
    """The connections of one ``PostgresStore`` (its constructor's options, checked there);
    ``abandoned`` is called when a pool whose loop ended is let go of."""

    def __init__(
        self,
        conninfo: str,
        *,
        lock_timeout: float,
        min_size: int,
        max_size: int,
        timeout: float,
        abandoned: Callable[[], None],
    ) -> None:
        self._conninfo = conninfo
        self._lock_timeout = lock_timeout
        self._min_size = min_size
        self._max_size = max_size
        self._timeout = timeout
        self._abandoned = abandoned
        self._pool: AsyncConnectionPool[Connection] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        """The loop the pool was opened in: its tasks and connections live there."""
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        """Every connection the pool opened, to close them if that loop ends before the pool."""
        self._opening: asyncio.Lock | None = None
        self._guard: asyncio.Task[None] | None = None
        self.closed = False

    async def _configure(self, conn: Connection) -> None:
        """Run on each new connection of the pool, before anyone uses it."""
        self._connections.add(conn)
        await conn.execute(f"SET lock_timeout = {int(self._lock_timeout * 1000)}")

    def abandon(self) -> None:
        """Let go of a pool whose event loop has ended (``asyncio.run`` returned): its tasks
        ended with the loop, so only its connections are left to close, which libpq does
        without a loop."""
        self._abandoned()
        for conn in list(self._connections):
            conn.pgconn.finish()
        self._connections = weakref.WeakSet()
        self._pool = self.loop = self._opening = self._guard = None

    async def ready(self) -> AsyncConnectionPool[Connection]:
        """The pool, opened (and the schema migrated) by the first call that needs it.

        A pool belongs to the event loop it was opened in. Once that loop has ended, a call
        from a new one (a script or a test running ``asyncio.run`` twice) opens a new pool;
        a call from another loop while the first still runs is a mistake, refused."""
        loop = asyncio.get_running_loop()
        if self.loop is not None and self.loop is not loop:
            if not self.loop.is_closed():
                msg = (
                    "this PostgresStore is in use in another event loop: a store (its pool of "
                    "connections) serves one loop at a time; make one store per loop"
                )
                raise SegueError(msg)
            self.abandon()
        pool = self._pool
        if pool is not None:
            return pool
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is not None:
                return self._pool
            pool = AsyncConnectionPool(
                self._conninfo,
                min_size=self._min_size,
                max_size=self._max_size,
                timeout=self._timeout,
                kwargs={"autocommit": True},
                configure=self._configure,
                open=False,
                name="segue",
            )
            await pool.open()
            try:
                async with pool.connection() as conn:
                    await self._migrate(conn)
            except BaseException:
                await pool.close()
                raise
            self._pool, self.loop = pool, loop
            self._guard = loop.create_task(_close_with_loop(pool), name="segue-pool-guard")
            return pool

    async def _migrate(self, conn: Connection) -> None:
        """Bring the schema to ``SCHEMA_VERSION`` in one transaction, one process at a time."""
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            await conn.execute("CREATE TABLE IF NOT EXISTS segue_schema (version integer NOT NULL)")
            cur = await conn.execute("SELECT max(version) FROM segue_schema")
            row = await cur.fetchone()
            current = int(row[0]) if row is not None and row[0] is not None else 0
            if current > SCHEMA_VERSION:
                raise newer_schema("the database", current, SCHEMA_VERSION)
            for step in MIGRATIONS[current:]:
                for statement in step:
                    await conn.execute(statement)
            if current != SCHEMA_VERSION:
                await conn.execute("DELETE FROM segue_schema")
                await conn.execute(
                    "INSERT INTO segue_schema (version) VALUES (%s)", (SCHEMA_VERSION,)
                )

    async def run(self, work: Callable[[Connection], Awaitable[T]], *, retry: bool = False) -> T:
        """Run ``work`` on a connection of the pool, with the driver's errors made segue's.

        ``retry``: ``work`` may run again, as it does the same whether or not a run the server
        cut short was applied (a read, a claim by its owner, completing done work). Such work is
        tried again while the server cannot be reached, for ``_RESTART`` seconds in all: a
        restarted server (every session cut) costs its callers a pause, not an error. A commit
        is not run twice here: its outcome may be unknown, and ``Commits`` decides."""
        if not retry:
            return await self._run_once(work)
        deadline = time.monotonic() + sum(_RETRY_PAUSES)
        for pause in _RETRY_PAUSES:
            try:
                return await self._run_once(work)
            except StoreFullError:
                raise
            except StoreUnavailableError:
                # Never reached (no pool opened): a wrong address, not a restart; say so now.
                if self.closed or self._pool is None or time.monotonic() + pause > deadline:
                    raise
                await asyncio.sleep(pause)
        return await self._run_once(work)

    async def _run_once(self, work: Callable[[Connection], Awaitable[T]]) -> T:
        if self.closed:
            msg = "the store is closed"
            raise SegueError(msg)
        try:
            pool = await self.ready()
            # getconn/putconn, not pool.connection(): its context managers cost more CPU than
            # a step's encoding, for a transaction handling autocommit has no use for.
            conn = await pool.getconn()
            try:
                return await work(conn)
            finally:
                await pool.putconn(conn)
        except errors.LockNotAvailable as error:
            msg = (
                "database is locked: another process holds it for longer than "
                f"lock_timeout ({self._lock_timeout:g}s)"
            )
            raise StoreLockedError(msg) from error
        except errors.DiskFull as error:
            # A statement is a transaction, or runs in one: nothing of it was kept.
            msg = (
                "PostgreSQL has no room left to write (disk full): nothing of this call was "
                f"stored; free space and call again: {error}"
            )
            raise StoreFullError(msg) from error
        except (psycopg.OperationalError, psycopg.InterfaceError) as error:
            # A dropped session, a server restart (AdminShutdown), no server at all (the
            # pool's timeout): nothing was committed. The pool throws the broken connection
            # away; after a restart its idle ones are broken too, so they are checked now
            # rather than failing the next calls one by one.
            opened = self._pool
            if opened is not None and not self.closed:
                with contextlib.suppress(Exception):  # a check that fails changes nothing
                    await opened.check()
            msg = f"PostgreSQL cannot be used: {type(error).__name__}: {error}".strip()
            raise StoreUnavailableError(msg) from error

    async def execute(self, statement: str, values: tuple[Any, ...]) -> None:
        """Run ``statement`` on a connection of the pool."""

        async def work(conn: Connection) -> None:
            await conn.execute(statement, values)

        await self.run(work)

    async def close(self) -> None:
        """Close the pool's connections; later calls raise ``SegueError``."""
        self.closed = True
        pool = self._pool
        if pool is None:
            return
        if self.loop is asyncio.get_running_loop():
            self._pool = self.loop = None
            await pool.close()
            guard, self._guard = self._guard, None
            if guard is not None:
                guard.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await guard
        elif self.loop is not None and self.loop.is_closed():
            self.abandon()
        else:
            msg = "close this PostgresStore in the event loop that uses it"
            raise SegueError(msg)


async def _close_with_loop(pool: AsyncConnectionPool[Connection]) -> None:
    """Close ``pool`` when its event loop shuts down with the store still open.

    ``asyncio.run`` ends by cancelling every task and waiting for them. A pool's worker that is
    cancelled in the middle of its work (opening a connection) catches the cancellation and
    waits for more work, so the loop would wait for it forever; only ``close()`` stops it. This
    task waits for that moment and closes the pool then (a no-op after ``close()``)."""
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        with contextlib.suppress(Exception):
            await pool.close(timeout=1.0)
