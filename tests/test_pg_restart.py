"""PostgreSQL restarted (fast shutdown: every session cut) while two processes run turns on
eight conversations: every turn completes once the server is back, one model call per reply,
nothing lost or doubled, and neither process needs a restart."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import psycopg
import pytest

from segue import PostgresStore, Runtime, ScriptedModel
from segue.testing.postgres import ThrowawayCluster, find_server_binaries

WORKER: Final = Path(__file__).with_name("process_worker.py")
MODEL: Final = "claude-sonnet-4-5"
CONVERSATIONS: Final = 8
SENDS: Final = 24
"""Messages each process sends, round-robin over the conversations."""
TIMEOUT: Final = 180


@pytest.fixture
def cluster() -> Iterator[ThrowawayCluster]:
    if find_server_binaries() is None:
        pytest.skip("PostgreSQL server binaries not found in /usr/lib/postgresql")
    with ThrowawayCluster() as running:
        yield running


def replies(url: str) -> int:
    """Assistant messages stored so far (read with a plain connection of its own)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM messages WHERE kind = 'assistant'").fetchone()
    return int(row[0]) if row else 0


@pytest.mark.slow
def test_a_restarted_server_loses_no_turn_and_pays_for_none_twice(
    cluster: ThrowawayCluster,
) -> None:
    url = cluster.create_database("restarted")

    async def create() -> list[str]:
        async with Runtime(store=PostgresStore(url), llm=ScriptedModel()) as rt:
            return [(await rt.create_conversation(model=MODEL)).id for _ in range(CONVERSATIONS)]

    ids = asyncio.run(create())
    workers = [
        subprocess.Popen(  # noqa: S603  # our own workers, no shell
            [sys.executable, str(WORKER), url, "send", ",".join(ids), str(SENDS), "0.05"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + TIMEOUT
        while replies(url) < SENDS // 2:  # both under way: restart in the middle of turns
            assert time.monotonic() < deadline, "the workers made no progress"
            assert all(worker.poll() is None for worker in workers)
            time.sleep(0.05)
        cluster.restart()
        outcomes = []
        for worker in workers:
            out, err = worker.communicate(timeout=TIMEOUT)
            assert worker.returncode == 0, err
            outcomes.append(json.loads(out.splitlines()[-1]))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.communicate(timeout=TIMEOUT)

    for outcome in outcomes:
        assert outcome["results"] == ["idle"] * SENDS, outcome["results"]
    calls = sum(outcome["calls"] for outcome in outcomes)

    async def check() -> None:
        store = PostgresStore(url)
        try:
            total = 0
            for cid in ids:
                stored = await store.load(cid)
                kinds = [m.kind for m in await store.messages(cid)]
                assert kinds == ["user", "assistant"] * (len(kinds) // 2), kinds
                assert (stored.state.phase.kind, stored.pending) == ("idle", ())
                total += len(kinds) // 2
            assert total == 2 * SENDS  # nothing lost, nothing doubled
            assert calls == total  # 1.00 model calls per reply
        finally:
            await store.close()

    asyncio.run(check())
