"""``SqliteStore``'s schema, its migrations from every earlier version, and how its connection
is opened (WAL, ``synchronous=NORMAL``, a private file, no automatic checkpoints).

A file records its schema version in ``PRAGMA user_version``; opening it for writing runs every
migration after that version in one transaction (taking the write lock only when there is one
to run, so two processes opening the same file do not both migrate it).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Final

from segue.executor.errors import SegueError
from segue.executor.stores._shared import newer_schema

SCHEMA_VERSION: Final = 7
"""What ``PRAGMA user_version`` says once every migration below has run."""

MEMORY: Final = ":memory:"
CHECKPOINT_WAIT: Final = 200
"""Milliseconds a checkpoint that restarts the WAL waits for the write lock and for readers."""

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    # 0 -> 1: the first schema.
    (
        """CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            parent_id TEXT,
            state TEXT NOT NULL,
            phase TEXT NOT NULL,
            version INTEGER NOT NULL CHECK (version >= 1),
            system TEXT,
            child_id TEXT,
            message_count INTEGER NOT NULL DEFAULT 0 CHECK (message_count >= 0),
            effect_count INTEGER NOT NULL DEFAULT 0 CHECK (effect_count >= 0),
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX conversations_by_age ON conversations (created_at)",
        """CREATE TABLE messages (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq INTEGER NOT NULL CHECK (seq >= 1),
            kind TEXT NOT NULL,
            message TEXT NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )""",
        """CREATE TABLE transitions (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq INTEGER NOT NULL CHECK (seq >= 1),
            event_kind TEXT NOT NULL,
            event TEXT NOT NULL,
            from_phase TEXT NOT NULL,
            to_phase TEXT NOT NULL,
            context_tokens INTEGER,
            reason TEXT NOT NULL,
            effect_kinds TEXT NOT NULL,
            at REAL NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )""",
        """CREATE TABLE outbox (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            id INTEGER NOT NULL CHECK (id >= 1),
            effect TEXT NOT NULL,
            PRIMARY KEY (conversation_id, id)
        ) WITHOUT ROWID""",
        """CREATE TABLE snapshots (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            version INTEGER NOT NULL CHECK (version >= 1),
            snapshot TEXT NOT NULL,
            PRIMARY KEY (conversation_id, version)
        )""",
    ),
    # 1 -> 2: claims on outbox effects (who performs one, until when), idempotency keys.
    (
        "ALTER TABLE outbox ADD COLUMN owner TEXT",
        "ALTER TABLE outbox ADD COLUMN lease_until REAL",
        """CREATE TABLE idempotency (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            key TEXT NOT NULL,
            version INTEGER NOT NULL,
            PRIMARY KEY (conversation_id, key)
        ) WITHOUT ROWID""",
    ),
    # 2 -> 3: how many effects each conversation has pending (a commit knows its outbox).
    (
        "ALTER TABLE conversations ADD COLUMN pending_count INTEGER NOT NULL DEFAULT 0"
        " CHECK (pending_count >= 0)",
        "UPDATE conversations SET pending_count ="
        " (SELECT count(*) FROM outbox WHERE outbox.conversation_id = conversations.id)",
    ),
    # 3 -> 4: the session each logged event happened in (NULL for events logged before).
    ("ALTER TABLE transitions ADD COLUMN session INTEGER",),
    # 4 -> 5: fewer pages per step (each one a WAL frame the COMMIT writes, and the next
    # checkpoint copies). The outbox moves into the conversation's row as a JSON array (see
    # ``_outbox``), which a step rewrites anyway; an idempotency key moves onto the event it came
    # with, unique per conversation. Messages and events are keyed by an integer made of the
    # conversation's ``ordinal`` and the seq (``ordinal * 2**32 + seq``): the rowid itself, so a
    # row is one b-tree entry, not a row and an index entry. The table ``outbox`` stays, empty,
    # because ``segue``'s CLI still recognises a store by it; ``idempotency`` goes.
    (
        "ALTER TABLE conversations ADD COLUMN outbox TEXT NOT NULL DEFAULT '[]'",
        """UPDATE conversations SET outbox = (
            SELECT json_group_array(json_object('id', o.id, 'effect', json(o.effect),
                'owner', o.owner, 'lease_until', o.lease_until))
            FROM (SELECT * FROM outbox WHERE outbox.conversation_id = conversations.id
                ORDER BY outbox.id) AS o
        ) WHERE id IN (SELECT conversation_id FROM outbox)""",
        "UPDATE conversations SET pending_count = json_array_length(outbox)",
        "DELETE FROM outbox",
        "ALTER TABLE conversations ADD COLUMN ordinal INTEGER",
        "UPDATE conversations SET ordinal = rowid",
        "CREATE UNIQUE INDEX conversations_by_ordinal ON conversations (ordinal)",
        """CREATE TABLE messages_5 (
            rid INTEGER PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq INTEGER NOT NULL CHECK (seq >= 1),
            kind TEXT NOT NULL,
            message TEXT NOT NULL
        )""",
        """INSERT INTO messages_5 (rid, conversation_id, seq, kind, message)
            SELECT c.ordinal * 4294967296 + m.seq, m.conversation_id, m.seq, m.kind, m.message
            FROM messages AS m JOIN conversations AS c ON c.id = m.conversation_id""",
        "DROP TABLE messages",
        "ALTER TABLE messages_5 RENAME TO messages",
        """CREATE TABLE transitions_5 (
            rid INTEGER PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq INTEGER NOT NULL CHECK (seq >= 1),
            event_kind TEXT NOT NULL,
            event TEXT NOT NULL,
            from_phase TEXT NOT NULL,
            to_phase TEXT NOT NULL,
            context_tokens INTEGER,
            reason TEXT NOT NULL,
            effect_kinds TEXT NOT NULL,
            at REAL NOT NULL,
            session INTEGER,
            idempotency_key TEXT
        )""",
        """INSERT INTO transitions_5 (rid, conversation_id, seq, event_kind, event, from_phase,
                to_phase, context_tokens, reason, effect_kinds, at, session, idempotency_key)
            SELECT c.ordinal * 4294967296 + t.seq, t.conversation_id, t.seq, t.event_kind,
                t.event, t.from_phase, t.to_phase, t.context_tokens, t.reason, t.effect_kinds,
                t.at, t.session, i.key
            FROM transitions AS t JOIN conversations AS c ON c.id = t.conversation_id
            LEFT JOIN idempotency AS i
                ON i.conversation_id = t.conversation_id AND i.version = t.seq + 1""",
        "DROP TABLE transitions",
        "ALTER TABLE transitions_5 RENAME TO transitions",
        "DROP TABLE idempotency",
        "CREATE UNIQUE INDEX transitions_by_key ON transitions (conversation_id,"
        " idempotency_key) WHERE idempotency_key IS NOT NULL",
    ),
    # 5 -> 6: the system prompt moves out of the conversation's row, which every step rewrites
    # whole (SQLite writes a new record, overflow pages and all): a prompt of a few kilobytes
    # cost every step its overflow pages (4 KB of prompt: a fifth more CPU per step). It is
    # written once, keyed by the conversation's ordinal; ``conversations.system`` stays, NULL.
    (
        "CREATE TABLE prompts (ordinal INTEGER PRIMARY KEY, system TEXT NOT NULL)",
        "INSERT INTO prompts (ordinal, system)"
        " SELECT ordinal, system FROM conversations WHERE system IS NOT NULL",
        "UPDATE conversations SET system = NULL WHERE system IS NOT NULL",
    ),
    # 6 -> 7: a conversation's age costs nothing, and a chat backend finds its conversations.
    # ``landmarks`` holds the messages a view is folded from without reading the transcript
    # (the first of each session and generation: ``_rows.landmark``) and the pinned ones, keyed
    # by their message's rid; a usual step writes none. ``tags`` holds the application's
    # metadata, one row a pair, indexed by value and age for a user's pages; listings page by
    # (created_at, ordinal). Existing transcripts are read once to fill ``landmarks``.
    (
        """CREATE TABLE landmarks (
            rid INTEGER PRIMARY KEY,
            session INTEGER NOT NULL,
            generation INTEGER NOT NULL,
            start INTEGER NOT NULL,
            pinned INTEGER NOT NULL
        )""",
        "CREATE INDEX landmarks_pinned ON landmarks (rid) WHERE pinned",
        """INSERT INTO landmarks (rid, session, generation, start, pinned)
            SELECT rid, s, g, start, pinned FROM (
                SELECT rid, s, g, pinned, CASE
                    WHEN kind = 'summary' THEN 2
                    WHEN lag(s) OVER w IS NULL OR lag(s) OVER w <> s OR lag(g) OVER w <> g
                        THEN 1
                    ELSE 0 END AS start
                FROM (SELECT rid, conversation_id, seq, kind,
                        coalesce(json_extract(message, '$.session'), 1) AS s,
                        coalesce(json_extract(message, '$.generation'), 1) AS g,
                        coalesce(json_extract(message, '$.pinned'), 0) AS pinned
                    FROM messages)
                WINDOW w AS (PARTITION BY conversation_id ORDER BY seq)
            ) WHERE start > 0 OR pinned""",
        """CREATE TABLE tags (
            ordinal INTEGER NOT NULL,
            key TEXT NOT NULL,
            value TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (ordinal, key)
        ) WITHOUT ROWID""",
        "CREATE INDEX tags_by_value ON tags (key, value, created_at, ordinal)",
        "DROP INDEX conversations_by_age",
        "CREATE INDEX conversations_by_age ON conversations (created_at, ordinal)",
    ),
)

