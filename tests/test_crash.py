"""Persistence and crash recovery across real processes, on a real SQLite file.

A child process (a helper script written to ``tmp_path``) runs a conversation; the test process
then opens the same file with a new ``Runtime``. For the crash tests the child talks, through
each provider's real client (``AnthropicModel``, ``OpenAIModel`` on both APIs), to that
provider's fake server running in the test process, whose scripted reply is held back until the
child is killed with SIGKILL mid-request: whatever the child committed is all there is.
``async with Runtime(...)`` must then perform what was pending, exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from segue import ContextExhausted, ContextExhaustionBehavior
from segue.executor.errors import ConversationExhaustedError
from segue.executor.models.scripted import ScriptedModel
from segue.executor.runtime import Runtime
from segue.executor.stores.postgres import PostgresStore
from segue.executor.stores.sqlite import SqliteStore
from segue.testing.conformance import Said
from segue.testing.harnesses import AnthropicHarness, OpenAIHarness

pytestmark = pytest.mark.slow

MODEL = "claude-sonnet-4-6"  # the fake Anthropic server says 200k
SERVED = "served-model"  # the fake OpenAI server says 200k (as vLLM's max_model_len)
SCRIPTED_WINDOW = 3_000
MARK = "RESULT "

SCRIPTED_CHILD = f"""
import asyncio
import sys

from segue.executor.runtime import Runtime
from segue.executor.models.scripted import ScriptedModel
from segue.executor.stores.sqlite import SqliteStore


async def main(path: str) -> None:
    model = ScriptedModel(window={SCRIPTED_WINDOW}, tool_every=0)
    async with Runtime(store=SqliteStore(path), llm=model) as rt:
        conv = await rt.create_conversation(model="claude-sonnet-4-5", system="Be brief.")
        for index in range(40):
            state = await rt.send(conv.id, f"Question {{index}}")
            if state.phase.kind != "idle":
                break
        print("{MARK}" + conv.id + " " + state.phase.kind, flush=True)


asyncio.run(main(sys.argv[1]))
"""

PROVIDER_CHILD = f"""
import asyncio
import sys

from segue.executor.runtime import Runtime
from segue.executor.stores.sqlite import SqliteStore


def connect(provider: str, url: str):
    if provider == "anthropic":
        import anthropic
        from segue.executor.models.anthropic import AnthropicModel

        client = anthropic.AsyncAnthropic(api_key="test", base_url=url, max_retries=0)
        return client, AnthropicModel(client), "{MODEL}"
    import openai
    from segue.executor.models.openai import OpenAIModel

    client = openai.AsyncOpenAI(api_key="test", base_url=url, max_retries=0)
    return client, OpenAIModel(client, api=provider.removeprefix("openai-")), "{SERVED}"


async def main(path: str, url: str, conversation_id: str, provider: str) -> None:
    client, llm, model = connect(provider, url)
    async with client:
        async with Runtime(store=SqliteStore(path), llm=llm) as rt:
            await rt.create_conversation(model=model, conversation_id=conversation_id)
            await rt.send(conversation_id, "Hello from a process about to die.")
            print("{MARK}finished", flush=True)


asyncio.run(main(*sys.argv[1:]))
"""


def spawn(tmp_path: Path, source: str, *args: str) -> subprocess.Popen[bytes]:
    """Start ``source`` as a script in a child process; its output goes to files in tmp_path."""
    script = tmp_path / "child.py"
    script.write_text(source, encoding="utf-8")
    with (tmp_path / "child.out").open("wb") as out, (tmp_path / "child.err").open("wb") as err:
        return subprocess.Popen(  # noqa: S603  # our own interpreter on our own script
            [sys.executable, str(script), *args], stdout=out, stderr=err
        )


def output(tmp_path: Path) -> str:
    return (tmp_path / "child.out").read_text(encoding="utf-8") + (
        tmp_path / "child.err"
    ).read_text(encoding="utf-8")


@pytest.fixture(params=["anthropic", "openai-chat", "openai-responses"])
def provider(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A started harness of each provider: its fake server and its adapter."""
    name: str = request.param
    harness: Any = AnthropicHarness()
    if name != "anthropic":
        harness = OpenAIHarness("chat" if name == "openai-chat" else "responses")
    with harness:
        if name != "anthropic":
            harness.server.models[SERVED] = {"owned_by": "vllm", "max_model_len": 200_000}
        harness.provider = name
        yield harness


