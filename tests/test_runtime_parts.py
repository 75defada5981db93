"""The runtime as parts: one answer to who holds a conversation's turn, read alike by the runtime,
the server's pause route and ``segue pause``; the calls on conversations passed on to the part
that carries them out; listeners added through the driver's method; the store given once.

Real stores throughout (SQLite files shared by runtimes and processes), a worker process whose
model holds its answer until the test lets it go (``gated_worker.py``), the server over HTTP
and the installed ``segue`` command as a process of its own.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from gated import Worker
from segue import ConversationBusyError, Paused, Runtime, ScriptedModel, SqliteStore
from segue.executor.conversations import Conversations
from segue.executor.model_port import LlmReply, LlmRequest
from segue.executor.turn_holder import Turn, turn_of
from segue.server import create_app
from segue.testing import live_server

WINDOW = 50_000


class Held(ScriptedModel):
    """Answers its first request once the test opens the gate (later ones at once)."""

    def __init__(self) -> None:
        super().__init__(reply_chars=30, window=WINDOW)
        self.asked = asyncio.Event()
        self.gate = asyncio.Event()

    async def complete(self, request: LlmRequest) -> LlmReply:
        if not self.asked.is_set():
            self.asked.set()
            await self.gate.wait()
        return await super().complete(request)


def create_conversation(db: Path) -> str:
    async def make() -> str:
        rt = Runtime(store=SqliteStore(db), llm=ScriptedModel(window=WINDOW))
        try:
            return (await rt.create_conversation(model="scripted", context_window=WINDOW)).id
        finally:
            await rt.close()

    return asyncio.run(make())


# --------------------------------------------------------------------------- one answer


def test_who_holds_the_turn_is_one_answer_read_from_the_store(tmp_path: Path) -> None:
    """Another runtime's live claim is ``elsewhere`` (naming it); this runtime's own claim, a
    claim of a process of this host that is gone and a lapsed lease are ``nobody``; a drive
    here is ``here``. Deleting and exporting refuse with the same holder the answer names."""

    async def main() -> None:
        model = Held()
        db = tmp_path / "s.db"
        running = Runtime(store=SqliteStore(db), llm=model)
        asking = Runtime(store=SqliteStore(db), llm=ScriptedModel(window=WINDOW))
        try:
            cid = (await running.create_conversation(model="scripted")).id
            turn = asyncio.create_task(running.send(cid, "a long task"))
            await model.asked.wait()
            stored = await asking.conversation(cid)
            assert turn_of(stored, owner=asking.owner) == Turn("elsewhere", running.owner)
            assert turn_of(stored, owner=running.owner) == Turn("nobody")  # its own work
            assert turn_of(stored, owner=running.owner, driving=True) == Turn("here")
            with pytest.raises(ConversationBusyError, match=running.owner):
                await asking.delete_conversation(cid)
            with pytest.raises(ConversationBusyError, match=running.owner):
                await asking.export_conversation(cid)

            store = SqliteStore(db)
            head = stored.pending[0]
            dead = f"{socket.gethostname()}/{_gone_pid()}/0000"
            now = time.time()
            taken = await store.claim(
                cid, head.id, owner=dead, lease_until=now + 60, now=now, take_from=running.owner
            )
            assert taken is not None
            assert taken.owner == dead
            assert turn_of(await store.load(cid), owner=asking.owner) == Turn("nobody")
            lapsed = await store.claim(
                cid,
                head.id,
                owner="another-host/1/ab",
                lease_until=now - 1,
                now=now,
                take_from=dead,
            )
            assert lapsed is not None
            assert lapsed.owner == "another-host/1/ab"
            assert turn_of(await store.load(cid), owner=asking.owner) == Turn("nobody")
            await store.close()
            model.gate.set()
            await asyncio.wait_for(turn, 60)
        finally:
            model.gate.set()
            await running.close()
            await asking.close()

    asyncio.run(main())


def _gone_pid() -> int:
    """A process id no process of this host has now."""
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            pass
        pid += 1


def test_a_turn_driven_here_is_paused_here_and_elsewhere_through_the_store(
    tmp_path: Path,
) -> None:
    """The runtime running the turn asks its own drive (``here``); another runtime on the
    store reaches it through the store (``elsewhere``, naming it): both pauses are the same
    pause, taken once at the turn's boundary."""

    async def main() -> None:
        model = Held()
        db = tmp_path / "s.db"
        running = Runtime(store=SqliteStore(db), llm=model)
        asking = Runtime(store=SqliteStore(db), llm=ScriptedModel(window=WINDOW))
        try:
            cid = (await running.create_conversation(model="scripted")).id
            turn = asyncio.create_task(running.send(cid, "a long task"))
            await model.asked.wait()
            here = await running.request_pause(cid, "mine")
            there = await asking.request_pause(cid, "theirs")
            assert (here.where, here.holder) == ("here", None)
            assert (there.where, there.holder) == ("elsewhere", running.owner)
            assert (await there.recorded()).pause_requested
            model.gate.set()
            assert (await asyncio.wait_for(turn, 60)).phase.kind == "paused"
            state = await asyncio.wait_for(there.outcome(), 60)
            # The request committed to the store came first; the flag here found it standing.
            assert isinstance(state.phase, Paused)
            assert state.phase.snapshot.reason == "theirs"
            assert len(await asking.store.snapshots(cid)) == 1
        finally:
            model.gate.set()
            await running.close()
            await asking.close()

    asyncio.run(main())