KEY_SPAN: Final = 4_294_967_296
"""``rid = ordinal * KEY_SPAN + seq`` in ``messages`` and ``transitions`` (seqs stay below it)."""
SYSTEM: Final = "(SELECT system FROM prompts WHERE prompts.ordinal = conversations.ordinal)"
"""A conversation's system prompt, as a column of its row: kept apart since version 6 (a step
rewrites the row, and a long prompt in it was written again by every step)."""
METADATA: Final = (
    "(SELECT json_group_object(key, value) FROM tags WHERE tags.ordinal = conversations.ordinal)"
)
"""A conversation's metadata as a JSON object (``{}`` when it has none), as a column of its
row."""


def prepare_file(path: Path) -> None:
    """Create missing directories 0700 and a missing database file 0600, before SQLite opens it
    (SQLite would create the file with the process umask, often world-readable; it gives its
    ``-wal`` and ``-shm`` files the database file's mode)."""
    missing: list[Path] = []
    directory = path.parent
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue  # created meanwhile by someone else: theirs to set up
        directory.chmod(0o700)  # the umask may have taken bits mkdir was given
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # an existing database keeps the mode its owner gave it
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def connect(path: str, busy_timeout: float) -> sqlite3.Connection:
    """The store's connection, its schema migrated. Usable from any thread (``Runner`` makes
    sure one uses it at a time); transactions are explicit (``BEGIN IMMEDIATE ... COMMIT``);
    automatic checkpoints are off and so is its busy timeout once migrated (``Runner`` waits
    for locks, and checkpoints, in its own thread)."""
    if path != MEMORY:
        prepare_file(Path(path))
    conn = sqlite3.connect(
        path,
        timeout=busy_timeout,
        isolation_level=None,
        cached_statements=64,
        check_same_thread=False,
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        # Freed space in a page is zeroed when the page is written anyway (no more I/O): the
        # older versions of a row a step rewrote do not linger in the file.
        conn.execute("PRAGMA secure_delete = FAST")
        migrate(conn, path)
        conn.execute("PRAGMA busy_timeout = 0")
    except BaseException:
        conn.close()
        raise
    return conn


def connect_checkpointer(path: str) -> sqlite3.Connection:
    """A connection for checkpoints only, in their own thread. A restarting checkpoint waits
    for the writer of the moment to finish (a step is short) and for readers to let go of the
    WAL, at most ``CHECKPOINT_WAIT`` ms: past that, it is left for the next one."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {CHECKPOINT_WAIT}")
    return conn


def connect_read_only(path: str, busy_timeout: float) -> sqlite3.Connection:
    """SQLite's read-only mode (``mode=ro``: it neither creates the file nor writes to it), on a
    file whose schema is this segue's."""
    if not Path(path).is_file():
        msg = f"{path} does not exist (a read-only store is never created)"
        raise SegueError(msg)
    uri = f"{Path(path).resolve().as_uri()}?mode=ro"
    conn = sqlite3.connect(
        uri,
        uri=True,
        timeout=busy_timeout,
        isolation_level=None,
        cached_statements=64,
        check_same_thread=False,
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        conn.execute("PRAGMA busy_timeout = 0")  # ``Runner`` waits, in its thread
        if version != SCHEMA_VERSION:
            problem = (
                "is not a segue store"
                if version == 0
                else f"has schema version {version}, not this segue's ({SCHEMA_VERSION})"
            )
            if 0 < version < SCHEMA_VERSION:
                problem += "; open it once for writing to upgrade it"
            msg = f"{path} {problem}"
            raise SegueError(msg)
    except BaseException:
        conn.close()
        raise
    return conn


def migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring the schema to ``SCHEMA_VERSION``, one numbered step at a time, atomically.

    An up-to-date file is only read; the write lock is taken (and the version read again under
    it) only when there is something to do, so two processes can migrate at once.
    """
    if int(conn.execute("PRAGMA user_version").fetchone()[0]) == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if current > SCHEMA_VERSION:
            raise newer_schema(path, current, SCHEMA_VERSION)
        for step in MIGRATIONS[current:]:
            for statement in step:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.rollback()
        raise
