"""``SqliteStore``'s conversation-level writes and listings: pages, metadata, deletion, import.

Why they are written this way:

- **Pages by keyset, through an index.** A page is the next ``limit`` conversations after the
  last one seen, by (``created_at``, ``ordinal``), read backwards along
  ``conversations_by_age``, or along ``tags_by_value`` when a metadata pair filters them (one
  user's conversations among everyone's): a page costs the same whatever came before it, and
  pages neither skip nor repeat while conversations are created.
- **Deletion leaves no text behind.** It runs alone on the store's connection, in a transaction
  of its own, with ``secure_delete`` on (SQLite zeroes what it frees) and the foreign keys'
  checks off (each would scan the transcript and the log, which are keyed by rid rather than
  by id; their rows go by key range instead). The WAL still holds the pages as they were
  before: it is checkpointed and truncated at once. A reader in another process sees the
  conversation whole, or not at all.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Final

from segue.executor.stores._rows import RestoredRows
from segue.executor.stores.sqlite_schema import KEY_SPAN, METADATA, SYSTEM

LISTED: Final = (
    f"conversations.state, conversations.version, {SYSTEM}, conversations.child_id,"
    f" conversations.created_at, {METADATA}, conversations.ordinal"
)
"""``_rows.LISTED_COLUMNS`` and the place, as a page reads them (qualified: ``tags`` has a
``created_at`` too)."""
CHECKPOINT_WAIT_MS: Final = 2_000
"""How long the checkpoint after a deletion waits for readers to let go of the WAL."""
_SECURE_DELETE: Final = {0: "OFF", 1: "ON", 2: "FAST"}
"""``PRAGMA secure_delete``'s answers, as the pragma takes them back."""
_INSERT_TRANSITION: Final = (
    "INSERT INTO transitions (rid, conversation_id, seq, event_kind, event, from_phase,"
    " to_phase, context_tokens, reason, effect_kinds, at, session)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _also(pairs: Sequence[tuple[str, str]], ordinal: str) -> tuple[str, list[str]]:
    """SQL requiring every pair of ``pairs`` of the conversation whose place is ``ordinal``."""
    clause = "".join(
        f" AND EXISTS (SELECT 1 FROM tags AS o WHERE o.ordinal = {ordinal}"  # noqa: S608
        " AND o.key = ? AND o.value = ?)"
        for _ in pairs
    )
    return clause, [part for pair in pairs for part in pair]


def page(
    pairs: Sequence[tuple[str, str]], limit: int, after: tuple[float, int] | None
) -> tuple[str, tuple[Any, ...]]:
    """A page's statement and values (``SqliteStore._page_rows``)."""
    values: list[Any] = []
    if not pairs:
        where = ""
        if after is not None:
            where, values = " WHERE (created_at, ordinal) < (?, ?)", [*after]
        statement = (
            f"SELECT {LISTED} FROM conversations{where}"  # noqa: S608
            " ORDER BY created_at DESC, ordinal DESC LIMIT ?"
        )
        return statement, (*values, limit)
    (key, value), rest = pairs[0], pairs[1:]
    values = [key, value]
    where = " WHERE t.key = ? AND t.value = ?"
    if after is not None:
        where += " AND (t.created_at, t.ordinal) < (?, ?)"
        values.extend(after)
    clause, more = _also(rest, "t.ordinal")
    statement = (
        f"SELECT {LISTED} FROM tags AS t"  # noqa: S608
        f" JOIN conversations ON conversations.ordinal = t.ordinal{where}{clause}"
        " ORDER BY t.created_at DESC, t.ordinal DESC LIMIT ?"
    )
    return statement, (*values, *more, limit)


def inactive(before: float, pairs: Sequence[tuple[str, str]]) -> tuple[str, tuple[Any, ...]]:
    """The statement and values of ``SqliteStore._inactive_ids``: a scan of the conversations
    (an index on ``updated_at`` would cost every step an index entry; a purge is rare)."""
    clause, more = _also(pairs, "conversations.ordinal")
    statement = (
        f"SELECT id FROM conversations WHERE updated_at < ?{clause}"  # noqa: S608
        " ORDER BY updated_at, ordinal"
    )
    return statement, (before, *more)


def write_tags(
    conn: sqlite3.Connection, ordinal: int, metadata: dict[str, str], created_at: float
) -> None:
    """Replace the conversation's metadata (one ``tags`` row a pair)."""
    conn.execute("DELETE FROM tags WHERE ordinal = ?", (ordinal,))
    conn.executemany(
        "INSERT INTO tags (ordinal, key, value, created_at) VALUES (?, ?, ?, ?)",
        [(ordinal, key, value, created_at) for key, value in metadata.items()],
    )


def delete(conn: sqlite3.Connection, conversation_id: str) -> bool:
    """Delete the conversation (see the module docstring); False when there is none."""
    secure = conn.execute("PRAGMA secure_delete").fetchone()[0]
    conn.execute("PRAGMA foreign_keys = OFF")  # a no-op inside a transaction: set before BEGIN
    conn.execute("PRAGMA secure_delete = ON")
    try:
        conn.execute("BEGIN IMMEDIATE")
        found = _delete_rows(conn, conversation_id)
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.rollback()
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA secure_delete = {_SECURE_DELETE.get(int(secure), 'FAST')}")
    if found:
        conn.execute(f"PRAGMA busy_timeout = {CHECKPOINT_WAIT_MS}")
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            conn.execute("PRAGMA busy_timeout = 0")
    return found


def _delete_rows(conn: sqlite3.Connection, conversation_id: str) -> bool:
    row = conn.execute(
        "SELECT ordinal, parent_id, child_id FROM conversations WHERE id = ?", (conversation_id,)
    ).fetchone()
    if row is None:
        return False
    ordinal, parent_id, child_id = row
    base = ordinal * KEY_SPAN
    for table in ("messages", "transitions", "landmarks"):
        conn.execute(
            f"DELETE FROM {table} WHERE rid > ? AND rid < ?",  # noqa: S608
            (base, base + KEY_SPAN),
        )
    for table in ("snapshots", "outbox"):
        conn.execute(f"DELETE FROM {table} WHERE conversation_id = ?", (conversation_id,))  # noqa: S608
    conn.execute("DELETE FROM prompts WHERE ordinal = ?", (ordinal,))
    conn.execute("DELETE FROM tags WHERE ordinal = ?", (ordinal,))
    if parent_id is not None:
        conn.execute(
            "UPDATE conversations SET child_id = NULL WHERE id = ? AND child_id = ?",
            (parent_id, conversation_id),
        )
    if child_id is not None:
        conn.execute(
            "UPDATE conversations SET parent_id = NULL WHERE id = ? AND parent_id = ?",
            (child_id, conversation_id),
        )
    conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
    return True


def restore(conn: sqlite3.Connection, rows: RestoredRows) -> None:
    """After the conversation's row and transcript are inserted: its version, its pending work,
    its event log and its snapshots, in the same transaction."""
    conversation_id = rows.new.row[0]
    conn.execute(
        "UPDATE conversations SET version = ?, updated_at = ?, effect_count = ?,"
        " pending_count = ?, outbox = ? WHERE id = ?",
        (
            rows.version,
            rows.updated_at,
            rows.effect_count,
            rows.effect_count,
            rows.outbox,
            conversation_id,
        ),
    )
    (ordinal,) = conn.execute(
        "SELECT ordinal FROM conversations WHERE id = ?", (conversation_id,)
    ).fetchone()
    base = ordinal * KEY_SPAN
    conn.executemany(
        _INSERT_TRANSITION,
        [(base + line[0], conversation_id, *line) for line in rows.transitions],
    )
    conn.executemany(
        "INSERT INTO snapshots (conversation_id, version, snapshot) VALUES (?, ?, ?)",
        [(conversation_id, *snapshot) for snapshot in rows.snapshots],
    )
