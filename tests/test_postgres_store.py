"""``PostgresStore`` against a real, throwaway PostgreSQL cluster.

A session fixture runs ``initdb`` into a temporary directory (as the ``postgres`` user when the
tests run as root, since PostgreSQL refuses to run as root), starts the server on a free port on
127.0.0.1 with ``pg_ctl``, and stops it at the end. Every test gets a fresh database. The
contract tests of ``test_stores`` run here unchanged, and so do its tests of persistent stores
(persistence across connections, two stores racing, a half-failed commit, a lock held by
another session, a closed store, a newer schema) through a PostgreSQL ``backend``; the test below
them covers what only a server shows (two runtimes taking turns on one database). Skipped only
when the PostgreSQL binaries are not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import test_processes
import test_stores
from segue.executor.models.scripted import ScriptedModel
from segue.executor.ports import Store, StoreUnavailableError
from segue.executor.runtime import Runtime
from segue.executor.stores.postgres import SCHEMA_VERSION, PostgresStore
from test_stores import Backend, run

pytestmark = pytest.mark.slow
PG_BIN = Path("/usr/lib/postgresql/15/bin")
_PREFIX = "segue-pg-"
_OWNER = "owner.pid"

# The contract: every test of test_stores that takes the ``store`` or the ``backend`` fixture
# runs here too, with the fixtures below (a PostgresStore on a fresh database) in place of the
# originals.
globals().update(
    {
        name: test
        for name, test in vars(test_stores).items()
        if name.startswith("test_")
        and {"store", "backend"} & set(inspect.signature(test).parameters)
    }
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _pg(tool: str, *args: str, check: bool = True) -> None:
    """Run one of the server's tools; as ``postgres`` when we are root (the server refuses
    root)."""
    command = [str(PG_BIN / tool), *args]
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, check=check, capture_output=True)  # noqa: S603  # fixed binary, no shell


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _reap_orphans() -> None:
    """Stop clusters of earlier runs killed before their teardown could (``timeout`` sends
    SIGTERM, which skips ``finally``). Only directories naming a dead owner are touched: a
    cluster serving a run still going on is left alone."""
    for base in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        try:
            owner = int((base / _OWNER).read_text())
        except (OSError, ValueError):
            continue
        if not _alive(owner):
            _pg("pg_ctl", "-D", str(base / "data"), "-m", "immediate", "stop", check=False)
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[str]:
    """A running throwaway cluster; yields the conninfo of its maintenance database."""
    if not (PG_BIN / "initdb").exists() or not (PG_BIN / "pg_ctl").exists():
        pytest.skip(f"PostgreSQL 15 binaries not found in {PG_BIN}")
    # Not pytest's tmp_path: its parents are private to root and the server user must reach it.
    _reap_orphans()
    base = Path(tempfile.mkdtemp(prefix=_PREFIX))
    (base / _OWNER).write_text(str(os.getpid()))
    if os.geteuid() == 0:
        server = pwd.getpwnam("postgres")
        os.chown(base, server.pw_uid, server.pw_gid)
    data, log = base / "data", base / "server.log"
    port = _free_port()
    _pg("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-N")
    options = f"-p {port} -c listen_addresses=127.0.0.1 -k {base} -c fsync=off"
    _pg("pg_ctl", "-D", str(data), "-l", str(log), "-o", options, "-w", "start")
    _DATA[:] = [data]
    try:
        yield f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    finally:
        _pg("pg_ctl", "-D", str(data), "-m", "fast", "stop", check=False)
        shutil.rmtree(base, ignore_errors=True)


_numbers = itertools.count()
_DATA: list[Path] = []
"""The running cluster's data directory (for the test that restarts the server)."""


