"""A conversation's age costs nothing: many compactions on a real store, every store.

Counted in store rows, never in seconds (a busy machine would make a timing lie): the rows a
runtime reads per compaction do not grow with the compactions before, the model's view folded
from a generation's start is exactly the fold of the whole transcript (pinned messages of
earlier sessions and generations first), and the compactions' archives together hold the
whole transcript. ``bench/bench_generations.py`` measures the time and memory.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from segue import (
    ContextExhaustionBehavior,
    MemoryStore,
    PostgresStore,
    Runtime,
    ScriptedModel,
    SqliteStore,
)
from segue.executor.cache import ViewCache
from segue.executor.store_port import Store, StoredMessage
from segue.executor.transcript import current_view
from segue.testing.postgres import ThrowawayCluster, find_server_binaries

MODEL = "claude-sonnet-4-5"
WINDOW = 6_000
StoreFactory = Callable[[], Store]
_databases = itertools.count()


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayCluster]:
    if find_server_binaries() is None:
        pytest.skip("PostgreSQL server binaries not found in /usr/lib/postgresql")
    with ThrowawayCluster() as running:
        yield running


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """The test's one store, opened again on each call (a runtime closes its store)."""
    if request.param == "memory":
        memory = MemoryStore()
        return lambda: memory
    if request.param == "sqlite":
        return lambda: SqliteStore(tmp_path / "segue.db")
    cluster: ThrowawayCluster = request.getfixturevalue("cluster")
    url = cluster.create_database(f"generations_{next(_databases)}")
    return lambda: PostgresStore(url)


class Counted:
    """A store that counts the transcript rows it hands out."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.rows = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def messages(
        self, conversation_id: str, *, after_seq: int = 0, before_seq: int | None = None
    ) -> list[StoredMessage]:
        bounds = {} if before_seq is None else {"before_seq": before_seq}
        read = await self.store.messages(conversation_id, after_seq=after_seq, **bounds)
        self.rows += len(read)
        return read

    async def pinned_messages(
        self, conversation_id: str, *, before_seq: int
    ) -> list[StoredMessage]:
        read = await self.store.pinned_messages(conversation_id, before_seq=before_seq)
        self.rows += len(read)
        return read


async def compact(rt: Runtime, counted: Counted, cid: str, times: int) -> list[int]:
    """Send until the conversation compacted ``times`` more times; the rows read by each
    compacting send. Now and then a short message is pinned."""
    rows: list[int] = []
    generation = (await rt.state(cid)).generation
    for turn in itertools.count():
        before = counted.rows
        pin = turn % 20 == 3
        text = f"Rule {turn}: be brief." if pin else f"turn {turn}: tell me of tides. " * 8
        state = await rt.send(cid, text, pinned=pin)
        if state.generation != generation:
            generation = state.generation
            rows.append(counted.rows - before)
            if len(rows) == times:
                return rows
    raise AssertionError  # pragma: no cover  # itertools.count() never ends


def test_rows_read_per_compaction_do_not_grow_and_the_view_is_the_whole_fold(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    """Twelve compactions, a pause and a resume (a new session) among them, pinned messages
    throughout: a compaction reads as many rows at the twelfth as at the second (a little
    slack for the pinned ones), and a cold runtime's view of the conversation, folded from the
    generation's start, is what folding the whole transcript gives."""

    async def main() -> None:
        counted = Counted(make_store())
        model = ScriptedModel(window=WINDOW)
        archive = tmp_path / "archive"
        async with Runtime(store=counted, llm=model, archive_dir=archive) as rt:  # type: ignore[arg-type]
            conv = await rt.create_conversation(
                model=MODEL,
                behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE,
                context_window=WINDOW,
                max_continuations=1_000,
            )
            early = await compact(rt, counted, conv.id, 6)
            await rt.pause(conv.id, "lunch")
            await rt.resume(conv.id)
            late = await compact(rt, counted, conv.id, 6)
            pinned = sum(m.message.pinned for m in await counted.store.messages(conv.id))
            assert max(late) <= max(early[1:]) + pinned, (early, late)
            assert (await rt.state(conv.id)).session == 2

        store = make_store()
        try:
            stored = await store.load(conv.id)
            transcript = [m.message for m in await store.messages(conv.id)]
            state = stored.state
            cold = list(await ViewCache(store).view(stored))
            assert cold == current_view(transcript, state.session, state.generation)
            assert any(message.pinned for message in cold[:3])  # pinned ones lead the view
            archived: list[str] = []
            files = sorted(
                archive.iterdir(), key=lambda path: int(path.name.split(".gen")[1].split(".")[0])
            )
            for path in files:
                archived.extend(path.read_text().splitlines()[1:])
            whole = [message.model_dump_json() for message in transcript]
            assert len(files) == 12
            assert archived == whole[: len(archived)]
            assert len(archived) > len(whole) // 2
            assert json.loads(files[-1].read_text().splitlines()[0])["generation"] == 12
        finally:
            await store.close()

    asyncio.run(main())


LEGACY = Path(__file__).parent / "fixtures" / "legacy"


def whole_pinned(messages: list[StoredMessage]) -> list[StoredMessage]:
    return [message for message in messages if message.message.pinned]


async def views_match_the_whole_fold(store: Store) -> int:
    """For every conversation of ``store``: the view folded from its landmarks is the fold of
    its whole transcript. How many conversations were compared."""
    fresh = 0
    try:
        listed = await store.list_conversations()
        for conversation in listed:
            stored = await store.load(conversation.state.id)
            state = stored.state
            whole = [m.message for m in await store.messages(state.id)]
            view = list(await ViewCache(store).view(stored))
            assert view == current_view(whole, state.session, state.generation), state.id
            start = await store.generation_start(state.id, state.session, state.generation)
            started_again = (state.session, state.generation) != (1, 1)
            assert (start > 1) == started_again, state.id  # found, not read from the start
            pinned = [m.seq for m in whole_pinned(await store.messages(state.id))]
            assert [
                m.seq for m in await store.pinned_messages(state.id, before_seq=10**6)
            ] == pinned
            fresh += started_again
        assert fresh >= 2  # the compacted and the restarted ones
        return len(listed)
    finally:
        await store.close()


def test_the_landmarks_of_a_release_database_are_found_when_it_is_migrated(
    tmp_path: Path, cluster: ThrowawayCluster
) -> None:
    """The databases the last release wrote (``test_legacy_stores``' fixtures), migrated on
    opening: their landmarks are found from the transcripts, so every view folded from them
    (a compacted conversation, a restarted one, pinned messages) is the whole fold."""
    path = tmp_path / "legacy.db"
    shutil.copyfile(LEGACY / "legacy.db", path)
    path.chmod(0o600)
    assert asyncio.run(views_match_the_whole_fold(SqliteStore(path))) >= 5
    url = cluster.create_database("legacy_landmarks")
    subprocess.run(  # noqa: S603  # the cluster's own psql, on a file of ours
        [
            str(cluster.binaries / "psql"),
            *("-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url),
            *("-f", str(LEGACY / "legacy-postgres.sql")),
        ],
        check=True,
        capture_output=True,
    )
    assert asyncio.run(views_match_the_whole_fold(PostgresStore(url))) >= 5
