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
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest

import test_control
import test_crash
import test_processes
import test_stores
from segue import LlmResponse, Message, Usage, UserMessage, new_conversation
from segue.executor.errors import SegueError, StoreUnavailableError
from segue.executor.models.scripted import ScriptedModel
from segue.executor.runtime import Runtime
from segue.executor.store_port import Store
from segue.executor.stores.postgres import SCHEMA_VERSION, PostgresStore
from segue.executor.stores.postgres_commits import COMMIT_MANY
from segue.executor.stores.postgres_schema import COMMIT, MIGRATIONS, fast_commit
from segue.testing.postgres import ThrowawayCluster, find_server_binaries
from test_stores import MODEL, Backend, run
from test_stores import step as store_step

pytestmark = pytest.mark.slow
FAST = {
    fast_commit(appended, queued, completed, keyed)
    for appended, queued, completed, keyed in itertools.product((0, 1), (0, 1), (0, 1), (0, 1))
}
"""Every statement of a commit alone of a usual shape."""
workers = test_processes.workers
"""The multi-process scenarios' fixture: their workers are killed and reaped when they end."""

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


@pytest.fixture(scope="session")
def cluster() -> Iterator[ThrowawayCluster]:
    """A running throwaway cluster for the whole session."""
    if find_server_binaries() is None:
        pytest.skip("PostgreSQL server binaries not found in /usr/lib/postgresql")
    with ThrowawayCluster() as running:
        yield running


_numbers = itertools.count()


