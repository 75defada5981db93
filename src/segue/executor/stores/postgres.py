"""``PostgresStore``: the ``Store`` contract on PostgreSQL, through psycopg 3's async API.

Same tables and semantics as ``SqliteStore``, so the same contract tests run against both:

- **A pool of connections** (``psycopg_pool``): the conversations of one process commit side
  by side, each call on a connection of its own, and a connection the server dropped (a
  restart, a network cut) is thrown away and replaced rather than failing every later call.
  Processes (or several stores) share the database as SQLite's do: writers of one conversation
  are serialised by the row lock the version-guarded ``UPDATE`` takes, and the loser sees the
  new version and gets ``ConcurrentUpdateError``.
- **One round trip per step.** ``commit`` is one statement: the version-guarded ``UPDATE`` and
  every insert and delete of the step are data-modifying ``WITH`` clauses of it, and its result
  is the conversation as committed, outbox included (a statement is its own transaction, so the
  step is still atomic). A worker's CPU goes on its own work, not on waiting for eight
  acknowledgements per step. Reads are one statement each too; only a refused commit asks a
  second time, to say why.
- **Append-only**, with counters on the conversation row (``message_count``, ``effect_count``)
  giving the next keys without reading the transcript.
- **``json`` columns, not ``jsonb``.** The store only keeps and returns documents, so the text is
  stored verbatim (``TransitionRecord.event_json`` comes back exactly as committed), nothing is
  re-encoded on write, and a ``\\u0000`` inside a tool's output, which ``jsonb`` refuses, is kept.
- **``lock_timeout``** bounds how long a call waits for another session's row or table lock;
  past it the call raises ``StoreLockedError``, as ``SqliteStore`` does past its busy timeout.
- **Schema versioning** in a one-row ``segue_schema`` table, migrated under an advisory lock so
  two processes starting together do not both create the tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Self, TypeVar
from urllib.parse import urlsplit

import psycopg
from psycopg import errors
from psycopg_pool import AsyncConnectionPool

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
    commit_rows,
    conversation_row,
    listed,
    loaded,
    not_found,
    pending_effect,
    seed_rows,
    transition_from_row,
    version_moved,
)
from segue.executor.stores.codec import dump_snapshot, load_message, load_snapshot
from segue.statemachine import ConversationState, Message
from segue.statemachine.checkpoint import SessionSnapshot

T = TypeVar("T")
Connection = psycopg.AsyncConnection[tuple[Any, ...]]

# psycopg_pool reports failed connection attempts as warnings on "psycopg.pool". An application
# that configured logging sees them; one that did not must not get them on stderr from Python's
# last-resort handler (a library is quiet), which a handler of any kind on the logger prevents.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())

SCHEMA_VERSION: Final = 3
_MIGRATION_LOCK: Final = 0x5E9E_0001
"""Advisory lock key held while migrating (any constant unlikely to clash with an app's)."""

_MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    # 0 -> 1: the first schema.
    (
        """CREATE TABLE conversations (
            id text PRIMARY KEY,
            parent_id text,
            state json NOT NULL,
            phase text NOT NULL,
            version integer NOT NULL CHECK (version >= 1),
            system text,
            child_id text,
            message_count integer NOT NULL DEFAULT 0 CHECK (message_count >= 0),
            effect_count integer NOT NULL DEFAULT 0 CHECK (effect_count >= 0),
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL,
            ordinal bigint GENERATED ALWAYS AS IDENTITY
        )""",
        "CREATE INDEX conversations_by_age ON conversations (created_at, ordinal)",
        """CREATE TABLE messages (
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq integer NOT NULL CHECK (seq >= 1),
            kind text NOT NULL,
            message json NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )""",
        """CREATE TABLE transitions (
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq integer NOT NULL CHECK (seq >= 1),
            event_kind text NOT NULL,
            event json NOT NULL,
            from_phase text NOT NULL,
            to_phase text NOT NULL,
            context_tokens integer,
            reason text NOT NULL,
            effect_kinds json NOT NULL,
            at double precision NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )""",
        """CREATE TABLE outbox (
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            id integer NOT NULL CHECK (id >= 1),
            effect json NOT NULL,
            PRIMARY KEY (conversation_id, id)
        )""",
        """CREATE TABLE snapshots (
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            version integer NOT NULL CHECK (version >= 1),
            snapshot json NOT NULL,
            PRIMARY KEY (conversation_id, version)
        )""",
    ),
    # 1 -> 2: claims on outbox effects (who performs one, until when), idempotency keys.
    (
        "ALTER TABLE outbox ADD COLUMN owner text, ADD COLUMN lease_until double precision",
        """CREATE TABLE idempotency (
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            key text NOT NULL,
            version integer NOT NULL,
            PRIMARY KEY (conversation_id, key)
        )""",
    ),
    # 2 -> 3: the session each logged event happened in (NULL for events logged before).
    ("ALTER TABLE transitions ADD COLUMN session integer",),
)

