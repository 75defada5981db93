"""segue against LangGraph: what a persisted step costs, on SQLite and on PostgreSQL.

Run ``python bench/bench_langgraph.py [--quick]``. LangGraph is an optional extra for this
benchmark only: ``pip install -e ".[bench]"``. Without it, segue's side runs alone and the report
says how to install the other. ``bench/sides.py`` says what a turn and a persisted step are on
each side (a turn: a message in, an instant model's answer out, both durable; two persisted
steps). Every comparison runs both sides in the same run, round by round, alternating which goes
first, so a busy machine weighs on both alike:

- SQLite, one conversation: microseconds per persisted step, turns 10 to 40 of a new
  conversation in every round (LangGraph's cost grows with the conversation, so both are timed
  early), the sides taking turns five turns at a time within the round. Targets: the median of
  the rounds' ratios >= 10x, every round >= 7x.
- SQLite, 100 conversations at once in one process: persisted steps per second, each round
  running the sides A, B, A. Target >= 15x.
- PostgreSQL (a throwaway cluster, ``segue.testing.postgres``), one conversation, as for SQLite.
  Target >= 6x.
- PostgreSQL, 1, 2, 4 and 8 worker processes, each with its own conversations, all sending at
  once: persisted steps per second over all workers. Target >= 4x at every count. Beside it, for
  information, the CPU a step took in the workers and in the server: a shared machine slows
  both sides down, but changes that less than it changes throughput.
- Growth: segue's cost per persisted step late in a conversation of 3,000 turns against early in
  a new one, batches of the two alternating (median of the batches), on both stores, with no
  VACUUM or other maintenance. Target <= 1.2x. LangGraph's growth is printed for information over
  a shorter conversation (``--langgraph-growth``): its checkpoints hold the whole conversation.

A script that prints a report: it exits 0 whatever the timings say (``--quick``, for the smoke
test, is too small to judge by).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sides import (
    INSTALL,
    LangGraphSide,
    SegueSide,
    Side,
    langgraph_missing,
    langgraph_versions,
    sqlite_sides,
)

HERE = Path(__file__).resolve()
ONE_TARGET, ONE_FLOOR, CONCURRENT_TARGET = 10.0, 7.0, 15.0
PG_ONE_TARGET, PG_WORKERS_TARGET = 6.0, 4.0
GROWTH_TARGET = 1.2
STEPS_PER_TURN = 2
CHUNK = 5
"""Turns timed on one side before the other side's turn, in a round of one conversation."""


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much each measurement does (``--quick`` shrinks everything)."""

    rounds: int
    warm: int
    timed: int
    concurrent: int
    concurrent_turns: int
    workers: tuple[int, ...]
    worker_conversations: int
    seconds: float
    growth: int
    growth_batches: int
    growth_batch: int
    langgraph_growth: int
    pool: int = 4
    """Connections per worker process, on both sides (``PostgresStore``'s default)."""


FULL = Sizes(
    rounds=7,
    warm=10,
    timed=30,
    concurrent=100,
    concurrent_turns=5,
    workers=(1, 2, 4, 8),
    worker_conversations=20,
    seconds=3.0,
    growth=3_000,
    growth_batches=9,
    growth_batch=10,
    langgraph_growth=300,
)
QUICK = Sizes(
    rounds=2,
    warm=3,
    timed=5,
    concurrent=10,
    concurrent_turns=2,
    workers=(1, 2),
    worker_conversations=4,
    seconds=0.5,
    growth=60,
    growth_batches=3,
    growth_batch=3,
    langgraph_growth=0,
)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} us"


@contextlib.asynccontextmanager
async def opened(sides: list[Side]) -> Any:
    for side in sides:
        await side.open()
    try:
        yield sides
    finally:
        for side in sides:
            await side.close()


def in_turn(rounds: int, sides: list[Side]) -> Iterator[tuple[int, list[Side]]]:
    """Each round's sides, the first one alternating from round to round."""
    for number in range(rounds):
        yield number, sides if number % 2 == 0 else sides[::-1]


