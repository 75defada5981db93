"""The user's control at the limit, on the wire (REQ-SEG-040 to REQ-SEG-046).

``Runtime`` -> ``AnthropicModel`` -> the real ``anthropic`` client -> HTTP -> the fake API: what
is checked is what the server received. A custom instruction or a focus in the limit's request
(and segue's own wording absent), the summary model on that request only, pinned text verbatim
in the first request after a compaction, a checkpoint restart and in a seeded child, a
1,000,000-character tool result cut on the wire with its note and its private file, a short one
byte for byte, the time bound with a fake clock, and a cancel that ends a pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from scenario import requirement
from segue import (
    CHECKPOINT_PROMPT,
    ContextExhausted,
    ContextExhaustionBehavior,
    ErrorKind,
    Failed,
    MessageRejectedError,
)
from segue.executor.instructions import COMPACTION_INSTRUCTION, CONTINUATION_INSTRUCTION
from segue.executor.models.anthropic import AnthropicModel
from segue.executor.runtime import Runtime
from segue.executor.stores.sqlite import SqliteStore
from segue.executor.tools import Tool
from segue.testing.anthropic_server import FakeAnthropicServer, MessageReply, ToolUse, Usage

KEY = "sk-ant-control-test-0000000000"
MODEL = "claude-sonnet-4-6"  # the fake reports a 200k window: warning 160,000, threshold 180,000
SUMMARY_MODEL = "claude-haiku-4-5"
Behavior = ContextExhaustionBehavior
SMALL = Usage(input_tokens=3_000, output_tokens=20)
CROSSING = MessageReply(
    text="A long answer.", usage=Usage(900, 300, cache_read_input_tokens=184_000)
)
CHECKPOINT = (
    "<checkpoint>\n## Goal\nShip the parser.\n\n## Remaining Tasks\n1. tests\n</checkpoint>"
)
DEFAULTS = {
    Behavior.THRESHOLD_BASED_CONTINUATION: CONTINUATION_INSTRUCTION,
    Behavior.CHECKPOINT_RESTART: CHECKPOINT_PROMPT,
    Behavior.CHECKPOINT_PAUSE: CHECKPOINT_PROMPT,
    Behavior.COMPACT_IN_PLACE: COMPACTION_INSTRUCTION,
}
ANSWERS = {
    Behavior.THRESHOLD_BASED_CONTINUATION: "Summary: the parser.",
    Behavior.CHECKPOINT_RESTART: CHECKPOINT,
    Behavior.CHECKPOINT_PAUSE: CHECKPOINT,
    Behavior.COMPACT_IN_PLACE: "Summary: the parser was discussed.",
}
LIMIT_BEHAVIORS = list(DEFAULTS)
CUSTOM = "Write the hand-over note as three bullet points: done, doing, next."


@pytest.fixture
def server() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer() as fake:
        yield fake


@contextlib.asynccontextmanager
async def connected(server: FakeAnthropicServer, **options: Any) -> AsyncIterator[Runtime]:
    async with (
        anthropic.AsyncAnthropic(api_key=KEY, base_url=server.url, max_retries=0) as client,
        Runtime(llm=AnthropicModel(client), **options) as rt,
    ):
        yield rt


def bodies(server: FakeAnthropicServer) -> list[dict[str, Any]]:
    return [dict(r.body) for r in server.message_requests()]


def texts(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if block["type"] == "text":
            parts.append(block["text"])
        elif block["type"] == "tool_result":
            inner = block.get("content", "")
            parts.append(inner if isinstance(inner, str) else texts({"content": inner}))
    return "\n".join(parts)


def instruction(body: dict[str, Any]) -> str:
    """The text of the last user message: where the limit's instruction goes."""
    return texts(body["messages"][-1])


def everything(body: dict[str, Any]) -> str:
    return str(body.get("system", "")) + "\n".join(texts(m) for m in body["messages"])


# --------------------------------------------------------------------------- the instruction


