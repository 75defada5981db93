"""Whether a conversation's age costs anything: 30 compactions of one conversation.

Run ``python bench/bench_generations.py [--quick] [--store sqlite|postgres|both]``. One
``COMPACT_IN_PLACE`` conversation talks to the scripted model (a window small enough to compact
every dozen turns) through a real ``Runtime`` on a real store, with an archive directory, until
it has compacted ``COMPACTIONS`` times. Reported per store:

- the compacting turn's time (the send that compacted, archive included) at the first
  compactions and at the last (the best of the first five and of the last five, which filters
  out a shared machine's pauses on both sides alike); target: the last within 1.2x of the
  first;
- traced memory (``tracemalloc``, after a collection) at the third compaction and at the last;
  target: grown by less than 100 KB;
- transcript rows the store read per compaction, first and last (not a timing: the same on any
  machine); it must not grow.

Prints PASS/FAIL per target and exits 1 if any target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from segue import (
    ContextExhaustionBehavior,
    PostgresStore,
    Runtime,
    ScriptedModel,
    SqliteStore,
    Store,
)
from segue.executor.store_port import StoredMessage
from segue.testing.postgres import ThrowawayCluster

COMPACTIONS = 30
TIME_TARGET = 1.2
MEMORY_TARGET = 100_000
WINDOW = 6_000


class Counted:
    """The store, counting the transcript rows it hands out (delegating everything else)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.rows = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def messages(
        self, conversation_id: str, *, after_seq: int = 0, before_seq: int | None = None
    ) -> list[StoredMessage]:
        bounds = {} if before_seq is None else {"before_seq": before_seq}  # as older stores
        read = await self.store.messages(conversation_id, after_seq=after_seq, **bounds)
        self.rows += len(read)
        return read


class Forgetful(ScriptedModel):
    """The scripted model, keeping no record of its requests (it would grow with them)."""

    async def complete(self, request):  # type: ignore[no-untyped-def]  # ScriptedModel's
        try:
            return await super().complete(request)
        finally:
            self.requests.clear()
            self.counted.clear()


async def compactions(
    make: Callable[[], Store], archive: Path, count: int
) -> dict[str, list[float]]:
    """Talk until ``count`` compactions: each compacting send's seconds, traced memory and
    transcript rows read."""
    counted = Counted(make())
    found: dict[str, list[float]] = {"seconds": [], "memory": [], "rows": []}
    runtime = Runtime(store=counted, llm=Forgetful(window=WINDOW), archive_dir=archive)  # type: ignore[arg-type]
    async with runtime:
        conversation = await runtime.create_conversation(
            model="claude-sonnet-4-5",
            behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE,
            context_window=WINDOW,
            max_continuations=10_000,
        )
        generation, turn = 1, 0
        while len(found["seconds"]) < count:
            turn += 1
            rows = counted.rows
            started = time.perf_counter()
            state = await runtime.send(conversation.id, f"Turn {turn}: tell me about tides. " * 8)
            took = time.perf_counter() - started
            if state.generation == generation:
                continue
            generation = state.generation
            gc.collect()
            found["seconds"].append(took)
            found["memory"].append(float(tracemalloc.get_traced_memory()[0]))
            found["rows"].append(float(counted.rows - rows))
    return found


@asynccontextmanager
async def stores(which: str, tmp: Path) -> AsyncIterator[list[tuple[str, Callable[[], Store]]]]:
    """The stores to measure: SQLite files in ``tmp``, a throwaway PostgreSQL cluster."""
    made: list[tuple[str, Callable[[], Store]]] = []
    counter = iter(range(1_000))
    if which in ("sqlite", "both"):
        made.append(("SqliteStore", lambda: SqliteStore(tmp / f"bench-{next(counter)}.db")))
    if which in ("postgres", "both"):
        with ThrowawayCluster() as cluster:
            made.append(
                (
                    "PostgresStore",
                    lambda: PostgresStore(cluster.create_database(f"bench{next(counter)}")),
                )
            )
            yield made
        return
    yield made


async def main(quick: bool, which: str) -> int:
    count = 12 if quick else COMPACTIONS
    failures = 0
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    print(f"load average {load:.2f} on {cpus} CPUs; {count} compactions of one conversation")
    with tempfile.TemporaryDirectory() as tmp:
        async with stores(which, Path(tmp)) as made:
            for name, make in made:
                tracemalloc.start()
                try:
                    found = await compactions(make, Path(tmp) / f"archive-{name}", count)
                finally:
                    tracemalloc.stop()
                seconds, memory, rows = found["seconds"], found["memory"], found["rows"]
                first, last = min(seconds[:5]), min(seconds[-5:])
                ratio = last / first
                ok = ratio <= TIME_TARGET
                failures += not ok
                print(
                    f"{name} compacting turn: {first * 1e3:,.2f} ms at the first compactions, "
                    f"{last * 1e3:,.2f} ms at the last: {ratio:.2f}x "
                    f"(target <= {TIME_TARGET}x) {'PASS' if ok else 'FAIL'}"
                )
                grown = memory[-1] - memory[2]
                ok = grown < MEMORY_TARGET
                failures += not ok
                print(
                    f"{name} traced memory from compaction 3 to {count}: {grown / 1e3:+,.1f} KB "
                    f"(target < {MEMORY_TARGET / 1e3:,.0f} KB) {'PASS' if ok else 'FAIL'}"
                )
                print(
                    f"{name} transcript rows read per compaction: {rows[0]:,.0f} at the first, "
                    f"{rows[-1]:,.0f} at the last"
                )
    return 1 if failures else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer compactions (smoke run)")
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    arguments = parser.parse_args()
    sys.exit(asyncio.run(main(arguments.quick, arguments.store)))