async def timed(
    work: Callable[[], Awaitable[None]], warm: Callable[[], Awaitable[None]] | None = None
) -> float:
    """Seconds ``work`` took, after a full garbage collection (the other side's garbage is not
    collected on this side's time) and ``warm``, untimed. The collection walks every object
    and leaves the caches cold: the steps right after it cost more, for about the same time on
    both sides, so mostly on the side whose steps are short (measured on the reference
    machine: a 5-turn chunk of segue's cost 35% more per step, one of LangGraph's no more than
    the noise between runs). ``warm`` brings them back first (one turn of a conversation not
    being timed)."""
    gc.collect()
    if warm is not None:
        await warm()
    start = time.perf_counter()
    await work()
    return time.perf_counter() - start


# --------------------------------------------------------------------------- measurements


async def one_conversation(sides: list[Side], sizes: Sizes) -> dict[str, list[float]]:
    """Seconds per persisted step, per side, one figure per round. A round starts a new
    conversation on each side, then times its turns in chunks of ``CHUNK``, the sides taking
    turns chunk by chunk: a pause of the machine lands on both sides alike. Before each chunk,
    one untimed turn of another conversation of that side (see ``timed``)."""
    figures: dict[str, list[float]] = {side.name: [] for side in sides}
    scratch = {side.name: await side.conversation() for side in sides}
    for _, order in in_turn(sizes.rounds, sides):
        ids = {}
        for side in order:
            ids[side.name] = cid = await side.conversation()
            for n in range(sizes.warm):
                await side.turn(cid, f"Warm-up message {n}.")
        spent = dict.fromkeys(ids, 0.0)
        for chunk in range(0, sizes.timed, CHUNK):
            for side in order:

                async def talk(
                    side: Side = side, cid: str = ids[side.name], first: int = chunk
                ) -> None:
                    for n in range(first, min(first + CHUNK, sizes.timed)):
                        await side.turn(cid, f"Message {n}.")

                async def warm(side: Side = side) -> None:
                    await side.turn(scratch[side.name], "Warm-up.")

                spent[side.name] += await timed(talk, warm)
        for name, seconds in spent.items():
            figures[name].append(seconds / (sizes.timed * STEPS_PER_TURN))
    return figures


async def at_once(sides: list[Side], sizes: Sizes) -> dict[str, list[float]]:
    """Persisted steps per second with ``sizes.concurrent`` conversations sending at once. A
    round runs the sides A, B, A (which is A alternating from round to round), A's figure
    from both of its runs: a pause of the machine lands on both sides alike."""
    figures: dict[str, list[float]] = {side.name: [] for side in sides}
    for _, order in in_turn(sizes.rounds, sides):
        steps = dict.fromkeys(figures, 0)
        spent = dict.fromkeys(figures, 0.0)
        for side in [*order, *order[:1]] if len(order) > 1 else order:
            ids = [await side.conversation() for _ in range(sizes.concurrent)]
            await asyncio.gather(*(side.turn(cid, "Warm up.") for cid in ids))

            async def talk(side: Side = side, ids: list[str] = ids) -> None:
                async def one(cid: str) -> None:
                    for n in range(sizes.concurrent_turns):
                        await side.turn(cid, f"Message {n}.")

                await asyncio.gather(*(one(cid) for cid in ids))

            spent[side.name] += await timed(talk)
            steps[side.name] += len(ids) * sizes.concurrent_turns * STEPS_PER_TURN
        for name, rates in figures.items():
            rates.append(steps[name] / spent[name])
    return figures


async def growth(side: Side, length: int, sizes: Sizes) -> tuple[float, float]:
    """Median seconds per persisted step early in a new conversation and late in one of
    ``length`` turns, batches of the two alternating."""
    long = await side.conversation()
    for n in range(length):
        await side.turn(long, f"Message {n}.")
    early: list[float] = []
    late: list[float] = []
    batch = sizes.growth_batch
    for number in range(sizes.growth_batches * 2):
        if number % 2 == 0:
            cid = await side.conversation()
            for n in range(10):  # "early" starts at turn 10, as the one-conversation rounds
                await side.turn(cid, f"Warm-up message {n}.")
        else:
            cid = long

        async def talk(cid: str = cid) -> None:
            for n in range(batch):
                await side.turn(cid, f"Timed message {n}.")

        per_step = await timed(talk) / (batch * STEPS_PER_TURN)
        (early if number % 2 == 0 else late).append(per_step)
    return statistics.median(early), statistics.median(late)


