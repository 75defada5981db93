"""``SqliteStore``'s commits: the step a ``Commit`` is, as statements on its one connection.

Why a step is written this way (``sqlite`` says why the tables are):

- **A usual step is three statements**: one guarded ``UPDATE ... RETURNING`` (``fast_update``:
  the version, the outbox holding just what the step completes, the key unused) and the two
  inserts (its messages, its log line). Nearly every step an executor commits has that shape
  (at most one effect queued, the one pending effect completed).
- **Any other step, or one whose guard did not hold**, reads the row first (``_checked``): that
  says why a refused step is refused (a key used, a version that moved, no such conversation),
  and gives the outbox to rewrite when it holds more than the step completes.

A step is a function of the connection that ``Runner`` runs inside a transaction it may share
with other steps, so it only executes statements: no BEGIN, no COMMIT.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from typing import Any, Final

from segue.executor.errors import DuplicateMessageError
from segue.executor.store_port import StoredConversation
from segue.executor.stores import _outbox
from segue.executor.stores._rows import CommitRows, Counters
from segue.executor.stores._shared import not_found, version_moved
from segue.executor.stores.sqlite_runner import PAGE
from segue.executor.stores.sqlite_schema import KEY_SPAN, SYSTEM

STEP_PAGES: Final = 4
"""Pages a step writes besides its documents (the conversation's row, a message, a log line and
now and then the key index or a new page), for ``Runner``'s checkpoint count."""

