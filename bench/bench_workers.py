"""Many worker processes, one database: throughput, CPU per step, latency, and honest work.

Run ``python bench/bench_workers.py [--quick] [--baseline REV] [--store sqlite|postgres|both]``.
Each worker is a process with its own ``Runtime`` (as a web server's workers are), driving its
own conversations concurrently with a model that answers at once (so the store and the runtime
are all that is measured), on one SQLite file or one database of a throwaway PostgreSQL cluster
(``segue.testing.postgres``; ``fsync`` off, alike for both sides of a comparison).

For 1, 2, 4 and 8 workers it prints: committed transitions per second (counted in the database,
not by the workers), worker CPU per committed transition (user + system time of every worker
over the timed window, its store threads included), p50/p99 of a turn (``send()`` to its
return), and model calls per stored reply.

Then the contention run: 8 workers send to the same 4 conversations, each message once, and the
database is checked: model calls per stored reply (target exactly 1.00: nobody performs work
another worker claimed), messages lost or stored twice (target 0), conversations left busy
(target 0).

``--baseline REV`` runs the same workers on the code of git revision ``REV`` of this repository
(exported to a temporary directory and put first on the workers' ``PYTHONPATH``) in the same run,
so the figures compare like with like on a noisy machine; the default is the last commit before
the connection pool and group commits. Targets, judged only with a baseline: PostgreSQL worker
CPU per transition <= 0.4 ms; PostgreSQL throughput with 2 workers >= 2.5x the baseline's with 1;
SQLite throughput with 1 worker and 100 concurrent conversations >= 1.5x the baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
MODEL = "claude-sonnet-4-5"  # 200k window; the instant model's usage stays far below it
DEFAULT_BASELINE = "f416e3d"
"""The last commit before PostgresStore's pool and one-statement commits and SqliteStore's
group commits (what the targets compare against)."""
PG_CPU_TARGET_MS = 0.4
PG_SCALE_TARGET = 2.5
SQLITE_TARGET = 1.5
CONTENTION_WORKERS, CONTENTION_CONVERSATIONS = 8, 4


# --------------------------------------------------------------------------- the worker


class InstantModel:
    """An ``LlmModel`` that answers every request at once, counting the requests."""

    exact_preflight = False

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: Any, **listeners: Any) -> Any:
        # The worker's segue may be the baseline's: its request carries no listener and its
        # runtime passes ``on_text`` as a keyword; its port module has another name.
        on_text = getattr(request, "on_text", None) or listeners.get("on_text")
        from segue import LlmReply, Usage  # noqa: PLC0415

        self.calls += 1
        if on_text is not None:
            on_text("Noted.")
        return LlmReply(text="Noted.", usage=Usage(input_tokens=40, output_tokens=5))

    async def context_window(self, model: str) -> int | None:
        return None

    async def count_tokens(self, request: Any) -> int | None:
        return None


def open_store(where: str) -> Any:
    if where.startswith(("host=", "postgresql://")):
        from segue.executor.stores.postgres import PostgresStore  # noqa: PLC0415

        return PostgresStore(where)
    from segue.executor.stores.sqlite import SqliteStore  # noqa: PLC0415

    return SqliteStore(where)


async def throughput_worker(where: str, conversations: int, seconds: float) -> dict[str, Any]:
    """Create conversations, say ready, wait for ``go`` on stdin, send for ``seconds``."""
    from segue import Runtime  # noqa: PLC0415

    model = InstantModel()
    async with Runtime(store=open_store(where), llm=model) as rt:
        ids = [(await rt.create_conversation(model=MODEL)).id for _ in range(conversations)]
        await asyncio.gather(*(rt.send(cid, "Warm up.") for cid in ids))
        print("ready", flush=True)  # the parent reads it
        await asyncio.to_thread(sys.stdin.readline)
        latencies: list[float] = []
        calls_before = model.calls
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.time()
        deadline = time.monotonic() + seconds

        async def keep_sending(cid: str) -> None:
            n = 0
            while time.monotonic() < deadline:
                began = time.perf_counter()
                await rt.send(cid, f"Message {n}.")
                latencies.append(time.perf_counter() - began)
                n += 1

        await asyncio.gather(*(keep_sending(cid) for cid in ids))
        end = time.time()
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return {
        "start": start,
        "end": end,
        "cpu": cpu,
        "calls": model.calls - calls_before,
        "latencies": latencies,
        "pid": os.getpid(),
    }


async def contention_worker(where: str, ids: list[str], count: int) -> dict[str, Any]:
    """Send ``count`` messages round-robin over ``ids`` (shared with other workers), waiting
    for ``go``; each message's text is unique, so the parent can find it exactly once."""
    from segue import Runtime  # noqa: PLC0415

    model = InstantModel()
    async with Runtime(store=open_store(where), llm=model) as rt:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        results: list[str] = []
        for n in range(count):
            try:
                state = await rt.send(ids[n % len(ids)], f"{os.getpid()}:{n}")
                results.append(state.phase.kind)
            except Exception as error:  # noqa: BLE001  # reported, and counted as lost
                results.append(f"{type(error).__name__}: {error}")
    return {"calls": model.calls, "results": results, "pid": os.getpid()}