# One statement per step. Every data-modifying clause reads ``upd``, so none of them writes
# unless the version-guarded UPDATE did; clauses of one statement all see the snapshot the
# statement started from, so the outbox read at the end is the outbox before this step, less
# what it completes, plus what it queued (``queued``'s RETURNING).
# The documents a step writes go as one JSON array each, a plain text parameter built by joining
# the JSON texts (``json_array_elements`` hands each back verbatim): psycopg's list adapters
# would examine every element and, in text form, escape every quote of the JSON inside.
_COMMIT: Final = """
WITH upd AS (
    UPDATE conversations SET state = %(state)s, phase = %(phase)s, version = version + 1,
        message_count = message_count + %(appended)s, effect_count = effect_count + %(queued)s,
        updated_at = %(at)s
    WHERE id = %(cid)s AND version = %(version)s AND NOT EXISTS (
        SELECT 1 FROM idempotency WHERE conversation_id = %(cid)s AND key = %(key)s)
    RETURNING message_count, effect_count, system, child_id, created_at
), appended AS (
    INSERT INTO messages (conversation_id, seq, kind, message)
    SELECT %(cid)s, upd.message_count - %(appended)s + m.n, m.kind, m.message
    FROM upd,
        ROWS FROM (json_array_elements(%(messages)s::json), unnest(%(kinds)s::text[]))
        WITH ORDINALITY AS m (message, kind, n)
), queued AS (
    INSERT INTO outbox (conversation_id, id, effect, owner, lease_until)
    SELECT %(cid)s, upd.effect_count - %(queued)s + e.n, e.effect, %(owner)s, %(lease)s
    FROM upd, json_array_elements(%(effects)s::json) WITH ORDINALITY AS e (effect, n)
    RETURNING id, owner, lease_until
), completed AS (
    DELETE FROM outbox
    WHERE conversation_id = %(cid)s AND id = ANY(%(completes)s::integer[])
        AND EXISTS (SELECT FROM upd)
), logged AS (
    INSERT INTO transitions (conversation_id, seq, event_kind, event, from_phase, to_phase,
        context_tokens, reason, effect_kinds, at, session)
    SELECT %(cid)s, %(version)s, %(event_kind)s, %(event)s, %(from_phase)s, %(phase)s,
        %(tokens)s, %(reason)s, %(effect_kinds)s, %(at)s, %(session)s
    FROM upd
), keyed AS (
    INSERT INTO idempotency (conversation_id, key, version)
    SELECT %(cid)s, %(key)s, %(version)s + 1 FROM upd WHERE %(key)s::text IS NOT NULL
)
SELECT upd.message_count, upd.effect_count, upd.system, upd.child_id, upd.created_at,
    p.id, p.effect, p.owner, p.lease_until
FROM upd LEFT JOIN (
    SELECT id, effect::text AS effect, owner, lease_until FROM outbox
    WHERE conversation_id = %(cid)s AND id <> ALL(%(completes)s::integer[])
    UNION ALL
    SELECT id, NULL, owner, lease_until FROM queued
) AS p ON true
ORDER BY p.id
"""

_WHY_REFUSED: Final = """
SELECT version, EXISTS (SELECT FROM idempotency WHERE conversation_id = %s AND key = %s)
FROM conversations WHERE id = %s
"""


