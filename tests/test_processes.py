"""Several processes on one store: real worker processes (``process_worker.py``) sharing a
SQLite file (here) or a PostgreSQL database (``test_postgres_store`` runs the same scenarios).

What must hold, whatever the interleaving: every message sent is stored once and answered
once, the model is asked exactly once per stored reply (a request in flight in one process is
never asked again by another), a process that starts meanwhile leaves live work alone, and the
work of a process killed with SIGKILL is taken over and finished by the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from segue import Runtime
from segue.executor.models.scripted import ScriptedModel
from segue.executor.store_port import Store
from segue.executor.stores.postgres import PostgresStore
from segue.executor.stores.sqlite import SqliteStore

pytestmark = pytest.mark.slow
T = TypeVar("T")
WORKER = Path(__file__).with_name("process_worker.py")
GATED_WORKER = Path(__file__).with_name("gated_worker.py")
MODEL = "claude-sonnet-4-5"
TIMEOUT = 120


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine

    return asyncio.run(main())


def open_store(where: str) -> Store:
    return PostgresStore(where) if where.startswith("host=") else SqliteStore(where)


class Workers:
    """The worker processes a scenario starts, so that its teardown can end them: a scenario
    whose assert fails midway would otherwise leave them running, their pipes open (a later
    test then hears of those as unraisable ``ResourceWarning``s)."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def start(self, where: str, *args: str) -> subprocess.Popen[str]:
        """``process_worker.py`` on ``where`` doing ``args``, its output piped."""
        return self.popen([str(WORKER), where, *args])

    def popen(self, args: list[str], *, stdin: bool = False) -> subprocess.Popen[str]:
        """Our interpreter running ``args``, its output (and input if ``stdin``) piped."""
        worker = subprocess.Popen(  # noqa: S603  # our own workers, no shell
            [sys.executable, *args],
            stdin=subprocess.PIPE if stdin else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(worker)
        return worker

    def reap(self) -> None:
        """Kill every worker still running, then reap each one and close its pipes."""
        for worker in self.started:
            if worker.poll() is None:
                worker.kill()
            with contextlib.suppress(ValueError):  # communicated already: its pipes are closed
                worker.communicate(timeout=TIMEOUT)


@pytest.fixture
def workers() -> Iterator[Workers]:
    """A scenario's workers, killed and reaped when it ends, passed or failed."""
    started = Workers()
    try:
        yield started
    finally:
        started.reap()


def finish(worker: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = worker.communicate(timeout=TIMEOUT)
    assert worker.returncode == 0, err
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


async def create(where: str, count: int) -> list[str]:
    async with Runtime(store=open_store(where), llm=ScriptedModel()) as rt:
        return [(await rt.create_conversation(model=MODEL)).id for _ in range(count)]


async def transcript_kinds(where: str, cid: str) -> tuple[list[str], str, int]:
    """The kinds of the stored messages, the phase and how much is pending."""
    store = open_store(where)
    try:
        stored = await store.load(cid)
        kinds = [m.kind for m in await store.messages(cid)]
        return kinds, stored.state.phase.kind, len(stored.pending)
    finally:
        await store.close()


def wait_for_claim(where: str, cid: str) -> str:
    """Poll until the conversation's pending request is claimed; its owner."""

    async def poll() -> str:
        store = open_store(where)
        try:
            for _ in range(TIMEOUT * 20):
                pending = (await store.load(cid)).pending
                if pending and pending[0].owner is not None:
                    return pending[0].owner
                await asyncio.sleep(0.05)
        finally:
            await store.close()
        raise AssertionError

    return run(poll())


# --------------------------------------------------------------------------- scenarios


def concurrent_senders(where: str, workers: Workers) -> None:
    """Four processes send four messages each, round-robin over two conversations."""
    ids = run(create(where, 2))
    senders = [workers.start(where, "send", ",".join(ids), "4", "0.05") for _ in range(4)]
    results = [finish(sender) for sender in senders]
    assert all(r == "idle" for result in results for r in result["results"]), results
    calls = sum(result["calls"] for result in results)
    replies = 0
    for cid in ids:
        kinds, phase, pending = run(transcript_kinds(where, cid))
        assert (phase, pending) == ("idle", 0)
        # One turn at a time: every message was answered before the next one was taken.
        assert kinds == ["user", "assistant"] * (len(kinds) // 2)
        replies += kinds.count("assistant")
    assert replies == 16
    assert calls == replies  # exactly one model call per stored reply


def a_process_starting_meanwhile(where: str, workers: Workers) -> None:
    """A second process starts (and recovers) while the first has a request in flight.

    The first one's model answers only when told (``gated_worker.py``), so its request is in
    flight for as long as the second process takes to start, however busy the machine is."""
    (cid,) = run(create(where, 1))
    first = workers.popen([str(GATED_WORKER), where, cid], stdin=True)
    try:
        assert first.stdout is not None
        assert json.loads(first.stdout.readline() or "{}") == {"asked": True}
        owner = wait_for_claim(where, cid)
        second = finish(workers.start(where, "recover"))
        assert second["calls"] == 0  # the live process's request was left to it
        assert first.poll() is None  # ... which was still at it
    finally:
        out, err = first.communicate("answer now\n", timeout=TIMEOUT)
    assert first.returncode == 0, err
    done = json.loads(out.splitlines()[-1])
    assert done["owner"] == owner
    assert (done["calls"], done["phase"]) == (1, "idle")
    assert run(transcript_kinds(where, cid)) == (["user", "assistant"], "idle", 0)


def a_killed_claimer(where: str, workers: Workers) -> None:
    """kill -9 of the process performing a request: the next process asks once more."""
    (cid,) = run(create(where, 1))
    hanging = workers.start(where, "hang", cid)
    assert hanging.stdout is not None
    assert json.loads(hanging.stdout.readline())["asked"]
    os.kill(hanging.pid, signal.SIGKILL)
    hanging.communicate(timeout=TIMEOUT)  # reaps it and closes its pipes
    assert wait_for_claim(where, cid).split("/")[1] == str(hanging.pid)
    recovered = finish(workers.start(where, "recover"))
    assert recovered["calls"] == 1  # the request asked once more, by one process
    assert run(transcript_kinds(where, cid)) == (["user", "assistant"], "idle", 0)


SCENARIOS = [concurrent_senders, a_process_starting_meanwhile, a_killed_claimer]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_processes_on_one_sqlite_file(tmp_path: Path, scenario: Any, workers: Workers) -> None:
    scenario(str(tmp_path / "shared.db"), workers)