async def create_conversations(where: str, count: int) -> list[str]:
    """Create the store (its schema, as this worker's segue writes it) and ``count``
    conversations; their ids."""
    from segue import Runtime  # noqa: PLC0415

    async with Runtime(store=open_store(where), llm=InstantModel()) as rt:
        return [(await rt.create_conversation(model=MODEL)).id for _ in range(count)]


def worker_main(argv: list[str]) -> None:
    job, where, *rest = argv
    result: Any
    if job == "throughput":
        result = asyncio.run(throughput_worker(where, int(rest[0]), float(rest[1])))
    elif job == "contention":
        result = asyncio.run(contention_worker(where, rest[0].split(","), int(rest[1])))
    else:
        result = asyncio.run(create_conversations(where, int(rest[0])))
    print(json.dumps(result), flush=True)


# --------------------------------------------------------------------------- the parent


@dataclass(frozen=True)
class Code:
    """Which segue the workers run: this checkout's, or a revision exported for comparison."""

    label: str
    pythonpath: str | None


def export_revision(revision: str, into: Path) -> Code | None:
    """``git archive`` of ``revision``'s ``src`` into ``into``; None if git cannot."""
    try:
        archive = subprocess.run(  # noqa: S603
            ["git", "-C", str(REPO), "archive", "--format=tar", revision, "src"],  # noqa: S607
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        print(f"baseline {revision}: not available ({error}); comparisons skipped")
        return None
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return Code(label=f"baseline {revision}", pythonpath=str(into / "src"))


def spawn(code: Code, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    if code.pythonpath:
        env["PYTHONPATH"] = code.pythonpath
    return subprocess.Popen(  # noqa: S603  # this script, our interpreter
        [sys.executable, str(HERE), "--worker", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def create(code: Code, where: str, count: int) -> list[str]:
    """Create the store with ``code`` (whose schema it must have) and ``count`` conversations."""
    worker = spawn(code, "create", where, str(count))
    out, err = worker.communicate(timeout=120)
    if worker.returncode != 0:
        raise RuntimeError(f"could not create the store: {err[-2000:]}")
    ids: list[str] = json.loads(out.splitlines()[-1])
    return ids


def run_workers(code: Code, argsets: list[list[str]]) -> list[dict[str, Any]]:
    """Start one worker per argument list, wait until all are ready, start them together."""
    workers = [spawn(code, *args) for args in argsets]
    for worker in workers:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        if line.strip() != "ready":
            _, err = worker.communicate(timeout=60)
            raise RuntimeError(f"a worker did not start: {line!r} {err[-2000:]}")
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    results = []
    for worker in workers:
        out, err = worker.communicate(timeout=600)
        if worker.returncode != 0:
            raise RuntimeError(f"a worker failed: {err[-2000:]}")
        results.append(json.loads(out.splitlines()[-1]))
    return results


class Database:
    """Fresh databases for each run, and what the parent reads back from them."""

    def __init__(self, kind: str, scratch: Path, cluster: Any) -> None:
        self.kind = kind
        self.scratch = scratch
        self.cluster = cluster
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        if self.kind == "sqlite":
            return str(self.scratch / f"bench_{self.count}.db")
        return str(self.cluster.create_database(f"bench_{self.count}"))

    def query(self, where: str, sql: str) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite":
            with sqlite3.connect(where) as conn:
                return conn.execute(sql).fetchall()
        import psycopg  # noqa: PLC0415

        with psycopg.connect(where) as conn:
            return conn.execute(sql.replace("?", "%s")).fetchall()

    def pending(self, where: str) -> int:
        """Conversations with pending work: their outbox (in the conversation's row since
        SQLite schema 5 and PostgreSQL schema 4; a table of its own before, as a baseline
        revision may have it)."""
        try:
            rows = self.query(
                where, "SELECT count(*) FROM conversations WHERE CAST(outbox AS TEXT) <> '[]'"
            )
        except Exception:  # noqa: BLE001  # an older schema, without the column
            rows = self.query(where, "SELECT count(DISTINCT conversation_id) FROM outbox")
        return int(rows[0][0])


@dataclass(frozen=True)
class Throughput:
    rate: float
    cpu_ms: float
    p50_ms: float
    p99_ms: float
    calls_per_reply: float


def throughput(
    db: Database, code: Code, workers: int, conversations: int, seconds: float
) -> Throughput:
    where = db.fresh()
    create(code, where, 0)  # the schema, once, before the workers race to make it
    before = db.query(where, "SELECT count(*) FROM transitions")[0][0]
    results = run_workers(
        code, [["throughput", where, str(conversations), str(seconds)] for _ in range(workers)]
    )
    # Every worker's warm-up committed 2 transitions per conversation before "go".
    committed = db.query(where, "SELECT count(*) FROM transitions")[0][0] - before
    committed -= 2 * workers * conversations
    replies = db.query(where, "SELECT count(*) FROM messages WHERE kind = 'assistant'")[0][0]
    replies -= workers * conversations
    elapsed = max(r["end"] for r in results) - min(r["start"] for r in results)
    latencies = sorted(x for r in results for x in r["latencies"])
    return Throughput(
        rate=committed / elapsed,
        cpu_ms=1000 * sum(r["cpu"] for r in results) / committed,
        p50_ms=1000 * statistics.median(latencies),
        p99_ms=1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        calls_per_reply=sum(r["calls"] for r in results) / replies,
    )


@dataclass(frozen=True)
class Contention:
    calls_per_reply: float
    lost: int
    doubled: int
    errors: int
    busy: int

    @property
    def honest(self) -> bool:
        """One model call per stored reply, nothing lost or doubled, nothing left busy."""
        return self.calls_per_reply == 1.0 and not (self.lost or self.doubled or self.busy)


def contention(db: Database, code: Code, count: int) -> Contention:
    """8 workers, the same 4 conversations, ``count`` messages each."""
    where = db.fresh()
    ids = create(code, where, CONTENTION_CONVERSATIONS)
    results = run_workers(
        code, [["contention", where, ",".join(ids), str(count)] for _ in range(CONTENTION_WORKERS)]
    )
    sent = {f"{r['pid']}:{n}" for r in results for n in range(count)}
    stored: dict[str, int] = {}
    for (text,) in db.query(where, "SELECT message FROM messages WHERE kind = 'user'"):
        key = (json.loads(text) if isinstance(text, str) else text)["text"]  # PG parses json
        stored[key] = stored.get(key, 0) + 1
    replies = db.query(where, "SELECT count(*) FROM messages WHERE kind = 'assistant'")[0][0]
    unsettled = db.query(where, "SELECT count(*) FROM conversations WHERE phase <> 'idle'")[0][0]
    pending = db.pending(where)
    return Contention(
        calls_per_reply=sum(r["calls"] for r in results) / max(replies, 1),
        lost=len(sent - stored.keys()),
        doubled=sum(n - 1 for n in stored.values()),
        errors=sum(result != "idle" for r in results for result in r["results"]),
        busy=unsettled + pending,
    )


# --------------------------------------------------------------------------- the report


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report_store(
    kind: str, codes: list[Code], cluster: Any, scratch: Path, args: argparse.Namespace
) -> dict[tuple[str, int], Throughput]:
    db = Database(kind, scratch, cluster)
    conversations = args.conversations
    print(
        f"{kind}: workers x {conversations} concurrent conversations each, instant model, "
        f"{args.seconds:g} s per run"
    )
    figures: dict[tuple[str, int], Throughput] = {}
    for workers in args.workers:
        for code in codes:
            got = throughput(db, code, workers, conversations, args.seconds)
            figures[code.label, workers] = got
            print(
                f"  {code.label:<18} {workers} worker{'s' if workers > 1 else ' '}: "
                f"{got.rate:8,.0f} transitions/s, CPU {got.cpu_ms:.3f} ms/transition, "
                f"turn p50 {got.p50_ms:.2f} ms p99 {got.p99_ms:.2f} ms, "
                f"{got.calls_per_reply:.2f} calls/reply"
            )
    for code in codes:
        got_c = contention(db, code, args.messages)
        print(
            f"  {code.label:<18} contention ({CONTENTION_WORKERS} workers, "
            f"{CONTENTION_CONVERSATIONS} shared conversations, {args.messages} messages each): "
            f"{got_c.calls_per_reply:.2f} calls/reply, {got_c.lost} lost, "
            f"{got_c.doubled} stored twice, {got_c.errors} errors, {got_c.busy} left busy "
            f"{verdict(got_c.honest)}"
        )
    return figures


def targets(figures: dict[str, dict[tuple[str, int], Throughput]], baseline: str | None) -> None:
    now = "this checkout"
    postgres = figures.get("postgres", {})
    sqlite = figures.get("sqlite", {})
    judged = [postgres[now, n].cpu_ms for n in (1, 2) if (now, n) in postgres]
    if judged:
        # Judged where the workers do not outnumber the cores: beyond that, each worker's CPU
        # time also counts the switching between processes the machine is short of.
        cpu = max(judged)
        print(
            f"PostgreSQL CPU per transition with 1 and 2 workers (the worse): {cpu:.3f} ms "
            f"(target <= {PG_CPU_TARGET_MS}) {verdict(cpu <= PG_CPU_TARGET_MS)}"
        )
    if baseline is None:
        print("No baseline: throughput ratios not judged (run with --baseline REV)")
        return
    if (now, 2) in postgres and (baseline, 1) in postgres:
        ratio = postgres[now, 2].rate / postgres[baseline, 1].rate
        print(
            f"PostgreSQL 2 workers / {baseline} with 1: {ratio:.2f}x "
            f"(target >= {PG_SCALE_TARGET}x) {verdict(ratio >= PG_SCALE_TARGET)}"
        )
    if (now, 1) in sqlite and (baseline, 1) in sqlite:
        ratio = sqlite[now, 1].rate / sqlite[baseline, 1].rate
        print(
            f"SQLite 1 worker / {baseline} with 1: {ratio:.2f}x "
            f"(target >= {SQLITE_TARGET}x) {verdict(ratio >= SQLITE_TARGET)}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 and 2 workers, short runs")
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument(
        "--baseline",
        default=None,
        help=f"git revision to compare against ('none' for no comparison; default "
        f"{DEFAULT_BASELINE}, or none with --quick)",
    )
    parser.add_argument("--conversations", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--messages", type=int, default=None)
    args = parser.parse_args()
    args.workers = [1, 2] if args.quick else [1, 2, 4, 8]
    args.conversations = args.conversations or (20 if args.quick else 100)
    args.seconds = args.seconds or (0.5 if args.quick else 3.0)
    args.messages = args.messages or (3 if args.quick else 10)
    revision = args.baseline or ("none" if args.quick else DEFAULT_BASELINE)

    from segue.testing.postgres import ThrowawayCluster, find_server_binaries  # noqa: PLC0415

    kinds = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    if "postgres" in kinds and find_server_binaries() is None:
        print("PostgreSQL server binaries not found: the PostgreSQL runs are skipped")
        kinds.remove("postgres")
    with tempfile.TemporaryDirectory(prefix="segue-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        codes = [Code(label="this checkout", pythonpath=None)]
        baseline = None
        if revision != "none":
            exported = export_revision(revision, scratch / "baseline")
            if exported is not None:
                codes.insert(0, exported)
                baseline = exported.label
        figures: dict[str, dict[tuple[str, int], Throughput]] = {}
        cluster = ThrowawayCluster().start() if "postgres" in kinds else None
        try:
            for kind in kinds:
                figures[kind] = report_store(kind, codes, cluster, scratch, args)
        finally:
            if cluster is not None:
                cluster.stop()
        targets(figures, baseline)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
    else:
        sys.exit(main())