@requirement("REQ-SEG-040")
@pytest.mark.parametrize("custom", [CUSTOM, None], ids=["custom", "default"])
@pytest.mark.parametrize("behavior", LIMIT_BEHAVIORS)
def test_seg040_the_limits_request_asks_in_the_users_words(
    server: FakeAnthropicServer, tmp_path: Path, behavior: Behavior, custom: str | None
) -> None:
    server.enqueue(MessageReply(usage=SMALL), CROSSING, MessageReply(text=ANSWERS[behavior]))

    async def main() -> None:
        async with connected(server, store=SqliteStore(tmp_path / "s.db")) as rt:
            conv = await rt.create_conversation(
                model=MODEL, behavior=behavior, summary_prompt=custom
            )
            await rt.send(conv.id, "Hello.")
            await rt.send(conv.id, "Tell me everything.")
        asked = instruction(bodies(server)[2])
        if custom is None:
            assert DEFAULTS[behavior] in asked
        else:
            assert CUSTOM in asked
            assert DEFAULTS[behavior] not in asked

    asyncio.run(main())


@requirement("REQ-SEG-041")
@pytest.mark.parametrize("behavior", LIMIT_BEHAVIORS)
def test_seg041_a_manual_trigger_sends_its_focus(
    server: FakeAnthropicServer, tmp_path: Path, behavior: Behavior
) -> None:
    server.enqueue(MessageReply(usage=SMALL), MessageReply(text=ANSWERS[behavior]))
    focus = "the decision to drop the legacy tokenizer"

    async def main() -> None:
        async with connected(server, store=SqliteStore(tmp_path / "s.db")) as rt:
            conv = await rt.create_conversation(model=MODEL, behavior=behavior)
            await rt.send(conv.id, "Hello.")
            await rt.continue_manually(conv.id, focus=focus)
        asked = instruction(bodies(server)[1])
        assert DEFAULTS[behavior] in asked
        assert focus in asked

    asyncio.run(main())


