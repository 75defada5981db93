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
  (``postgres_commits``), each still guarded on its own. A worker's CPU goes on its own work,
  not on waiting for acknowledgements. Reads are one statement each too; only a refused commit
  asks a second time, to say why. Claims, rare, read and write the outbox in a transaction
  with the row locked.
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
- **Schema versioning** in a one-row ``segue_schema`` table, migrated under an advisory lock so
  two processes starting together do not both create the tables.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Self, TypeVar
from urllib.parse import urlsplit

import psycopg
from psycopg import errors

from segue.executor.errors import ConversationExistsError, DuplicateMessageError, SegueError
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
    commit_rows,
    conversation_row,
    listed,
    loaded,
    seed_rows,
)
from segue.executor.stores._shared import (
    check_snapshot_unchanged,
    check_storable,
    holdable,
    not_found,
    require_holdable,
    transition_from_row,
    version_moved,
)
from segue.executor.stores.codec import dump_snapshot, load_message, load_snapshot
from segue.executor.stores.postgres_commits import COMMIT_MANY, document, fast, params, stored
from segue.executor.stores.postgres_pool import Connection, Pool
from segue.executor.stores.postgres_schema import (
    COMMIT,
    SCHEMA_VERSION,
    WHY_REFUSED,
)
from segue.executor.stores.postgres_watch import Watches
from segue.statemachine import ConversationState, Message
from segue.statemachine.checkpoint import SessionSnapshot

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

T = TypeVar("T")


# psycopg_pool reports failed connection attempts as warnings on "psycopg.pool". An application
# that configured logging sees them; one that did not must not get them on stderr from Python's
# last-resort handler (a library is quiet), which a handler of any kind on the logger prevents.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())


def _tell(
    future: asyncio.Future[StoredConversation],
    result: StoredConversation | None,
    error: BaseException | None,
) -> None:
    if future.done():
        return  # its caller gave up waiting; the commit itself was made (or refused) anyway
    if error is not None:
        future.set_exception(error)
    elif result is not None:
        future.set_result(result)