# --------------------------------------------------------------------------- workers


async def worker(
    kind: str, where: str, conversations: int, seconds: float, pool: int
) -> dict[str, Any]:
    """One worker process: open a side, start its conversations, say ready, wait for ``go``,
    then turn every conversation over and over for ``seconds``."""
    side: Side = (
        SegueSide(where, pool_size=pool)
        if kind == "segue"
        else LangGraphSide("postgres-async", where, pool_size=pool, setup=False)
    )
    await side.open()
    try:
        ids = [await side.conversation() for _ in range(conversations)]
        await asyncio.gather(*(side.turn(cid, "Warm up.") for cid in ids))
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        turns = 0
        start = time.time()
        cpu = time.process_time()  # every thread of the process (LangGraph writes in threads)
        deadline = time.monotonic() + seconds

        async def keep_sending(cid: str) -> None:
            nonlocal turns
            n = 0
            while time.monotonic() < deadline:
                await side.turn(cid, f"Message {n}.")
                turns += 1
                n += 1

        await asyncio.gather(*(keep_sending(cid) for cid in ids))
        end = time.time()
        return {"start": start, "end": end, "turns": turns, "cpu": time.process_time() - cpu}
    finally:
        await side.close()


@dataclass(frozen=True, slots=True)
class Throughput:
    """What a run of worker processes did: persisted steps per second, and the CPU each step
    took in the workers and in the database server (which a busy machine does not change much:
    with the machine to themselves, both sides would be held back by the CPU)."""

    rate: float
    client_cpu: float
    server_cpu: float


