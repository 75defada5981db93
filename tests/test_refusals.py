"""A refusal costs the running turn nothing; work whose performer raised is let go at once.

Two runtimes share a store (in one process, or in two processes on SQLite and on PostgreSQL).
While the first one's model call is in flight, a message sent to the second with ``wait=False``
is refused as busy: that refusal writes nothing (no outbox entry for anyone to perform, no new
version under the running turn), so the first turn ends as soon as its model answers. An
adapter that raises instead of reporting leaves its request pending but unclaimed, so another
runtime can finish the turn at once.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from segue import MessageRejectedError, Runtime
from segue.executor.claims import DEFAULT_LEASE
from segue.executor.model_port import LlmReply, LlmRequest
from segue.executor.models.scripted import ScriptedModel
from segue.executor.store_port import Store
from segue.executor.stores.memory import MemoryStore
from segue.executor.stores.postgres import PostgresStore
from segue.executor.stores.sqlite import SqliteStore
from test_postgres_store import cluster, database  # noqa: F401  # the shared PostgreSQL fixtures

T = TypeVar("T")
MODEL = "claude-sonnet-4-5"
WORKER = Path(__file__).with_name("gated_worker.py")
TIMEOUT = 120


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine

    return asyncio.run(main())


class Gated(ScriptedModel):
    """Answers once ``gate`` is set; ``asked`` is set when a request arrives."""

    def __init__(self) -> None:
        super().__init__(reply_chars=30)
        self.asked = asyncio.Event()
        self.gate = asyncio.Event()

    async def complete(self, request: LlmRequest) -> LlmReply:
        self.asked.set()
        await self.gate.wait()
        return await super().complete(request)


class Broken(ScriptedModel):
    """An adapter with a bug: it raises what the port does not allow."""

    async def complete(self, request: LlmRequest) -> LlmReply:
        self.requests.append(request)
        raise RuntimeError("an adapter bug")


StoreFactory = Callable[[Path], Store]
_SHARED_MEMORY: dict[Path, MemoryStore] = {}
STORES: dict[str, StoreFactory] = {
    "memory": lambda where: _SHARED_MEMORY.setdefault(where, MemoryStore()),
    "sqlite": lambda where: SqliteStore(where / "shared.db"),
}


@pytest.mark.parametrize("kind", STORES)
def test_a_busy_refusal_from_another_runtime_leaves_nothing_pending(
    tmp_path: Path, kind: str
) -> None:
    make = STORES[kind]

    async def scenario() -> None:
        model = Gated()
        first = Runtime(store=make(tmp_path), llm=model)
        second = Runtime(store=make(tmp_path), llm=ScriptedModel())
        cid = (await first.create_conversation(model=MODEL)).id
        sending = asyncio.create_task(first.send(cid, "first"))
        await model.asked.wait()
        before = await second.store.load(cid)

        with pytest.raises(MessageRejectedError) as refused:
            await second.send(cid, "second", wait=False)
        assert refused.value.cause == "busy"

        after = await second.store.load(cid)
        assert after.version == before.version  # nothing was committed under the running turn
        assert [(p.effect.kind, p.owner) for p in after.pending] == [("request_llm", first.owner)]
        model.gate.set()
        state = await asyncio.wait_for(sending, timeout=DEFAULT_LEASE / 2)
        assert state.phase.kind == "idle"
        done = await second.store.load(cid)
        assert done.pending == ()
        assert [m.text for m in await second.store.messages(cid) if m.kind == "user"] == ["first"]
        logged = [t.event_kind for t in await second.store.transitions(cid)]
        assert logged == ["user_message", "llm_response"]  # the refusal is not a step
        await first.close()
        if kind != "memory":
            await second.close()

    run(scenario())


@pytest.mark.parametrize("kind", STORES)
def test_work_whose_adapter_raised_is_let_go_at_once(tmp_path: Path, kind: str) -> None:
    make = STORES[kind]

    async def scenario() -> None:
        broken = Broken()
        first = Runtime(store=make(tmp_path), llm=broken)
        cid = (await first.create_conversation(model=MODEL)).id
        with pytest.raises(RuntimeError, match="an adapter bug"):
            await first.send(cid, "hello")
        (pending,) = (await first.store.load(cid)).pending
        assert (pending.effect.kind, pending.owner) == ("request_llm", None)

        # Another runtime (a second worker sharing the store) finishes the turn now, not when
        # a lease would have ended.
        working = ScriptedModel()
        second = Runtime(store=make(tmp_path), llm=working)
        await asyncio.wait_for(second.recover(), timeout=DEFAULT_LEASE / 2)
        assert len(working.requests) == 1
        stored = await second.store.load(cid)
        assert (stored.state.phase.kind, stored.pending) == ("idle", ())
        assert [m.kind for m in await second.store.messages(cid)] == ["user", "assistant"]
        await second.close()
        if kind != "memory":
            await first.close()

    run(scenario())


def test_close_lets_go_of_work_whose_request_is_in_flight(tmp_path: Path) -> None:
    async def scenario() -> None:
        model = Gated()
        first = Runtime(store=SqliteStore(tmp_path / "s.db"), llm=model)
        cid = (await first.create_conversation(model=MODEL)).id
        sending = asyncio.create_task(first.send(cid, "hello"))
        await model.asked.wait()
        await first.close()
        await asyncio.gather(sending, return_exceptions=True)
        store = SqliteStore(tmp_path / "s.db")
        (pending,) = (await store.load(cid)).pending
        assert pending.owner is None
        await store.close()

    run(scenario())


# --------------------------------------------------------------------------- two processes


def _start_gated(where: str, cid: str) -> subprocess.Popen[str]:
    worker = subprocess.Popen(  # noqa: S603  # our own worker, no shell
        [sys.executable, str(WORKER), where, cid],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    line = worker.stdout.readline()
    assert line, worker.communicate(timeout=TIMEOUT)[1]
    assert json.loads(line) == {"asked": True}
    return worker


def _refusal_across_processes(where: str, open_store: Callable[[], Store]) -> None:
    async def create() -> str:
        async with Runtime(store=open_store(), llm=ScriptedModel()) as rt:
            return (await rt.create_conversation(model=MODEL)).id

    cid = run(create())
    worker = _start_gated(where, cid)
    try:

        async def refuse() -> tuple[Any, Any]:
            async with Runtime(store=open_store(), llm=ScriptedModel()) as rt:
                before = await rt.store.load(cid)
                with pytest.raises(MessageRejectedError) as refused:
                    await rt.send(cid, "from the other process", wait=False)
                assert refused.value.cause == "busy"
                return before, await rt.store.load(cid)

        before, after = run(refuse())
        assert after.version == before.version
        assert [p.effect.kind for p in after.pending] == ["request_llm"]
        assert after.pending[0].owner == before.pending[0].owner  # still the worker's alone
    finally:
        out, err = worker.communicate("open\n", timeout=TIMEOUT)  # the model answers now
    assert worker.returncode == 0, err
    result = json.loads(out.splitlines()[-1])
    assert (result["calls"], result["phase"]) == (1, "idle")
    # The turn ends once its model answers, not when a lease taken by the refusal runs out.
    assert result["seconds_after_gate"] < DEFAULT_LEASE / 2

    async def outbox() -> tuple[int, list[str]]:
        store = open_store()
        try:
            stored = await store.load(cid)
            return len(stored.pending), [m.kind for m in await store.messages(cid)]
        finally:
            await store.close()

    assert run(outbox()) == (0, ["user", "assistant"])


@pytest.mark.slow
def test_a_busy_refusal_costs_a_turn_in_another_process_nothing_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    _refusal_across_processes(str(path), lambda: SqliteStore(path))


@pytest.mark.slow
def test_a_busy_refusal_costs_a_turn_in_another_process_nothing_on_postgres(
    database: str,  # noqa: F811  # the fixture imported above
) -> None:
    _refusal_across_processes(database, lambda: PostgresStore(database))