@pytest.fixture
def database(cluster: str) -> str:
    """A fresh, empty database on the cluster; yields its conninfo."""
    name = f"segue_test_{next(_numbers)}"
    with psycopg.connect(cluster, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return cluster.replace("dbname=postgres", f"dbname={name}")


@pytest.fixture
def store(database: str) -> Iterator[Store]:
    made = PostgresStore(database)
    yield made
    run(made.close())


@pytest.fixture
def backend(database: str) -> Backend:
    def execute(statement: str, parameters: tuple[Any, ...]) -> None:
        with psycopg.connect(database, autocommit=True) as raw:
            raw.execute(statement.replace("?", "%s"), parameters)

    @contextlib.contextmanager
    def holding_lock() -> Iterator[None]:
        with psycopg.connect(database) as holder:
            holder.execute("SELECT * FROM conversations WHERE id = 'c1' FOR UPDATE")
            yield
            holder.rollback()

    def stamp_schema(version: int) -> int:
        with psycopg.connect(database, autocommit=True) as raw:
            ((replaced,),) = raw.execute("SELECT version FROM segue_schema").fetchall()
            raw.execute("UPDATE segue_schema SET version = %s", (version,))
            return int(replaced)

    return Backend(
        open=lambda: PostgresStore(database),
        open_impatient=lambda: PostgresStore(database, lock_timeout=0.2),
        execute=execute,
        holding_lock=holding_lock,
        integrity_error=psycopg.errors.UniqueViolation,
        schema_version=SCHEMA_VERSION,
        stamp_schema=stamp_schema,
    )


# --------------------------------------------------------------------------- PostgreSQL only


def test_postgres_two_runtimes_take_turns_on_one_conversation(database: str) -> None:
    """Two runtimes (two processes, say) on one database: each request carries every message,
    whoever wrote it, and a runtime whose copy is behind commits again on the current one."""

    async def scenario() -> None:
        model = ScriptedModel(reply_chars=40)
        async with (
            Runtime(store=PostgresStore(database), llm=model) as first,
            Runtime(store=PostgresStore(database), llm=model) as second,
        ):
            conv = await first.create_conversation(model="claude-sonnet-4-5")
            for turn in range(3):
                for rt in (first, second):
                    await rt.send(conv.id, f"turn {turn}")
            sent = [m.text for m in model.requests[-1].messages if m.kind == "user"]
            assert sent == [f"turn {turn}" for turn in range(3) for _ in range(2)]
            assert len(model.requests[-1].messages) == 11
            transcript = await first.messages(conv.id)
            assert [m.seq for m in transcript] == list(range(1, 13))
            assert (await second.state(conv.id)).phase.kind == "idle"

    run(scenario())


@pytest.mark.parametrize("scenario", test_processes.SCENARIOS, ids=lambda s: s.__name__)
def test_processes_on_one_postgres_database(database: str, scenario: Any) -> None:
    """The multi-process scenarios of ``test_processes``, with real worker processes."""
    scenario(database)


def test_a_server_restart_mid_turn_loses_nothing_and_asks_once(database: str) -> None:
    """The server restarts while a request is in flight: the answer's commit fails on the dead
    session, is retried on a new connection, and lands; the caller sees no driver error."""

    async def scenario() -> None:
        model = ScriptedModel(delay=0.5)
        async with Runtime(store=PostgresStore(database), llm=model) as rt:
            conv = await rt.create_conversation(model="claude-sonnet-4-5")
            await rt.send(conv.id, "before")
            sending = asyncio.create_task(rt.send(conv.id, "during"))
            await asyncio.sleep(0.2)
            data = _DATA[0]
            # -l: a server started without a log file writes to pg_ctl's output, which never
            # closes (capture_output would wait for it forever).
            log = str(data.parent / "server.log")
            await asyncio.to_thread(
                _pg, "pg_ctl", "-D", str(data), "-l", log, "-m", "fast", "-w", "restart"
            )
            assert (await sending).phase.kind == "idle"
            assert len(model.requests) == 2
            await rt.send(conv.id, "after")
            messages = await rt.messages(conv.id)
            assert [m.text for m in messages if m.kind == "user"] == ["before", "during", "after"]
            assert [m.kind for m in messages].count("assistant") == 3

    run(scenario())


def test_a_server_that_is_gone_is_a_segue_error(database: str) -> None:
    """No reachable server: segue's error, with the driver's as its cause."""
    gone = database.replace("host=127.0.0.1", "host=127.0.0.1 connect_timeout=2").replace(
        "port=", "port=1"
    )

    async def scenario() -> None:
        store = PostgresStore(gone)
        with pytest.raises(StoreUnavailableError) as caught:
            await store.load("c1")
        assert isinstance(caught.value.__cause__, psycopg.OperationalError)
        await store.close()

    run(scenario())
