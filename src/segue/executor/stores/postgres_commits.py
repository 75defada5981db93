"""``PostgresStore``'s commits: one statement per step, or one for many (``Commits``).

Why many in one: conversations of one process that commit in the same turn of the event loop
(a busy server, a worker with many conversations) each paid a round trip, a transaction and a
wake-up of a server process; on a machine short of cores, that is what a step cost most of.
They are now sent together, as one statement (``COMMIT_MANY``) whose input is one JSON
document listing the commits: one round trip, one transaction, one execution of the plan.
Every commit in it is still guarded by its own version and key, so one that is refused (a
version that moved) is left out while the others land, and says why afterwards, as a commit
alone does. A batch whose statement fails (two commits racing with one key, a row in the way)
is committed again one by one, so that only the culprit gets the error.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any, Final, NoReturn

import psycopg
from psycopg import errors

from segue.executor.errors import DuplicateMessageError, SegueError
from segue.executor.store_port import StoredConversation
from segue.executor.stores import _outbox
from segue.executor.stores._rows import CommitRows, Counters
from segue.executor.stores._shared import not_found, version_moved
from segue.executor.stores.postgres_pool import Connection, Pool
from segue.executor.stores.postgres_schema import COMMIT, COMMIT_MARKED, WHY_REFUSED, fast_commit

Waiting = list[tuple[CommitRows, asyncio.Future[StoredConversation]]]
"""Commits and the futures their callers wait on."""

# ``COMMIT`` (in ``postgres_schema``) for every commit of the document at once: the input is a
# relation of commits (their columns as ``json_to_recordset`` reads them), the version-guarded
# UPDATE joins it, and the inserts take what the UPDATE returned (``n`` numbers the commits). A
# commit whose guard fails returns no row.
COMMIT_MANY: Final = """
WITH input AS (
    SELECT * FROM json_to_recordset(%s::json) AS i (
        n integer, cid text, version integer, state json, phase text, appended integer,
        queued integer, at double precision, key text, owner text, lease double precision,
        completes integer[], effects json, messages json, kinds text[], event_kind text,
        event json, from_phase text, tokens integer, reason text, effect_kinds json,
        session integer
    )
), upd AS (
    UPDATE conversations AS c SET state = i.state, phase = i.phase, version = c.version + 1,
        message_count = c.message_count + i.appended,
        effect_count = c.effect_count + i.queued, updated_at = i.at,
        outbox = (
            SELECT coalesce(json_agg(e.entry ORDER BY e.id), '[]')
            FROM (
                SELECT o.entry, (o.entry->>'id')::integer AS id
                FROM json_array_elements(c.outbox) AS o (entry)
                WHERE (o.entry->>'id')::integer <> ALL(i.completes)
                UNION ALL
                SELECT json_build_object('id', c.effect_count + q.n, 'effect', q.effect,
                    'owner', i.owner, 'lease_until', i.lease),
                    c.effect_count + q.n
                FROM json_array_elements(i.effects) WITH ORDINALITY AS q (effect, n)
            ) AS e
        )
    FROM input AS i
    WHERE c.id = i.cid AND c.version = i.version AND NOT EXISTS (
        SELECT FROM transitions AS t
        WHERE t.conversation_id = i.cid AND t.idempotency_key = i.key)
    RETURNING i.n, c.message_count, c.effect_count, c.system, c.child_id, c.created_at,
        CASE WHEN json_array_length(c.outbox) = i.queued THEN NULL ELSE c.outbox::text END
), appended AS (
    INSERT INTO messages (conversation_id, seq, kind, message)
    SELECT i.cid, upd.message_count - i.appended + m.n, m.kind, m.message
    FROM upd JOIN input AS i ON i.n = upd.n,
        ROWS FROM (json_array_elements(i.messages), unnest(i.kinds))
        WITH ORDINALITY AS m (message, kind, n)
), logged AS (
    INSERT INTO transitions (conversation_id, seq, event_kind, event, from_phase, to_phase,
        context_tokens, reason, effect_kinds, at, session, idempotency_key)
    SELECT i.cid, i.version, i.event_kind, i.event, i.from_phase, i.phase, i.tokens, i.reason,
        i.effect_kinds, i.at, i.session, i.key
    FROM upd JOIN input AS i ON i.n = upd.n
)
SELECT upd.*, (SELECT pg_notify('segue_changes', w.conversation_id) IS NULL
    FROM input AS i JOIN segue_watches AS w ON w.conversation_id = i.cid WHERE i.n = upd.n
    LIMIT 1)
FROM upd
"""


def _fields(rows: CommitRows) -> dict[str, Any]:
    """What a commit writes, by ``COMMIT``'s parameter names (the documents as JSON texts)."""
    commit = rows.commit
    (
        _,
        version,
        event_kind,
        event,
        from_phase,
        phase,
        tokens,
        reason,
        effect_kinds,
        at,
        session,
        key,
    ) = rows.transition
    return {
        "cid": commit.conversation_id,
        "version": version,
        "state": rows.state,
        "phase": phase,
        "appended": len(rows.appended),
        "queued": len(rows.queued),
        "at": at,
        "key": key,
        "owner": commit.owner,
        "lease": commit.lease_until,
        "event_kind": event_kind,
        "event": event,
        "from_phase": from_phase,
        "tokens": tokens,
        "reason": reason,
        "effect_kinds": effect_kinds,
        "session": session,
    }


