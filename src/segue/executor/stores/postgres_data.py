"""``PostgresStore``'s conversation-level reads and writes: landmarks, metadata, deletion,
import, export's one-snapshot read, and its listings' dialect (``sqlite_data`` is SQLite's; the
reasons are the same).

A deletion is one transaction that locks the conversation's row first: a step committing at the
same time either lands before it (and is deleted with the rest, or, for a purge, makes the
conversation young again, which the check made with the row locked sees) or finds no row (``not
found``). No row of the conversation is left, but its text is: every deleted row is a dead tuple
in the table's and its indexes' files, which a plain VACUUM only marks free; ``VACUUMED`` are
the tables ``PostgresStore.vacuum`` rewrites with ``VACUUM FULL`` (``docs/data.md``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

from psycopg import errors

from segue.executor.stores._listing import Dialect, still_matches
from segue.executor.stores._rows import RestoredRows, without_parent
from segue.executor.stores._shared import already_exists
from segue.executor.stores._sql import Deletion, WholeRows
from segue.executor.stores.postgres_pool import Connection
from segue.executor.stores.postgres_schema import METADATA

LISTED: Final = (
    "c.state::text, c.version, c.system, c.child_id, c.created_at,"
    f" {METADATA.replace('conversations.ordinal', 'c.ordinal')}, c.ordinal"
)
"""``_rows.LISTED_COLUMNS`` and the place, of ``conversations AS c``."""
VACUUMED: Final = (
    "conversations",
    "messages",
    "transitions",
    "landmarks",
    "snapshots",
    "tags",
)
"""The tables that hold a conversation's text, which ``PostgresStore.vacuum`` rewrites."""
DIALECT: Final = Dialect(mark="%s", listed=LISTED)
"""PostgreSQL's listings (``_listing``)."""
START_SEQ: Final = (
    "SELECT c.id, l.seq FROM conversations AS c LEFT JOIN LATERAL ("
    " SELECT seq FROM landmarks WHERE conversation_id = c.id AND {which}"
    " ORDER BY seq DESC LIMIT 1) AS l ON true WHERE c.id = %s"
)
"""The latest start of the conversation that ``which`` admits, read backwards along the
primary key (nearly always the last landmark), with the conversation's existence."""
PINNED: Final = (
    "SELECT c.id, m.seq, m.message::text FROM conversations AS c"
    " LEFT JOIN landmarks AS l ON l.conversation_id = c.id AND l.pinned AND l.seq < %s"
    " LEFT JOIN messages AS m ON m.conversation_id = c.id AND m.seq = l.seq"
    " WHERE c.id = %s ORDER BY l.seq"
)


def start_seq(session: int | None, generation: int) -> tuple[str, tuple[Any, ...]]:
    """``START_SEQ`` for ``SqlStore._start_seq``'s question, and its values but the id."""
    if session is None:
        return START_SEQ.format(which="start = 2 AND generation <= %s"), (generation,)
    which = "start > 0 AND (session < %s OR (session = %s AND generation <= %s))"
    return START_SEQ.format(which=which), (session, session, generation)


async def write_tags(conn: Connection, conversation_id: str, metadata: dict[str, str]) -> bool:
    """Replace the conversation's metadata, in the caller's transaction; False if there is no
    such conversation."""
    cur = await conn.execute(
        "SELECT created_at, ordinal FROM conversations WHERE id = %s FOR UPDATE",
        (conversation_id,),
    )
    row = await cur.fetchone()
    if row is None:
        return False
    await conn.execute("DELETE FROM tags WHERE ordinal = %s", (row[1],))
    if metadata:
        async with conn.cursor() as insert:
            await insert.executemany(
                "INSERT INTO tags (key, value, created_at, ordinal) VALUES (%s, %s, %s, %s)",
                [(key, value, *row) for key, value in metadata.items()],
            )
    return True


async def delete(conn: Connection, deletion: Deletion) -> list[str] | None:
    """Delete the conversations in one transaction (see the module docstring): the ids deleted,
    [] when a purge's condition no longer holds, None when the first one is not there."""
    first = deletion.ids[0]
    async with conn.transaction():
        cur = await conn.execute("SELECT 1 FROM conversations WHERE id = %s FOR UPDATE", (first,))
        if await cur.fetchone() is None:
            return None
        if deletion.idle_before is not None or deletion.pairs:
            # Read with the row locked: a step commits before this lock (and is seen here) or
            # waits for it (and finds no row).
            statement, values = still_matches(DIALECT, first, deletion.idle_before, deletion.pairs)
            cur = await conn.execute(statement, values)
            if await cur.fetchone() is None:
                return []
        return [cid for cid in deletion.ids if await _delete_rows(conn, cid, deletion.files)]