def test_a_blank_focus_is_refused_before_anything_happens(tmp_path: Path) -> None:
    from segue import ScriptedModel

    async def main() -> None:
        model = ScriptedModel()
        async with Runtime(store=SqliteStore(tmp_path / "s.db"), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            with pytest.raises(ValueError, match="focus"):
                await rt.continue_manually(conv.id, focus="   ")
            assert (await rt.state(conv.id)).phase.kind == "idle"
            assert model.requests == []

    asyncio.run(main())


@requirement("REQ-SEG-045")
def test_seg045_the_summary_model_answers_the_limits_request_only(
    server: FakeAnthropicServer, tmp_path: Path
) -> None:
    server.enqueue(
        MessageReply(usage=SMALL),
        CROSSING,
        MessageReply(text="Summary.", usage=Usage(input_tokens=150_000, output_tokens=200)),
    )

    async def main() -> None:
        async with connected(server, store=SqliteStore(tmp_path / "s.db")) as rt:
            conv = await rt.create_conversation(model=MODEL, summary_model=SUMMARY_MODEL)
            await rt.send(conv.id, "Hello.")
            state = await rt.send(conv.id, "Tell me everything.")
            assert isinstance(state.phase, ContextExhausted)
            assert [body["model"] for body in bodies(server)] == [MODEL, MODEL, SUMMARY_MODEL]
            report = await rt.usage(conv.id)
            by_model = report.by_purpose_and_model
            assert by_model[("continuation", SUMMARY_MODEL)].output_tokens == 200
            assert by_model[("turn", MODEL)].output_tokens == 320
            assert set(report.by_model) == {MODEL, SUMMARY_MODEL}

    asyncio.run(main())


# --------------------------------------------------------------------------- pinned messages

PIN = "Always answer in French, and never delete the migrations folder."


@pytest.mark.parametrize(
    "behavior",
    [Behavior.COMPACT_IN_PLACE, Behavior.CHECKPOINT_RESTART, Behavior.THRESHOLD_BASED_CONTINUATION],
)
@requirement("REQ-SEG-042")
def test_seg042_a_pinned_message_survives_every_fresh_start_verbatim(
    server: FakeAnthropicServer, tmp_path: Path, behavior: Behavior
) -> None:
    server.enqueue(
        MessageReply(text="D'accord.", usage=SMALL),
        MessageReply(usage=Usage(input_tokens=5_000, output_tokens=20)),
        MessageReply(usage=Usage(input_tokens=7_000, output_tokens=20)),
        MessageReply(usage=Usage(input_tokens=9_000, output_tokens=20)),
        CROSSING,
        MessageReply(text=ANSWERS[behavior]),
        MessageReply(text="Bien."),
    )

    async def main() -> None:
        async with connected(
            server, store=SqliteStore(tmp_path / "s.db"), archive_dir=tmp_path / "a", keep_recent=2
        ) as rt:
            conv = await rt.create_conversation(model=MODEL, behavior=behavior)
            await rt.send(conv.id, PIN, pinned=True)
            for text in ("One.", "Two.", "Three."):
                await rt.send(conv.id, text)
            state = await rt.send(conv.id, "Four.")
            target = conv.id
            if behavior is Behavior.THRESHOLD_BASED_CONTINUATION:
                assert isinstance(state.phase, ContextExhausted)
                child = await rt.start_new_from(conv.id)
                assert child.pinned_tokens > 0
                target = child.id
            await rt.send(target, "Five.")
            messages = await rt.messages(target)
            assert [m.text for m in messages if m.message.pinned] == [PIN]
        first_after = bodies(server)[-1]
        sent = [texts(m) for m in first_after["messages"]]
        assert any(PIN in text for text in sent), sent  # carried, verbatim
        assert all("One." not in text for text in sent)  # while older history is gone
        assert "Five." in sent[-1]

    asyncio.run(main())


def test_pinned_text_beyond_its_budget_is_refused_when_sent(tmp_path: Path) -> None:
    from segue import ScriptedModel

    async def main() -> None:
        model = ScriptedModel(window=20_000)  # pinned messages may hold 5,000 tokens
        async with Runtime(store=SqliteStore(tmp_path / "s.db"), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL, context_window=20_000)
            await rt.send(conv.id, "a" * 9_000, pinned=True)  # about 3,000 tokens
            with pytest.raises(MessageRejectedError) as refused:
                await rt.send(conv.id, "b" * 9_000, pinned=True)
            assert refused.value.cause == "too_large"
            assert "pinned" in refused.value.reason
            assert "5,000" in refused.value.reason
            await rt.send(conv.id, "b" * 9_000)  # the same text, unpinned, is taken
            kinds = [(m.kind, m.message.pinned) for m in await rt.messages(conv.id)]
            assert kinds == [
                ("user", True),
                ("assistant", False),
                ("user", False),
                ("assistant", False),
            ]

    asyncio.run(main())


# --------------------------------------------------------------------------- tool output


async def flood(_tool_input: dict[str, Any]) -> str:
    return "".join(f"line {n:07d} of a very long listing\n" for n in range(30_000))[:1_000_000]


async def small(_tool_input: dict[str, Any]) -> str:
    return "exact output \u00e9\u4e2d\n" * 50


@requirement("REQ-SEG-043")
@pytest.mark.parametrize("archived", [True, False], ids=["archive_dir", "no_archive"])
def test_seg043_a_huge_tool_result_is_cut_on_the_wire_and_kept_whole_in_a_private_file(
    server: FakeAnthropicServer, tmp_path: Path, archived: bool
) -> None:
    server.enqueue(
        MessageReply(tool_uses=[ToolUse("flood", id="toolu_flood")], stop_reason="tool_use"),
        MessageReply(text="Read it.", usage=SMALL),
    )
    archive_dir = tmp_path / "archives" if archived else None
    tools = [Tool(name="flood", description="Lists everything.", function=flood)]

    async def main() -> str | None:
        async with connected(
            server, store=SqliteStore(tmp_path / "s.db"), tools=tools, archive_dir=archive_dir
        ) as rt:
            conv = await rt.create_conversation(model=MODEL)  # cap: 25,000 tokens
            state = await rt.send(conv.id, "List everything.")
            assert state.phase.kind == "idle"  # not exhausted by one tool
        result = texts(bodies(server)[1]["messages"][-1])
        whole = await flood({})
        assert len(result.encode("utf-8")) <= 25_000 * 3
        assert result.startswith(whole[:5_000])  # the head...
        assert result.endswith(whole[-5_000:])  # ... and the tail, verbatim
        assert "of this output were cut here" in result
        if not archived:
            assert "saved in" not in result
            return None
        (path,) = re.findall(r"The whole output is saved in (\S+)\.\]", result)
        return str(path)

    path = asyncio.run(main())
    if path is not None:
        saved = Path(path)
        assert saved.parent == tmp_path / "archives"
        assert stat.S_IMODE(saved.stat().st_mode) == 0o600
        assert (
            saved.read_text(encoding="utf-8")
            == "".join(f"line {n:07d} of a very long listing\n" for n in range(30_000))[:1_000_000]
        )


def test_a_short_tool_result_goes_byte_for_byte(
    server: FakeAnthropicServer, tmp_path: Path
) -> None:
    server.enqueue(
        MessageReply(tool_uses=[ToolUse("small", id="toolu_small")], stop_reason="tool_use"),
        MessageReply(text="Read it.", usage=SMALL),
    )
    tools = [Tool(name="small", description="Answers briefly.", function=small)]

    async def main() -> None:
        async with connected(
            server, store=SqliteStore(tmp_path / "s.db"), tools=tools, archive_dir=tmp_path / "a"
        ) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.send(conv.id, "Go.")
        (block,) = [
            b for b in bodies(server)[1]["messages"][-1]["content"] if b["type"] == "tool_result"
        ]
        content = block["content"]
        sent = content if isinstance(content, str) else "".join(b["text"] for b in content)
        assert sent == await small({})
        assert not (tmp_path / "a").exists()  # nothing saved for a result that fits

    asyncio.run(main())


# --------------------------------------------------------------------------- the time bound


class Clock:
    """The runtime's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@requirement("REQ-SEG-044")
@pytest.mark.parametrize("ran", [4_000.0, 100.0], ids=["past_the_bound", "within_it"])
def test_seg044_a_run_past_its_time_bound_stops_at_the_limit(
    server: FakeAnthropicServer, tmp_path: Path, ran: float
) -> None:
    server.enqueue(
        MessageReply(usage=SMALL),
        CROSSING,
        MessageReply(text=CHECKPOINT),
        MessageReply(text="Carrying on.", usage=SMALL),
    )
    clock = Clock()

    async def main() -> None:
        async with connected(server, store=SqliteStore(tmp_path / "s.db"), clock=clock) as rt:
            conv = await rt.create_conversation(
                model=MODEL, behavior=Behavior.CHECKPOINT_RESTART, max_run_seconds=3_600
            )
            await rt.send(conv.id, "Ship the parser.")
            clock.now += ran
            state = await rt.send(conv.id, "Go on.")
            if ran < 3_600:
                assert (state.session, state.phase.kind) == (2, "idle")  # restarted
                return
            assert isinstance(state.phase, Failed)
            assert state.phase.error_kind is ErrorKind.RUN_TIME_LIMIT
            assert "3,600 s" in state.phase.message
            assert len(bodies(server)) == 3  # the checkpoint was asked for; nothing after it
            assert (await rt.messages(conv.id))[-1].kind == "checkpoint"
            child = await rt.start_new_from(conv.id)
            seed = (await rt.messages(child.id))[0]
            assert "Ship the parser." in seed.text

    asyncio.run(main())


# --------------------------------------------------------------------------- pauses


@requirement("REQ-SEG-046")
def test_seg046_a_cancel_ends_a_pause(tmp_path: Path) -> None:
    from segue import ScriptedModel

    async def main() -> None:
        async with Runtime(store=SqliteStore(tmp_path / "s.db"), llm=ScriptedModel()) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.send(conv.id, "Hello.")
            paused = await rt.pause(conv.id, "lunch")
            assert paused.phase.kind == "paused"
            with pytest.raises(MessageRejectedError):
                await rt.send(conv.id, "Still there?")
            state = await rt.cancel(conv.id)
            assert (state.phase.kind, state.session) == ("idle", 1)
            assert len(await rt.store.snapshots(conv.id)) == 1  # the snapshot stays
            assert (await rt.send(conv.id, "Still there?")).phase.kind == "idle"

    asyncio.run(main())


def test_the_tool_output_archive_is_private(tmp_path: Path) -> None:
    from segue.executor.archive import write_tool_output

    path = write_tool_output(tmp_path / "x" / "y", "../../etc", "toolu_../1", "whole")
    assert path.parent == tmp_path / "x" / "y"
    assert ".." not in path.name
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "x").stat().st_mode) == 0o700
    assert os.sep not in path.name


@pytest.mark.slow
def test_a_pause_asked_from_another_process_is_taken_at_the_turns_boundary(
    tmp_path: Path,
) -> None:
    """An orchestrator's process pauses a conversation whose turn another process runs: the
    request goes through the store, the owner pauses at its next turn boundary (writing the
    checkpoint itself), and the orchestrator's call returns once the pause is taken."""
    import json
    import subprocess
    import sys

    from segue import ScriptedModel

    db = tmp_path / "shared.db"

    async def create() -> str:
        async with Runtime(store=SqliteStore(db), llm=ScriptedModel()) as rt:
            return (await rt.create_conversation(model=MODEL)).id

    cid = asyncio.run(create())
    worker = subprocess.Popen(  # noqa: S603  # our own worker, no shell
        [sys.executable, str(Path(__file__).with_name("gated_worker.py")), str(db), cid],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert worker.stdin is not None
    assert worker.stdout is not None
    try:
        assert json.loads(worker.stdout.readline() or "{}") == {"asked": True}
        ours = ScriptedModel()

        async def orchestrate() -> Any:
            async with Runtime(store=SqliteStore(db), llm=ours) as rt:
                pausing = asyncio.create_task(rt.pause(cid, "deploy window"))
                for _ in range(6_000):  # the pause reaches the store (read, across processes)
                    if (await rt.store.load(cid)).state.pause_requested:
                        break
                    await asyncio.sleep(0.01)
                assert worker.stdin is not None
                worker.stdin.write("answer now\n")
                worker.stdin.flush()
                return await asyncio.wait_for(pausing, timeout=60)

        state = asyncio.run(orchestrate())
    finally:
        out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    assert state.phase.kind == "paused"
    assert state.phase.snapshot.reason == "deploy window"
    result = json.loads(out.splitlines()[-1])
    assert (result["phase"], result["calls"]) == ("paused", 2)  # the turn, then the checkpoint
    assert ours.requests == []  # the owner did the work


@requirement("REQ-SEG-019")
def test_seg019_a_pause_from_another_runtime_is_forced_at_its_timeout(tmp_path: Path) -> None:
    """The runtime running the turn is not told to stop: its request is cancelled through the
    store, which makes its answer stale, and the asking runtime takes the pause."""
    from segue import ScriptedModel
    from segue.executor.model_port import LlmReply, LlmRequest

    class Gated(ScriptedModel):
        def __init__(self) -> None:
            super().__init__(reply_chars=30)
            self.asked = asyncio.Event()
            self.gate = asyncio.Event()

        async def complete(self, request: LlmRequest) -> LlmReply:
            self.asked.set()
            await self.gate.wait()
            return await super().complete(request)

    async def main() -> None:
        model = Gated()
        owner = Runtime(store=SqliteStore(tmp_path / "s.db"), llm=model)
        other = Runtime(store=SqliteStore(tmp_path / "s.db"), llm=ScriptedModel())
        cid = (await owner.create_conversation(model=MODEL)).id
        turn = asyncio.create_task(owner.send(cid, "a long task"))
        await model.asked.wait()
        state = await other.pause(cid, "deploy window", timeout=0.2)
        assert state.phase.kind == "paused"
        assert state.phase.snapshot.reason == "deploy window"
        model.gate.set()  # the owner's answer comes too late: stale, not stored
        assert (await turn).phase.kind == "paused"
        kinds = [m.kind for m in await other.messages(cid)]
        assert "assistant" not in kinds, kinds
        assert len(await other.store.snapshots(cid)) == 1
        await owner.close()
        await other.close()

    asyncio.run(main())


@pytest.mark.slow
@pytest.mark.parametrize("how", ["send", "stream"])
def test_a_pause_forced_from_another_process_cancels_the_turn_where_it_runs(
    tmp_path: Path, how: str
) -> None:
    """``pause(cid, timeout=2)`` from this process while a worker process's model call hangs:
    past the timeout the pause is forced through the store, and the worker, which runs the
    turn, notices: its model call is cancelled and its ``send()`` (or ``stream()``, whose last
    update says so) returns the paused state within about a second, not when the call ends.
    (``test_postgres_store`` runs it on PostgreSQL.)"""
    forced_pause_across_processes(str(tmp_path / "shared.db"), how)


def forced_pause_across_processes(where: str, how: str) -> None:
    """The scenario above on ``where`` (a SQLite path or a PostgreSQL conninfo)."""
    import json
    import select
    import subprocess
    import sys
    import time

    from segue import ScriptedModel
    from test_processes import open_store

    async def create() -> str:
        async with Runtime(store=open_store(where), llm=ScriptedModel()) as rt:
            return (await rt.create_conversation(model=MODEL)).id

    cid = asyncio.run(create())
    worker = subprocess.Popen(  # noqa: S603  # our own worker, no shell
        [sys.executable, str(Path(__file__).with_name("gated_worker.py")), where, cid, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    try:
        assert json.loads(worker.stdout.readline() or "{}") == {"asked": True}
        ours = ScriptedModel()

        async def force() -> tuple[Any, float, float]:
            async with Runtime(store=open_store(where), llm=ours) as rt:
                asked = time.time()
                state = await rt.pause(cid, "deploy window", timeout=2)
                return state, asked, time.time()

        state, asked, forced = asyncio.run(force())
        # The worker's answer is still held: its send returns only if its call was cancelled.
        ready, _, _ = select.select([worker.stdout], [], [], 10)
        assert ready, "the worker's turn went on after the forced pause"
        result = json.loads(worker.stdout.readline())
    finally:
        worker.communicate("answer now\n", timeout=120)  # its blocked read of the gate ends
    assert worker.returncode == 0
    assert state.phase.kind == "paused"
    assert state.phase.snapshot.reason == "deploy window"
    assert forced - asked < 4  # the 2 s wait, then the cancel and the checkpoint
    assert result["phase"] == "paused"
    assert result["cancelled_at"] is not None  # the hanging call itself was cancelled
    assert result["calls"] == 0  # ... and never answered; the checkpoint was ours
    assert result["returned_at"] - forced < 2.0, (result, forced)
    assert len(ours.requests) == 1  # the pause's checkpoint, written by the forcing process
    if how == "stream":
        assert result["updates"][-1] == "done"

    async def stored() -> list[str]:
        store = open_store(where)
        try:
            return [m.kind for m in await store.messages(cid)]
        finally:
            await store.close()

    assert "assistant" not in asyncio.run(stored())


def test_a_cancel_from_another_runtime_stops_the_call_where_the_turn_runs(
    tmp_path: Path,
) -> None:
    """Another runtime sharing the store cancels the turn: the runtime running it notices at
    its next look at the store, cancels its hanging model call, and its ``send()`` returns the
    cancelled (idle) conversation, without the call ever answering."""
    from segue import ScriptedModel
    from segue.executor.model_port import LlmReply, LlmRequest

    class Hanging(ScriptedModel):
        def __init__(self) -> None:
            super().__init__(reply_chars=30)
            self.asked = asyncio.Event()
            self.cancelled = False

        async def complete(self, request: LlmRequest) -> LlmReply:
            self.asked.set()
            try:
                await asyncio.sleep(120)
            except asyncio.CancelledError:
                self.cancelled = True
                raise
            return await super().complete(request)

    async def main() -> None:
        model = Hanging()
        async with (
            Runtime(store=SqliteStore(tmp_path / "s.db"), llm=model) as owner,
            Runtime(store=SqliteStore(tmp_path / "s.db"), llm=ScriptedModel()) as other,
        ):
            cid = (await owner.create_conversation(model=MODEL)).id
            turn = asyncio.create_task(owner.send(cid, "a long task"))
            await model.asked.wait()
            assert (await other.cancel(cid)).phase.kind == "idle"
            loop = asyncio.get_running_loop()
            cancelled_at = loop.time()
            state = await asyncio.wait_for(turn, timeout=10)
            assert loop.time() - cancelled_at < 2.5
            assert state.phase.kind == "idle"
            assert model.cancelled
            assert [m.kind for m in await other.messages(cid)] == ["user"]

    asyncio.run(main())