def ask_the_runtime(db: Path, cid: str) -> tuple[str, str | None, bool]:
    """``Runtime.request_pause``: where it says the turn runs, who holds it, and whether the
    request reached the store (it stops following it then; the request stays)."""

    async def ask() -> tuple[str, str | None, bool]:
        rt = Runtime(store=SqliteStore(db), llm=ScriptedModel(window=WINDOW))
        try:
            request = await rt.request_pause(cid, "from the runtime")
            state = await request.recorded()
            await request.abandon()
            return request.where, request.holder, state.pause_requested
        finally:
            await rt.close()

    return asyncio.run(ask())


def ask_the_server(db: Path, cid: str) -> dict[str, Any]:
    """``POST .../pause`` on a server of its own over the same database."""
    app = create_app(Runtime(store=SqliteStore(db), llm=ScriptedModel(window=WINDOW)))
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as client:
        asked = client.post(f"/api/conversations/{cid}/pause", json={"reason": "from the server"})
        assert asked.status_code == 200, asked.text
        shown: dict[str, Any] = asked.json()
        return shown


def ask_the_cli(db: Path, cid: str) -> tuple[int, str]:
    """``segue pause --timeout``: its exit code and what it said, on one line."""
    segue = shutil.which("segue")
    assert segue is not None, "the console script is not installed (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"} | {"COLUMNS": "300"}
    ran = subprocess.run(  # noqa: S603  # the installed console script, no shell
        [segue, "pause", cid, "--db", str(db), "--offline", "--timeout", "0.5"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in ran.stderr, ran.stderr
    return ran.returncode, " ".join(ran.stdout.split())


@pytest.mark.slow
def test_a_turn_another_process_runs_is_reported_alike_by_runtime_server_and_cli(
    tmp_path: Path,
) -> None:
    """While a worker process holds its turn, the runtime's pause request, the server's pause
    route and ``segue pause`` each say the turn runs elsewhere and name the same holder, the
    worker; each leaves its request in the store, and the worker pauses at its boundary."""
    db = tmp_path / "shared.db"
    cid = create_conversation(db)
    worker = Worker(db, cid)
    try:
        where, holder, recorded = ask_the_runtime(db, cid)
        shown = ask_the_server(db, cid)
        code, said = ask_the_cli(db, cid)
        outcome = worker.open()
    finally:
        worker.stop()
    owner = outcome["owner"]
    assert (where, holder, recorded) == ("elsewhere", owner, True)
    assert (shown["running_in"], shown["pause_requested"]) == (owner, True)
    assert (shown["phase"], shown["snapshot_version"]) == ("llm_requesting", None)
    assert code == 3, said  # requested, not yet taken within the half second
    assert f"in another process ({owner})" in said
    assert (outcome["phase"], outcome["calls"]) == ("paused", 2)  # its turn, its checkpoint


def test_a_pause_nobody_runs_is_taken_by_the_asking_runtime_and_names_no_holder(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    cid = create_conversation(db)
    app = create_app(Runtime(store=SqliteStore(db), llm=ScriptedModel(window=WINDOW)))
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as client:
        asked = client.post(f"/api/conversations/{cid}/pause", json={"reason": "idle"})
    assert asked.status_code == 200, asked.text
    shown = asked.json()
    assert (shown["phase"], shown["snapshot_version"], shown["running_in"]) == ("paused", 1, None)


# --------------------------------------------------------------------------- the parts


def test_the_runtime_passes_conversation_calls_to_its_part(tmp_path: Path) -> None:
    """A method passed on has the part's signature and docstring, and is called on the part
    the runtime holds, from an instance or from the class."""
    assert inspect.signature(Runtime.create_conversation) == inspect.signature(
        Conversations.create_conversation
    )
    assert Runtime.delete_conversation.__doc__ == Conversations.delete_conversation.__doc__
    assert not issubclass(Runtime, Conversations)

    async def main() -> None:
        effects: list[str] = []
        rt = Runtime(store=SqliteStore(tmp_path / "s.db"), llm=ScriptedModel(window=WINDOW))
        rt.subscribe(lambda cid, effect: effects.append(type(effect).__name__))
        try:
            cid = (await rt.create_conversation(model="scripted")).id
            await rt.send(cid, "hello")
            assert (await Runtime.state(rt, cid)).phase.kind == "idle"
            assert await rt.last_reply(cid) == await Runtime.last_reply(rt, cid)
            assert effects == ["RequestLlm"]
            with pytest.raises(AttributeError):
                rt.store = SqliteStore(tmp_path / "other.db")  # type: ignore[misc]
        finally:
            await rt.close()

    asyncio.run(main())
