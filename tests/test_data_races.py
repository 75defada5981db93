"""A user's data under concurrency and crashes, on SQLite and PostgreSQL: a purge that meets a
conversation written to after it listed it, a chain deletion killed half-way, a tool of another
process that saves its output after the conversation was deleted, PostgreSQL's files after a
deletion and a vacuum, exports taken while another process commits, a forged cursor, and the
neighbours of a conversation deleted from the middle of its chain.

Real stores, real runtimes, real processes; the interleavings that matter are made certain by
hooks at the store's seam (a subclass of the real store that runs the other writer at the
moment in question), never by mocking what is being tested.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import httpx2
import psycopg
import pytest

from cli_run import invoke
from segue import (
    ConversationNotFoundError,
    MemoryStore,
    PostgresStore,
    Runtime,
    ScriptedModel,
    SqliteStore,
    Store,
)
from segue.executor.archive import write_tool_output
from segue.executor.errors import ConversationBusyError, InvalidCursorError
from segue.executor.stores._shared import encode_cursor
from segue.executor.stores.postgres_data import VACUUMED
from segue.executor.tool_runs import saved
from segue.server import create_app
from segue.statemachine import new_conversation
from segue.testing import live_server
from segue.testing.postgres import ThrowawayCluster, find_server_binaries

MODEL: Final = "claude-sonnet-4-5"
WORKER: Final = Path(__file__).parent / "process_worker.py"
_databases = itertools.count()
Meanwhile = Callable[[Sequence[str]], Awaitable[None]]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayCluster]:
    if find_server_binaries() is None:
        pytest.skip("PostgreSQL server binaries not found in /usr/lib/postgresql")
    with ThrowawayCluster() as running:
        yield running


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The test's store: a SQLite path, or a fresh PostgreSQL database's conninfo."""
    if request.param == "sqlite":
        return str(tmp_path / "segue.db")
    running: ThrowawayCluster = request.getfixturevalue("cluster")
    return running.create_database(f"races_{next(_databases)}")


def open_store(where: str) -> Store:
    return PostgresStore(where) if where.startswith("host=") else SqliteStore(where)


