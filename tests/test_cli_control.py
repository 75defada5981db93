"""The user's control at the limit from the command line: ``segue chat``'s ``/continue <focus>``
and ``/pin``, checked on the wire (the real ``anthropic`` client against the fake API), and
``segue pause`` on a conversation whose turn another process runs (a worker whose model answers
only when the test says so, and ``segue pause`` as a process of its own).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import Result

import cli_run
from cli_run import plain_output
from gated import Worker
from segue import Runtime, ScriptedModel, SqliteStore
from segue.testing.anthropic_server import FakeAnthropicServer, MessageReply, Usage

KEY = "sk-ant-test-cli-control-0123456789"
PINNED = "Never touch the migrations folder, whatever the plan says."


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    plain_output(monkeypatch, "ANTHROPIC_API_KEY")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropicServer]:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    reply = MessageReply(text="Hello from the fake API.", usage=Usage(input_tokens=1_000))
    with FakeAnthropicServer(default=reply) as server:
        yield server


def chat(fake: FakeAnthropicServer, db: Path, lines: list[str], *args: str) -> Result:
    return cli_run.chat(fake, db, "\n".join(lines) + "\n", *args)


def last_user_text(body: dict[str, Any]) -> str:
    content = body["messages"][-1]["content"]
    if isinstance(content, str):
        return content
    return "\n".join(block.get("text", "") for block in content if block.get("type") == "text")


# --------------------------------------------------------------------------- segue chat


def test_continue_with_a_focus_sends_it_with_the_limits_request(
    fake: FakeAnthropicServer, tmp_path: Path
) -> None:
    lines = ["/help", "plan the schema", "/continue   the index decisions  ", "/quit"]
    result = chat(fake, tmp_path / "c.db", lines, "--context-window", "50000")
    assert result.exit_code == 0, result.output
    assert "/continue [focus]" in result.stdout
    assert "/pin text" in result.stdout
    assert "this conversation is read-only now" in result.stdout
    turn, limit = (r.body for r in fake.message_requests())
    assert "tools" not in limit  # the summary's request, after the turn's
    asked = last_user_text(limit)
    assert "focus above all on: the index decisions" in asked
    assert "plan the schema" in json.dumps(turn["messages"])

    plain = chat(fake, tmp_path / "p.db", ["plan it", "/continue", "/quit"])
    assert plain.exit_code == 0, plain.output
    assert "focus above all" not in last_user_text(fake.message_requests()[-1].body)


def test_a_pinned_message_is_sent_verbatim_to_the_seeded_child(
    fake: FakeAnthropicServer, tmp_path: Path
) -> None:
    db = tmp_path / "pin.db"
    lines = [
        "/pin",  # nothing to pin: says how, sends nothing
        f"/pin {PINNED}",
        "an ordinary remark about lunch",
        "/continue",
        "/new",  # the child, seeded with the summary (and the pinned message)
        "where were we?",
        "/quit",
    ]
    result = chat(fake, db, lines, "--context-window", "50000")
    assert result.exit_code == 0, result.output
    assert "/pin takes the message to pin" in result.stdout
    first = fake.message_requests()[0].body
    assert last_user_text(first) == PINNED  # sent as typed, without the command
    in_child = json.dumps(fake.message_requests()[-1].body)
    assert PINNED in in_child
    assert "lunch" not in in_child  # only a summary stands for the rest


def test_a_pin_too_large_is_refused_and_nothing_is_sent(
    fake: FakeAnthropicServer, tmp_path: Path
) -> None:
    db = tmp_path / "large.db"
    result = chat(fake, db, ["/pin " + "keep this " * 400, "/quit"], "--context-window", "4000")
    assert result.exit_code == 1  # the last message was refused
    assert "cannot be pinned" in result.stderr
    assert "Traceback" not in result.output
    assert fake.message_requests() == []


# --------------------------------------------------------------------------- segue pause


def create_conversation(db: Path) -> str:
    async def make() -> str:
        async with Runtime(store=SqliteStore(db), llm=ScriptedModel()) as rt:
            return (await rt.create_conversation(model="claude-sonnet-4-6")).id

    return asyncio.run(make())


def stored_state(db: Path, cid: str) -> Any:
    async def read() -> Any:
        store = SqliteStore(db)
        try:
            return (await store.load(cid)).state
        finally:
            await store.close()

    return asyncio.run(read())


def segue_pause(db: Path, cid: str, *args: str) -> subprocess.Popen[str]:
    segue = shutil.which("segue")
    assert segue is not None, "the console script is not installed (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    return subprocess.Popen(  # noqa: S603  # the installed console script, no shell
        [segue, "pause", cid[:8], "--db", str(db), "--offline", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def until_requested(db: Path, cid: str, pausing: subprocess.Popen[str]) -> None:
    """Wait until the pause request is in the store, ``segue pause`` waiting meanwhile."""
    deadline = time.monotonic() + 60
    while not stored_state(db, cid).pause_requested:
        assert pausing.poll() is None, pausing.communicate()
        assert time.monotonic() < deadline, "the pause request never reached the store"
        time.sleep(0.05)


@pytest.mark.slow
def test_segue_pause_on_a_turn_another_process_runs_is_taken_there(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    cid = create_conversation(db)
    worker = Worker(db, cid)
    try:
        pausing = segue_pause(db, cid, "--reason", "deploy window")
        until_requested(db, cid, pausing)
        assert stored_state(db, cid).phase.kind == "llm_requesting"  # the turn goes on
        outcome = worker.open()
        out, err = pausing.communicate(timeout=120)
    finally:
        worker.stop()
    assert pausing.returncode == 0, err
    assert "in another process" in " ".join(out.split())  # the line wraps at 80 columns
    assert f"paused {cid}: snapshot v1 saved" in out
    assert (outcome["phase"], outcome["calls"]) == ("paused", 2)  # its turn, its checkpoint
    state = stored_state(db, cid)
    assert (state.phase.kind, state.phase.snapshot.reason) == ("paused", "deploy window")


@pytest.mark.slow
def test_segue_pause_with_a_timeout_says_the_pause_is_requested_not_taken(
    tmp_path: Path,
) -> None:
    db = tmp_path / "shared.db"
    cid = create_conversation(db)
    worker = Worker(db, cid)
    try:
        pausing = segue_pause(db, cid, "--timeout", "0.5")
        out, err = pausing.communicate(timeout=120)  # the worker's answer is held meanwhile
        assert pausing.returncode == 3, (out, err)
        words = " ".join(out.split())  # the line wraps at 80 columns
        assert f"pause requested, not yet taken: conversation {cid} is still in its turn" in words
        assert "Traceback" not in err
        state = stored_state(db, cid)
        assert (state.phase.kind, state.pause_requested) == ("llm_requesting", True)
        outcome = worker.open()
    finally:
        worker.stop()
    assert (outcome["phase"], outcome["calls"]) == ("paused", 2)  # taken at its boundary
    assert stored_state(db, cid).phase.snapshot.version == 1
