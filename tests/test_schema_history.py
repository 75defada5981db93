"""One migration history for both dialects, and one store port that every store implements.

Both dialects run ``migrations.HISTORY``: these tests open a real SQLite file and a database on
a throwaway PostgreSQL cluster, from empty and from every earlier version as that version left
it, and read back what each holds (its recorded version, its tables and their columns), so a
migration written for one dialect only, or a column one of them lacks, fails here. The rows an
upgrade keeps are ``test_stores.py::test_every_earlier_schema_is_upgraded_in_place`` (on both
dialects) and ``test_legacy_stores.py`` (databases the release wrote).

The port's tests read every store class against every narrow protocol ``Store`` is made of.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest

from segue.executor.store_port import (
    Catalogue,
    ConversationLog,
    Exports,
    LogReader,
    Outbox,
    SnapshotStore,
    Store,
)
from segue.executor.stores import postgres_schema, sqlite_schema
from segue.executor.stores.memory import MemoryStore
from segue.executor.stores.migrations import DIALECT_ONLY, HISTORY, SCHEMA_VERSION, Dialect
from segue.executor.stores.postgres import SCHEMA_VERSION as POSTGRES_VERSION
from segue.executor.stores.postgres import PostgresStore
from segue.executor.stores.sqlite import SCHEMA_VERSION as SQLITE_VERSION
from segue.executor.stores.sqlite import SqliteStore
from segue.testing.postgres import ThrowawayCluster, find_server_binaries
from test_legacy_stores import FIXTURES, compare, expected, read_back

Schema = dict[str, frozenset[str]]
"""A database's tables, each with the names of its columns."""

PORTS: Final = (LogReader, ConversationLog, Outbox, Catalogue, SnapshotStore, Exports)
STORES: Final = (MemoryStore, SqliteStore, PostgresStore)
_numbers = itertools.count()


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayCluster]:
    if find_server_binaries() is None:
        pytest.skip("PostgreSQL server binaries not found in /usr/lib/postgresql")
    with ThrowawayCluster() as running:
        yield running


# --------------------------------------------------------------------------- the two dialects


def _opened(store: Store) -> None:
    """Open ``store`` (which migrates its database) with one read, then close it."""

    async def read() -> None:
        try:
            await store.with_pending()
        finally:
            await store.close()

    asyncio.run(read())


def _sqlite_schema(path: Path) -> tuple[int, Schema]:
    with contextlib.closing(sqlite3.connect(path)) as raw:
        (version,) = raw.execute("PRAGMA user_version").fetchone()
        tables = [
            name
            for (name,) in raw.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        schema = {
            table: frozenset(row[1] for row in raw.execute(f"PRAGMA table_info({table})"))
            for table in tables
        }
    return int(version), schema


def _postgres_schema(conninfo: str) -> tuple[int, Schema]:
    with psycopg.connect(conninfo) as raw:
        ((version,),) = raw.execute("SELECT version FROM segue_schema").fetchall()
        rows = raw.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema()"
        ).fetchall()
    schema: dict[str, set[str]] = {}
    for table, column in rows:
        schema.setdefault(str(table), set()).add(str(column))
    return int(version), {table: frozenset(columns) for table, columns in schema.items()}


def _old_sqlite(path: Path, version: int) -> None:
    """A file as segue left it at ``version``: that version's migrations run, and recorded."""
    with contextlib.closing(sqlite3.connect(path)) as raw, raw:
        for migration in sqlite_schema.MIGRATIONS[:version]:
            for statement in migration:
                raw.execute(statement)
        raw.execute(f"PRAGMA user_version = {int(version)}")


def _old_postgres(conninfo: str, version: int) -> None:
    with psycopg.connect(conninfo, autocommit=True) as raw:
        raw.execute("CREATE TABLE segue_schema (version integer NOT NULL)")
        for migration in postgres_schema.MIGRATIONS[:version]:
            for statement in migration:
                raw.execute(statement)
        raw.execute("INSERT INTO segue_schema (version) VALUES (%s)", (version,))


