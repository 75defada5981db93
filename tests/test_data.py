"""A chat backend's conversations, on SQLite and PostgreSQL: metadata, pages, deletion, export
and import, retention.

Real stores, real runtimes, real processes: a deletion racing another process's turn, a
process killed with SIGKILL in the middle of a purge, the bytes of a deleted conversation
searched for in the SQLite file (its WAL included) and the archive directory, an export from
one store imported into the other and continued.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest

from segue import (
    ContextExhaustionBehavior,
    ConversationExistsError,
    ConversationNotFoundError,
    ConversationState,
    PostgresStore,
    Runtime,
    ScriptedModel,
    SqliteStore,
    Store,
    Tool,
)
from segue.executor.cache import ViewCache
from segue.executor.errors import (
    ConversationBusyError,
    InvalidCursorError,
    InvalidDocumentError,
    InvalidMetadataError,
    MessageRejectedError,
)
from segue.executor.model_port import LlmReply, LlmRequest
from segue.testing.postgres import ThrowawayCluster, find_server_binaries

MODEL: Final = "claude-sonnet-4-5"
WORKER: Final = Path(__file__).parent / "process_worker.py"
_databases = itertools.count()


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayCluster]:
    if find_server_binaries() is None:
        pytest.skip("PostgreSQL server binaries not found in /usr/lib/postgresql")
    with ThrowawayCluster() as running:
        yield running


def new_database(cluster: ThrowawayCluster) -> str:
    return cluster.create_database(f"data_{next(_databases)}")


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The test's store: a SQLite path, or a fresh PostgreSQL database's conninfo."""
    if request.param == "sqlite":
        return str(tmp_path / "segue.db")
    return new_database(request.getfixturevalue("cluster"))


def open_store(where: str) -> Store:
    return PostgresStore(where) if where.startswith("host=") else SqliteStore(where)