def kill_when(server: Any, child: subprocess.Popen[bytes], requests: int, tmp_path: Path) -> None:
    """SIGKILL ``child`` once the server has received ``requests`` requests (it holds the last)."""
    try:
        arrived = server.wait_for_requests(requests, timeout=60)
        assert arrived, f"the child never sent {requests} requests:\n{output(tmp_path)}"
        assert child.poll() is None, f"the child ended early:\n{output(tmp_path)}"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert MARK not in output(tmp_path)


def test_an_exhausted_conversation_reads_the_same_in_another_process(tmp_path: Path) -> None:
    db = tmp_path / "segue.db"
    child = spawn(tmp_path, SCRIPTED_CHILD, str(db))
    assert child.wait(timeout=120) == 0, output(tmp_path)
    result = next(line for line in output(tmp_path).splitlines() if line.startswith(MARK))
    conversation_id, phase = result.removeprefix(MARK).split()
    assert phase == "context_exhausted"

    async def main() -> None:
        model = ScriptedModel(window=SCRIPTED_WINDOW)
        async with Runtime(store=SqliteStore(db), llm=model) as rt:
            assert await rt.store.with_pending() == []
            state = await rt.state(conversation_id)
            assert isinstance(state.phase, ContextExhausted)
            transcript = await rt.messages(conversation_id)
            assert transcript[-1].kind == "continuation"
            assert transcript[-1].text == state.phase.summary
            assert state.phase.summary.startswith("Continuation summary")
            users = [m.text for m in transcript if m.kind == "user"]
            assert users == [f"Question {index}" for index in range(len(users))]

            log = await rt.store.transitions(conversation_id)
            assert (log[0].event_kind, log[0].from_phase) == ("user_message", "idle")
            assert (log[-1].from_phase, log[-1].to_phase) == (
                "awaiting_continuation",
                "context_exhausted",
            )
            assert log[-1].effect_kinds == ("append_message", "notify_context_exhausted")
            assert [r.seq for r in log] == sorted(r.seq for r in log)
            assert len(log) == 2 * len(users) + 1

            with pytest.raises(ConversationExhaustedError):
                await rt.send(conversation_id, "Still there?")
            child_conv = await rt.start_new_from(conversation_id)
            assert child_conv.parent_id == conversation_id
            assert model.requests == []  # nothing was pending, nothing was asked again

    asyncio.run(main())


def test_a_crash_during_an_llm_call_is_recovered_exactly_once(
    provider: Any, tmp_path: Path
) -> None:
    db = tmp_path / "segue.db"
    conversation_id = "crash-1"
    provider.default(Said(text="Answer after the crash."))
    provider.script(Said(text="This reply never arrives.", delay=60))
    server = provider.server
    child = spawn(tmp_path, PROVIDER_CHILD, str(db), server.url, conversation_id, provider.provider)
    kill_when(server, child, 2, tmp_path)  # the model's window, then the held request
    assert len(provider.sent()) == 1

    async def main() -> None:
        inspect = SqliteStore(db)
        try:
            before = await inspect.load(conversation_id)
            assert before.state.phase.kind == "llm_requesting"
            assert [p.effect.kind for p in before.pending] == ["request_llm"]
        finally:
            await inspect.close()
        async with provider.model() as llm, Runtime(store=SqliteStore(db), llm=llm) as rt:
            state = await rt.state(conversation_id)
            assert state.phase.kind == "idle"
            transcript = await rt.messages(conversation_id)
            assert [(m.kind, m.text) for m in transcript] == [
                ("user", "Hello from a process about to die."),
                ("assistant", "Answer after the crash."),
            ]
            assert await rt.store.with_pending() == []

    asyncio.run(main())
    retried = provider.sent()
    assert len(retried) == 2
    assert retried[1].turns == retried[0].turns


