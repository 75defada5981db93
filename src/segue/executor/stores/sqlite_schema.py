"""``SqliteStore``'s schema (its migrations are ``migrations.HISTORY``'s SQLite statements),
and how its connection is opened (WAL, ``synchronous=NORMAL``, a private file, no automatic
checkpoints).

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
from segue.executor.stores.migrations import SCHEMA_VERSION, statements

MEMORY: Final = ":memory:"
CHECKPOINT_WAIT: Final = 200
"""Milliseconds a checkpoint that restarts the WAL waits for the write lock and for readers."""

MIGRATIONS: Final = statements("sqlite")
"""Each version's statements on this dialect, from ``migrations.HISTORY`` (index ``v - 1``:
version ``v``)."""

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
