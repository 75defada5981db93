"""``PostgresStore``: the ``Store`` contract on PostgreSQL, through psycopg 3's async API.

Same tables and semantics as ``SqliteStore``, so the same contract tests run against both:

- **A pool of connections** (``psycopg_pool``): the conversations of one process commit side
  by side, each call on a connection of its own, and a connection the server dropped (a
  restart, a network cut) is thrown away and replaced rather than failing every later call.
  Processes (or several stores) share the database as SQLite's do: writers of one conversation
  are serialised by the row lock the version-guarded ``UPDATE`` takes, and the loser sees the
  new version and gets ``ConcurrentUpdateError``.
- **One round trip per step, or fewer.** ``commit`` is one statement (``postgres_schema.COMMIT``):
  the version-guarded ``UPDATE`` and the inserts of the step are data-modifying ``WITH`` clauses
  of it, and its result is the conversation as committed (a statement is its own transaction,
  so the step is still atomic). A step of the usual shape has a statement with a simpler plan
  (``fast_commit``: the server's work per step is mostly setting up the plan's nodes), and no
  foreign key or CHECK queries run per step (schema 5). Commits made in the same turn of the
  event loop (many conversations in one process) go together as one statement
  (``postgres_commits.Commits``), each still guarded on its own. A worker's CPU goes on its own
  work, not on waiting for acknowledgements. Reads are one statement each too; only a refused
  commit asks a second time, to say why. Claims, rare, read and write the outbox in a
  transaction with the row locked.
- **A step costs the same at any length.** It updates the conversation's row in place (its
  state, counters and outbox, a JSON array of what is pending: ``_outbox``) and appends to the
  transcript and the event log; nothing is deleted, so no dead rows pile up. The update is HOT
  (no index covers a column it changes), so the row's old versions are pruned within its page
  without waiting for a VACUUM; the table's fillfactor leaves room on each page for them. Counters
  on the row (``message_count``, ``effect_count``) give the next keys without reading the
  transcript.
- **``json`` columns, not ``jsonb``.** The store only keeps and returns documents, so the text is
  stored verbatim (``TransitionRecord.event_json`` comes back exactly as committed), nothing is
  re-encoded on write, and a ``\\u0000`` inside a tool's output, which ``jsonb`` refuses, is kept.
- **``lock_timeout``** bounds how long a call waits for another session's row or table lock;
  past it the call raises ``StoreLockedError``, as ``SqliteStore`` does past its busy timeout.
- **Watchers are woken by NOTIFY** (``wait_for_change``, ``postgres_watch``), sent only for
  conversations a listener registered: PostgreSQL serialises notifying commits.
- **What each operation means is ``SqlStore``'s** (``_sql``), shared with ``SqliteStore``; this
  module gives it PostgreSQL's statements and the pool they run on.
- **Schema versioning** in a one-row ``segue_schema`` table, migrated under an advisory lock so
  two processes starting together do not both create the tables.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, Final, Self, TypeVar
from urllib.parse import urlsplit

from psycopg import errors

from segue.executor.errors import SegueError
from segue.executor.store_port import Commit, StoredConversation
from segue.executor.stores import _listing, _outbox, postgres_data
from segue.executor.stores._rows import LOAD_COLUMNS, NewConversation, RestoredRows, commit_rows
from segue.executor.stores._shared import already_exists, holdable, not_found
from segue.executor.stores._sql import Deletion, Row, SqlStore, WholeRows
from segue.executor.stores.migrations import SCHEMA_VERSION
from segue.executor.stores.postgres_commits import Commits
from segue.executor.stores.postgres_pool import Connection, Pool
from segue.executor.stores.postgres_schema import METADATA
from segue.executor.stores.postgres_watch import Watches

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

T = TypeVar("T")

_LOAD_SQL: Final = (
    LOAD_COLUMNS.replace("state", "state::text")
    .replace("outbox", "outbox::text")
    .replace("metadata", METADATA)
)
_LOAD: Final = f"SELECT {_LOAD_SQL} FROM conversations WHERE id = %s"  # noqa: S608

# psycopg_pool reports failed connection attempts as warnings on "psycopg.pool". An application
# that configured logging sees them; one that did not must not get them on stderr from Python's
# last-resort handler (a library is quiet), which a handler of any kind on the logger prevents.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())


class PostgresStore(SqlStore):
    """A ``Store`` in a PostgreSQL database named by a libpq ``conninfo`` string or URL.

    Connections come from a pool opened on first use: at least ``min_size`` kept open, at most
    ``max_size`` (the calls of one process that run at once; the server's ``max_connections``
    bounds the sum over all processes). A call waits at most ``timeout`` seconds for a
    connection (the server unreachable all that time: ``StoreUnavailableError``), and at most
    ``lock_timeout`` seconds for another session's lock (``StoreLockedError``). Methods do what
    ``Store`` says; the notes here say only how.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        lock_timeout: float = 5.0,
        min_size: int = 1,
        max_size: int = 4,
        timeout: float = 10.0,
    ) -> None:
        if not 1 <= min_size <= max_size:
            msg = f"the pool needs 1 <= min_size <= max_size, not {min_size} and {max_size}"
            raise ValueError(msg)
        if not lock_timeout > 0 or not timeout > 0:
            msg = "lock_timeout and timeout must be positive numbers of seconds"
            raise ValueError(msg)
        self._conninfo = conninfo
        self._bounds = (lock_timeout, min_size, max_size, timeout)
        self._open_parts()

    def _open_parts(self) -> None:
        """The pool, the commits and the watches of a store not yet used (none connects yet)."""
        lock_timeout, min_size, max_size, timeout = self._bounds
        self._db = Pool(
            self._conninfo,
            lock_timeout=lock_timeout,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            abandoned=lambda: self._watches.abandon(),  # noqa: PLW0108  # made next
        )
        """The connections, opened on first use (``postgres_pool``)."""
        self._commits = Commits(self._db)
        """How commits are sent: together within a turn of the loop (``postgres_commits``)."""
        self._watches = Watches(self._conninfo, self._db.execute)
        """The LISTEN connection of ``wait_for_change`` (opened by the first wait)."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """A store for a ``postgresql://user:password@host:port/dbname?...`` URL (what
        deployments keep in ``DATABASE_URL``); ``options`` as for the constructor."""
        scheme = urlsplit(url).scheme
        if scheme not in ("postgres", "postgresql"):
            msg = f"a PostgreSQL URL starts with postgresql:// or postgres://, not {scheme}://"
            raise ValueError(msg)
        return cls(url, **options)

    async def wait_for_change(
        self,
        conversation_id: str,
        *,
        timeout: float,  # noqa: ASYNC109  # what Feed calls: a wait bounded by its poll
    ) -> bool:
        """Wait until another session commits to the conversation (True) or ``timeout``
        seconds pass (False), through LISTEN/NOTIFY (``postgres_watch``); the first wait for a
        conversation returns once it is registered, so that the caller reads it again."""
        if self._db.closed:
            msg = "the store is closed"
            raise SegueError(msg)
        if not holdable(conversation_id):
            await asyncio.sleep(timeout)
            return False
        await self._db.ready()
        return await self._watches.wait(conversation_id, timeout)

    def _fetch(
        self, conversation_id: str, statement: str, values: tuple[Any, ...]
    ) -> Awaitable[list[tuple[Any, ...]]]:
        """The rows of a read made as ``conversations AS c LEFT JOIN <what is read>``, its
        first column ``c.id``: none at all means no such conversation (``not_found``), one row
        whose first read column is NULL means nothing to read."""

        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            cur = await conn.execute(statement, values)
            rows = await cur.fetchall()
            if not rows:
                raise not_found(conversation_id)
            return [row[1:] for row in rows if row[1] is not None]

        return self._db.run(work, retry=True)

    # ------------------------------------------------------------------ SqlStore's dialect

    def _insert(self, new: NewConversation) -> Awaitable[None]:
        row, seeds = new.row, new.seeds
        conversation_id = row[0]

        async def work(conn: Connection) -> None:
            try:
                async with conn.transaction():
                    await conn.execute(
                        "INSERT INTO conversations (id, parent_id, state, phase, version, system,"
                        " message_count, created_at, updated_at)"
                        " VALUES (%s, %s, %s, %s, 1, %s, %s, %s, %s)",
                        row,
                    )
                    if seeds:
                        async with conn.cursor() as cur:
                            await cur.executemany(
                                "INSERT INTO messages (conversation_id, seq, kind, message)"
                                " VALUES (%s, %s, %s, %s)",
                                seeds,
                            )
                            await cur.executemany(
                                "INSERT INTO landmarks (conversation_id, seq, session,"
                                " generation, start, pinned) VALUES (%s, %s, %s, %s, %s, %s)",
                                [(conversation_id, *mark) for mark in new.landmarks],
                            )
                    if new.metadata:
                        await postgres_data.write_tags(conn, conversation_id, new.metadata)
            except errors.UniqueViolation:
                raise already_exists(conversation_id) from None

        return self._db.run(work)

    def _load_row(self, conversation_id: str) -> Awaitable[Row | None]:
        async def work(conn: Connection) -> Row | None:
            cur = await conn.execute(_LOAD, (conversation_id,))
            return await cur.fetchone()

        return self._db.run(work, retry=True)

    def _outbox_step(self, conversation_id: str, change: _outbox.Change[T]) -> Awaitable[T]:
        """One transaction with the conversation's row locked: two runtimes changing the
        outbox at once are served one after the other."""

        async def work(conn: Connection) -> T:
            async with conn.transaction():
                cur = await conn.execute(
                    "SELECT outbox::text FROM conversations WHERE id = %s FOR UPDATE",
                    (conversation_id,),
                )
                row = await cur.fetchone()
                if row is None:
                    raise not_found(conversation_id)
                result, entries = _outbox.apply(row[0], change)
                if entries is not None:
                    await conn.execute(
                        "UPDATE conversations SET outbox = %s WHERE id = %s",
                        (_outbox.dump(entries), conversation_id),
                    )
                return result

        return self._db.run(work, retry=True)

    def _message_rows(
        self, conversation_id: str, after_seq: int, before_seq: int | None
    ) -> Awaitable[Sequence[tuple[int, str]]]:
        if before_seq is None:
            return self._fetch(
                conversation_id,
                "SELECT c.id, m.seq, m.message::text FROM conversations AS c"
                " LEFT JOIN messages AS m ON m.conversation_id = c.id AND m.seq > %s"
                " WHERE c.id = %s ORDER BY m.seq",
                (after_seq, conversation_id),
            )
        return self._fetch(
            conversation_id,
            "SELECT c.id, m.seq, m.message::text FROM conversations AS c"
            " LEFT JOIN messages AS m ON m.conversation_id = c.id AND m.seq > %s AND m.seq < %s"
            " WHERE c.id = %s ORDER BY m.seq",
            (after_seq, before_seq, conversation_id),
        )

    async def _start_seq(
        self, conversation_id: str, session: int | None, generation: int
    ) -> int | None:
        statement, values = postgres_data.start_seq(session, generation)
        rows = await self._fetch(conversation_id, statement, (*values, conversation_id))
        return int(rows[0][0]) if rows else None

    def _pinned_rows(
        self, conversation_id: str, before_seq: int
    ) -> Awaitable[Sequence[tuple[int, str]]]:
        return self._fetch(conversation_id, postgres_data.PINNED, (before_seq, conversation_id))

    def _page_rows(
        self, pairs: Sequence[tuple[str, str]], limit: int, after: tuple[float, int] | None
    ) -> Awaitable[Sequence[Row]]:
        statement, values = _listing.page(postgres_data.DIALECT, pairs, limit, after)
        return self._rows(statement, values)

    def _set_tags(self, conversation_id: str, metadata: dict[str, str]) -> Awaitable[Row | None]:
        async def work(conn: Connection) -> Row | None:
            async with conn.transaction():
                if not await postgres_data.write_tags(conn, conversation_id, metadata):
                    return None
                cur = await conn.execute(_LOAD, (conversation_id,))
                return await cur.fetchone()

        return self._db.run(work, retry=True)

    async def _inactive_ids(self, before: float, pairs: Sequence[tuple[str, str]]) -> Sequence[str]:
        statement, values = _listing.inactive(postgres_data.DIALECT, before, pairs)
        return [str(cid) for (cid,) in await self._rows(statement, values)]

    def _delete(self, deletion: Deletion) -> Awaitable[list[str] | None]:
        return self._db.run(lambda conn: postgres_data.delete(conn, deletion))

    def _whole_rows(self, conversation_id: str) -> Awaitable[WholeRows]:
        return self._db.run(
            lambda conn: postgres_data.whole_rows(conn, _LOAD, conversation_id), retry=True
        )

    def _restore(self, rows: RestoredRows) -> Awaitable[None]:
        return self._db.run(lambda conn: postgres_data.restore(conn, rows))

    def _rows(self, statement: str, values: tuple[Any, ...]) -> Awaitable[list[tuple[Any, ...]]]:
        """The rows of one read."""

        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            cur = await conn.execute(statement, values)
            return await cur.fetchall()

        return self._db.run(work, retry=True)

    def _transition_rows(self, conversation_id: str, after_seq: int) -> Awaitable[Sequence[Row]]:
        return self._fetch(
            conversation_id,
            "SELECT c.id, t.seq, t.event_kind, t.event::text, t.from_phase, t.to_phase,"
            " t.context_tokens, t.reason, t.effect_kinds::text, t.at, t.session"
            " FROM conversations AS c"
            " LEFT JOIN transitions AS t ON t.conversation_id = c.id AND t.seq > %s"
            " WHERE c.id = %s ORDER BY t.seq",
            (after_seq, conversation_id),
        )

    async def _snapshot_texts(self, conversation_id: str) -> Sequence[str]:
        rows = await self._fetch(
            conversation_id,
            "SELECT c.id, s.snapshot::text FROM conversations AS c"
            " LEFT JOIN snapshots AS s ON s.conversation_id = c.id"
            " WHERE c.id = %s ORDER BY s.version",
            (conversation_id,),
        )
        return [text for (text,) in rows]

    def _listed_rows(self) -> Awaitable[Sequence[Row]]:
        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            cur = await conn.execute(
                f"SELECT {postgres_data.LISTED} FROM conversations AS c"  # noqa: S608
                " ORDER BY c.created_at, c.ordinal"
            )
            return await cur.fetchall()

        return self._db.run(work, retry=True)

    def _link_child(self, parent_id: str, child_id: str) -> Awaitable[str | None]:
        async def work(conn: Connection) -> str | None:
            cur = await conn.execute(
                "UPDATE conversations SET child_id = coalesce(child_id, %s) WHERE id = %s"
                " RETURNING child_id",
                (child_id, parent_id),
            )
            row = await cur.fetchone()
            return None if row is None else str(row[0])

        return self._db.run(work, retry=True)

    def _insert_snapshot(
        self, conversation_id: str, version: int, text: str
    ) -> Awaitable[str | None]:
        """One statement: the insert's clause and the read see the same snapshot."""

        async def work(conn: Connection) -> str | None:
            cur = await conn.execute(
                "WITH saved AS (INSERT INTO snapshots (conversation_id, version, snapshot)"
                " SELECT id, %s, %s FROM conversations WHERE id = %s"
                " ON CONFLICT DO NOTHING RETURNING version)"
                " SELECT (SELECT count(*) FROM saved), s.snapshot::text FROM conversations AS c"
                " LEFT JOIN snapshots AS s ON s.conversation_id = c.id AND s.version = %s"
                " WHERE c.id = %s",
                (version, text, conversation_id, version, conversation_id),
            )
            row = await cur.fetchone()
            if row is None:
                raise not_found(conversation_id)
            saved, existing = row
            return None if saved else existing

        return self._db.run(work, retry=True)

    # ------------------------------------------------------------------ Store

    async def commit(self, commit: Commit) -> StoredConversation:
        """Apply ``commit``: with the other commits of this turn of the event loop, in one
        statement, or alone when it is the only one (``postgres_commits.Commits``)."""
        return await self._commits.commit(commit_rows(commit))

    async def with_pending(self) -> list[str]:
        """A scan of the conversations (at startup): an index on what changes with every step
        would make every step's update a non-HOT one."""

        async def work(conn: Connection) -> list[str]:
            cur = await conn.execute("SELECT id FROM conversations WHERE outbox::text <> '[]'")
            return [str(row[0]) for row in await cur.fetchall()]

        return await self._db.run(work, retry=True)

    async def vacuum(self) -> None:
        """``VACUUM (FULL)`` each of segue's tables: the table and its indexes are written anew
        without the dead rows deleted conversations left (a plain VACUUM only marks their space
        free: their text stays in the files until it is overwritten), and the old files are
        emptied at once and removed at the next checkpoint. Each table is locked against
        every other session while it is rewritten (ACCESS EXCLUSIVE): steps wait for it, and
        one that waits longer than ``lock_timeout`` fails with ``StoreLockedError``."""

        async def work(conn: Connection) -> None:
            for table in postgres_data.VACUUMED:
                await conn.execute(f"VACUUM (FULL) {table}")  # our own table names

        await self._db.run(work)

    async def close(self) -> None:
        """Finish the commits under way, close the pool's connections; later calls raise
        ``SegueError``."""
        loop = asyncio.get_running_loop()
        if loop is self._db.loop and not self._db.closed:
            await self._commits.finish(loop)
            await self._watches.close()  # its registrations are deleted through the pool
        await self._db.close()

    async def reopen(self) -> None:
        """Use a closed store again (an application started again after its shutdown closed
        it): a new pool, opened by the next call. A no-op while the store is open."""
        if self._db.closed:
            self._open_parts()