def _script(tmp_path: Path, name: str, text: str, *args: str) -> subprocess.Popen[str]:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return subprocess.Popen(  # noqa: S603  # our own interpreter on our own script
        [sys.executable, str(path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )


# --------------------------------------------------------------------------- purge


async def _listed_then(found: list[str], meanwhile: Meanwhile, done: list[bool]) -> list[str]:
    if not done:  # the first listing only: the purge's
        done.append(True)
        await meanwhile(found)
    return found


class MeanwhileSqlite(SqliteStore):
    """The real store; between a purge's listing and its deletions, ``meanwhile`` runs."""

    def __init__(self, path: str, meanwhile: Meanwhile) -> None:
        super().__init__(path)
        self._meanwhile, self._done = meanwhile, list[bool]()

    async def inactive(
        self, *, before: float, metadata: Mapping[str, str] | None = None
    ) -> list[str]:
        found = await super().inactive(before=before, metadata=metadata)
        return await _listed_then(found, self._meanwhile, self._done)


class MeanwhilePostgres(PostgresStore):
    """``MeanwhileSqlite`` on PostgreSQL."""

    def __init__(self, conninfo: str, meanwhile: Meanwhile) -> None:
        super().__init__(conninfo)
        self._meanwhile, self._done = meanwhile, list[bool]()

    async def inactive(
        self, *, before: float, metadata: Mapping[str, str] | None = None
    ) -> list[str]:
        found = await super().inactive(before=before, metadata=metadata)
        return await _listed_then(found, self._meanwhile, self._done)


def test_purge_spares_what_was_written_to_or_relabelled_after_it_listed_it(where: str) -> None:
    """Six old conversations of team a; after the purge listed them, another runtime (its own
    connection) sends to the last one and moves the one before it to team b. Both survive,
    whole; the four others go."""
    now = [1_000.0]

    async def main() -> None:
        writer = Runtime(store=open_store(where), llm=ScriptedModel(), clock=lambda: 5_000.0)

        async def meanwhile(found: Sequence[str]) -> None:
            await writer.send(found[-1], "still here")
            await writer.set_metadata(found[-2], {"team": "b"})

        store: Store = (
            MeanwhilePostgres(where, meanwhile)
            if where.startswith("host=")
            else MeanwhileSqlite(where, meanwhile)
        )
        async with writer, Runtime(store=store, llm=ScriptedModel(), clock=lambda: now[0]) as rt:
            ids = [
                (await rt.create_conversation(model=MODEL, metadata={"team": "a"})).id
                for _ in range(6)
            ]
            now[0] = 5_500.0
            assert await rt.purge(older_than=2_000, metadata={"team": "a"}) == 4
            assert {c.state.id for c in await rt.conversations()} == {ids[-1], ids[-2]}
            assert [m.kind for m in await rt.messages(ids[-1])] == ["user", "assistant"]
            assert (await rt.conversation(ids[-2])).metadata == {"team": "b"}

    asyncio.run(main())


PURGER: Final = """
import asyncio, sys
from segue import PostgresStore, Runtime, ScriptedModel, SqliteStore

async def main(where):
    store = PostgresStore(where) if where.startswith("host=") else SqliteStore(where)
    async with Runtime(store=store, llm=ScriptedModel()) as rt:
        print(await rt.purge(older_than=float(sys.argv[2]), metadata={"team": "a"}), flush=True)

asyncio.run(main(sys.argv[1]))
"""


def test_purges_in_two_processes_spare_what_a_third_keeps_writing_to(
    where: str, tmp_path: Path
) -> None:
    """Two processes purge 120 conversations nobody wrote to for 30 seconds (made "100
    seconds ago") while a third sends to 20 of them: each of the 20 whose send returned is still
    there with its reply (the ones the purge reached first may be gone before their send: the
    send then says so). 30 seconds: a busy machine's purge takes longer than a second, and
    then rightly deletes a conversation whose send returned more than a second before."""

    async def create() -> list[str]:
        made = ScriptedModel(reply_chars=20)
        async with Runtime(
            store=open_store(where), llm=made, clock=lambda: time.time() - 100
        ) as rt:
            return [
                (await rt.create_conversation(model=MODEL, metadata={"team": "a"})).id
                for _ in range(120)
            ]

    ids = asyncio.run(create())
    written = ids[-20:]
    purgers = [_script(tmp_path, f"purger{n}.py", PURGER, where, "30") for n in range(2)]
    sender = subprocess.Popen(  # noqa: S603  # our own interpreter on our own script
        [sys.executable, str(WORKER), where, "send", ",".join(reversed(written)), "20", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )
    outs = [p.communicate(timeout=300) for p in purgers]
    out, err = sender.communicate(timeout=300)
    assert all(p.returncode == 0 for p in purgers), [o[1] for o in outs]
    assert sender.returncode == 0, err
    results = json.loads(out.splitlines()[-1])["results"]
    answered = [
        cid for cid, result in zip(reversed(written), results, strict=True) if result == "idle"
    ]
    assert answered, results

    async def check() -> None:
        store = open_store(where)
        try:
            for cid in answered:
                kinds = [m.kind for m in await store.messages(cid)]
                assert kinds == ["user", "assistant"], cid
        finally:
            await store.close()

    asyncio.run(check())


# --------------------------------------------------------------------------- chains


async def _exhausted(rt: Runtime, cid: str) -> None:
    while (await rt.state(cid)).phase.kind != "context_exhausted":
        await rt.send(cid, "Tell me about tides. " * 20)


async def _chain(rt: Runtime) -> list[str]:
    """Root, middle, last: a chain of three, the last one fresh."""
    root = await rt.create_conversation(model=MODEL, context_window=3_000)
    await _exhausted(rt, root.id)
    middle = await rt.start_new_from(root.id)
    await _exhausted(rt, middle.id)
    last = await rt.start_new_from(middle.id)
    return [root.id, middle.id, last.id]


CHAIN_KILLER: Final = """
import asyncio, os, signal, sys
from segue import PostgresStore, Runtime, ScriptedModel, SqliteStore

def dying_after(base, count):
    class Dying(base):
        async def delete(self, conversation_id, **options):
            files, seen = options["files"], []

            def remove(cid):
                files(cid)
                seen.append(cid)
                if len(seen) == count:  # inside the transaction, between two conversations
                    os.kill(os.getpid(), signal.SIGKILL)

            return await super().delete(conversation_id, **dict(options, files=remove))
    return Dying

async def main(where, cid):
    base = PostgresStore if where.startswith("host=") else SqliteStore
    async with Runtime(store=dying_after(base, 2)(where), llm=ScriptedModel()) as rt:
        await rt.delete_conversation(cid, chain=True)

asyncio.run(main(*sys.argv[1:3]))
"""


def test_a_chain_deletion_killed_half_way_leaves_the_chain_and_asking_again_deletes_it(
    where: str, tmp_path: Path
) -> None:
    """The process deleting a chain of three is killed (SIGKILL) after the second
    conversation's rows were deleted, before the end: the whole chain is still there with its
    text and links, and the same request again (Python, the CLI and REST, each on a chain of
    its own) deletes all of it and says so (the ids, 204), not "not found"."""

    async def create() -> tuple[list[str], list[str], list[str], dict[str, int]]:
        async with Runtime(store=open_store(where), llm=ScriptedModel(window=3_000)) as rt:
            first, second, third = await _chain(rt), await _chain(rt), await _chain(rt)
            sizes = {cid: len(await rt.messages(cid)) for cid in [*first, *second, *third]}
            return first, second, third, sizes

    first, second, third, sizes = asyncio.run(create())
    for chain in (first, second, third):
        killed = _script(tmp_path, "killer.py", CHAIN_KILLER, where, chain[-1])
        _, err = killed.communicate(timeout=120)
        assert killed.returncode == -signal.SIGKILL, err

    async def after_the_crash() -> None:
        async with Runtime(store=open_store(where), llm=ScriptedModel()) as rt:
            for chain in (first, second, third):
                assert [link.id for link in await rt.lineage(chain[0])] == chain
                for cid in chain:
                    assert len(await rt.messages(cid)) == sizes[cid]
            assert await rt.delete_conversation(first[0], chain=True) == first
            for cid in first:
                with pytest.raises(ConversationNotFoundError):
                    await rt.state(cid)

    asyncio.run(after_the_crash())
    place = ("--database-url", where) if where.startswith("host=") else ("--db", where)
    again = invoke("delete", second[0], "--chain", "--yes", *place)
    assert again.exit_code == 0, again.output
    assert "deleted 3 conversations" in again.output
    assert all(cid in again.output for cid in second)

    with (
        live_server(create_app(Runtime(store=open_store(where), llm=ScriptedModel()))) as url,
        httpx2.Client(base_url=url, timeout=60) as http,
    ):
        answer = http.delete(f"/api/conversations/{third[0]}", params={"chain": "true"})
        assert answer.status_code == 204, answer.text
        for cid in third:
            assert http.get(f"/api/conversations/{cid}").status_code == 404

    async def gone() -> None:
        store = open_store(where)
        try:
            assert await store.list_conversations() == []
        finally:
            await store.close()

    asyncio.run(gone())


def test_deleting_the_middle_of_a_chain_leaves_no_link_to_it_on_either_side(
    where: str,
) -> None:
    """The parent forgets its child and the child its parent: in the state (as this runtime,
    a fresh store and a later step read it) and in ``lineage``."""

    async def main() -> None:
        async with Runtime(store=open_store(where), llm=ScriptedModel(window=3_000)) as rt:
            root, middle, last = await _chain(rt)
            assert (await rt.state(last)).parent_id == middle
            assert await rt.delete_conversation(middle) == [middle]
            assert (await rt.state(last)).parent_id is None
            assert (await rt.conversation(root)).child_id is None
            assert [link.id for link in await rt.lineage(last)] == [last]
            assert [link.id for link in await rt.lineage(root)] == [root]
            after = await rt.send(last, "Still here?")  # a step commits the state it knows
            assert after.parent_id is None
        fresh = open_store(where)
        try:
            assert (await fresh.load(last)).state.parent_id is None
            assert (await fresh.load(root)).child_id is None
        finally:
            await fresh.close()

    asyncio.run(main())


def test_the_memory_store_unlinks_the_middle_of_a_chain_too() -> None:
    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel(window=3_000)) as rt:
            root, middle, last = await _chain(rt)
            assert await rt.delete_conversation(middle) == [middle]
            assert (await rt.state(last)).parent_id is None
            assert (await rt.conversation(root)).child_id is None
            assert [link.id for link in await rt.lineage(last)] == [last]

    asyncio.run(main())


# --------------------------------------------------------------------------- late files


LATE_TOOL: Final = """
import asyncio, os, sys
from pathlib import Path
from segue import PostgresStore, Runtime, ScriptedModel, SqliteStore, Tool

where, archive, flag, cid = sys.argv[1:5]

async def slow(tool_input):
    print("started", flush=True)
    while not os.path.exists(flag):
        await asyncio.sleep(0.02)
    return "zebra-output " * 20_000

async def main():
    store = PostgresStore(where) if where.startswith("host=") else SqliteStore(where)
    tool = Tool(name="lookup", description="Look something up.", function=slow)
    async with Runtime(
        store=store, llm=ScriptedModel(tool_every=1), tools=[tool], archive_dir=Path(archive)
    ) as rt:
        try:
            await rt.send(cid, "Look it up.")
        except Exception as error:
            print(type(error).__name__, flush=True)
    print("finished", flush=True)

asyncio.run(main())
"""


def test_a_tool_output_saved_after_another_process_deleted_the_conversation_is_removed(
    where: str, tmp_path: Path
) -> None:
    """Process B runs a slow tool whose output passes the cap (its whole output goes to the
    archive directory); this process deletes the conversation with ``cancel=True`` meanwhile;
    then the tool returns and B saves the output. Nothing of it is left in the directory."""
    archive, flag = tmp_path / "archive", tmp_path / "go"

    async def create() -> str:
        async with Runtime(store=open_store(where), llm=ScriptedModel()) as rt:
            conv = await rt.create_conversation(model=MODEL, max_tool_output_tokens=256)
            return conv.id

    cid = asyncio.run(create())
    tool_runner = _script(tmp_path, "late.py", LATE_TOOL, where, str(archive), str(flag), cid)
    try:
        assert tool_runner.stdout is not None
        assert tool_runner.stdout.readline().strip() == "started"

        async def delete() -> None:
            async with Runtime(
                store=open_store(where), llm=ScriptedModel(), archive_dir=archive
            ) as rt:
                assert await rt.delete_conversation(cid, cancel=True) == [cid]

        asyncio.run(delete())
        flag.write_text("go")
        out, err = tool_runner.communicate(timeout=120)
    finally:
        if tool_runner.poll() is None:
            tool_runner.kill()
            tool_runner.communicate(timeout=30)
    assert tool_runner.returncode == 0, err
    assert "finished" in out, out
    assert not archive.exists() or list(archive.iterdir()) == []


# --------------------------------------------------------------------------- PostgreSQL files


def _files_holding(cluster: ThrowawayCluster, conninfo: str, phrase: bytes) -> list[str]:
    """The data files of segue's tables (each table, its indexes, its TOAST table and index)
    that hold ``phrase``, after a CHECKPOINT wrote every page out."""
    assert cluster.base is not None
    data = cluster.base / "data"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        rows = conn.execute(
            "SELECT r.relname, pg_relation_filepath(r.oid) FROM pg_class AS r"
            " WHERE r.oid IN ("
            "   SELECT c.oid FROM pg_class AS c WHERE c.relname = ANY(%(t)s)"
            "   UNION SELECT i.indexrelid FROM pg_index AS i JOIN pg_class AS c"
            "     ON c.oid = i.indrelid WHERE c.relname = ANY(%(t)s)"
            "   UNION SELECT c.reltoastrelid FROM pg_class AS c WHERE c.relname = ANY(%(t)s)"
            "   UNION SELECT i.indexrelid FROM pg_index AS i JOIN pg_class AS c"
            "     ON i.indrelid = c.reltoastrelid WHERE c.relname = ANY(%(t)s))",
            {"t": list(VACUUMED)},
        ).fetchall()
    held = []
    for name, relative in rows:
        if relative is None:
            continue
        for path in [data / relative, *data.glob(f"{relative}.*")]:  # its 1 GB segments
            if path.exists() and phrase in path.read_bytes():
                held.append(name)
    assert len(rows) >= len(VACUUMED)
    return held


def test_postgres_keeps_deleted_text_in_its_files_until_vacuum_rewrites_them(
    cluster: ThrowawayCluster,
) -> None:
    """After a deletion and a CHECKPOINT the phrase is still in the files of the tables (dead
    rows: what docs/data.md says); after ``purge(..., vacuum=True)`` it is in none of them,
    indexes and TOAST included, while the other conversation is whole."""
    conninfo = cluster.create_database(f"races_{next(_databases)}")
    phrase = f"zq{uuid.uuid4().hex[:12]}"

    async def main() -> None:
        async with Runtime(store=PostgresStore(conninfo), llm=ScriptedModel()) as rt:
            kept = await rt.create_conversation(model=MODEL, metadata={"user": "keep"})
            await rt.send(kept.id, "A message that stays.")
            conv = await rt.create_conversation(
                model=MODEL, system=f"You know {phrase}.", metadata={"user": phrase}
            )
            for turn in range(3):
                await rt.send(conv.id, f"{phrase} {turn}: tell me of tides.")
            await rt.pause(conv.id, phrase)
            assert await rt.delete_conversation(conv.id) == [conv.id]
            left = _files_holding(cluster, conninfo, phrase.encode())
            assert {"messages", "transitions", "tags"} <= set(left), left
            assert await rt.purge(older_than=1e9, vacuum=True) == 0
            assert _files_holding(cluster, conninfo, phrase.encode()) == []
            assert [m.text for m in await rt.messages(kept.id)][:1] == ["A message that stays."]

    asyncio.run(main())


def test_vacuum_is_a_no_op_said_so_where_deletion_overwrites(tmp_path: Path) -> None:
    async def main() -> None:
        for store in (SqliteStore(tmp_path / "v.db"), MemoryStore()):
            async with Runtime(store=store, llm=ScriptedModel()) as rt:
                assert await rt.vacuum() is False

    asyncio.run(main())


# --------------------------------------------------------------------------- export


def _consistent(document: dict[str, Any]) -> None:
    """One step's picture: the version follows the log, the log ends in the state's phase,
    an idle conversation's last message is the answer to its last question."""
    head, lines, messages = document["conversation"], document["transitions"], document["messages"]
    assert head["version"] == len(lines) + 1
    phase = head["state"]["phase"]["kind"]
    assert lines[-1]["to_phase"] == phase
    assert phase == "idle", phase  # a running turn is refused, never exported
    assert messages[-1]["kind"] == "assistant"
    users = sum(1 for m in messages if m["kind"] == "user")
    assert len(messages) == 2 * users
    assert document["pending"] == []


def test_exports_taken_while_another_process_commits_are_each_one_consistent_picture(
    where: str,
) -> None:
    """Another process sends 40 messages as fast as its model answers; this one exports the
    conversation over and over meanwhile. Each export is refused (a turn runs) or is one
    step's consistent picture, which imports."""

    async def create() -> str:
        async with Runtime(store=open_store(where), llm=ScriptedModel(reply_chars=30)) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.send(conv.id, "first")
            return conv.id

    cid = asyncio.run(create())
    sender = subprocess.Popen(  # noqa: S603  # our own interpreter on our own script
        [sys.executable, str(WORKER), where, "send", cid, "40", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )

    async def export_meanwhile() -> tuple[int, int]:
        exported = refused = 0
        async with Runtime(store=open_store(where), llm=ScriptedModel()) as rt:
            while sender.poll() is None:
                try:
                    document = await rt.export_conversation(cid)
                except ConversationBusyError:
                    refused += 1
                    continue
                _consistent(document)
                async with Runtime(store=MemoryStore(), llm=ScriptedModel()) as copy:
                    await copy.import_conversation(document)
                exported += 1
            _consistent(await rt.export_conversation(cid))  # and once it is all done
        return exported, refused

    try:
        exported, refused = asyncio.run(export_meanwhile())
    finally:
        out, err = sender.communicate(timeout=120)
    assert sender.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["results"] == ["idle"] * 40
    assert exported + refused > 0  # exported while it committed (on a loaded machine
    # every try may meet a turn: each was refused then, never exported half-way)


# --------------------------------------------------------------------------- cursors


def test_a_forged_cursor_out_of_range_is_refused_on_every_store(where: str) -> None:
    forged = [
        encode_cursor(1e12, 2**63),
        encode_cursor(1e12, -(2**63) - 1),
        encode_cursor(float("inf"), 1),
        "WyJ4IiwxXQ",  # ["x",1]
    ]

    async def main() -> None:
        async with Runtime(store=open_store(where), llm=ScriptedModel()) as rt:
            await rt.create_conversation(model=MODEL)
            for cursor in forged:
                with pytest.raises(InvalidCursorError):
                    await rt.list_conversations(cursor=cursor)
            edge = await rt.list_conversations(cursor=encode_cursor(1e12, 2**63 - 1))
            assert len(edge.conversations) == 1

    asyncio.run(main())
    with (
        live_server(create_app(Runtime(store=open_store(where), llm=ScriptedModel()))) as url,
        httpx2.Client(base_url=url, timeout=60) as http,
    ):
        for cursor in forged:
            answer = http.get("/api/conversations", params={"cursor": cursor})
            assert answer.status_code == 422, answer.text
            assert answer.json()["error"] == "invalid_cursor"


def test_purge_vacuums_when_asked_over_rest_and_the_cli(where: str) -> None:
    """``vacuum`` in the REST purge's body says whether the files were rewritten (PostgreSQL)
    or needed no rewriting (SQLite), and is left out of the answer when not asked;
    ``segue purge --vacuum`` says the same in words."""
    postgres = where.startswith("host=")
    with (
        live_server(create_app(Runtime(store=open_store(where), llm=ScriptedModel()))) as url,
        httpx2.Client(base_url=url, timeout=60) as http,
    ):
        for _ in range(2):
            assert http.post("/api/conversations", json={"model": MODEL}).status_code == 201
        plain = http.post("/api/purge", json={"older_than": 3_600})
        assert plain.json() == {"deleted": 0}
        vacuumed = http.post("/api/purge", json={"older_than": 0, "vacuum": True})
        assert vacuumed.json() == {"deleted": 2, "vacuumed": postgres}
    place = ("--database-url", where) if postgres else ("--db", where)
    said = invoke("purge", "--older-than", "0s", "--vacuum", "--yes", *place)
    assert said.exit_code == 0, said.output
    assert "nothing to purge" in said.output
    expected = "vacuumed: the tables were rewritten" if postgres else "nothing to vacuum"
    assert expected in said.output


def test_a_file_whose_write_was_cancelled_is_removed_when_the_write_ends(tmp_path: Path) -> None:
    """A tool's output or an archive being written when the work is cancelled (a cancel, or
    another process's deletion seen meanwhile): the thread finishes the file, which nothing
    will ever name, so it is removed then."""
    release = threading.Event()
    written: list[Path] = []

    def slow_write(directory: Path, cid: str, text: str) -> Path:
        release.wait(30)
        path = write_tool_output(directory, cid, "call_1", text)
        written.append(path)
        return path

    async def main() -> None:
        store = MemoryStore()
        await store.create(new_conversation(model=MODEL, conversation_id="c1"), system=None, at=0.0)
        task = asyncio.create_task(saved(store, "failed", slow_write, tmp_path, "c1", "zebra"))
        await asyncio.sleep(0.05)
        task.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(500):  # the thread's write, then its callback on this loop
            if written and not written[0].exists():
                break
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert len(written) == 1
    assert list(tmp_path.iterdir()) == []