def params(rows: CommitRows) -> dict[str, Any]:
    """``COMMIT``'s parameters. The documents go as JSON arrays of the texts as they are (each
    a JSON object already), kinds and ids as array literals: text parameters, which psycopg
    sends as they are (its list adapters would examine every element and, in text form,
    escape every quote of the JSON inside)."""
    return {
        **_fields(rows),
        "messages": f"[{','.join(text for _, text in rows.appended)}]",
        "kinds": f"{{{','.join(kind for kind, _ in rows.appended)}}}",  # plain words
        "effects": f"[{','.join(text for _, text in rows.queued)}]",
        "completes": f"{{{','.join(map(str, sorted(rows.completes)))}}}",
    }


_DOCUMENTS: Final = frozenset({"state", "event", "effect_kinds"})
"""Fields that are JSON texts already: written into the document as they are."""


def document(batch: Sequence[CommitRows]) -> str:
    """``COMMIT_MANY``'s input: a JSON array with one object per commit (``n`` its place in
    ``batch``), built around the JSON texts the commits already hold (nothing is parsed or
    encoded again but the plain fields)."""
    records = []
    for n, rows in enumerate(batch):
        parts = [f'"n":{n}']
        for name, value in _fields(rows).items():
            text = value if name in _DOCUMENTS else json.dumps(value)
            parts.append(f'"{name}":{text}')
        parts.append(f'"messages":[{",".join(text for _, text in rows.appended)}]')
        parts.append(f'"kinds":{json.dumps([kind for kind, _ in rows.appended])}')
        parts.append(f'"effects":[{",".join(text for _, text in rows.queued)}]')
        parts.append(f'"completes":{json.dumps(sorted(rows.completes))}')
        records.append(f"{{{','.join(parts)}}}")
    return f"[{','.join(records)}]"


def fast(rows: CommitRows) -> tuple[str, dict[str, Any]] | None:
    """``fast_commit``'s statement for ``rows`` and its parameters, when the step has its
    shape (see there); else None."""
    appended, queued, completes = rows.appended, rows.queued, rows.completes
    if len(appended) > 1 or len(queued) > 1 or len(completes) > 1 or rows.landmarks:
        return None
    commit = rows.commit
    key = commit.idempotency_key
    values = _fields(rows)
    if appended:
        values["kind"], values["message"] = appended[0]
    if queued:
        values["effect"] = queued[0][1]
    if completes:
        (values["completed"],) = completes
    return fast_commit(len(appended), len(queued), len(completes), key is not None), values


def general(rows: CommitRows) -> tuple[str, dict[str, Any]]:
    """The statement for a step of any shape and its parameters: ``COMMIT``, or
    ``COMMIT_MARKED`` for a step that appends landmarks (built only when the usual shape's
    statement is not enough: most steps never need them)."""
    values = params(rows)
    if not rows.landmarks:
        return COMMIT, values
    values["landmarks"] = json.dumps(
        [
            {"n": n, "session": s, "generation": g, "start": start, "pinned": pinned}
            for n, s, g, start, pinned in rows.landmarks
        ]
    )
    return COMMIT_MARKED, values


def stored(rows: CommitRows, returned: Sequence[Any]) -> StoredConversation:
    """The conversation as committed, from what ``COMMIT`` (or a row of ``COMMIT_MANY``, its
    ``n`` left out) returned: the counters, and the outbox when it holds more than what the
    step queued (then whether watchers were notified, which is not needed here)."""
    message_count, effect_count, system, child_id, created_at, outbox = returned[:6]
    counters = Counters(message_count, effect_count, system, child_id, created_at)
    first_new = effect_count - len(rows.queued) + 1
    older = (
        []
        if outbox is None
        else [entry for entry in _outbox.parse(outbox) if entry["id"] < first_new]
    )
    return rows.stored(counters, older)


class Commits:
    """How ``PostgresStore``'s commits reach the server: those made in the same turn of an
    event loop together (``COMMIT_MANY``), a conversation committing alone, step after step, at
    once (it does not wait for the end of the loop's turn), and each caller told its own
    outcome."""

    def __init__(self, db: Pool) -> None:
        self._db = db
        self._batches: dict[asyncio.AbstractEventLoop, Waiting] = {}
        """Commits made in this turn of each loop, sent together at its end."""
        self._last: tuple[asyncio.AbstractEventLoop, str] | None = None
        """The loop that committed last, and to which conversation."""
        self._committing: set[asyncio.Task[None]] = set()
        """Batches being committed (held here: a task nobody holds may be collected)."""

    async def commit(self, rows: CommitRows) -> StoredConversation:
        """Commit ``rows``: with the other commits of this turn of the loop, or alone."""
        conversation_id = rows.commit.conversation_id
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

    async def finish(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send ``loop``'s batch now and wait for every batch under way (closing)."""
        self._flush(loop)
        await asyncio.gather(*list(self._committing), return_exceptions=True)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Commit the loop's batch, in a task of its own (the callers wait on its futures)."""
        batch = self._batches.pop(loop, [])
        if batch:
            task = loop.create_task(self._commit_batch(batch), name="segue-pg-commit")
            self._committing.add(task)
            task.add_done_callback(self._committing.discard)

    async def _commit_batch(self, batch: Waiting) -> None:
        """Commit ``batch`` and tell each caller its outcome. A commit to a conversation
        already in the batch goes alone (the statement updates a row once)."""
        together: Waiting = []
        alone: Waiting = []
        seen: set[str] = set()
        for rows, future in batch:
            cid = rows.commit.conversation_id
            # A step with landmarks has a statement of its own (``COMMIT_MARKED``).
            (alone if cid in seen or rows.landmarks else together).append((rows, future))
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
            cur = await conn.execute(*general(rows), binary=True)
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