async def _delete_rows(
    conn: Connection, conversation_id: str, files: Callable[[str], object] | None
) -> bool:
    cur = await conn.execute(
        "SELECT parent_id, child_id, ordinal FROM conversations WHERE id = %s FOR UPDATE",
        (conversation_id,),
    )
    row = await cur.fetchone()
    if row is None:
        return False
    if files is not None:
        await asyncio.to_thread(files, conversation_id)
    parent_id, child_id, ordinal = row
    for table in ("messages", "transitions", "landmarks", "snapshots"):
        await conn.execute(
            f"DELETE FROM {table} WHERE conversation_id = %s",  # noqa: S608
            (conversation_id,),
        )
    await conn.execute("DELETE FROM tags WHERE ordinal = %s", (ordinal,))
    if parent_id is not None:
        await conn.execute(
            "UPDATE conversations SET child_id = NULL WHERE id = %s AND child_id = %s",
            (parent_id, conversation_id),
        )
    if child_id is not None:
        cur = await conn.execute(
            "SELECT state::text FROM conversations WHERE id = %s FOR UPDATE", (child_id,)
        )
        found = await cur.fetchone()
        state = None if found is None else without_parent(found[0], conversation_id)
        await conn.execute(
            "UPDATE conversations SET parent_id = NULL, state = coalesce(%s::json, state)"
            " WHERE id = %s AND (parent_id = %s OR %s::text IS NOT NULL)",
            (state, child_id, conversation_id, state),
        )
    await conn.execute("DELETE FROM conversations WHERE id = %s", (conversation_id,))
    return True


async def whole_rows(conn: Connection, load: str, conversation_id: str) -> WholeRows:
    """The conversation's rows in one REPEATABLE READ transaction: every read sees the one
    snapshot the first took (READ COMMITTED would give each statement its own); ``load`` is
    ``PostgresStore.load``'s statement."""
    async with conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cur = await conn.execute(load, (conversation_id,))
        row = await cur.fetchone()
        if row is None:
            return None, (), (), ()
        cur = await conn.execute(
            "SELECT seq, message::text FROM messages WHERE conversation_id = %s ORDER BY seq",
            (conversation_id,),
        )
        messages = await cur.fetchall()
        cur = await conn.execute(
            "SELECT seq, event_kind, event::text, from_phase, to_phase, context_tokens, reason,"
            " effect_kinds::text, at, session FROM transitions WHERE conversation_id = %s"
            " ORDER BY seq",
            (conversation_id,),
        )
        lines = await cur.fetchall()
        cur = await conn.execute(
            "SELECT snapshot::text FROM snapshots WHERE conversation_id = %s ORDER BY version",
            (conversation_id,),
        )
        snapshots = [str(text) for (text,) in await cur.fetchall()]
    return row, messages, lines, snapshots


async def restore(conn: Connection, rows: RestoredRows) -> None:
    """Write a whole conversation in one transaction (``already_exists`` if the id is taken)."""
    new = rows.new
    row = new.row
    conversation_id = row[0]
    try:
        async with conn.transaction():
            await conn.execute(
                "INSERT INTO conversations (id, parent_id, state, phase, version, system,"
                " message_count, effect_count, created_at, updated_at, outbox)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    *row[:4],
                    rows.version,
                    row[4],
                    row[5],
                    rows.effect_count,
                    row[6],
                    rows.updated_at,
                    rows.outbox,
                ),
            )
            async with conn.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO messages (conversation_id, seq, kind, message)"
                    " VALUES (%s, %s, %s, %s)",
                    new.seeds,
                )
                await cur.executemany(
                    "INSERT INTO landmarks (conversation_id, seq, session, generation, start,"
                    " pinned) VALUES (%s, %s, %s, %s, %s, %s)",
                    [(conversation_id, *mark) for mark in new.landmarks],
                )
                await cur.executemany(
                    "INSERT INTO transitions (conversation_id, seq, event_kind, event,"
                    " from_phase, to_phase, context_tokens, reason, effect_kinds, at, session)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    [(conversation_id, *line) for line in rows.transitions],
                )
                await cur.executemany(
                    "INSERT INTO snapshots (conversation_id, version, snapshot)"
                    " VALUES (%s, %s, %s)",
                    [(conversation_id, *snapshot) for snapshot in rows.snapshots],
                )
            await write_tags(conn, conversation_id, new.metadata)
    except errors.UniqueViolation:
        raise already_exists(conversation_id) from None
