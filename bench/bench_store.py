"""Store benchmarks: committed transitions per second, and whether a commit's cost grows.

Run ``python bench/bench_store.py [--quick]``. Every commit is what the executor commits: a real
``transition()`` of a four-step tool turn (user -> LLM asks for a tool -> tool result -> LLM
answers), with each response completing the request it answers.

- Throughput: committed transitions per second on ``SqliteStore`` (a real file in a temporary
  directory, WAL, ``synchronous=NORMAL``); target >= 3,000/s.
- Growth: the mean cost of a commit with 10 messages in the transcript and with 10,000, for
  both stores; target: within 1.5x (append-only storage, so it should not grow at all).

Timings come in batches: throughput is judged on the median batch (best also shown), growth on
the best batch at each size, which filters out a shared machine's pauses on both sides alike.
Prints PASS/FAIL per target and exits 1 if any target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from segue import LlmResponse, ToolCall, ToolResult, Usage, UserMessage, new_conversation
from segue import transition as core_transition
from segue.executor.store_port import Commit, Store, StoredConversation
from segue.executor.stores.codec import dump_event
from segue.executor.stores.memory import MemoryStore
from segue.executor.stores.sqlite import SqliteStore

THROUGHPUT_TARGET = 3_000.0
GROWTH_TARGET = 1.5
SMALL, LARGE = 10, 10_000
CALL = ToolCall(id="call_1", name="read_file", input={"path": "README.md"})
TURN: tuple[Any, ...] = (
    UserMessage(text="What does the README say about stores?"),
    LlmResponse(text="Let me read it.", tool_calls=(CALL,), usage=Usage(input_tokens=2_000)),
    ToolResult(tool_call_id=CALL.id, output="segue keeps conversations in SQLite. " * 20),
    LlmResponse(text="It says they live in SQLite.", usage=Usage(input_tokens=2_300)),
)


class Driver:
    """Feeds the turn's events to the core and commits each step, like the executor does."""

    def __init__(self, store: Store, conversation_id: str) -> None:
        self.store = store
        self.conversation_id = conversation_id
        self.stored: StoredConversation | None = None
        self.commits = 0

    async def start(self) -> None:
        state = new_conversation(model="claude-sonnet-4-5", conversation_id=self.conversation_id)
        self.stored = await self.store.create(state, system="You are terse.", at=time.time())

    async def turn(self) -> None:
        for event in TURN:
            stored = self.stored
            assert stored is not None
            state, effects = core_transition(stored.state, event)
            self.stored = await self.store.commit(
                Commit(
                    conversation_id=self.conversation_id,
                    expected_version=stored.version,
                    state=state,
                    event_kind=event.kind,
                    event_json=dump_event(event),
                    from_phase=stored.state.phase.kind,
                    reason=event.kind,
                    effects=effects,
                    completes=tuple(p.id for p in stored.pending),
                    at=time.time(),
                )
            )
            self.commits += 1

    async def grow_to(self, messages: int) -> None:
        """Run turns until the transcript holds ``messages`` (one message per commit)."""
        while self.commits < messages:
            await self.turn()

    async def per_commit(self, turns: int, batches: int) -> float:
        """Best mean seconds per commit over ``batches`` batches of ``turns`` turns."""
        best = float("inf")
        for _ in range(batches):
            gc.collect()  # start each batch from a collected heap, at either size alike
            start = time.perf_counter()
            for _ in range(turns):
                await self.turn()
            best = min(best, (time.perf_counter() - start) / (turns * len(TURN)))
        return best


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


async def throughput(make: Callable[[], Store], turns: int, batches: int) -> tuple[float, float]:
    """Committed transitions per second over many short conversations (a busy server): the
    median and the best of ``batches`` batches (the median is what the target is judged on)."""
    store = make()
    try:
        drivers = [Driver(store, f"t{index}") for index in range(10)]
        for driver in drivers:
            await driver.start()
            await driver.turn()  # warm the statement cache and the pages
        rates: list[float] = []
        for _ in range(batches):
            gc.collect()
            start = time.perf_counter()
            for _ in range(turns):
                for driver in drivers:
                    await driver.turn()
            rates.append(turns * len(drivers) * len(TURN) / (time.perf_counter() - start))
        return statistics.median(rates), max(rates)
    finally:
        await store.close()


async def growth(make: Callable[[], Store], turns: int, batches: int) -> tuple[float, float]:
    """Seconds per commit with ~SMALL and with ~LARGE messages in the transcript."""
    store = make()
    try:
        driver = Driver(store, "long")
        await driver.start()
        await driver.grow_to(SMALL)
        small = await driver.per_commit(turns, batches)
        await driver.grow_to(LARGE)
        large = await driver.per_commit(turns, batches)
        messages = len(await store.messages("long"))
        assert messages >= LARGE, messages
        return small, large
    finally:
        await store.close()


async def main(quick: bool) -> int:
    turns, batches = (25, 9) if quick else (100, 15)
    failures = 0
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    print(
        f"load average {load:.2f} on {cpus} CPUs"
        + (": the machine is busy, timings are pessimistic" if load > cpus * 0.75 else "")
    )
    with tempfile.TemporaryDirectory() as tmp:
        counter = iter(range(1_000))

        def sqlite() -> Store:
            return SqliteStore(Path(tmp) / f"bench-{next(counter)}.db")

        rate, best = await throughput(sqlite, turns, batches)
        ok = rate >= THROUGHPUT_TARGET
        failures += not ok
        print(
            f"SqliteStore throughput: {rate:,.0f} committed transitions/s median, {best:,.0f} best "
            f"of {batches} batches (target >= {THROUGHPUT_TARGET:,.0f}) {verdict(ok)}"
        )
        rate, best = await throughput(MemoryStore, turns * 10, batches)
        print(
            f"MemoryStore throughput: {rate:,.0f} committed transitions/s median, {best:,.0f} best "
            "(no target: the bench's own transition() and encoding dominate)"
        )

        for name, make in (("MemoryStore", MemoryStore), ("SqliteStore", sqlite)):
            small, large = await growth(make, turns, batches)
            ratio = large / small
            ok = ratio <= GROWTH_TARGET
            failures += not ok
            print(
                f"{name} per commit: {small * 1e6:,.1f} us at {SMALL} messages, "
                f"{large * 1e6:,.1f} us at {LARGE:,} messages: {ratio:.2f}x "
                f"(target <= {GROWTH_TARGET}x) {verdict(ok)}"
            )
    return 1 if failures else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (CI smoke run)")
    sys.exit(asyncio.run(main(parser.parse_args().quick)))