class Gated(ScriptedModel):
    """Answers once ``opened`` is set; ``asked`` is set when a request arrives."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.asked = asyncio.Event()
        self.opened = asyncio.Event()

    async def complete(self, request: LlmRequest) -> LlmReply:
        self.asked.set()
        await self.opened.wait()
        return await super().complete(request)


async def running_turn(
    rt: Runtime, model: Gated
) -> tuple[ConversationState, asyncio.Future[ConversationState]]:
    """A new conversation, and its first turn, under way: the model was asked and waits."""
    conv = await rt.create_conversation(model=MODEL)
    turn = asyncio.ensure_future(rt.send(conv.id, "hello"))
    await model.asked.wait()
    return conv, turn


# --------------------------------------------------------------------------- metadata and pages


def test_metadata_is_stored_replaced_bounded_and_inherited(where: str) -> None:
    async def main() -> None:
        async with Runtime(store=open_store(where), llm=ScriptedModel(window=3_000)) as rt:
            conv = await rt.create_conversation(
                model=MODEL, context_window=3_000, metadata={"user": "u-17", "title": "Tides"}
            )
            stored = await rt.conversation(conv.id)
            assert stored.metadata == {"user": "u-17", "title": "Tides"}
            for wrong in (
                {f"k{n}": "v" for n in range(65)},
                {"k" * 65: "v"},
                {"title": "x" * 1_025},
                {"user": 17},
                {"user": "a\x00b"},
            ):
                with pytest.raises(InvalidMetadataError):
                    await rt.create_conversation(model=MODEL, metadata=wrong)  # type: ignore[arg-type]
                with pytest.raises(InvalidMetadataError):
                    await rt.set_metadata(conv.id, wrong)  # type: ignore[arg-type]
            assert len(await rt.conversations()) == 1  # nothing stored by the refusals
            replaced = await rt.set_metadata(conv.id, {"user": "u-17", "project": "sea"})
            assert replaced.metadata == {"user": "u-17", "project": "sea"}
            assert (await rt.conversation(conv.id)).metadata == replaced.metadata
            state = conv
            while state.phase.kind != "context_exhausted":
                state = await rt.send(conv.id, "Tell me about tides. " * 20)
            child = await rt.start_new_from(conv.id)
            assert (await rt.conversation(child.id)).metadata == replaced.metadata

    asyncio.run(main())


def test_pages_are_newest_first_filtered_and_stable_while_conversations_are_created(
    where: str,
) -> None:
    async def main() -> None:
        clock = itertools.count(1_000)
        async with Runtime(
            store=open_store(where), llm=ScriptedModel(), clock=lambda: float(next(clock))
        ) as rt:
            mine = [
                (await rt.create_conversation(model=MODEL, metadata={"user": "u1"})).id
                for _ in range(7)
            ]
            for _ in range(3):
                await rt.create_conversation(model=MODEL, metadata={"user": "u2"})
            await rt.create_conversation(model=MODEL, metadata={"user": "u1", "team": "t"})
            seen: list[str] = []
            cursor = None
            while True:
                page = await rt.list_conversations(metadata={"user": "u1"}, limit=3, cursor=cursor)
                seen.extend(c.state.id for c in page.conversations)
                assert all(c.metadata["user"] == "u1" for c in page.conversations)
                # Created meanwhile: newer than every page, never in a later one.
                await rt.create_conversation(model=MODEL, metadata={"user": "u1"})
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
            assert seen[1:] == mine[::-1]
            assert len(seen) == len(set(seen)) == 8
            both = await rt.list_conversations(metadata={"user": "u1", "team": "t"})
            assert [c.state.id for c in both.conversations] == [seen[0]]
            everyone = await rt.list_conversations(limit=1_000)
            assert len(everyone.conversations) == 7 + 3 + 1 + 3
            assert everyone.next_cursor is None
            with pytest.raises(InvalidCursorError):
                await rt.list_conversations(cursor="not-a-cursor")
            with pytest.raises(ValueError, match="limit"):
                await rt.list_conversations(limit=0)

    asyncio.run(main())


# --------------------------------------------------------------------------- deletion


def _lookup(size: int) -> Tool:
    async def lookup(tool_input: dict[str, Any]) -> str:
        return f"{tool_input.get('query', '?')} " + "secret-zebra " * size

    return Tool(name="lookup", description="Look something up.", function=lookup)


def test_a_deleted_conversation_leaves_no_byte_of_its_text(where: str, tmp_path: Path) -> None:
    """Its transcript in a compacting conversation (an archive written), a tool's output too
    large for the window (saved to a file): after the deletion, the token it was all written
    with is nowhere in the SQLite file and its WAL, nor in the archive directory; PostgreSQL
    holds no row that names it. The other conversation is untouched."""
    token = f"zq{uuid.uuid4().hex[:12]}"
    archive = tmp_path / "archive"

    async def main() -> str:
        model = ScriptedModel(window=4_000, tool_every=3)
        async with Runtime(
            store=open_store(where), llm=model, tools=[_lookup(2_000)], archive_dir=archive
        ) as rt:
            kept = await rt.create_conversation(model=MODEL, metadata={"user": "keep"})
            await rt.send(kept.id, "A message that stays.")
            conv = await rt.create_conversation(
                model=MODEL,
                behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE,
                context_window=4_000,
                max_tool_output_tokens=256,
                system=f"You know {token}.",
                metadata={"user": token},
            )
            state = conv
            for turn in range(12):
                state = await rt.send(conv.id, f"{token} {turn}: tell me of tides. " * 6)
            assert state.generation > 1
            names = [path.name for path in archive.iterdir()]
            assert any(".tool." in name for name in names), names
            assert any(".gen1." in name for name in names), names
            assert await rt.delete_conversation(conv.id) == [conv.id]
            if not where.startswith("host="):  # the WAL as it is while the store is open
                for name in ("segue.db", "segue.db-wal"):
                    path = tmp_path / name
                    if path.exists():
                        assert token.encode() not in path.read_bytes(), name
            with pytest.raises(ConversationNotFoundError):
                await rt.state(conv.id)
            with pytest.raises(ConversationNotFoundError):
                await rt.delete_conversation(conv.id)
            first = (await rt.messages(kept.id))[0]
            assert first.text == "A message that stays."
            page = await rt.list_conversations(metadata={"user": token})
            assert page.conversations == ()
            return kept.id

    kept_id = asyncio.run(main())
    assert list(archive.iterdir()) == []  # the one conversation that wrote files is gone
    if where.startswith("host="):
        with psycopg.connect(where) as conn:
            assert conn.execute("SELECT id FROM conversations").fetchall() == [(kept_id,)]
            for table in ("messages", "transitions", "snapshots", "landmarks"):
                left = conn.execute(
                    f"SELECT count(*) FROM {table} WHERE conversation_id <> %s",  # noqa: S608
                    (kept_id,),
                ).fetchone()
                assert left == (0,), table
            tags = conn.execute(  # named by ordinal, as on SQLite (schema 8)
                "SELECT count(*) FROM tags WHERE ordinal NOT IN"
                " (SELECT ordinal FROM conversations WHERE id = %s)",
                (kept_id,),
            ).fetchone()
            assert tags == (0,)
    else:
        for name in ("segue.db", "segue.db-wal"):
            path = tmp_path / name
            if path.exists():
                assert token.encode() not in path.read_bytes(), name


def test_a_running_turn_is_refused_or_cancelled_first(where: str) -> None:
    async def main() -> None:
        model = Gated()
        async with Runtime(store=open_store(where), llm=model) as rt:
            conv, turn = await running_turn(rt, model)
            with pytest.raises(ConversationBusyError) as refused:
                await rt.delete_conversation(conv.id)
            assert isinstance(refused.value, MessageRejectedError)
            assert refused.value.cause == "busy"
            assert (await rt.state(conv.id)).phase.kind == "llm_requesting"
            assert await rt.delete_conversation(conv.id, cancel=True) == [conv.id]
            outcome = await asyncio.gather(turn, return_exceptions=True)
            assert outcome[0] is not None
            with pytest.raises(ConversationNotFoundError):
                await rt.state(conv.id)

    asyncio.run(main())


def test_a_chain_goes_whole_or_its_neighbours_lose_the_link(where: str) -> None:
    async def main() -> None:
        async with Runtime(store=open_store(where), llm=ScriptedModel(window=3_000)) as rt:

            async def exhausted(cid: str) -> None:
                while (await rt.state(cid)).phase.kind != "context_exhausted":
                    await rt.send(cid, "Tell me about tides. " * 20)

            root = await rt.create_conversation(model=MODEL, context_window=3_000)
            await exhausted(root.id)
            middle = await rt.start_new_from(root.id)
            await exhausted(middle.id)
            last = await rt.start_new_from(middle.id)
            assert [link.id for link in await rt.lineage(last.id)] == [root.id, middle.id, last.id]
            assert await rt.delete_conversation(middle.id) == [middle.id]
            assert [link.id for link in await rt.lineage(root.id)] == [root.id]
            assert [link.id for link in await rt.lineage(last.id)] == [last.id]
            assert (await rt.conversation(root.id)).child_id is None
            assert len(await rt.messages(last.id)) > 0  # its own text kept

            other = await rt.create_conversation(model=MODEL, context_window=3_000)
            await exhausted(other.id)
            child = await rt.start_new_from(other.id)
            assert sorted(await rt.delete_conversation(child.id, chain=True)) == sorted(
                [other.id, child.id]
            )
            assert {c.state.id for c in await rt.conversations()} == {root.id, last.id}

    asyncio.run(main())


def _worker(where: str, job: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(  # noqa: S603  # our own interpreter on our own script
        [sys.executable, str(WORKER), where, job, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )


def test_deleting_a_turn_another_process_runs_is_refused_and_it_then_sees_it_gone(
    where: str,
) -> None:
    """Another process holds the conversation's model request (a live claim): the deletion is
    refused. Once that process is gone (SIGKILL), the deletion goes through, and a process
    that sends to it then is told it does not exist."""

    async def create() -> str:
        async with Runtime(store=open_store(where), llm=ScriptedModel()) as rt:
            return (await rt.create_conversation(model=MODEL)).id

    cid = asyncio.run(create())
    hanging = _worker(where, "hang", cid)
    try:
        assert hanging.stdout is not None
        assert json.loads(hanging.stdout.readline())["asked"]  # its claim is live now

        async def refused() -> None:
            async with Runtime(store=open_store(where), llm=ScriptedModel()) as rt:
                with pytest.raises(ConversationBusyError, match="runs its turn"):
                    await rt.delete_conversation(cid)
                assert (await rt.state(cid)).phase.kind == "llm_requesting"

        asyncio.run(refused())
        os.kill(hanging.pid, signal.SIGKILL)
        hanging.communicate(timeout=30)
    finally:
        if hanging.poll() is None:
            hanging.kill()
            hanging.communicate(timeout=30)

    async def deleted() -> None:
        rt = Runtime(store=open_store(where), llm=ScriptedModel())  # no recover(): no new turn
        try:
            assert await rt.delete_conversation(cid) == [cid]
        finally:
            await rt.close()

    asyncio.run(deleted())
    sender = _worker(where, "send", cid, "1", "0")
    out, err = sender.communicate(timeout=120)
    assert sender.returncode == 0, err
    results = json.loads(out.splitlines()[-1])["results"]
    assert results[0].startswith("ConversationNotFoundError"), results


PURGER: Final = """
import asyncio, sys
from segue import PostgresStore, Runtime, ScriptedModel, SqliteStore

