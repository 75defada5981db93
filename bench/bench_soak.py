"""A soak: many persisted steps, many conversations, a worker killed every few seconds.

Run ``python bench/bench_soak.py [--quick] [--steps N] [--conversations N] [--kill-every S]``.
Two worker processes share one SQLite file, each driving its own half of the conversations
(``COMPACT_IN_PLACE`` with a small window, so they compact as they go), a message at a time with
an idempotency key per planned message:

- the **steady** worker runs to the end; its resident memory and open files are sampled every
  half second;
- the **victim** is killed with SIGKILL every few seconds and started again; each time it
  recovers what the last one left pending and goes on with its plan where the store says it
  stopped.

At the end the database is read: every planned message is stored exactly once (nothing lost,
nothing doubled), every conversation waits for input again, and the model's own log of the calls
it answered gives the model calls per stored reply. Targets (issue: long lives, nothing lost,
nothing grows): resident memory of the steady worker flat after warm-up (within 20 MB), its open
files flat, nothing lost, 1.00 model calls per reply.

A script that prints a report: it exits 0 whatever the figures say, except when a worker fails
in a way the soak did not cause (a traceback), which it prints.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
MODEL = "claude-sonnet-4-5"
WINDOW = 4_000
"""Small, so a conversation compacts every few dozen turns."""
KILLED = -signal.SIGKILL


# --------------------------------------------------------------------------- the worker


async def work(db: str, calls_log: str, ids: list[str], until: float, seed: int) -> None:
    """Send the planned messages of ``ids`` (message ``n`` of a conversation has key ``n``),
    picking conversations at random, until ``until`` (a wall-clock time) or every plan is done."""
    from segue import ContextExhaustionBehavior, Runtime, ScriptedModel, SqliteStore  # noqa: PLC0415
    from segue.executor.model_port import LlmReply, LlmRequest  # noqa: PLC0415

    class Logged(ScriptedModel):
        """The scripted model, logging each call it answered (a line, appended at once)."""

        async def complete(self, request: LlmRequest) -> LlmReply:
            reply = await super().complete(request)
            with open(calls_log, "a") as log:  # noqa: ASYNC230  # one short line
                log.write(f"{request.purpose} {request.conversation_id}\n")
            return reply

    rng = random.Random(seed)  # a workload, not a secret
    async with Runtime(store=SqliteStore(db), llm=Logged(reply_chars=300)) as rt:
        for cid in ids:
            try:
                await rt.state(cid)
            except LookupError:
                await rt.create_conversation(
                    model=MODEL,
                    behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE,
                    context_window=WINDOW,
                    max_continuations=10_000,  # a soak compacts for as long as it runs
                    conversation_id=cid,
                )
        sent = {cid: sum(m.kind == "user" for m in await rt.messages(cid)) for cid in ids}
        while time.time() < until:
            cid = rng.choice(ids)
            number = sent[cid] + 1
            await rt.send(cid, f"Message {number} of {cid}.", idempotency_key=str(number))
            sent[cid] = number


def worker_main(argv: list[str]) -> None:
    db, calls_log, ids_json, until, seed = argv
    asyncio.run(work(db, calls_log, json.loads(ids_json), float(until), int(seed)))


# --------------------------------------------------------------------------- the soak


def spawn(db: Path, log: Path, ids: list[str], until: float, seed: int) -> subprocess.Popen[str]:
    return subprocess.Popen(  # noqa: S603  # this interpreter, this script
        [sys.executable, str(HERE), "--worker", str(db), str(log), json.dumps(ids), str(until),
         str(seed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def steps(db: Path) -> int:
    """Persisted steps so far (rows of the event log), read without disturbing the workers."""
    if not db.exists():  # the workers have not made it yet
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as db_:
        try:
            return int(db_.execute("SELECT count(*) FROM transitions").fetchone()[0])
        except sqlite3.OperationalError:  # the file is there, its tables not yet
            return 0


def sample(pid: int) -> tuple[int, int] | None:
    """Resident memory (KiB) and open files of a process, None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        files = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    rss = [int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")]
    return (rss[0], files) if rss else None  # no VmRSS: it exited and waits to be reaped


def soak(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    db, log = folder / "soak.db", folder / "calls.log"
    ids = [f"c{n:04d}" for n in range(args.conversations)]
    half = len(ids) // 2
    until = time.time() + args.limit
    steady = spawn(db, log, ids[:half], until, 1)
    victim = spawn(db, log, ids[half:], until, 2)
    samples: list[tuple[float, int, int]] = []
    kills = 0
    started = time.monotonic()
    next_kill = started + args.kill_every
    errors: list[str] = []
    while steady.poll() is None:
        time.sleep(0.5)
        seen = sample(steady.pid)
        if seen is not None:
            samples.append((time.monotonic() - started, *seen))
        done = steps(db) >= args.steps
        if time.monotonic() >= next_kill or victim.poll() is not None or done:
            if victim.poll() is None:
                victim.send_signal(signal.SIGKILL)
                kills += 1
            victim.wait()
            if victim.returncode not in (0, KILLED):
                errors.append(victim.stderr.read() if victim.stderr else "")
            if done:
                break
            seed = 3 + kills
            victim = spawn(db, log, ids[half:], until, seed)
            next_kill = time.monotonic() + args.kill_every * random.uniform(0.5, 1.5)
    steady.send_signal(signal.SIGTERM)
    steady.wait()
    if steady.returncode not in (0, -signal.SIGTERM):
        errors.append(steady.stderr.read() if steady.stderr else "")
    # Finish what the last victim left, then read the books.
    subprocess.run(  # noqa: S603
        [sys.executable, str(HERE), "--worker", str(db), str(log), json.dumps(ids), "0", "0"],
        check=True,
    )
    return {"samples": samples, "kills": kills, "errors": errors, **books(db, log)}


def books(db: Path, log: Path) -> dict[str, Any]:
    """What the database and the model's log say once every worker stopped."""
    with contextlib.closing(sqlite3.connect(db)) as connection:
        rows = connection.execute(
            "SELECT conversation_id, kind, message FROM messages ORDER BY conversation_id, seq"
        ).fetchall()
        phases = connection.execute("SELECT phase, count(*) FROM conversations GROUP BY phase")
        phase_counts = dict(phases.fetchall())
        # The work a conversation has pending is in its row (its outbox); the table of that
        # name was left empty since schema 5, and schema 8 dropped it.
        pending = connection.execute(
            "SELECT count(*) FROM conversations WHERE CAST(outbox AS TEXT) <> '[]'"
        ).fetchone()[0]
        total_steps = connection.execute("SELECT count(*) FROM transitions").fetchone()[0]
    users: dict[str, list[int]] = {}
    replies = summaries = 0
    for cid, kind, message in rows:
        if kind == "user":
            text = json.loads(message)["text"]
            users.setdefault(cid, []).append(int(text.split()[1]))
        elif kind == "assistant":
            replies += 1
        elif kind == "summary":
            summaries += 1
    lost = doubled = 0
    for numbers in users.values():
        expected = list(range(1, max(numbers) + 1))
        lost += len(set(expected) - set(numbers))
        doubled += len(numbers) - len(set(numbers))
    calls = log.read_text().splitlines() if log.exists() else []
    turn_calls = sum(line.startswith("turn ") for line in calls)
    return {
        "steps": total_steps,
        "messages": sum(len(n) for n in users.values()),
        "replies": replies,
        "compactions": summaries,
        "turn_calls": turn_calls,
        "lost": lost,
        "doubled": doubled,
        "busy": sum(count for phase, count in phase_counts.items() if phase != "idle"),
        "pending": pending,
    }


def report(figures: dict[str, Any]) -> None:
    samples = figures["samples"]
    warm = [s for s in samples if s[0] >= samples[-1][0] * 0.2] or samples
    rss = [s[1] for s in warm]
    files = [s[2] for s in warm]
    growth = (max(rss) - statistics.median(rss[: max(1, len(rss) // 5)])) / 1024
    print(f"soak: {figures['steps']:,} persisted steps, {figures['kills']} kills of the victim")
    print(
        f"  messages {figures['messages']:,}, replies {figures['replies']:,}, compactions "
        f"{figures['compactions']:,}"
    )
    print(
        f"  lost {figures['lost']}, stored twice {figures['doubled']}, conversations left busy "
        f"{figures['busy']}, work left pending {figures['pending']} (targets: 0)"
    )
    ratio = figures["turn_calls"] / max(1, figures["replies"])
    print(f"  model calls per stored reply {ratio:.3f} (target 1.00)")
    print(
        f"  steady worker after warm-up: RSS {min(rss) / 1024:.1f}-{max(rss) / 1024:.1f} MB "
        f"(grew {growth:.1f} MB; target within 20 MB), open files {min(files)}-{max(files)}"
    )
    for error in figures["errors"]:
        print(f"  a worker failed:\n{error}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run for the smoke test")
    parser.add_argument("--steps", type=int, default=None, help="persisted steps (20,000)")
    parser.add_argument("--conversations", type=int, default=None, help="conversations (200)")
    parser.add_argument("--kill-every", type=float, default=None, help="seconds (3)")
    parser.add_argument("--limit", type=float, default=None, help="seconds at most (1,200)")
    args = parser.parse_args()
    args.steps = args.steps or (400 if args.quick else 20_000)
    args.conversations = args.conversations or (10 if args.quick else 200)
    args.kill_every = args.kill_every or (1.0 if args.quick else 3.0)
    args.limit = args.limit or (60.0 if args.quick else 1_200.0)
    with tempfile.TemporaryDirectory() as folder:
        report(soak(args, Path(folder)))


if __name__ == "__main__":
    main()
