"""Databases written by the release open and run on this code.

``tests/fixtures/legacy`` holds a SQLite file and a ``pg_dump`` of a PostgreSQL database that
the released segue (commit 66c3451) wrote through its public ``Runtime``, and what that release
read back from each (``generate.py`` there says how they were made). Each test restores one
into a fresh store, checks that this code reads every conversation back as the release did
(states compared as JSON, so a renamed or retyped field of the stored state fails here), then
runs on: ``recover()`` finishes the work the release left in the outbox, idle conversations
take a message and answer, the exhausted and failed ones refuse, the paused one resumes.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from added_fields import release_shape
from segue import (
    ConversationExhaustedError,
    MessageRejectedError,
    PostgresStore,
    Runtime,
    ScriptedModel,
    SqliteStore,
    Store,
    Tool,
)
from segue.testing.postgres import ThrowawayCluster, find_server_binaries

FIXTURES: Final = Path(__file__).parent / "fixtures" / "legacy"
MODEL: Final = "claude-sonnet-4-5"
WINDOW: Final = 2_000
"""The window the fixtures' conversations were made with (``generate.py``)."""
IDLE: Final = ("idle-tools", "image", "pinned", "compacted", "restarted")
"""Conversations the release left idle (the exhausted one's child is found by its link)."""
StoreFactory = Callable[[], Store]


async def lookup(tool_input: dict[str, Any]) -> str:
    return f"result for {tool_input.get('query', '?')}"


LOOKUP: Final = Tool(name="lookup", description="Look something up.", function=lookup)


def expected(kind: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"expected-{kind}.json").read_text())
    assert data["release"] == "66c3451"
    conversations: dict[str, Any] = data["conversations"]
    return conversations


async def read_back(store: Store) -> dict[str, Any]:
    """What this code reads from ``store``, in the shape ``generate.py`` saved the release's."""
    conversations: dict[str, Any] = {}
    for listed in await store.list_conversations():
        cid = listed.state.id
        stored = await store.load(cid)
        conversations[cid] = {
            # What the release wrote: the fields added since read back as their defaults.
            "state": release_shape(stored.state.model_dump(mode="json"), check_defaults=True),
            "version": stored.version,
            "system": stored.system,
            "child_id": stored.child_id,
            "last_seq": stored.last_seq,
            "messages": [
                {"seq": m.seq, "kind": m.kind, "text": m.text} for m in await store.messages(cid)
            ],
            "transitions": [t.event_kind for t in await store.transitions(cid)],
            "snapshots": [s.model_dump(mode="json") for s in await store.snapshots(cid)],
            "pending": [
                {"id": p.id, "kind": p.effect.kind, "owner": p.owner} for p in stored.pending
            ],
        }
    return conversations


def compare(seen: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Conversation by conversation and field by field, so a failure names what moved."""
    assert sorted(seen) == sorted(wanted)
    for cid, conversation in wanted.items():
        for field, value in conversation.items():
            assert seen[cid][field] == value, f"{cid}: {field}"


async def reads_back_then_runs_on(open_store: StoreFactory, wanted: dict[str, Any]) -> None:
    store = open_store()
    try:
        compare(await read_back(store), wanted)
    finally:
        await store.close()
    pending = {cid for cid, c in wanted.items() if c["pending"]}
    assert pending == {"pending-request", "pending-tool"}  # the fixture holds what is tested
    model = ScriptedModel(window=WINDOW, reply_chars=160)
    async with Runtime(store=open_store(), llm=model, tools=[LOOKUP]) as rt:  # recover()s
        assert await rt.store.with_pending() == []
        for cid in pending:
            state = await rt.state(cid)
            assert state.phase.kind == "idle", cid
            kinds = [m.kind for m in await rt.messages(cid)]
            assert kinds[-1] == "assistant", cid
        tool_results = [m for m in await rt.messages("pending-tool") if m.kind == "tool_result"]
        assert [m.text for m in tool_results] == ["result for x"]

        child = wanted["exhausted"]["child_id"]
        for cid in (*IDLE, child, *pending):
            before = len(wanted[cid]["messages"])
            state = await rt.send(cid, "One more question.")
            assert state.phase.kind == "idle", cid
            transcript = await rt.messages(cid)
            assert [m.kind for m in transcript[-2:]] == ["user", "assistant"], cid
            assert [m.seq for m in transcript] == list(range(1, len(transcript) + 1)), cid
            assert len(transcript) > before, cid

        # The key the release stored with a message still says it was taken.
        pinned = len(await rt.messages("pinned"))
        await rt.send("pinned", "What is the capital of Peru?", idempotency_key="peru-1")
        assert len(await rt.messages("pinned")) == pinned

        with pytest.raises(ConversationExhaustedError):
            await rt.send("exhausted", "Still there?")
        with pytest.raises(MessageRejectedError):
            await rt.send("unhandled", "Still there?")
        assert (await rt.start_new_from("exhausted")).id == child  # the link the release made

        resumed = await rt.resume("paused", "Go on.")
        assert (resumed.phase.kind, resumed.session) == ("idle", 2)
        assert (await rt.send("paused", "And then?")).phase.kind == "idle"
        assert len(await rt.store.snapshots("paused")) == 1


def test_a_sqlite_file_of_the_release(tmp_path: Path) -> None:
    path = tmp_path / "legacy.db"
    shutil.copyfile(FIXTURES / "legacy.db", path)
    path.chmod(0o600)
    asyncio.run(reads_back_then_runs_on(lambda: SqliteStore(path), expected("sqlite")))


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayCluster]:
    if find_server_binaries() is None:
        pytest.skip("PostgreSQL server binaries not found in /usr/lib/postgresql")
    with ThrowawayCluster() as running:
        yield running


@pytest.mark.slow
def test_a_postgres_database_of_the_release(cluster: ThrowawayCluster) -> None:
    conninfo = cluster.create_database("legacy")
    subprocess.run(  # noqa: S603  # the cluster's own psql, on a file of ours
        [
            str(cluster.binaries / "psql"),
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            conninfo,
            "-f",
            str(FIXTURES / "legacy-postgres.sql"),
        ],
        check=True,
        capture_output=True,
    )
    asyncio.run(reads_back_then_runs_on(lambda: PostgresStore(conninfo), expected("postgres")))