def test_a_crash_while_summarising_asks_for_the_summary_again(
    provider: Any, tmp_path: Path
) -> None:
    db = tmp_path / "segue.db"
    conversation_id = "crash-2"
    crossing = Said(text="A very long answer.", prompt=186_000, cached=185_000, output=200)
    provider.default(Said(text="Summary written after the crash."))
    provider.script(crossing, Said(text="This summary never arrives.", delay=60))
    server = provider.server
    child = spawn(tmp_path, PROVIDER_CHILD, str(db), server.url, conversation_id, provider.provider)
    kill_when(server, child, 3, tmp_path)  # the window, the crossing turn, the held summary
    assert not provider.sent()[-1].tools

    async def main() -> None:
        async with provider.model() as llm, Runtime(store=SqliteStore(db), llm=llm) as rt:
            state = await rt.state(conversation_id)
            assert isinstance(state.phase, ContextExhausted)
            assert state.phase.summary == "Summary written after the crash."
            transcript = await rt.messages(conversation_id)
            assert [m.kind for m in transcript] == ["user", "assistant", "continuation"]
            assert state.behavior is ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION

    asyncio.run(main())
    summaries = provider.sent()[1:]
    assert len(summaries) == 2  # the held one, then exactly one more
    assert summaries[0].turns == summaries[1].turns


DURABLE_CHILD = f"""
import asyncio
import sys
import threading

from segue.executor.models.scripted import ScriptedModel
from segue.executor.runtime import Runtime
from segue.executor.stores.postgres import PostgresStore
from segue.executor.stores.sqlite import SqliteStore


async def main(where: str, conversation_id: str) -> None:
    sqlite = not where.startswith("host=")
    store = SqliteStore(where) if sqlite else PostgresStore(where)
    commits_here = 0  # COMMITs run on this (the event loop's) thread: the inline write path
    loop_thread = threading.get_ident()

    def trace(statement: str) -> None:
        nonlocal commits_here
        if statement == "COMMIT" and threading.get_ident() == loop_thread:
            commits_here += 1

    async with Runtime(store=store, llm=ScriptedModel(reply_chars=20)) as rt:
        await rt.create_conversation(model="claude-sonnet-4-5", conversation_id=conversation_id)
        if sqlite:
            await store._run(lambda conn: conn.set_trace_callback(trace))
        for index in range(10_000):
            await rt.send(conversation_id, f"Question {{index}}")
            print("{MARK}" + f"{{index}} {{commits_here}}", flush=True)


asyncio.run(main(*sys.argv[1:]))
"""


def a_returned_send_survives_kill_9(tmp_path: Path, where: str) -> None:
    """A child sends message after message and says so each time ``send()`` has returned; it is
    killed with SIGKILL while it goes on sending. Every message it said was sent is in the
    store with its answer (on SQLite, written on the event loop's own thread: the inline write
    path), and what the kill interrupted is finished on the next start."""
    conversation_id = "durable-1"
    script = tmp_path / "durable.py"
    script.write_text(DURABLE_CHILD, encoding="utf-8")
    child = subprocess.Popen(  # noqa: S603  # our own interpreter on our own script
        [sys.executable, str(script), where, conversation_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: list[tuple[int, int]] = []
    try:
        assert child.stdout is not None
        while len(said) < 30:
            line = child.stdout.readline()  # blocks until the child has sent one more
            assert line, f"the child ended early: {child.communicate()[1]}"
            index, inline = line.removeprefix(MARK).split()
            said.append((int(index), int(inline)))
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert [index for index, _ in said] == list(range(30))
    if not where.startswith("host="):
        assert said[-1][1] >= 30  # most of the 60 commits ran on the loop's thread

    async def main() -> None:
        store = SqliteStore(where) if not where.startswith("host=") else PostgresStore(where)
        try:
            transcript = [(m.kind, m.text) for m in await store.messages(conversation_id)]
        finally:
            await store.close()
        for index in range(30):
            assert transcript[2 * index][1] == f"Question {index}"
            assert transcript[2 * index + 1][0] == "assistant"
        async with Runtime(store=open_store(where), llm=ScriptedModel(reply_chars=20)) as rt:
            state = await rt.state(conversation_id)
            assert state.phase.kind == "idle"
            kinds = [m.kind for m in await rt.messages(conversation_id)]
            assert kinds == ["user", "assistant"] * (len(kinds) // 2)
            assert await rt.store.with_pending() == []

    asyncio.run(main())


def open_store(where: str) -> SqliteStore | PostgresStore:
    return SqliteStore(where) if not where.startswith("host=") else PostgresStore(where)


def test_a_returned_send_survives_kill_9_on_sqlite(tmp_path: Path) -> None:
    a_returned_send_survives_kill_9(tmp_path, str(tmp_path / "segue.db"))