@pytest.fixture
def database(cluster: ThrowawayCluster) -> str:
    """A fresh, empty database on the cluster; its conninfo."""
    return cluster.create_database(f"segue_test_{next(_numbers)}")


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

    def old_schema(version: int) -> None:
        with psycopg.connect(database, autocommit=True) as raw:
            raw.execute("DROP SCHEMA public CASCADE")
            raw.execute("CREATE SCHEMA public")
            raw.execute("CREATE TABLE segue_schema (version integer NOT NULL)")
            for migration in MIGRATIONS[:version]:
                for statement in migration:
                    raw.execute(statement)
            raw.execute("INSERT INTO segue_schema (version) VALUES (%s)", (version,))

    def columns(table: str) -> set[str]:
        with psycopg.connect(database) as raw:
            rows = raw.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s",
                (table,),
            ).fetchall()
            return {str(name) for (name,) in rows}

    return Backend(
        open=lambda: PostgresStore(database),
        open_impatient=lambda: PostgresStore(database, lock_timeout=0.2),
        execute=execute,
        holding_lock=holding_lock,
        integrity_error=psycopg.errors.UniqueViolation,
        schema_version=SCHEMA_VERSION,
        stamp_schema=stamp_schema,
        old_schema=old_schema,
        columns=columns,
        plant=lambda table: execute(*test_stores.planted(table)),
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
def test_processes_on_one_postgres_database(
    database: str, scenario: Any, workers: test_processes.Workers
) -> None:
    """The multi-process scenarios of ``test_processes``, with real worker processes."""
    scenario(database, workers)


def test_a_pause_forced_from_another_process_on_postgres(database: str) -> None:
    """``test_control``'s forced pause across processes, on PostgreSQL: the worker's hanging
    call is cancelled and its ``send()`` returns the paused state."""
    test_control.forced_pause_across_processes(database, "send")


def test_a_returned_send_survives_kill_9_on_postgres(database: str, tmp_path: Path) -> None:
    """``test_crash``'s kill -9 of a process that keeps sending, on PostgreSQL."""
    test_crash.a_returned_send_survives_kill_9(tmp_path, database)


def test_commits_made_at_once_are_one_statement(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Conversations committing in the same turn of the event loop share one statement (one
    round trip, one transaction); when that statement fails (a row in the way of one of them),
    they are committed again one by one, and only the culprit gets the error."""
    sent: list[str] = []
    execute = psycopg.AsyncConnection.execute

    async def recording(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        # A connection the pool opens meanwhile (it grows when commits wait for one, which a
        # busy machine makes likelier) is set up with a SET first: not a step's statement.
        if not (isinstance(query, str) and query.startswith("SET ")):
            one = query is COMMIT or query in FAST  # a commit alone, of any shape
            sent.append("many" if query is COMMIT_MANY else "one" if one else "other")
        return await execute(self, query, *args, **kwargs)

    answer = LlmResponse(text="reply", usage=Usage(input_tokens=100))

    async def scenario() -> None:
        store = PostgresStore(database)
        try:
            ids = ["a", "b", "c", "d", "e"]
            asked = [
                await store_step(
                    store,
                    await store.create(
                        new_conversation(model=MODEL, conversation_id=cid), system=None
                    ),
                    UserMessage(text=f"to {cid}"),
                )
                for cid in ids
            ]
            monkeypatch.setattr(psycopg.AsyncConnection, "execute", recording)
            answered = await asyncio.gather(
                *(store_step(store, stored, answer, completes=[1]) for stored in asked)
            )
            assert sent == ["many"]
            assert [a.version for a in answered] == [3] * 5
            with psycopg.connect(database, autocommit=True) as raw:
                raw.execute(
                    "INSERT INTO messages VALUES ('e', 3, 'user', %s)",
                    (Message(kind="user", text="planted").model_dump_json(),),
                )
            sent.clear()
            outcomes = await asyncio.gather(
                *(store_step(store, stored, UserMessage(text="more")) for stored in answered),
                return_exceptions=True,
            )
            assert sent == ["many", "one", "one", "one", "one", "one"]
            assert isinstance(outcomes[-1], psycopg.errors.UniqueViolation)
            assert [o.version for o in outcomes[:-1]] == [4] * 4  # type: ignore[union-attr]
            assert (await store.load("e")).version == 3
        finally:
            await store.close()

    run(scenario())


def test_a_server_restart_mid_turn_loses_nothing_and_asks_once(
    cluster: ThrowawayCluster, database: str
) -> None:
    """The server restarts while a request is in flight: the answer's commit fails on the dead
    session, is retried on a new connection, and lands; the caller sees no driver error."""

    async def scenario() -> None:
        model = ScriptedModel(delay=0.5)
        async with Runtime(store=PostgresStore(database), llm=model) as rt:
            conv = await rt.create_conversation(model="claude-sonnet-4-5")
            await rt.send(conv.id, "before")
            sending = asyncio.create_task(rt.send(conv.id, "during"))
            await asyncio.sleep(0.2)
            await asyncio.to_thread(cluster.restart)
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


def test_a_conversation_waiting_for_a_lock_does_not_hold_up_the_others(database: str) -> None:
    """Each call has a connection of its own: while one conversation's commit waits for a row
    lock another session holds, other conversations are read and written at once."""

    async def scenario() -> None:
        store = PostgresStore(database, lock_timeout=10.0)
        try:
            blocked = await store.create(
                new_conversation(model=MODEL, conversation_id="c1"), system=None
            )
            free = await store.create(
                new_conversation(model=MODEL, conversation_id="c2"), system=None
            )
            async with await psycopg.AsyncConnection.connect(database) as holder:
                await holder.execute("SELECT * FROM conversations WHERE id = 'c1' FOR UPDATE")
                waiting = asyncio.create_task(
                    store_step(store, blocked, UserMessage(text="behind the lock"))
                )
                await asyncio.sleep(0.2)
                assert not waiting.done()
                started = time.monotonic()
                await store_step(store, free, UserMessage(text="not held up"))
                assert (await store.load("c2")).version == 2
                assert time.monotonic() - started < 5.0  # not behind the 10 s lock wait
                await holder.rollback()
            assert (await waiting).version == 2
        finally:
            await store.close()

    run(scenario())


def test_a_store_left_open_does_not_hold_up_the_end_of_its_loop(database: str) -> None:
    """A program that never closes its store still ends: ``asyncio.run`` cancels the pool's
    work, which psycopg_pool's workers survive unless the pool is closed, and the store closes
    it then. (Concurrent calls make the pool open connections as the loop ends.)"""
    script = textwrap.dedent(
        """
        import asyncio, sys
        from segue import PostgresStore

        async def main(number):
            store = PostgresStore(sys.argv[1], max_size=4)
            await asyncio.gather(*(store.list_conversations() for _ in range(8)))

        for number in range(15):
            asyncio.run(main(number))
        print("ended")
        """
    )
    done = subprocess.run(  # noqa: S603  # our own script, no shell
        [sys.executable, "-c", script, database],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "ended"
    assert done.stderr == ""  # and quietly


def test_one_store_serves_one_loop_then_the_next(database: str) -> None:
    """Used again once its first loop has ended, a store opens a new pool; used from a second
    loop while the first still runs, it refuses (a pool's connections belong to one loop)."""
    store = PostgresStore(database)
    run(store.create(new_conversation(model=MODEL, conversation_id="c1"), system=None))
    assert run(store.load("c1")).version == 1

    async def from_another_loop() -> None:
        await store.load("c1")
        elsewhere: list[BaseException] = []

        def other() -> None:
            try:
                asyncio.run(store.load("c1"))
            except SegueError as error:
                elsewhere.append(error)

        await asyncio.to_thread(other)
        assert len(elsewhere) == 1
        assert "another event loop" in str(elsewhere[0])
        await store.close()

    run(from_another_loop())


def test_from_url_takes_a_database_url(database: str) -> None:
    params = dict(item.split("=", 1) for item in database.split())
    url = f"postgresql://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"

    async def scenario() -> None:
        store = PostgresStore.from_url(url, max_size=2)
        try:
            await store.create(new_conversation(model=MODEL, conversation_id="c1"), system=None)
            assert (await store.load("c1")).version == 1
        finally:
            await store.close()

    run(scenario())
    with pytest.raises(ValueError, match="postgresql://"):
        PostgresStore.from_url("mysql://db/chat")
    with pytest.raises(ValueError, match="min_size"):
        PostgresStore(database, min_size=3, max_size=2)


def test_the_server_on_postgresql(database: str, tmp_path: Path) -> None:
    """``segue serve --database-url``: the API over a PostgresStore, a turn streamed and read
    back from the database."""
    from segue.server.run import ServerConfig, build_app  # the server extra
    from segue.testing import live_server

    app = build_app(ServerConfig(db=tmp_path / "unused.db", database_url=database))
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=30) as http:
        cid = http.post("/api/conversations", json={}).json()["id"]
        turn = http.post(f"/api/conversations/{cid}/messages", json={"text": "Hello."})
        assert turn.status_code == 200
        assert "event: done" in turn.text
        kinds = [m["kind"] for m in http.get(f"/api/conversations/{cid}/messages").json()]
        assert kinds[0] == "user"
        assert "assistant" in kinds
    assert not (tmp_path / "unused.db").exists()  # the database was PostgreSQL's
    with psycopg.connect(database) as raw:
        ((stored,),) = raw.execute("SELECT count(*) FROM messages").fetchall()
    assert stored == len(kinds)


def test_wait_for_change_is_woken_by_a_commit_of_another_session(database: str) -> None:
    """The first wait registers the conversation (and returns: the caller reads again), the next
    one is woken by a commit made through another store, a conversation nobody waits for is
    not notified, and closing the store drops its registrations."""

    def watched() -> list[tuple[str, int]]:
        with psycopg.connect(database, autocommit=True) as raw:
            return raw.execute("SELECT conversation_id, pid FROM segue_watches").fetchall()

    async def scenario() -> None:
        watcher, writer = PostgresStore(database), PostgresStore(database)
        try:
            quiet, told = [
                await writer.create(new_conversation(model=MODEL, conversation_id=cid), system=None)
                for cid in ("q", "t")
            ]
            assert await watcher.wait_for_change("t", timeout=60) is True  # registered
            assert [cid for cid, _ in watched()] == ["t"]
            waiting = asyncio.create_task(watcher.wait_for_change("t", timeout=60))
            await store_step(writer, quiet, UserMessage(text="to nobody"))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            await store_step(writer, told, UserMessage(text="to the watcher"))
            assert await waiting is True
            assert await watcher.wait_for_change("t", timeout=0.01) is False  # nothing new
        finally:
            await watcher.close()
            await writer.close()
        assert watched() == []

    run(scenario())