def _shared(schema: Schema, dialect: Dialect) -> Schema:
    """``schema`` without what ``DIALECT_ONLY`` says only ``dialect`` has; every declared name
    must be there (a declaration left behind by a migration fails too)."""
    declared = DIALECT_ONLY[dialect]
    for table, columns in declared.items():
        assert columns <= schema.get(table, frozenset()), (dialect, table)
    left = {table: columns - declared.get(table, frozenset()) for table, columns in schema.items()}
    return {table: columns for table, columns in left.items() if columns}


def _sqlite_from(tmp_path: Path, version: int) -> tuple[int, Schema]:
    path = tmp_path / f"segue-{version}.db"
    if version:
        _old_sqlite(path, version)
    _opened(SqliteStore(path))
    return _sqlite_schema(path)


def _postgres_from(cluster: ThrowawayCluster, version: int) -> tuple[int, Schema]:
    conninfo = cluster.create_database(f"segue_history_{next(_numbers)}")
    if version:
        _old_postgres(conninfo, version)
    _opened(PostgresStore(conninfo))
    return _postgres_schema(conninfo)


def test_one_history_numbers_both_dialects_alike() -> None:
    """Versions 1, 2, 3... with no gap, and each dialect's list is that history's."""
    assert [m.version for m in HISTORY] == list(range(1, SCHEMA_VERSION + 1))
    assert SQLITE_VERSION == POSTGRES_VERSION == SCHEMA_VERSION
    assert tuple(m.sqlite for m in HISTORY) == sqlite_schema.MIGRATIONS
    assert tuple(m.postgres for m in HISTORY) == postgres_schema.MIGRATIONS
    assert SCHEMA_VERSION > 7  # past both dialects' versions before the histories were joined


def test_both_dialects_reach_one_version_and_one_schema_from_empty(
    tmp_path: Path, cluster: ThrowawayCluster
) -> None:
    sqlite_version, sqlite = _sqlite_from(tmp_path, 0)
    postgres_version, postgres = _postgres_from(cluster, 0)
    assert sqlite_version == postgres_version == SCHEMA_VERSION
    assert _shared(sqlite, "sqlite") == _shared(postgres, "postgres")
    assert {"conversations", "messages", "transitions", "snapshots", "tags"} <= sqlite.keys()


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_every_old_sqlite_file_reaches_the_schema_of_a_new_one(
    tmp_path: Path, version: int
) -> None:
    """Today's files (version 7) among them."""
    assert _sqlite_from(tmp_path, version) == _sqlite_from(tmp_path, 0)


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_every_old_postgres_database_reaches_the_schema_of_a_new_one(
    cluster: ThrowawayCluster, version: int
) -> None:
    """Today's databases (version 6) among them."""
    assert _postgres_from(cluster, version) == _postgres_from(cluster, 0)


# --------------------------------------------------------------------------- the port


def _methods(port: type) -> dict[str, Callable[..., Any]]:
    """The methods ``port`` declares, its bases' included."""
    found: dict[str, Callable[..., Any]] = {}
    for klass in reversed(port.__mro__):
        if klass is object or klass.__name__ in {"Protocol", "Generic"}:
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and inspect.isfunction(value):
                found[name] = value
    return found