def _exists_then(rows: Sequence[tuple[Any, ...]], conversation_id: str) -> list[tuple[Any, ...]]:
    """The rows of a read made as ``conversations LEFT JOIN <what is read>``: none at all means
    no such conversation, one row whose first read column is NULL means nothing to read."""
    if not rows:
        raise not_found(conversation_id)
    return [row[1:] for row in rows if row[1] is not None]


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
        self._db = Pool(
            conninfo,
            lock_timeout=lock_timeout,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            abandoned=lambda: self._watches.abandon(),  # noqa: PLW0108  # made next
        )
        """The connections, opened on first use (``postgres_pool``)."""
        self._batches: dict[
            asyncio.AbstractEventLoop, list[tuple[CommitRows, asyncio.Future[StoredConversation]]]
        ] = {}
        """Commits made in this turn of each loop, sent together at its end."""
        self._last: tuple[asyncio.AbstractEventLoop, str] | None = None
        """The loop that committed last, and to which conversation."""
        self._committing: set[asyncio.Task[None]] = set()
        """Batches being committed (held here: a task nobody holds may be collected)."""
        self._watches = Watches(conninfo, self._db.execute)
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

        await self._db.run(work)
        return StoredConversation(
            state=state, version=1, system=system, created_at=at, last_seq=len(seeds)
        )

    async def load(self, conversation_id: str) -> StoredConversation:
        """The conversation's row: state, version, ``last_seq`` and outbox, read together."""
        require_holdable(conversation_id)
        columns = LOAD_COLUMNS.replace("state", "state::text").replace("outbox", "outbox::text")

        async def work(conn: Connection) -> tuple[Any, ...] | None:
            cur = await conn.execute(
                f"SELECT {columns} FROM conversations WHERE id = %s",  # noqa: S608
                (conversation_id,),
            )
            return await cur.fetchone()

        return loaded(conversation_id, await self._db.run(work))

    async def commit(self, commit: Commit) -> StoredConversation:
        """Apply ``commit``: with the other commits of this turn of the event loop, in one
        statement (``postgres_commits``), or alone (``COMMIT``) when it is the only one (a
        conversation committing alone, step after step, does not wait for the end of the
        loop's turn)."""
        rows = commit_rows(commit)
        conversation_id = commit.conversation_id
        loop = asyncio.get_running_loop()
        batch = self._batches.get(loop)
        if batch is None and self._last == (loop, conversation_id):
            return await self._commit_one(rows)
        self._last = (loop, conversation_id)
        future: asyncio.Future[StoredConversation] = loop.create_future()
        if batch is None:
            batch = self._batches[loop] = []
            loop.call_soon(self._flush, loop)
        batch.append((rows, future))
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Commit the loop's batch, in a task of its own (the callers wait on its futures)."""
        batch = self._batches.pop(loop, [])
        if batch:
            task = loop.create_task(self._commit_batch(batch), name="segue-pg-commit")
            self._committing.add(task)
            task.add_done_callback(self._committing.discard)

    async def _commit_batch(
        self, batch: list[tuple[CommitRows, asyncio.Future[StoredConversation]]]
    ) -> None:
        """Commit ``batch`` and tell each caller its outcome. A commit to a conversation
        already in the batch goes alone (the statement updates a row once)."""
        together: list[tuple[CommitRows, asyncio.Future[StoredConversation]]] = []
        alone: list[tuple[CommitRows, asyncio.Future[StoredConversation]]] = []
        seen: set[str] = set()
        for rows, future in batch:
            cid = rows.commit.conversation_id
            (alone if cid in seen else together).append((rows, future))
            seen.add(cid)
        if len(together) == 1:
            alone.insert(0, together.pop())
        if together:
            try:
                results = await self._commit_many([rows for rows, _ in together])
            except (SegueError, psycopg.Error):
                # Refused as a whole (two commits racing with one key, a row in the way, a
                # store gone): one by one, so that each caller gets its own outcome.
                alone = together + alone
            except BaseException as stopped:  # cancelled: every caller hears it
                for _, future in together + alone:
                    _tell(future, None, stopped)
                raise
            else:
                for (_, future), (result, problem) in zip(together, results, strict=True):
                    _tell(future, result, problem)
        for rows, future in alone:
            try:
                landed = await self._commit_one(rows)
            except BaseException as error:  # the caller gets it
                _tell(future, None, error)
                if not isinstance(error, Exception):
                    raise
            else:
                _tell(future, landed, None)

    async def _commit_many(
        self, batch: list[CommitRows]
    ) -> list[tuple[StoredConversation | None, BaseException | None]]:
        """``COMMIT_MANY`` for ``batch``; each commit's outcome (those it left out say why
        afterwards, as a commit alone does)."""

        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            cur = await conn.execute(COMMIT_MANY, (document(batch),), binary=True)
            return await cur.fetchall()

        returned = {row[0]: row[1:] for row in await self._db.run(work)}
        outcomes: list[tuple[StoredConversation | None, BaseException | None]] = []
        for n, rows in enumerate(batch):
            if n in returned:
                outcomes.append((stored(rows, returned[n]), None))
                continue
            try:
                await self._why_refused(rows)
            except SegueError as error:
                outcomes.append((None, error))
        return outcomes

    async def _commit_one(self, rows: CommitRows) -> StoredConversation:
        """One commit: the statement of its shape if it has a usual one (``fast_commit``),
        else, or if that wrote nothing, ``COMMIT``; when that writes nothing either, a read
        says why."""
        key = rows.commit.idempotency_key
        conversation_id = rows.commit.conversation_id
        shaped = fast(rows)

        async def work(conn: Connection) -> tuple[Any, ...] | None:
            if shaped is not None:
                cur = await conn.execute(shaped[0], shaped[1], binary=True)
                landed = await cur.fetchone()
                if landed is not None:
                    return landed
            cur = await conn.execute(COMMIT, params(rows), binary=True)
            return await cur.fetchone()

        try:
            row = await self._db.run(work)
        except errors.UniqueViolation as error:
            if key is None or error.diag.constraint_name != "transitions_by_key":
                raise
            # A key used before (the usual shape's statement leaves it to the unique index),
            # or two commits racing with one key on different versions.
            raise DuplicateMessageError(conversation_id, key) from None
        if row is None:
            await self._why_refused(rows)
        return stored(rows, row)

    async def _why_refused(self, rows: CommitRows) -> NoReturn:
        """Raise why a commit wrote nothing: a duplicate key, a version that moved, no such
        conversation."""
        commit = rows.commit
        conversation_id, key = commit.conversation_id, commit.idempotency_key

        async def work(conn: Connection) -> tuple[Any, ...] | None:
            cur = await conn.execute(WHY_REFUSED, (conversation_id, key, conversation_id))
            return await cur.fetchone()

        why = await self._db.run(work)
        if why is None:
            raise not_found(conversation_id)
        if why[1]:
            raise DuplicateMessageError(conversation_id, str(key))
        raise version_moved(conversation_id, why[0], commit.expected_version)

    async def _outbox_step(
        self, conversation_id: str, change: Callable[[list[_outbox.Entry]], tuple[T, bool]]
    ) -> T:
        """Read the conversation's outbox with its row locked, ``change`` it (in place; it says
        what to return and whether it changed anything), and write it back if it changed: one
        transaction, so two runtimes claiming at once are served one after the other."""
        require_holdable(conversation_id)

        async def work(conn: Connection) -> T:
            async with conn.transaction():
                cur = await conn.execute(
                    "SELECT outbox::text FROM conversations WHERE id = %s FOR UPDATE",
                    (conversation_id,),
                )
                row = await cur.fetchone()
                if row is None:
                    raise not_found(conversation_id)
                entries = _outbox.parse(row[0])
                result, changed = change(entries)
                if changed:
                    await conn.execute(
                        "UPDATE conversations SET outbox = %s WHERE id = %s",
                        (_outbox.dump(entries), conversation_id),
                    )
                return result

        return await self._db.run(work)

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
        """Read and claim with the conversation's row locked: two sessions claiming at once
        cannot both win; the loser reads who holds it."""

        def change(entries: list[_outbox.Entry]) -> tuple[_outbox.Entry | None, bool]:
            return _outbox.claim(
                entries,
                effect_id,
                owner=owner,
                lease_until=lease_until,
                now=now,
                take_from=take_from,
            )

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

        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            cur = await conn.execute(
                "SELECT c.id, m.seq, m.message::text FROM conversations AS c"
                " LEFT JOIN messages AS m ON m.conversation_id = c.id AND m.seq > %s"
                " WHERE c.id = %s ORDER BY m.seq",
                (after_seq, conversation_id),
            )
            return _exists_then(await cur.fetchall(), conversation_id)

        rows = await self._db.run(work)
        return [StoredMessage(seq=seq, message=load_message(text)) for seq, text in rows]

    async def transitions(self, conversation_id: str) -> list[TransitionRecord]:
        require_holdable(conversation_id)

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

        return [transition_from_row(row) for row in await self._db.run(work)]

    async def list_conversations(self) -> list[StoredConversation]:
        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            cur = await conn.execute(
                "SELECT state::text, version, system, child_id, created_at FROM conversations"
                " ORDER BY created_at, ordinal"
            )
            return await cur.fetchall()

        return [listed(row) for row in await self._db.run(work)]

    async def with_pending(self) -> list[str]:
        """A scan of the conversations (at startup): an index on what changes with every step
        would make every step's update a non-HOT one."""

        async def work(conn: Connection) -> list[str]:
            cur = await conn.execute("SELECT id FROM conversations WHERE outbox::text <> '[]'")
            return [str(row[0]) for row in await cur.fetchall()]

        return await self._db.run(work)

    async def link_child(self, parent_id: str, child_id: str) -> str:
        require_holdable(parent_id)

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

        return await self._db.run(work)

    async def save_snapshot(self, snapshot: SessionSnapshot) -> None:
        """Insert unless the version is taken; then the snapshot kept under it, to compare
        (one statement: the insert's clause and the read see the same snapshot)."""
        conversation_id = snapshot.conversation_id
        require_holdable(conversation_id)
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

        row = await self._db.run(work)
        if row is None:
            raise not_found(conversation_id)
        saved, existing = row
        if not saved and existing is not None:
            check_snapshot_unchanged(load_snapshot(existing), snapshot)

    async def snapshots(self, conversation_id: str) -> list[SessionSnapshot]:
        require_holdable(conversation_id)

        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            cur = await conn.execute(
                "SELECT c.id, s.snapshot::text FROM conversations AS c"
                " LEFT JOIN snapshots AS s ON s.conversation_id = c.id"
                " WHERE c.id = %s ORDER BY s.version",
                (conversation_id,),
            )
            return _exists_then(await cur.fetchall(), conversation_id)

        return [load_snapshot(text) for (text,) in await self._db.run(work)]

    async def close(self) -> None:
        """Finish the commits under way, close the pool's connections; later calls raise
        ``SegueError``."""
        loop = asyncio.get_running_loop()
        if loop is self._db.loop and not self._db.closed:
            self._flush(loop)
            await asyncio.gather(*list(self._committing), return_exceptions=True)
            await self._watches.close()  # its registrations are deleted through the pool
        await self._db.close()