def server_cpu(cluster: Any) -> float:
    """CPU seconds the cluster's server processes have used: its postmaster, with the children
    that ended (a backend whose client went away), and its live children (``/proc``; 0 where
    there is none). Other clusters on the machine (other test runs) are not counted."""
    try:
        pid = int((cluster.base / "data" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            data = stat.read_text(encoding="ascii", errors="replace")
        except OSError:
            continue  # it ended meanwhile
        fields = data.rpartition(")")[2].split()
        if stat.parent.name == str(pid):
            total += sum(int(field) for field in fields[11:15])  # utime, stime, cutime, cstime
        elif fields[1] == str(pid):  # a child of the postmaster
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def run_workers(kind: str, where: str, count: int, sizes: Sizes, cluster: Any) -> Throughput:
    """``count`` worker processes of ``kind`` on ``where``, sending at once."""
    args = [str(HERE), "--worker", kind, where, str(sizes.worker_conversations)]
    processes = [
        subprocess.Popen(  # noqa: S603  # this script, our interpreter
            [sys.executable, *args, str(sizes.seconds), str(sizes.pool)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    for process in processes:
        assert process.stdout is not None
        line = process.stdout.readline()
        if line.strip() != "ready":
            _, err = process.communicate(timeout=60)
            raise RuntimeError(f"a {kind} worker did not start: {line!r} {err[-2000:]}")
    server_before = server_cpu(cluster)
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    results = []
    for process in processes:
        out, err = process.communicate(timeout=600)
        if process.returncode != 0:
            raise RuntimeError(f"a {kind} worker failed: {err[-2000:]}")
        results.append(json.loads(out.splitlines()[-1]))
    server = server_cpu(cluster) - server_before  # the workers' closing too, a little
    elapsed: float = max(r["end"] for r in results) - min(r["start"] for r in results)
    steps: int = sum(r["turns"] for r in results) * STEPS_PER_TURN
    client: float = sum(r["cpu"] for r in results)
    return Throughput(rate=steps / elapsed, client_cpu=client / steps, server_cpu=server / steps)


# --------------------------------------------------------------------------- the report


def compare(
    title: str, figures: dict[str, list[float]], *, higher: bool, target: float, floor: float = 0
) -> None:
    """Print each round and the median; ratios (LangGraph / segue per step, or segue /
    LangGraph per second) when both sides ran."""
    unit = "steps/s" if higher else "us per persisted step"
    print(title)

    def shown(value: float) -> str:
        return f"{value:,.0f} steps/s" if higher else us(value)

    ours = figures["segue"]
    theirs = figures.get("LangGraph")
    ratios = []
    for number, mine in enumerate(ours):
        line = f"  round {number + 1}: segue {shown(mine)}"
        if theirs is not None:
            ratio = mine / theirs[number] if higher else theirs[number] / mine
            ratios.append(ratio)
            line += f", LangGraph {shown(theirs[number])}: {ratio:.1f}x"
        print(line)
    summary = f"  median ({unit}): segue {shown(statistics.median(ours))}"
    if theirs is None:
        print(summary)
        return
    ratio = statistics.median(ratios)
    summary += (
        f", LangGraph {shown(statistics.median(theirs))}: {ratio:.1f}x "
        f"(target >= {target:g}x) {verdict(ratio >= target)}"
    )
    print(summary)
    if floor:
        low = min(ratios)
        print(f"  lowest round: {low:.1f}x (target >= {floor:g}x) {verdict(low >= floor)}")


def cpu_ms(figures: Throughput) -> str:
    both = figures.client_cpu + figures.server_cpu
    return f"{both * 1e3:.2f} ms ({figures.client_cpu * 1e3:.2f} + {figures.server_cpu * 1e3:.2f})"


def growth_line(
    store: str, name: str, figures: tuple[float, float], length: int, sizes: Sizes, *, target: bool
) -> None:
    early, late = figures
    ratio = late / early
    judged = f"(target <= {GROWTH_TARGET}x) {verdict(ratio <= GROWTH_TARGET)}"
    early_turns = f"10-{10 + sizes.growth_batch}"
    print(
        f"  {store} {name}: {us(early)} per step at turns {early_turns}, {us(late)} at turn "
        f"{length:,}: {ratio:.2f}x " + (judged if target else "(for information)")
    )


async def sqlite_part(scratch: Path, sizes: Sizes) -> None:
    async with opened(sqlite_sides(scratch, "one", concurrent=False)) as sides:
        figures = await one_conversation(sides, sizes)
    compare(
        f"SQLite, one conversation (turns {sizes.warm}-{sizes.warm + sizes.timed}, "
        f"{sizes.rounds} rounds):",
        figures,
        higher=False,
        target=ONE_TARGET,
        floor=ONE_FLOOR,
    )
    async with opened(sqlite_sides(scratch, "many", concurrent=True)) as sides:
        figures = await at_once(sides, sizes)
    compare(
        f"SQLite, {sizes.concurrent} conversations at once ({sizes.concurrent_turns} turns each, "
        f"{sizes.rounds} rounds):",
        figures,
        higher=True,
        target=CONCURRENT_TARGET,
    )


async def postgres_part(cluster: Any, sizes: Sizes) -> None:
    segue_db = cluster.create_database("segue_one")
    sides: list[Side] = [SegueSide(segue_db)]
    if langgraph_missing() is None:
        sides.append(LangGraphSide("postgres", cluster.create_database("langgraph_one")))
    async with opened(sides):
        figures = await one_conversation(sides, sizes)
    compare(
        f"PostgreSQL, one conversation (turns {sizes.warm}-{sizes.warm + sizes.timed}, "
        f"{sizes.rounds} rounds):",
        figures,
        higher=False,
        target=PG_ONE_TARGET,
    )
    kinds = ["segue"] + (["langgraph"] if langgraph_missing() is None else [])
    print(
        f"PostgreSQL, worker processes x {sizes.worker_conversations} conversations each, "
        f"{sizes.pool} connections each, {sizes.seconds:g} s per run:"
    )
    for count in sizes.workers:
        rates: dict[str, Throughput] = {}
        order = kinds if count % 2 else kinds[::-1]
        for kind in order:
            where = cluster.create_database(f"{kind}_workers_{count}")
            # The tables, once, before the workers start together.
            async with opened(
                [SegueSide(where) if kind == "segue" else LangGraphSide("postgres-async", where)]
            ):
                pass
            rates[kind] = await asyncio.to_thread(run_workers, kind, where, count, sizes, cluster)
        label = f"{count} worker{'s' if count > 1 else ' '}"
        ours = rates["segue"]
        line = f"  {label}: segue {ours.rate:,.0f} steps/s"
        if "langgraph" in rates:
            theirs = rates["langgraph"]
            ratio = ours.rate / theirs.rate
            line += (
                f", LangGraph {theirs.rate:,.0f} steps/s: {ratio:.1f}x "
                f"(target >= {PG_WORKERS_TARGET:g}x) {verdict(ratio >= PG_WORKERS_TARGET)}"
            )
        print(line)
        cpu = f"    CPU per step (workers + server): segue {cpu_ms(ours)}"
        if "langgraph" in rates:
            theirs = rates["langgraph"]
            mine, other = ours.client_cpu + ours.server_cpu, theirs.client_cpu + theirs.server_cpu
            cpu += f", LangGraph {cpu_ms(theirs)}: {other / mine:.1f}x"
        print(cpu)


async def growth_part(scratch: Path, cluster: Any, sizes: Sizes) -> None:
    print(
        f"Growth, one conversation (median of {sizes.growth_batches} batches of "
        f"{sizes.growth_batch} turns at each end, alternating):"
    )
    stores: list[tuple[str, str]] = [("SQLite", str(scratch / "segue-growth.db"))]
    if cluster is not None:
        stores.append(("PostgreSQL", cluster.create_database("segue_growth")))
    for store, where in stores:
        async with opened([SegueSide(where)]) as (side,):
            figures = await growth(side, sizes.growth, sizes)
        growth_line(store, "segue", figures, sizes.growth, sizes, target=True)
    if sizes.langgraph_growth and langgraph_missing() is None:
        lg_stores: list[tuple[str, Side]] = [
            ("SQLite", LangGraphSide("sqlite", str(scratch / "langgraph-growth.db")))
        ]
        if cluster is not None:
            db = cluster.create_database("langgraph_growth")
            lg_stores.append(("PostgreSQL", LangGraphSide("postgres", db)))
        for store, lg in lg_stores:
            async with opened([lg]):
                figures = await growth(lg, sizes.langgraph_growth, sizes)
            growth_line(store, "LangGraph", figures, sizes.langgraph_growth, sizes, target=False)


async def main(sizes: Sizes, store: str) -> int:
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    busy = ": the machine is busy, timings are pessimistic" if load > cpus * 0.75 else ""
    print(f"load average {load:.2f} on {cpus} CPUs{busy}")
    missing = langgraph_missing()
    if missing is None:
        print(f"LangGraph: {langgraph_versions()}")
    else:
        print(
            f"LangGraph is not installed ({missing}): only segue's side is measured. "
            f"Install it with: {INSTALL}"
        )
    from segue.testing.postgres import ThrowawayCluster, find_server_binaries  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="segue-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        if store in ("sqlite", "both"):
            await sqlite_part(scratch, sizes)
        cluster = None
        if store in ("postgres", "both"):
            if find_server_binaries() is None:
                print("PostgreSQL server binaries not found: the PostgreSQL runs are skipped")
            else:
                cluster = ThrowawayCluster().start()
        try:
            if cluster is not None:
                await postgres_part(cluster, sizes)
            await growth_part(scratch, cluster, sizes)
        finally:
            if cluster is not None:
                cluster.stop()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kind, where, conversations, seconds, pool = sys.argv[2:7]
        result = asyncio.run(worker(kind, where, int(conversations), float(seconds), int(pool)))
        print(json.dumps(result), flush=True)
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the smoke test)")
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rounds", type=int, help="rounds of each comparison")
    parser.add_argument("--growth", type=int, help="turns of segue's long conversation")
    parser.add_argument(
        "--langgraph-growth", type=int, help="turns of LangGraph's long conversation (0: skip)"
    )
    parser.add_argument("--pool", type=int, help="connections per worker process, both sides")
    args = parser.parse_args()
    chosen = QUICK if args.quick else FULL
    overrides = {
        name: value
        for name, value in (
            ("rounds", args.rounds),
            ("growth", args.growth),
            ("langgraph_growth", args.langgraph_growth),
            ("pool", args.pool),
        )
        if value is not None
    }
    chosen = dataclasses.replace(chosen, **overrides)
    sys.exit(asyncio.run(main(chosen, args.store)))
