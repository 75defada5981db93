"""``SqliteStore``'s conversation-level writes: metadata, deletion, import, and its listings'
dialect.

Why they are written this way:

- **Pages by keyset, through an index** (``_listing``, written once for both dialects):
  backwards along ``conversations_by_age``, or ``tags_by_value`` when metadata filters them.
- **Deletion leaves no text behind.** It runs alone on the store's connection, in a transaction
  of its own, with ``secure_delete`` on (SQLite zeroes what it frees) and the foreign keys'
  checks off (each would scan the transcript and the log, which are keyed by rid rather than
  by id; their rows go by key range instead). The WAL still holds the pages as they were
  before: it is checkpointed and truncated at once. A reader in another process sees the
  conversation whole, or not at all.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Final

from segue.executor.stores._listing import Dialect, still_matches
from segue.executor.stores._rows import RestoredRows, without_parent
from segue.executor.stores._sql import Deletion
from segue.executor.stores.sqlite_schema import KEY_SPAN, METADATA, SYSTEM

DIALECT: Final = Dialect(
    mark="?",
    listed=(
        f"c.state, c.version, {SYSTEM}, c.child_id, c.created_at, {METADATA}, c.ordinal"
    ).replace("conversations.ordinal", "c.ordinal"),
)
"""SQLite's listings (``_listing``)."""
CHECKPOINT_WAIT_MS: Final = 2_000
"""How long the checkpoint after a deletion waits for readers to let go of the WAL."""
_SECURE_DELETE: Final = {0: "OFF", 1: "ON", 2: "FAST"}
"""``PRAGMA secure_delete``'s answers, as the pragma takes them back."""
_INSERT_TRANSITION: Final = (
    "INSERT INTO transitions (rid, conversation_id, seq, event_kind, event, from_phase,"
    " to_phase, context_tokens, reason, effect_kinds, at, session)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def write_tags(
    conn: sqlite3.Connection, ordinal: int, metadata: dict[str, str], created_at: float
) -> None:
    """Replace the conversation's metadata (one ``tags`` row a pair)."""
    conn.execute("DELETE FROM tags WHERE ordinal = ?", (ordinal,))
    conn.executemany(
        "INSERT INTO tags (ordinal, key, value, created_at) VALUES (?, ?, ?, ?)",
        [(ordinal, key, value, created_at) for key, value in metadata.items()],
    )


def delete(conn: sqlite3.Connection, deletion: Deletion) -> list[str] | None:
    """Delete the conversations (see the module docstring): the ids deleted, [] when a purge's
    condition no longer holds, None when the first one is not there."""
    secure = conn.execute("PRAGMA secure_delete").fetchone()[0]
    conn.execute("PRAGMA foreign_keys = OFF")  # a no-op inside a transaction: set before BEGIN
    conn.execute("PRAGMA secure_delete = ON")
    try:
        conn.execute("BEGIN IMMEDIATE")  # the write lock: no step commits until this is done
        deleted = _delete_all(conn, deletion)
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.rollback()
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA secure_delete = {_SECURE_DELETE.get(int(secure), 'FAST')}")
    if deleted:
        conn.execute(f"PRAGMA busy_timeout = {CHECKPOINT_WAIT_MS}")
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            conn.execute("PRAGMA busy_timeout = 0")
    return deleted


def _delete_all(conn: sqlite3.Connection, deletion: Deletion) -> list[str] | None:
    first = deletion.ids[0]
    if conn.execute("SELECT 1 FROM conversations WHERE id = ?", (first,)).fetchone() is None:
        return None
    if deletion.idle_before is not None or deletion.pairs:
        statement, values = still_matches(DIALECT, first, deletion.idle_before, deletion.pairs)
        if conn.execute(statement, values).fetchone() is None:
            return []  # written to (or relabelled) since the purge chose it: it stays
    return [cid for cid in deletion.ids if _delete_rows(conn, cid, deletion.files)]


def _delete_rows(
    conn: sqlite3.Connection, conversation_id: str, files: Callable[[str], object] | None
) -> bool:
    row = conn.execute(
        "SELECT ordinal, parent_id, child_id FROM conversations WHERE id = ?", (conversation_id,)
    ).fetchone()
    if row is None:
        return False
    if files is not None:
        files(conversation_id)
    ordinal, parent_id, child_id = row
    base = ordinal * KEY_SPAN
    for table in ("messages", "transitions", "landmarks"):
        conn.execute(
            f"DELETE FROM {table} WHERE rid > ? AND rid < ?",  # noqa: S608
            (base, base + KEY_SPAN),
        )
    conn.execute("DELETE FROM snapshots WHERE conversation_id = ?", (conversation_id,))
    conn.execute("DELETE FROM prompts WHERE ordinal = ?", (ordinal,))
    conn.execute("DELETE FROM tags WHERE ordinal = ?", (ordinal,))
    if parent_id is not None:
        conn.execute(
            "UPDATE conversations SET child_id = NULL WHERE id = ? AND child_id = ?",
            (parent_id, conversation_id),
        )
    if child_id is not None:
        _unlink_child(conn, child_id, conversation_id)
    conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
    return True


def _unlink_child(conn: sqlite3.Connection, child_id: str, parent_id: str) -> None:
    """The child of a conversation being deleted names it nowhere: not in its ``parent_id``
    column, not in its state."""
    found = conn.execute("SELECT state FROM conversations WHERE id = ?", (child_id,)).fetchone()
    if found is None:
        return
    state = without_parent(found[0], parent_id)
    conn.execute(
        "UPDATE conversations SET parent_id = NULL, state = coalesce(?, state)"
        " WHERE id = ? AND (parent_id = ? OR ? IS NOT NULL)",
        (state, child_id, parent_id, state),
    )


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