def _exists_then(rows: Sequence[tuple[Any, ...]], conversation_id: str) -> list[tuple[Any, ...]]:
    """The rows of a read made as ``conversations LEFT JOIN <what is read>``: none at all means
    no such conversation, one row whose first read column is NULL means nothing to read."""
    if not rows:
        raise not_found(conversation_id)
    return [row[1:] for row in rows if row[1] is not None]


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


class PostgresStore:
    """A ``Store`` in a PostgreSQL database named by a libpq ``conninfo`` string or URL.

    Connections come from a pool opened on first use: at least ``min_size`` kept open, at most
    ``max_size`` (the calls of one process that run at once; the server's ``max_connections``
    bounds the sum over all processes). A call waits at most ``timeout`` seconds for a
    connection (the server unreachable all that time: ``StoreUnavailableError``), and at most
    ``lock_timeout`` seconds for another session's lock (``StoreLockedError``). Methods do what
    ``Store`` (in ``ports``) says; their notes here say only how.
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
        self._lock_timeout = lock_timeout
        self._min_size = min_size
        self._max_size = max_size
        self._timeout = timeout
        self._pool: AsyncConnectionPool[Connection] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop the pool was opened in: its tasks and connections live there."""
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        """Every connection the pool opened, to close them if that loop ends before the pool."""
        self._opening: asyncio.Lock | None = None
        self._guard: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """A store for a ``postgresql://user:password@host:port/dbname?...`` URL (what
        deployments keep in ``DATABASE_URL``); ``options`` as for the constructor."""
        scheme = urlsplit(url).scheme
        if scheme not in ("postgres", "postgresql"):
            msg = f"a PostgreSQL URL starts with postgresql:// or postgres://, not {scheme}://"
            raise ValueError(msg)
        return cls(url, **options)

    # ------------------------------------------------------------------ plumbing

    async def _configure(self, conn: Connection) -> None:
        """Run on each new connection of the pool, before anyone uses it."""
        self._connections.add(conn)
        await conn.execute(f"SET lock_timeout = {int(self._lock_timeout * 1000)}")

    def _abandon(self) -> None:
        """Let go of a pool whose event loop has ended (``asyncio.run`` returned): its tasks
        ended with the loop, so only its connections are left to close, which libpq does
        without a loop."""
        for conn in list(self._connections):
            conn.pgconn.finish()
        self._connections = weakref.WeakSet()
        self._pool = self._loop = self._opening = self._guard = None

    async def _ready(self) -> AsyncConnectionPool[Connection]:
        """The pool, opened (and the schema migrated) by the first call that needs it.

        A pool belongs to the event loop it was opened in. Once that loop has ended, a call
        from a new one (a script or a test running ``asyncio.run`` twice) opens a new pool;
        a call from another loop while the first still runs is a mistake, refused."""
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop:
            if not self._loop.is_closed():
                msg = (
                    "this PostgresStore is in use in another event loop: a store (its pool of "
                    "connections) serves one loop at a time; make one store per loop"
                )
                raise SegueError(msg)
            self._abandon()
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
            self._pool, self._loop = pool, loop
            self._guard = loop.create_task(_close_with_loop(pool), name="segue-pool-guard")
            return pool

    async def _migrate(self, conn: Connection) -> None:
        """Bring the schema to ``SCHEMA_VERSION`` in one transaction, one process at a time."""
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            await conn.execute("CREATE TABLE IF NOT EXISTS segue_schema (version integer NOT NULL)")
            cur = await conn.execute("SELECT max(version) FROM segue_schema")
            row = await cur.fetchone()
            current = int(row[0]) if row is not None and row[0] is not None else 0
            if current > SCHEMA_VERSION:
                msg = (
                    f"the database has schema version {current}, newer than this segue "
                    f"understands ({SCHEMA_VERSION}); upgrade segue to open it"
                )
                raise SegueError(msg)
            for step in _MIGRATIONS[current:]:
                for statement in step:
                    await conn.execute(statement)
            if current != SCHEMA_VERSION:
                await conn.execute("DELETE FROM segue_schema")
                await conn.execute(
                    "INSERT INTO segue_schema (version) VALUES (%s)", (SCHEMA_VERSION,)
                )

    async def _run(self, work: Callable[[Connection], Awaitable[T]]) -> T:
        """Run ``work`` on a connection of the pool, with the driver's errors made segue's."""
        if self._closed:
            msg = "the store is closed"
            raise SegueError(msg)
        try:
            pool = await self._ready()
            async with pool.connection() as conn:
                return await work(conn)
        except errors.LockNotAvailable as error:
            msg = (
                "database is locked: another process holds it for longer than "
                f"lock_timeout ({self._lock_timeout:g}s)"
            )
            raise StoreLockedError(msg) from error
        except (psycopg.OperationalError, psycopg.InterfaceError) as error:
            # A dropped session, a server restart (AdminShutdown), no server at all (the
            # pool's timeout): nothing was committed. The pool throws the broken connection
            # away; after a restart its idle ones are broken too, so they are checked now
            # rather than failing the next calls one by one.
            opened = self._pool
            if opened is not None and not self._closed:
                with contextlib.suppress(Exception):  # a check that fails changes nothing
                    await opened.check()
            msg = f"PostgreSQL cannot be used: {type(error).__name__}: {error}".strip()
            raise StoreUnavailableError(msg) from error

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
            except errors.UniqueViolation:
                msg = f"conversation {conversation_id!r} already exists"
                raise ConversationExistsError(msg) from None

        await self._run(work)
        return StoredConversation(
            state=state, version=1, system=system, created_at=at, last_seq=len(seeds)
        )

    async def load(self, conversation_id: str) -> StoredConversation:
        """The current state, version, ``last_seq`` and pending outbox, read by one statement
        (one snapshot and one round trip, instead of a transaction around two reads)."""

        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            cur = await conn.execute(
                "SELECT c.state::text, c.version, c.system, c.child_id, c.created_at,"
                " c.message_count, o.id, o.effect::text, o.owner, o.lease_until"
                " FROM conversations AS c"
                " LEFT JOIN outbox AS o ON o.conversation_id = c.id"
                " WHERE c.id = %s ORDER BY o.id",
                (conversation_id,),
            )
            return await cur.fetchall()

        return loaded(conversation_id, await self._run(work))

    async def commit(self, commit: Commit) -> StoredConversation:
        """Apply ``commit`` in one statement (see ``_COMMIT``); when it writes nothing, a second
        read says why (a duplicate key, a version that moved, no such conversation)."""
        conversation_id = commit.conversation_id
        rows = commit_rows(commit)
        key = commit.idempotency_key
        completes = [effect_id for _, effect_id in rows.completes]
        (
            state,
            phase,
            appended,
            queued,
            at,
            _,
            version,
        ) = rows.update
        _, _, event_kind, event, from_phase, _, tokens, reason, effect_kinds, _, session = (
            rows.transition
        )
        params = {
            "cid": conversation_id,
            "version": version,
            "state": state,
            "phase": phase,
            "appended": appended,
            "queued": queued,
            "at": at,
            "key": key,
            # JSON arrays of the documents as they are (each is a JSON object already), and
            # array literals of kinds and ids: text parameters, which psycopg sends as they are.
            "messages": f"[{','.join(text for _, text in rows.appended)}]",
            "kinds": f"{{{','.join(kind for kind, _ in rows.appended)}}}",  # plain words
            "effects": f"[{','.join(text for _, text in rows.queued)}]",
            "owner": commit.owner,
            "lease": commit.lease_until,
            "completes": f"{{{','.join(map(str, completes))}}}",
            "event_kind": event_kind,
            "event": event,
            "from_phase": from_phase,
            "tokens": tokens,
            "reason": reason,
            "effect_kinds": effect_kinds,
            "session": session,
        }

        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            cur = await conn.execute(_COMMIT, params, binary=True)
            result = await cur.fetchall()
            if result:
                return result
            cur = await conn.execute(_WHY_REFUSED, (conversation_id, key, conversation_id))
            why = await cur.fetchone()
            if why is None:
                raise not_found(conversation_id)
            if why[1]:
                raise DuplicateMessageError(conversation_id, str(key))
            raise version_moved(conversation_id, why[0], commit.expected_version)

        try:
            result = await self._run(work)
        except errors.UniqueViolation as error:
            if key is None or error.diag.table_name != "idempotency":
                raise
            # Two commits racing with one key on different versions: the second one's insert.
            raise DuplicateMessageError(conversation_id, key) from None
        first = result[0]
        pending_rows = [row[5:] for row in result] if first[5] is not None else []
        return rows.stored(first[:5], pending_rows)

    async def complete(self, conversation_id: str, effect_ids: Sequence[int]) -> None:
        async def work(conn: Connection) -> None:
            cur = await conn.execute(
                "WITH done AS (DELETE FROM outbox WHERE conversation_id = %s"
                " AND id = ANY(%s::integer[]))"
                " SELECT FROM conversations WHERE id = %s",
                (conversation_id, list(effect_ids), conversation_id),
            )
            if await cur.fetchone() is None:
                raise not_found(conversation_id)

        await self._run(work)

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
        """One guarded ``UPDATE``: its row lock makes the check and the claim one step, so two
        sessions claiming at once cannot both win; the loser reads who holds it."""

        async def work(conn: Connection) -> tuple[Any, ...] | None:
            cur = await conn.execute(
                "UPDATE outbox SET owner = %s, lease_until = %s"
                " WHERE conversation_id = %s AND id = %s AND (owner IS NULL OR owner = %s"
                " OR owner = %s OR lease_until IS NULL OR lease_until < %s)"
                " RETURNING id, effect::text, owner, lease_until",
                (owner, lease_until, conversation_id, effect_id, owner, take_from, now),
            )
            row = await cur.fetchone()
            if row is not None:
                return row
            cur = await conn.execute(
                "SELECT o.id, o.effect::text, o.owner, o.lease_until FROM conversations AS c"
                " LEFT JOIN outbox AS o ON o.conversation_id = c.id AND o.id = %s"
                " WHERE c.id = %s",
                (effect_id, conversation_id),
            )
            row = await cur.fetchone()
            if row is None:
                raise not_found(conversation_id)
            return None if row[0] is None else row

        row = await self._run(work)
        return None if row is None else pending_effect(row)

    async def renew(
        self, conversation_id: str, effect_ids: Sequence[int], *, owner: str, lease_until: float
    ) -> bool:
        async def work(conn: Connection) -> bool:
            cur = await conn.execute(
                "WITH renewed AS (UPDATE outbox SET lease_until = %s"
                " WHERE conversation_id = %s AND id = ANY(%s::integer[]) AND owner = %s"
                " RETURNING 1)"
                " SELECT (SELECT count(*) FROM renewed) FROM conversations WHERE id = %s",
                (lease_until, conversation_id, list(effect_ids), owner, conversation_id),
            )
            row = await cur.fetchone()
            if row is None:
                raise not_found(conversation_id)
            return bool(row[0] == len(set(effect_ids)))

        return await self._run(work)

    async def release(self, conversation_id: str, effect_ids: Sequence[int], *, owner: str) -> None:
        async def work(conn: Connection) -> None:
            cur = await conn.execute(
                "WITH released AS (UPDATE outbox SET owner = NULL, lease_until = NULL"
                " WHERE conversation_id = %s AND id = ANY(%s::integer[]) AND owner = %s)"
                " SELECT FROM conversations WHERE id = %s",
                (conversation_id, list(effect_ids), owner, conversation_id),
            )
            if await cur.fetchone() is None:
                raise not_found(conversation_id)

        await self._run(work)

    async def messages(self, conversation_id: str, *, after_seq: int = 0) -> list[StoredMessage]:
        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            cur = await conn.execute(
                "SELECT c.id, m.seq, m.message::text FROM conversations AS c"
                " LEFT JOIN messages AS m ON m.conversation_id = c.id AND m.seq > %s"
                " WHERE c.id = %s ORDER BY m.seq",
                (after_seq, conversation_id),
            )
            return _exists_then(await cur.fetchall(), conversation_id)

        rows = await self._run(work)
        return [StoredMessage(seq=seq, message=load_message(text)) for seq, text in rows]

    async def transitions(self, conversation_id: str) -> list[TransitionRecord]:
        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            cur = await conn.execute(
                "SELECT c.id, t.seq, t.event_kind, t.event::text, t.from_phase, t.to_phase,"
                " t.context_tokens, t.reason, t.effect_kinds::text, t.at, t.session"
                " FROM conversations AS c"
                " LEFT JOIN transitions AS t ON t.conversation_id = c.id"
                " WHERE c.id = %s ORDER BY t.seq",
                (conversation_id,),
            )
            return _exists_then(await cur.fetchall(), conversation_id)

        return [transition_from_row(row) for row in await self._run(work)]

    async def list_conversations(self) -> list[StoredConversation]:
        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            cur = await conn.execute(
                "SELECT state::text, version, system, child_id, created_at FROM conversations"
                " ORDER BY created_at, ordinal"
            )
            return await cur.fetchall()

        return [listed(row) for row in await self._run(work)]

    async def with_pending(self) -> list[str]:
        async def work(conn: Connection) -> list[str]:
            cur = await conn.execute("SELECT DISTINCT conversation_id FROM outbox")
            return [str(row[0]) for row in await cur.fetchall()]

        return await self._run(work)

    async def link_child(self, parent_id: str, child_id: str) -> str:
        async def work(conn: Connection) -> str:
            cur = await conn.execute(
                "UPDATE conversations SET child_id = coalesce(child_id, %s) WHERE id = %s"
                " RETURNING child_id",
                (child_id, parent_id),
            )
            row = await cur.fetchone()
            if row is None:
                raise not_found(parent_id)
            return str(row[0])

        return await self._run(work)

    async def save_snapshot(self, snapshot: SessionSnapshot) -> None:
        """Insert unless the version is taken; then the snapshot kept under it, to compare
        (one statement: the insert's clause and the read see the same snapshot)."""
        conversation_id = snapshot.conversation_id
        text = dump_snapshot(snapshot)

        async def work(conn: Connection) -> tuple[Any, ...] | None:
            cur = await conn.execute(
                "WITH saved AS (INSERT INTO snapshots (conversation_id, version, snapshot)"
                " SELECT id, %s, %s FROM conversations WHERE id = %s"
                " ON CONFLICT DO NOTHING RETURNING version)"
                " SELECT (SELECT count(*) FROM saved), s.snapshot::text FROM conversations AS c"
                " LEFT JOIN snapshots AS s ON s.conversation_id = c.id AND s.version = %s"
                " WHERE c.id = %s",
                (snapshot.version, text, conversation_id, snapshot.version, conversation_id),
            )
            return await cur.fetchone()

        row = await self._run(work)
        if row is None:
            raise not_found(conversation_id)
        saved, existing = row
        if not saved and existing is not None:
            check_snapshot_unchanged(load_snapshot(existing), snapshot)

    async def snapshots(self, conversation_id: str) -> list[SessionSnapshot]:
        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            cur = await conn.execute(
                "SELECT c.id, s.snapshot::text FROM conversations AS c"
                " LEFT JOIN snapshots AS s ON s.conversation_id = c.id"
                " WHERE c.id = %s ORDER BY s.version",
                (conversation_id,),
            )
            return _exists_then(await cur.fetchall(), conversation_id)

        return [load_snapshot(text) for (text,) in await self._run(work)]

    async def close(self) -> None:
        """Close the pool's connections; later calls raise ``SegueError``."""
        self._closed = True
        pool = self._pool
        if pool is None:
            return
        if self._loop is asyncio.get_running_loop():
            self._pool = self._loop = None
            await pool.close()
            guard, self._guard = self._guard, None
            if guard is not None:
                guard.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await guard
        elif self._loop is not None and self._loop.is_closed():
            self._abandon()
        else:
            msg = "close this PostgresStore in the event loop that uses it"
            raise SegueError(msg)