def _shape(function: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """Parameters as a caller sees them: names, kinds, defaults."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_store_is_the_union_of_the_narrow_ports_and_close() -> None:
    union = {name for port in PORTS for name in _methods(port)}
    assert set(_methods(Store)) == union | {"close"}
    assert all(issubclass(Store, port) for port in PORTS)


@pytest.mark.parametrize("store_class", STORES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("port", [*PORTS, Store], ids=lambda p: p.__name__)
def test_every_store_implements_every_method_of_every_port(store_class: type, port: type) -> None:
    """A coroutine method of the same name and parameters (names, kinds, defaults) as the
    port's, inherited or its own."""
    for name, declared in _methods(port).items():
        implemented = getattr(store_class, name, None)
        assert implemented is not None, f"{store_class.__name__} lacks {port.__name__}.{name}"
        assert inspect.iscoroutinefunction(implemented), name
        assert _shape(implemented) == _shape(declared), name


def test_a_store_instance_is_every_port(tmp_path: Path) -> None:
    """What the runtime-checkable ports say of real stores (a class lacking one method fails)."""
    sqlite = SqliteStore(tmp_path / "segue.db")
    try:
        for store in (MemoryStore(), sqlite):
            assert all(isinstance(store, port) for port in (*PORTS, Store))
    finally:
        asyncio.run(sqlite.close())

    class Partial:
        async def load(self, conversation_id: str) -> None: ...

    assert not isinstance(Partial(), LogReader)
    assert not isinstance(Partial(), Store)


# --------------------------------------------------------------------------- today's databases


def _sqlite_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with contextlib.closing(sqlite3.connect(path)) as raw:
        tables = [
            name
            for (name,) in raw.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        return {
            table: sorted(raw.execute(f"SELECT * FROM {table}"), key=repr)  # noqa: S608
            for table in tables
        }


def _postgres_rows(conninfo: str) -> dict[str, list[str]]:
    with psycopg.connect(conninfo) as raw:
        tables = [
            str(name)
            for (name,) in raw.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = current_schema() AND table_name <> 'segue_schema'"
            )
        ]
        return {
            table: sorted(
                str(row)
                for (row,) in raw.execute(f"SELECT row_to_json(t)::text FROM {table} AS t")  # noqa: S608
            )
            for table in tables
        }


def _kept(before: dict[str, list[Any]], after: dict[str, list[Any]]) -> None:
    """Every row of every table is still there, unchanged; a table that went was empty."""
    assert sum(map(len, before.values())) > 50  # the fixture holds real conversations
    for table, rows in before.items():
        assert after.get(table, []) == rows, table


def _reads_back(store: Store, kind: str) -> None:
    async def read() -> None:
        try:
            compare(await read_back(store), expected(kind))
        finally:
            await store.close()

    asyncio.run(read())


def test_a_sqlite_file_of_today_s_version_upgrades_keeping_every_row(tmp_path: Path) -> None:
    """The release's file (version 6) brought to version 7 as the code before this history
    did, then opened: every row kept, every conversation read back as the release read it."""
    path = tmp_path / "legacy.db"
    shutil.copyfile(FIXTURES / "legacy.db", path)
    path.chmod(0o600)
    with contextlib.closing(sqlite3.connect(path)) as raw, raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (6,)
        for statement in sqlite_schema.MIGRATIONS[6]:
            raw.execute(statement)
        raw.execute("PRAGMA user_version = 7")
    before = _sqlite_rows(path)
    _reads_back(SqliteStore(path), "sqlite")
    assert _sqlite_schema(path)[0] == SCHEMA_VERSION
    _kept(before, _sqlite_rows(path))


def test_a_postgres_database_of_today_s_version_upgrades_keeping_every_row(
    cluster: ThrowawayCluster,
) -> None:
    """The release's database (version 5) brought to version 6 as the code before this history
    did, then opened: every row kept, every conversation read back as the release read it."""
    conninfo = cluster.create_database(f"segue_history_{next(_numbers)}")
    subprocess.run(  # noqa: S603  # the cluster's own psql, on a file of ours
        [
            str(cluster.binaries / "psql"),
            *("-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", conninfo),
            *("-f", str(FIXTURES / "legacy-postgres.sql")),
        ],
        check=True,
        capture_output=True,
    )
    with psycopg.connect(conninfo, autocommit=True) as raw:
        assert raw.execute("SELECT version FROM segue_schema").fetchall() == [(5,)]
        for statement in postgres_schema.MIGRATIONS[5]:
            raw.execute(statement)
        raw.execute("UPDATE segue_schema SET version = 6")
    before = _postgres_rows(conninfo)
    _reads_back(PostgresStore(conninfo), "postgres")
    assert _postgres_schema(conninfo)[0] == SCHEMA_VERSION
    _kept(before, _postgres_rows(conninfo))