INSERT_MESSAGE: Final = (
    "INSERT INTO messages (rid, conversation_id, seq, kind, message) VALUES (?, ?, ?, ?, ?)"
)
INSERT_LANDMARK: Final = (
    "INSERT INTO landmarks (rid, session, generation, start, pinned) VALUES (?, ?, ?, ?, ?)"
)
_INSERT_TRANSITION: Final = (
    "INSERT INTO transitions (rid, conversation_id, seq, event_kind, event, from_phase,"
    " to_phase, context_tokens, reason, effect_kinds, at, session, idempotency_key)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def commit_step(rows: CommitRows) -> tuple[Callable[[sqlite3.Connection], StoredConversation], int]:
    """The step that writes ``rows``, and the pages it writes (for the checkpoint count).
    Everything is encoded before: the write lock is held for SQL only."""
    fast = _fast(rows)

    def step(conn: sqlite3.Connection) -> StoredConversation:
        if fast is not None:
            landed = conn.execute(*fast).fetchall()
            if landed:
                message_count, effect_count, system, child_id, created_at, ordinal = landed[0]
                counters = Counters(message_count, effect_count, system, child_id, created_at)
                _append(conn, rows, ordinal, counters)
                return rows.stored(counters, [])
        return _checked(conn, rows)

    size = sum(len(text) for _, text in rows.appended) + len(rows.transition[3])
    return step, STEP_PAGES + size // PAGE


def _checked(conn: sqlite3.Connection, rows: CommitRows) -> StoredConversation:
    """A step of another shape, or one the fast guard refused: read the row, say why it is
    refused if it is, else write the row with its new outbox, the messages and the log line."""
    commit = rows.commit
    conversation_id, key, expected = (
        commit.conversation_id,
        commit.idempotency_key,
        commit.expected_version,
    )
    if (
        key is not None
        and conn.execute(
            "SELECT 1 FROM transitions WHERE conversation_id = ? AND idempotency_key = ?",
            (conversation_id, key),
        ).fetchone()
    ):
        raise DuplicateMessageError(conversation_id, key)
    row = conn.execute(
        f"SELECT version, message_count, effect_count, outbox, {SYSTEM}, child_id,"  # noqa: S608
        " created_at, ordinal, pending_count FROM conversations WHERE id = ?",
        (conversation_id,),
    ).fetchone()
    if row is None:
        raise not_found(conversation_id)
    version, message_count, effect_count, current, system, child_id, created_at = row[:7]
    ordinal, pending_count = row[7:]
    if version != expected:
        raise version_moved(conversation_id, version, expected)
    outbox, kept = rows.outbox(current, effect_count, pending_count)
    counters = Counters(
        message_count=message_count + len(rows.appended),
        effect_count=effect_count + len(rows.queued),
        system=system,
        child_id=child_id,
        created_at=created_at,
    )
    conn.execute(
        "UPDATE conversations SET state = ?, phase = ?, version = ?, message_count = ?,"
        " effect_count = ?, pending_count = ?, outbox = ?, updated_at = ? WHERE id = ?",
        (
            rows.state,
            commit.state.phase.kind,
            expected + 1,
            counters.message_count,
            counters.effect_count,
            len(kept) + len(rows.queued),
            outbox,
            commit.at,
            conversation_id,
        ),
    )
    _append(conn, rows, ordinal, counters)
    return rows.stored(counters, kept)


@functools.lru_cache(maxsize=4)
def _fast_update(queued: bool, keyed: bool) -> str:
    """The guarded UPDATE of a step of the usual shape: the row at the expected version, its
    outbox holding exactly what the step completes (``pending_count`` entries, the first one
    with the id the step completes: ``_outbox.head``), its message's key not used yet. The new
    outbox is what the step queues, whose id SQL knows (``effect_count + 1``)."""
    outbox = """'[{"id":' || (effect_count + 1) || ?""" if queued else "'[]'"
    unused = (
        " AND NOT EXISTS (SELECT 1 FROM transitions"
        " WHERE conversation_id = ? AND idempotency_key = ?)"
        if keyed
        else ""
    )
    return (  # literal fragments only, every value a parameter
        "UPDATE conversations SET state = ?, phase = ?, version = ?,"  # noqa: S608
        " message_count = message_count + ?, effect_count = effect_count + ?,"
        f" pending_count = ?, outbox = {outbox}, updated_at = ?"
        " WHERE id = ? AND version = ? AND pending_count = ? AND substr(outbox, 1, ?) = ?"
        f"{unused} RETURNING message_count, effect_count, {SYSTEM}, child_id, created_at, ordinal"
    )


def _fast(rows: CommitRows) -> tuple[str, tuple[Any, ...]] | None:
    """``_fast_update`` and its parameters for ``rows``, when the step has the usual shape."""
    commit = rows.commit
    head = _outbox.head(rows.completes)
    if head is None or len(rows.queued) > 1:
        return None
    queued = len(rows.queued)
    key = commit.idempotency_key
    tail = (
        (_outbox.entry_tail(rows.queued[0][1], commit.owner, commit.lease_until) + "]",)
        if queued
        else ()
    )
    values = (
        rows.state,
        commit.state.phase.kind,
        commit.expected_version + 1,
        len(rows.appended),
        queued,
        queued,
        *tail,
        commit.at,
        commit.conversation_id,
        commit.expected_version,
        len(rows.completes),
        len(head),
        head,
        *(() if key is None else (commit.conversation_id, key)),
    )
    return _fast_update(bool(queued), key is not None), values


def _append(conn: sqlite3.Connection, rows: CommitRows, ordinal: int, counters: Counters) -> None:
    """Insert the step's messages and its log line (``counters`` as the step left them)."""
    base = ordinal * KEY_SPAN
    appended = rows.messages(counters.message_count)
    if len(appended) == 1:
        conn.execute(INSERT_MESSAGE, (base + appended[0][1], *appended[0]))
    elif appended:
        conn.executemany(INSERT_MESSAGE, [(base + m[1], *m) for m in appended])
    if rows.landmarks:  # rare: a new session or generation, a pinned message
        before = base + counters.message_count - len(appended)
        conn.executemany(
            INSERT_LANDMARK, [(before + place, *mark) for place, *mark in rows.landmarks]
        )
    conn.execute(_INSERT_TRANSITION, (base + rows.commit.expected_version, *rows.transition))