async def main(where):
    store = PostgresStore(where) if where.startswith("host=") else SqliteStore(where)
    rt = Runtime(store=store, llm=ScriptedModel())
    for cid in await store.inactive(before=1e12):
        await rt.delete_conversation(cid)
        print(cid, flush=True)

asyncio.run(main(sys.argv[1]))
"""


def test_a_process_killed_while_deleting_leaves_each_conversation_whole_or_gone(
    where: str, tmp_path: Path
) -> None:
    async def create() -> dict[str, int]:
        sizes: dict[str, int] = {}
        async with Runtime(store=open_store(where), llm=ScriptedModel(reply_chars=40)) as rt:
            for n in range(40):
                conv = await rt.create_conversation(model=MODEL, metadata={"n": str(n)})
                for turn in range(n % 4 + 1):
                    await rt.send(conv.id, f"question {turn} " * 30)
                sizes[conv.id] = len(await rt.messages(conv.id))
        return sizes

    sizes = asyncio.run(create())
    script = tmp_path / "purger.py"
    script.write_text(PURGER, encoding="utf-8")
    child = subprocess.Popen(  # noqa: S603  # our own interpreter on our own script
        [sys.executable, str(script), where], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        gone = [child.stdout.readline().strip() for _ in range(5)]
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL

    async def check() -> None:
        store = open_store(where)
        try:
            left = {c.state.id for c in await store.list_conversations()}
            assert not left & set(gone)
            assert 0 < len(left) < len(sizes)
            for cid, size in sizes.items():
                if cid not in left:
                    with pytest.raises(ConversationNotFoundError):
                        await store.messages(cid)
                    continue
                stored = await store.load(cid)
                assert len(await store.messages(cid)) == stored.last_seq == size
                assert len(await store.transitions(cid)) == stored.version - 1
                assert stored.metadata.keys() == {"n"}
        finally:
            await store.close()

    asyncio.run(check())


def test_purge_deletes_what_nobody_wrote_to_for_long_enough(where: str) -> None:
    async def main() -> None:
        now = [1_000.0]
        async with Runtime(
            store=open_store(where), llm=ScriptedModel(), clock=lambda: now[0]
        ) as rt:
            old = [
                (await rt.create_conversation(model=MODEL, metadata={"u": "a"})).id
                for _ in range(3)
            ]
            other = (await rt.create_conversation(model=MODEL, metadata={"u": "b"})).id
            now[0] = 5_000.0
            await rt.send(old[0], "still here")  # written to: active again
            fresh = (await rt.create_conversation(model=MODEL, metadata={"u": "a"})).id
            now[0] = 5_500.0
            with pytest.raises(ValueError, match="older_than"):
                await rt.purge(older_than=-1)
            assert await rt.purge(older_than=2_000, metadata={"u": "a"}) == 2
            left = {c.state.id for c in await rt.conversations()}
            assert left == {old[0], other, fresh}
            assert await rt.purge(older_than=2_000) == 1
            assert {c.state.id for c in await rt.conversations()} == {old[0], fresh}

    asyncio.run(main())


# --------------------------------------------------------------------------- export and import


def _pair(where: str, tmp_path: Path, cluster: Callable[[], ThrowawayCluster]) -> str:
    """The other store: PostgreSQL for SQLite, SQLite for PostgreSQL."""
    if where.startswith("host="):
        return str(tmp_path / "other.db")
    return new_database(cluster())


def test_an_export_imported_into_the_other_store_continues_where_it_was(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    other = _pair(where, tmp_path, lambda: request.getfixturevalue("cluster"))

    async def main() -> None:
        async with Runtime(store=open_store(where), llm=ScriptedModel(window=5_000)) as rt:
            conv = await rt.create_conversation(
                model=MODEL,
                behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE,
                context_window=5_000,
                system="Be brief.",
                metadata={"user": "u-17"},
            )
            await rt.send(conv.id, "Rule: answer in English.", pinned=True)
            state = conv
            while state.generation < 3:
                state = await rt.send(conv.id, "Tell me of tides. " * 10)
            await rt.pause(conv.id, "lunch")
            await rt.resume(conv.id)
            document = await rt.export_conversation(conv.id)
            original = await rt.conversation(conv.id)
            view = list(await ViewCache(lambda: rt.store).view(original))
        json.dumps(document)  # JSON through and through
        assert (document["format"], document["version"]) == ("segue.conversation", 1)

        async with Runtime(store=open_store(other), llm=ScriptedModel(window=5_000)) as rt:
            for broken, reason in (
                ({}, "format"),
                ({**document, "version": 2}, "version"),
                ({**document, "messages": [{"kind": "nonsense"}]}, "messages.0.kind"),
                ({**document, "transitions": document["transitions"][1:]}, "seqs"),
                ({**document, "conversation": {**document["conversation"], "id": "x"}}, "id"),
            ):
                with pytest.raises(InvalidDocumentError, match=reason):
                    await rt.import_conversation(broken)
            assert await rt.conversations() == []  # nothing half-imported
            imported = await rt.import_conversation(document)
            with pytest.raises(ConversationExistsError):
                await rt.import_conversation(document)
            copy = await rt.import_conversation(document, conversation_id="copy")
            assert (copy.id, copy.generation) == ("copy", imported.generation)
            stored = await rt.conversation(conv.id)
            assert stored.state == original.state
            assert (stored.version, stored.system, stored.metadata, stored.last_seq) == (
                original.version,
                original.system,
                original.metadata,
                original.last_seq,
            )
            assert list(await ViewCache(lambda: rt.store).view(stored)) == view
            assert [s.version for s in await rt.store.snapshots(conv.id)] == [1]
            again = await rt.export_conversation(conv.id)
            assert {k: v for k, v in again.items() if k != "exported_at"} == {
                k: v for k, v in document.items() if k != "exported_at"
            }
            after = await rt.send(conv.id, "Go on.")
            assert after.phase.kind == "idle"
            assert after.generation >= imported.generation
            assert after.session == imported.session == 2
            assert after.pinned_tokens == imported.pinned_tokens > 0

    asyncio.run(main())


def test_a_turn_in_flight_is_not_exported(where: str) -> None:
    async def main() -> None:
        model = Gated()
        async with Runtime(store=open_store(where), llm=model) as rt:
            conv, turn = await running_turn(rt, model)
            with pytest.raises(ConversationBusyError):
                await rt.export_conversation(conv.id)
            model.opened.set()
            await turn
            assert (await rt.export_conversation(conv.id))["pending"] == []

    asyncio.run(main())
