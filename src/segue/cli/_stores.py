"""Where a CLI command's conversations are: a SQLite file (``--db``) or a PostgreSQL database
(``--database-url``, or ``SEGUE_DATABASE_URL``), opened for inspecting or for writing.

Inspecting never creates a database nor adds segue's tables to one that is some other
program's: a SQLite file is opened in SQLite's read-only mode, and a PostgreSQL database must
hold segue's tables already. A conversation is named by its id or any start of it that names
only it.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

import typer

from segue.cli._app import CliError
from segue.cli._output import printable
from segue.executor.errors import ConversationNotFoundError
from segue.executor.store_port import Catalogue, Store

DatabaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="SEGUE_DATABASE_URL",
        help="PostgreSQL URL or conninfo (instead of the SQLite --db).",
    ),
]
_PASSWORD = re.compile(r"(password\s*=\s*)(\S+)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class StoreAt:
    """The store a command was pointed at: PostgreSQL at ``database_url``, else ``db``."""

    db: Path
    database_url: str | None = None

    def __str__(self) -> str:
        """The store as a person reads it in a message: the file, or the database without its
        password."""
        return shown_url(self.database_url) if self.database_url else str(self.db)


def shown_url(url: str) -> str:
    """A PostgreSQL URL or conninfo with its password hidden."""
    parts = urlsplit(url)
    if parts.scheme and parts.password:
        host = parts.netloc.rsplit("@", 1)[-1]
        user = parts.username or ""
        return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    return _PASSWORD.sub(r"\1***", url)


def _postgres(url: str) -> Store:
    try:
        from segue.executor.stores.postgres import PostgresStore  # noqa: PLC0415  # an extra
    except ImportError:
        msg = "--database-url needs the postgres extra: pip install 'segue[postgres]'"
        raise CliError(msg, 2) from None
    return PostgresStore(url)


def writable_store(where: StoreAt) -> Store:
    """The store to write to (its tables made if new), as ``segue chat`` and ``serve`` use."""
    if where.database_url is not None:
        return _postgres(where.database_url)
    from segue.executor.stores.sqlite import SqliteStore  # noqa: PLC0415

    return SqliteStore(where.db)


def existing_store(where: StoreAt, *, read_only: bool) -> Store:
    """The store at ``where`` only if it is a segue store already: inspecting never creates
    a database, ``read_only`` opens a SQLite file in SQLite's read-only mode (nothing is ever
    written to it), and a command that writes (pause, resume) never adds segue's tables to a
    database that is some other program's."""
    if where.database_url is not None:
        if not holds_segue_tables(where.database_url):
            msg = f"{where} holds no segue store (`segue serve --database-url` makes one)"
            raise CliError(msg, 2)
        return _postgres(where.database_url)
    from segue.executor.stores.sqlite import SqliteStore  # noqa: PLC0415

    db = where.db
    if not db.is_file():
        msg = (
            f"no database at {db} (set --db or $SEGUE_DB): `segue demo --db {db}` makes one to "
            "keep, and `segue serve` and `segue chat` write one as they run"
        )
        raise CliError(msg, 2)
    if not read_only and not is_segue_store(db):
        raise CliError(f"{db} is not a segue store", 1)
    return SqliteStore(db, read_only=read_only)


def holds_segue_tables(url: str) -> bool:
    """Whether the PostgreSQL database at ``url`` holds segue's tables (read, never written);
    a usage error when it cannot be reached."""
    try:
        import psycopg  # noqa: PLC0415  # the postgres extra
    except ImportError:
        msg = "--database-url needs the postgres extra: pip install 'segue[postgres]'"
        raise CliError(msg, 2) from None
    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            row = conn.execute("SELECT to_regclass('segue_schema') IS NOT NULL").fetchone()
    except psycopg.Error as error:
        message = f"cannot reach {shown_url(url)}: {type(error).__name__}"
        raise CliError(message, 2) from None
    return bool(row and row[0])


def is_segue_store(db: Path) -> bool:
    """Whether ``db`` holds segue's schema (any version: a writer upgrades an older one), read
    without writing to it."""
    uri = f"{db.resolve().as_uri()}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.DatabaseError:
        return False
    return version > 0 and {"conversations", "messages", "transitions"} <= tables


async def resolve(store: Catalogue, given: str) -> str:
    """The conversation id ``given`` names: the id itself, or a prefix of exactly one."""
    listed = await store.list_conversations()
    ids = [c.state.id for c in listed]
    if given in ids:
        return given
    matches = [cid for cid in ids if given and cid.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ConversationNotFoundError(f"no conversation {printable(given)!r} in this store")
    shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
    msg = f"{printable(given)!r} is the start of {len(matches)} conversations ({shown})"
    raise CliError(f"{msg}: give more of the id", 2)


__all__ = [
    "DatabaseUrlOption",
    "StoreAt",
    "existing_store",
    "is_segue_store",
    "resolve",
    "shown_url",
    "writable_store",
]
