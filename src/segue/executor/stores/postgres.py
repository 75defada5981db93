"""``PostgresStore``: the ``Store`` contract on PostgreSQL, through psycopg 3's async API.

Same tables and semantics as ``SqliteStore``, so the same contract tests run against both:

- **One connection per store, one operation at a time.** A psycopg connection runs one
  transaction at a time, so calls of one store are serialised by an ``asyncio.Lock``. Processes
  (or several stores) share the database as SQLite's do: writers of one conversation are
  serialised by the row lock the version-guarded ``UPDATE`` takes, and the loser sees the new
  version and gets ``ConcurrentUpdateError``.
- **Append-only, one transaction per step**, with counters on the conversation row
  (``message_count``, ``effect_count``) giving the next keys without reading the transcript.
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
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import psycopg
from psycopg import errors

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
    outbox_keys,
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

SCHEMA_VERSION: Final = 2
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
)


async def _require(conn: Connection, conversation_id: str) -> None:
    cur = await conn.execute("SELECT 1 FROM conversations WHERE id = %s", (conversation_id,))
    if await cur.fetchone() is None:
        raise not_found(conversation_id)


class PostgresStore:
    """A ``Store`` in a PostgreSQL database named by a libpq ``conninfo`` string or URL.

    The connection is opened on first use. ``lock_timeout`` (seconds) is how long a call waits
    for another session's lock before raising ``StoreLockedError``. Methods do what ``Store``
    (in ``ports``) says; their notes here say only how.
    """

    def __init__(self, conninfo: str, *, lock_timeout: float = 5.0) -> None:
        self._conninfo = conninfo
        self._lock_timeout = lock_timeout
        self._conn: Connection | None = None
        self._lock: asyncio.Lock | None = None
        self._closed = False

    # ------------------------------------------------------------------ plumbing

    async def _connect(self) -> Connection:
        conn: Connection = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        try:
            await conn.execute(f"SET lock_timeout = {int(self._lock_timeout * 1000)}")
            await self._migrate(conn)
        except BaseException:
            await conn.close()
            raise
        return conn

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
        """Run ``work`` alone on the store's connection (opened on first use)."""
        if self._closed:
            msg = "the store is closed"
            raise SegueError(msg)
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = await self._connect()
                return await work(self._conn)
            except errors.LockNotAvailable as error:
                msg = (
                    "database is locked: another process holds it for longer than "
                    f"lock_timeout ({self._lock_timeout:g}s)"
                )
                raise StoreLockedError(msg) from error
            except (psycopg.OperationalError, psycopg.InterfaceError) as error:
                # A dropped session, a server restart (AdminShutdown), a refused connection:
                # the transaction did not commit. The next call opens a new connection.
                conn, self._conn = self._conn, None
                if conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        await conn.close()
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
        """Apply ``commit`` in one transaction (see ``Commit``)."""
        conversation_id = commit.conversation_id
        rows = commit_rows(commit)
        key = commit.idempotency_key

        async def work(conn: Connection) -> StoredConversation:
            async with conn.transaction():
                if key is not None:
                    cur = await conn.execute(
                        "SELECT 1 FROM idempotency WHERE conversation_id = %s AND key = %s",
                        (conversation_id, key),
                    )
                    if await cur.fetchone() is not None:
                        raise DuplicateMessageError(conversation_id, key)
                cur = await conn.execute(
                    "UPDATE conversations SET state = %s, phase = %s, version = version + 1,"
                    " message_count = message_count + %s, effect_count = effect_count + %s,"
                    " updated_at = %s WHERE id = %s AND version = %s"
                    " RETURNING message_count, effect_count, system, child_id, created_at",
                    rows.update,
                )
                counters = await cur.fetchone()
                if counters is None:
                    raise await _version_moved(conn, conversation_id, commit.expected_version)
                async with conn.cursor() as many:
                    if rows.appended:
                        await many.executemany(
                            "INSERT INTO messages (conversation_id, seq, kind, message)"
                            " VALUES (%s, %s, %s, %s)",
                            rows.messages(counters[0]),
                        )
                    if rows.queued:
                        await many.executemany(
                            "INSERT INTO outbox (conversation_id, id, effect, owner, lease_until)"
                            " VALUES (%s, %s, %s, %s, %s)",
                            rows.outbox(counters[1]),
                        )
                    if rows.completes:
                        await many.executemany(
                            "DELETE FROM outbox WHERE conversation_id = %s AND id = %s",
                            rows.completes,
                        )
                await conn.execute(
                    "INSERT INTO transitions (conversation_id, seq, event_kind, event, from_phase,"
                    " to_phase, context_tokens, reason, effect_kinds, at)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    rows.transition,
                )
                if key is not None:
                    # Two commits racing with one key: the version check lets one through.
                    await conn.execute(
                        "INSERT INTO idempotency (conversation_id, key, version)"
                        " VALUES (%s, %s, %s)",
                        (conversation_id, key, commit.expected_version + 1),
                    )
                cur = await conn.execute(
                    "SELECT id, effect::text, owner, lease_until FROM outbox"
                    " WHERE conversation_id = %s ORDER BY id",
                    (conversation_id,),
                )
                pending_rows = await cur.fetchall()
            return rows.stored(counters, pending_rows)

        return await self._run(work)

    async def complete(self, conversation_id: str, effect_ids: Sequence[int]) -> None:
        rows = outbox_keys(conversation_id, effect_ids)

        async def work(conn: Connection) -> None:
            async with conn.transaction():
                await _require(conn, conversation_id)
                if rows:
                    async with conn.cursor() as cur:
                        await cur.executemany(
                            "DELETE FROM outbox WHERE conversation_id = %s AND id = %s", rows
                        )

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
                "SELECT id, effect::text, owner, lease_until FROM outbox"
                " WHERE conversation_id = %s AND id = %s",
                (conversation_id, effect_id),
            )
            row = await cur.fetchone()
            if row is None:
                await _require(conn, conversation_id)
            return row

        row = await self._run(work)
        return None if row is None else pending_effect(row)

    async def renew(
        self, conversation_id: str, effect_ids: Sequence[int], *, owner: str, lease_until: float
    ) -> bool:
        async def work(conn: Connection) -> bool:
            cur = await conn.execute(
                "UPDATE outbox SET lease_until = %s"
                " WHERE conversation_id = %s AND id = ANY(%s) AND owner = %s",
                (lease_until, conversation_id, list(effect_ids), owner),
            )
            if cur.rowcount == 0:
                await _require(conn, conversation_id)
            return cur.rowcount == len(set(effect_ids))

        return await self._run(work)

    async def release(self, conversation_id: str, effect_ids: Sequence[int], *, owner: str) -> None:
        async def work(conn: Connection) -> None:
            cur = await conn.execute(
                "UPDATE outbox SET owner = NULL, lease_until = NULL"
                " WHERE conversation_id = %s AND id = ANY(%s) AND owner = %s",
                (conversation_id, list(effect_ids), owner),
            )
            if cur.rowcount == 0:
                await _require(conn, conversation_id)

        await self._run(work)

    async def messages(self, conversation_id: str, *, after_seq: int = 0) -> list[StoredMessage]:
        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            async with conn.transaction():
                await _require(conn, conversation_id)
                cur = await conn.execute(
                    "SELECT seq, message::text FROM messages"
                    " WHERE conversation_id = %s AND seq > %s ORDER BY seq",
                    (conversation_id, after_seq),
                )
                return await cur.fetchall()

        rows = await self._run(work)
        return [StoredMessage(seq=seq, message=load_message(text)) for seq, text in rows]

    async def transitions(self, conversation_id: str) -> list[TransitionRecord]:
        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            async with conn.transaction():
                await _require(conn, conversation_id)
                cur = await conn.execute(
                    "SELECT seq, event_kind, event::text, from_phase, to_phase, context_tokens,"
                    " reason, effect_kinds::text, at FROM transitions"
                    " WHERE conversation_id = %s ORDER BY seq",
                    (conversation_id,),
                )
                return await cur.fetchall()

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
            async with conn.transaction():
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
        conversation_id = snapshot.conversation_id
        text = dump_snapshot(snapshot)

        async def work(conn: Connection) -> str | None:
            async with conn.transaction():
                await _require(conn, conversation_id)
                cur = await conn.execute(
                    "INSERT INTO snapshots (conversation_id, version, snapshot)"
                    " VALUES (%s, %s, %s) ON CONFLICT DO NOTHING RETURNING version",
                    (conversation_id, snapshot.version, text),
                )
                if await cur.fetchone() is not None:
                    return None
                cur = await conn.execute(
                    "SELECT snapshot::text FROM snapshots WHERE conversation_id = %s"
                    " AND version = %s",
                    (conversation_id, snapshot.version),
                )
                row = await cur.fetchone()
                return None if row is None else str(row[0])

        existing = await self._run(work)
        if existing is not None:
            check_snapshot_unchanged(load_snapshot(existing), snapshot)

    async def snapshots(self, conversation_id: str) -> list[SessionSnapshot]:
        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            async with conn.transaction():
                await _require(conn, conversation_id)
                cur = await conn.execute(
                    "SELECT snapshot::text FROM snapshots WHERE conversation_id = %s"
                    " ORDER BY version",
                    (conversation_id,),
                )
                return await cur.fetchall()

        return [load_snapshot(text) for (text,) in await self._run(work)]

    async def close(self) -> None:
        """Close the connection; later calls raise ``SegueError``."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


async def _version_moved(conn: Connection, conversation_id: str, expected: int) -> SegueError:
    cur = await conn.execute("SELECT version FROM conversations WHERE id = %s", (conversation_id,))
    row = await cur.fetchone()
    if row is None:
        return not_found(conversation_id)
    return version_moved(conversation_id, row[0], expected)
