"""The runtime end to end: whole conversations through ``Runtime`` on both stores.

The model is the offline ``ScriptedModel`` (usage per request, growing with the prompt, as a
provider reports it), the stores are the real ``MemoryStore`` and ``SqliteStore`` (a file in
``tmp_path``), tools are real coroutines. Each behaviour of ``docs/design.md`` section 2 is
driven to the place where it must end; the runtime's own duties (retries with back-off,
cancellation, tool failures as results, many conversations at once, sub-agents, one log line per
transition) are checked on the same footing. Regressions of fixed runtime bugs are at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from segue import (
    CANCELLED_SUMMARY,
    CHECKPOINT_PROMPT,
    ContextExhausted,
    ContextExhaustionBehavior,
    ConversationState,
    ErrorKind,
    Failed,
    Message,
    Paused,
    SessionSnapshot,
    ToolCall,
    Usage,
    extract_checkpoint,
)
from segue.executor.errors import (
    ConversationExhaustedError,
    LlmCallError,
    MessageRejectedError,
    SegueError,
)
from segue.executor.instructions import COMPACTION_INSTRUCTION, CONTINUATION_INSTRUCTION
from segue.executor.model_port import LlmReply, LlmRequest
from segue.executor.models.scripted import ScriptedModel, prompt_tokens
from segue.executor.runtime import Runtime
from segue.executor.store_port import Commit, Store, StoredConversation, StoredMessage
from segue.executor.stores.memory import MemoryStore
from segue.executor.stores.sqlite import SqliteStore
from segue.executor.subagent import subagent_tool
from segue.executor.tools import Tool
from segue.executor.transcript import TranscriptView, ViewSnapshot, current_view
from segue.testing.logs import capture_logs

MODEL = "claude-sonnet-4-5"
WINDOW = 3_000  # ScriptedModel(window=WINDOW): threshold 2,700, exhausted after a few turns
Behavior = ContextExhaustionBehavior
StoreFactory = Callable[[], Store]


async def lookup(tool_input: dict[str, Any]) -> str:
    """A tool that answers at once."""
    return f"result for {tool_input.get('query', '?')}"


LOOKUP = Tool(name="lookup", description="Look something up.", function=lookup)


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Opens the test's one store: the same ``MemoryStore``, or the same SQLite file, each time.

    A ``Runtime`` closes its store on exit, so a test that reopens gets a fresh ``SqliteStore``
    on the same file; ``MemoryStore.close`` keeps its data, so the same object serves again.
    """
    if request.param == "memory":
        memory = MemoryStore()
        return lambda: memory
    return lambda: SqliteStore(tmp_path / "segue.db")


class SleepRecorder:
    """The runtime's ``sleep``: records each back-off delay and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


async def send_until(
    rt: Runtime,
    conversation_id: str,
    done: Callable[[ConversationState], bool],
    *,
    limit: int = 40,
) -> ConversationState:
    """Send numbered questions until ``done(state)``; fail if ``limit`` sends do not get there."""
    for index in range(limit):
        state = await rt.send(conversation_id, f"Question {index}: tell me more.")
        if done(state):
            return state
    pytest.fail(f"{conversation_id} did not get there in {limit} sends")


def not_idle(state: ConversationState) -> bool:
    return state.phase.kind != "idle"


def kinds(messages: Sequence[StoredMessage]) -> list[str]:
    return [m.kind for m in messages]


def assert_paired(view: Sequence[Any]) -> None:
    """Every tool_result in ``view`` answers a tool_use of an earlier assistant message in it."""
    called: set[str] = set()
    for message in view:
        if message.kind == "assistant":
            called.update(call.id for call in message.tool_calls)
        if message.kind == "tool_result":
            assert message.tool_call_id in called, f"orphan tool_result in view: {message!r}"


# --------------------------------------------------------------------------- the four behaviours


def test_threshold_ends_read_only_and_continues_in_one_seeded_child(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        model = ScriptedModel(window=WINDOW, tool_every=2)
        effects: list[str] = []
        async with Runtime(store=make_store(), llm=model, tools=[LOOKUP]) as rt:
            rt.subscribe(lambda _cid, effect: effects.append(effect.kind))
            conv = await rt.create_conversation(model=MODEL, system="Be brief.")
            state = await send_until(rt, conv.id, not_idle)

            assert isinstance(state.phase, ContextExhausted)
            summary = state.phase.summary
            assert summary.startswith("Continuation summary")
            transcript = await rt.messages(conv.id)
            assert transcript[-1].kind == "continuation"
            assert transcript[-1].text == summary
            assert transcript[-2].kind == "assistant"  # the crossing response was kept
            asked = model.requests[-1]
            assert asked.purpose == "continuation"  # declared tools, none callable at the limit
            assert asked.tools == model.requests[0].tools
            assert asked.instruction == CONTINUATION_INSTRUCTION
            assert all(r.purpose == "turn" and r.tools for r in model.requests[:-1])
            assert effects.count("notify_context_warning") == 1
            assert effects.count("notify_context_exhausted") == 1

            asked_before = len(model.requests)
            with pytest.raises(ConversationExhaustedError, match=r"start_new_from") as info:
                await rt.send(conv.id, "One more thing.")
            assert conv.id in str(info.value)
            assert "read-only" in str(info.value)
            assert len(await rt.messages(conv.id)) == len(transcript)
            assert len(model.requests) == asked_before

            child = await rt.start_new_from(conv.id)
            again = await rt.start_new_from(conv.id)
            assert again.id == child.id != conv.id
            assert child.parent_id == conv.id
            assert child.behavior is Behavior.THRESHOLD_BASED_CONTINUATION
            seeded = await rt.messages(child.id)
            assert [(m.kind, m.text) for m in seeded] == [("summary", summary)]

            requests_before = len(model.requests)
            after = await rt.send(child.id, "Carry on.")
            assert after.phase.kind == "idle"
            first_turn = model.requests[requests_before]
            assert first_turn.conversation_id == child.id
            assert first_turn.system == "Be brief."
            assert [(m.kind, m.text) for m in first_turn.messages] == [
                ("summary", summary),
                ("user", "Carry on."),
            ]
            children = [c for c in await rt.store.list_conversations() if c.state.parent_id]
            assert [c.state.id for c in children] == [child.id]

    asyncio.run(main())


def test_start_new_from_refuses_a_conversation_that_is_not_exhausted(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        async with Runtime(store=make_store(), llm=ScriptedModel(window=WINDOW)) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.send(conv.id, "Hello.")
            with pytest.raises(SegueError, match="only a conversation that ended"):
                await rt.start_new_from(conv.id)

    asyncio.run(main())


def test_manual_continuation_summarises_an_idle_conversation(make_store: StoreFactory) -> None:
    async def main() -> None:
        model = ScriptedModel(window=WINDOW)
        async with Runtime(store=make_store(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.send(conv.id, "Hello.")
            state = await rt.continue_manually(conv.id)
            assert isinstance(state.phase, ContextExhausted)
            assert kinds(await rt.messages(conv.id)) == ["user", "assistant", "continuation"]
            assert [r.purpose for r in model.requests] == ["turn", "continuation"]

    asyncio.run(main())


def test_intentionally_unhandled_fails_with_context_exhausted_and_no_summary(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        model = ScriptedModel(window=WINDOW)
        async with Runtime(store=make_store(), llm=model) as rt:
            conv = await rt.create_conversation(
                model=MODEL, behavior=Behavior.INTENTIONALLY_UNHANDLED
            )
            state = await send_until(rt, conv.id, not_idle)
            assert isinstance(state.phase, Failed)
            assert state.phase.error_kind is ErrorKind.CONTEXT_EXHAUSTED
            assert all(r.purpose == "turn" for r in model.requests)
            assert set(kinds(await rt.messages(conv.id))) == {"user", "assistant"}
            with pytest.raises(MessageRejectedError, match="context_exhausted"):
                await rt.send(conv.id, "Still there?")

    asyncio.run(main())


def test_checkpoint_restart_continues_in_a_new_session_seeded_with_the_checkpoint(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        model = ScriptedModel(window=WINDOW)
        async with Runtime(store=make_store(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL, behavior=Behavior.CHECKPOINT_RESTART)
            state = await send_until(rt, conv.id, lambda s: s.session > 1 or not_idle(s))
            assert state.phase.kind == "idle"
            assert (state.session, state.continuations) == (2, 1)
            checkpoint_request = model.requests[-1]
            assert checkpoint_request.purpose == "checkpoint"
            assert checkpoint_request.tools == model.requests[0].tools
            assert checkpoint_request.instruction == CHECKPOINT_PROMPT

            transcript = await rt.messages(conv.id)
            written = [m for m in transcript if m.kind == "checkpoint"]
            assert len(written) == 1
            seed = next(m for m in transcript if m.message.session == 2)
            assert seed.kind == "user"
            checkpoint = extract_checkpoint(written[0].text)
            assert f"<checkpoint>\n{checkpoint}\n</checkpoint>" in seed.text
            assert "## Remaining Tasks" in seed.text

            await rt.send(conv.id, "Next step, please.")
            turn = model.requests[-1]
            assert turn.purpose == "turn"
            assert [m.text for m in turn.messages] == [seed.text, "Next step, please."]
            assert {m.session for m in turn.messages} == {2}

    asyncio.run(main())


def test_checkpoint_restart_stops_at_the_bound_on_continuations(make_store: StoreFactory) -> None:
    async def main() -> None:
        model = ScriptedModel(window=WINDOW)
        async with Runtime(store=make_store(), llm=model) as rt:
            conv = await rt.create_conversation(
                model=MODEL, behavior=Behavior.CHECKPOINT_RESTART, max_continuations=2
            )
            state = await send_until(rt, conv.id, not_idle, limit=60)
            assert isinstance(state.phase, Failed)
            assert state.phase.error_kind is ErrorKind.CONTINUATION_LIMIT
            assert (state.session, state.continuations) == (3, 2)
            transcript = await rt.messages(conv.id)
            assert kinds(transcript).count("checkpoint") == 2
            # The third exhaustion fails at once: no third checkpoint is asked for.
            assert [r.purpose for r in model.requests].count("checkpoint") == 2

    asyncio.run(main())


def test_checkpoint_too_big_for_a_fresh_session_fails_instead_of_looping(
    make_store: StoreFactory,
) -> None:
    def respond(request: LlmRequest) -> LlmReply:
        if request.purpose == "checkpoint":  # about 10,000 tokens: over the 9,000 threshold
            return LlmReply(text=f"<checkpoint>\n## Goal\n{'x' * 30_000}\n</checkpoint>")
        return LlmReply(text="Working.", usage=Usage(input_tokens=9_200))

    async def main() -> None:
        model = ScriptedModel([respond] * 5, window=10_000)
        async with Runtime(store=make_store(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL, behavior=Behavior.CHECKPOINT_RESTART)
            state = await rt.send(conv.id, "Do the whole job.")
            assert isinstance(state.phase, Failed)
            assert state.phase.error_kind is ErrorKind.CHECKPOINT_OVERFLOW
            assert (state.session, state.continuations) == (1, 0)
            assert [r.purpose for r in model.requests] == ["turn", "checkpoint"]
            assert kinds(await rt.messages(conv.id)) == ["user", "assistant", "checkpoint"]

    asyncio.run(main())


CALL = ToolCall(id="toolu_look", name="lookup", input={"query": "tides"})


def compaction_script() -> list[LlmReply]:
    """Two turns, the second with a tool call; its final answer crosses the threshold."""
    return [
        LlmReply(text="First answer.", usage=Usage(input_tokens=1_000, output_tokens=10)),
        LlmReply(
            text="Let me look.",
            tool_calls=(CALL,),
            stop_reason="tool_use",
            usage=Usage(input_tokens=1_500, output_tokens=10),
        ),
        LlmReply(text="Second answer.", usage=Usage(input_tokens=9_500, output_tokens=10)),
        LlmReply(text="SUMMARY: the user asked about tides."),
    ]


def test_compact_in_place_archives_privately_and_keeps_the_tail_paired(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    archive_dir = tmp_path / "archives"
    evil = "../../etc/passwd"

    async def main() -> None:
        model = ScriptedModel(compaction_script(), window=10_000)  # threshold 9,000
        async with Runtime(
            store=make_store(), llm=model, tools=[LOOKUP], archive_dir=archive_dir, keep_recent=2
        ) as rt:
            conv = await rt.create_conversation(
                model=MODEL, behavior=Behavior.COMPACT_IN_PLACE, conversation_id=evil
            )
            assert (await rt.send(conv.id, "Hi.")).generation == 1
            state = await rt.send(conv.id, "What about the tides?")
            assert state.phase.kind == "idle"
            assert (state.generation, state.continuations) == (2, 1)
            compaction = model.requests[-1]
            assert compaction.purpose == "compaction"
            assert compaction.tools == model.requests[0].tools
            assert compaction.instruction == COMPACTION_INSTRUCTION

            transcript = await rt.messages(conv.id)
            generation_one = [m.message for m in transcript if m.message.generation == 1]
            summary = transcript[-1]
            assert summary.kind == "summary"
            assert summary.text == "SUMMARY: the user asked about tides."
            # keep_recent=2 would cut between the tool call and its result: the tail grows back.
            assert summary.message.kept_messages == 3
            tail = generation_one[-3:]
            assert [m.kind for m in tail] == ["assistant", "tool_result", "assistant"]

            await rt.send(conv.id, "And tomorrow?")
            view = list(model.requests[-1].messages)
            assert view[0].kind == "summary"
            assert view[1:4] == tail
            assert [m.text for m in view[4:]] == ["And tomorrow?"]
            assert_paired(view)

        # The archive: one private file, in a private directory, named safely from the id.
        assert stat.S_IMODE(archive_dir.stat().st_mode) == 0o700
        files = list(archive_dir.iterdir())
        assert len(files) == 1
        archive = files[0]
        assert os.sep not in archive.name
        assert ".." not in archive.name
        assert archive.resolve().parent == archive_dir.resolve()
        assert stat.S_IMODE(archive.stat().st_mode) == 0o600
        assert not (tmp_path / "etc").exists()
        lines = archive.read_text(encoding="utf-8").splitlines()
        assert json.loads(lines[0]) == {"conversation_id": evil, "generation": 1}
        archived = [json.loads(line)["text"] for line in lines[1:]]
        assert archived == [m.text for m in generation_one]

    asyncio.run(main())


def test_compaction_goes_on_when_the_archive_cannot_be_written(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the archive directory should be", encoding="utf-8")

    async def main() -> None:
        model = ScriptedModel(compaction_script(), window=10_000)
        async with Runtime(
            store=make_store(), llm=model, tools=[LOOKUP], archive_dir=blocked / "archives"
        ) as rt:
            conv = await rt.create_conversation(model=MODEL, behavior=Behavior.COMPACT_IN_PLACE)
            await rt.send(conv.id, "Hi.")
            with capture_logs() as logs:
                state = await rt.send(conv.id, "What about the tides?")
            assert (state.phase.kind, state.generation) == ("idle", 2)
            assert [e["event"] for e in logs].count("archive_failed") == 1

    asyncio.run(main())


# --------------------------------------------------------------------------- runtime duties


def test_retryable_errors_back_off_then_succeed(make_store: StoreFactory) -> None:
    async def main() -> None:
        overloaded = LlmCallError("overloaded", retryable=True, status_code=529)
        model = ScriptedModel([overloaded, overloaded, LlmReply(text="Finally.")])
        sleep = SleepRecorder()
        async with Runtime(store=make_store(), llm=model, sleep=sleep) as rt:
            conv = await rt.create_conversation(model=MODEL)
            state = await rt.send(conv.id, "Hello?")
            assert state.phase.kind == "idle"
            assert sleep.delays == [1.0, 2.0]
            assert len(model.requests) == 3
            transcript = await rt.messages(conv.id)
            assert [(m.kind, m.text) for m in transcript] == [
                ("user", "Hello?"),
                ("assistant", "Finally."),
            ]

    asyncio.run(main())


def test_retries_are_bounded_and_the_conversation_recovers(make_store: StoreFactory) -> None:
    async def main() -> None:
        overloaded = LlmCallError("overloaded", retryable=True, status_code=529)
        model = ScriptedModel([overloaded] * 4)
        sleep = SleepRecorder()
        async with Runtime(store=make_store(), llm=model, sleep=sleep) as rt:
            conv = await rt.create_conversation(model=MODEL)
            state = await rt.send(conv.id, "Hello?")
            assert isinstance(state.phase, Failed)
            assert state.phase.error_kind is ErrorKind.RETRIES_EXHAUSTED
            assert sleep.delays == [1.0, 2.0, 4.0]
            assert len(model.requests) == 4
            again = await rt.send(conv.id, "Try again.")
            assert again.phase.kind == "idle"
            assert kinds(await rt.messages(conv.id)) == ["user", "user", "assistant"]

    asyncio.run(main())


def test_a_fatal_error_is_not_retried(make_store: StoreFactory) -> None:
    async def main() -> None:
        denied = LlmCallError("bad key", retryable=True, fatal=True, status_code=401)
        model = ScriptedModel([denied])
        sleep = SleepRecorder()
        async with Runtime(store=make_store(), llm=model, sleep=sleep) as rt:
            conv = await rt.create_conversation(model=MODEL)
            state = await rt.send(conv.id, "Hello?")
            assert isinstance(state.phase, Failed)
            assert state.phase.error_kind is ErrorKind.LLM_ERROR
            assert sleep.delays == []

    asyncio.run(main())


async def wait_for_requests(model: ScriptedModel, count: int) -> None:
    async with asyncio.timeout(5):
        while len(model.requests) < count:  # noqa: ASYNC110  # the model has no event to await
            await asyncio.sleep(0.005)


def test_cancel_during_an_llm_call_returns_to_idle(make_store: StoreFactory) -> None:
    async def main() -> None:
        slow = ScriptedModel(delay=30)
        async with Runtime(store=make_store(), llm=slow) as rt:
            conv = await rt.create_conversation(model=MODEL)
            running = asyncio.create_task(rt.send(conv.id, "Take your time."))
            await wait_for_requests(slow, 1)
            cancelled = await rt.cancel(conv.id)
            assert cancelled.phase.kind == "idle"
            returned = await asyncio.wait_for(running, 5)
            assert returned.phase.kind == "idle"
            assert kinds(await rt.messages(conv.id)) == ["user"]

            rt.llm = fast = ScriptedModel()
            state = await rt.send(conv.id, "Quick one.")
            assert state.phase.kind == "idle"
            assert kinds(await rt.messages(conv.id)) == ["user", "user", "assistant"]
            assert [m.text for m in fast.requests[0].messages] == [
                "Take your time.",
                "Quick one.",
            ]

    asyncio.run(main())


def test_cancel_during_tools_answers_every_call(make_store: StoreFactory) -> None:
    started = asyncio.Event()

    async def stuck(_input: dict[str, Any]) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    async def main() -> None:
        call = ToolCall(id="toolu_stuck", name="stuck", input={})
        model = ScriptedModel([LlmReply(text="Running it.", tool_calls=(call,))])
        tools = [Tool(name="stuck", description="Never ends.", function=stuck)]
        async with Runtime(store=make_store(), llm=model, tools=tools) as rt:
            conv = await rt.create_conversation(model=MODEL)
            running = asyncio.create_task(rt.send(conv.id, "Run the stuck tool."))
            await asyncio.wait_for(started.wait(), 5)
            state = await rt.cancel(conv.id)
            assert state.phase.kind == "idle"
            assert (await asyncio.wait_for(running, 5)).phase.kind == "idle"
            transcript = await rt.messages(conv.id)
            assert kinds(transcript) == ["user", "assistant", "tool_result"]
            assert transcript[-1].message.is_error
            assert transcript[-1].message.tool_call_id == call.id
            state = await rt.send(conv.id, "Never mind.")
            assert state.phase.kind == "idle"
            assert_paired(model.requests[-1].messages)

    asyncio.run(main())


def test_cancel_while_summarising_ends_with_the_cancelled_summary(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        summary_started = asyncio.Event()

        def respond(request: LlmRequest) -> LlmReply:
            if request.purpose == "continuation":
                summary_started.set()
            return LlmReply(text="Answer.", usage=Usage(input_tokens=9_500))

        model = ScriptedModel([respond, respond], window=10_000, delay=0.05)
        async with Runtime(store=make_store(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            running = asyncio.create_task(rt.send(conv.id, "Hello."))
            await wait_for_requests(model, 2)
            assert model.requests[-1].purpose == "continuation"
            state = await rt.cancel(conv.id)
            assert isinstance(state.phase, ContextExhausted)
            assert state.phase.summary == CANCELLED_SUMMARY
            await asyncio.wait_for(running, 5)
            assert not summary_started.is_set()  # the summary reply never came back
            transcript = await rt.messages(conv.id)
            assert (transcript[-1].kind, transcript[-1].text) == (
                "continuation",
                CANCELLED_SUMMARY,
            )

    asyncio.run(main())


def test_tool_failures_become_error_results(make_store: StoreFactory) -> None:
    async def boom(_input: dict[str, Any]) -> str:
        raise RuntimeError("kaboom")

    async def slow(_input: dict[str, Any]) -> str:
        await asyncio.sleep(30)
        return "too late"

    async def main() -> None:
        calls = (
            ToolCall(id="toolu_boom", name="boom", input={}),
            ToolCall(id="toolu_slow", name="slow", input={}),
            ToolCall(id="toolu_ghost", name="ghost", input={}),
            ToolCall(id="toolu_ok", name="lookup", input={"query": "tides"}),
        )
        model = ScriptedModel(
            [LlmReply(text="Trying four tools.", tool_calls=calls), LlmReply(text="Done.")]
        )
        tools = [
            Tool(name="boom", description="Raises.", function=boom),
            Tool(name="slow", description="Hangs.", function=slow, timeout=0.05),
            LOOKUP,
        ]
        async with Runtime(store=make_store(), llm=model, tools=tools) as rt:
            conv = await rt.create_conversation(model=MODEL)
            state = await rt.send(conv.id, "Use every tool.")
            assert state.phase.kind == "idle"
            results = {
                m.message.tool_call_id: m.message
                for m in await rt.messages(conv.id)
                if m.kind == "tool_result"
            }
            assert set(results) == {call.id for call in calls}
            assert results["toolu_boom"].is_error
            assert "kaboom" in results["toolu_boom"].text
            assert results["toolu_slow"].is_error
            assert "timed out" in results["toolu_slow"].text
            assert results["toolu_ghost"].is_error
            assert "Unknown tool 'ghost'" in results["toolu_ghost"].text
            assert not results["toolu_ok"].is_error
            assert results["toolu_ok"].text == "result for tides"
            second = model.requests[1]
            assert [m.kind for m in second.messages].count("tool_result") == 4
            assert_paired(second.messages)

    asyncio.run(main())


def test_a_hundred_conversations_at_once(make_store: StoreFactory) -> None:
    """Even conversations run a tool turn and a plain turn; odd ones cross the threshold at
    their first answer, end exhausted, and refuse their second message."""

    def respond(request: LlmRequest) -> LlmReply:
        cid = request.conversation_id
        if request.purpose == "continuation":
            return LlmReply(text=f"Summary of {cid}.")
        if int(cid[1:]) % 2:
            return LlmReply(text=f"Big answer for {cid}.", usage=Usage(input_tokens=2_800))
        if len(request.messages) == 1:
            call = ToolCall(id=f"toolu_{cid}", name="lookup", input={"query": cid})
            return LlmReply(text="Looking.", tool_calls=(call,), stop_reason="tool_use")
        return LlmReply(text=f"Answer for {cid}.")

    async def main() -> None:
        model = ScriptedModel([respond] * 1_000, window=WINDOW, delay=0.001)
        async with Runtime(store=make_store(), llm=model, tools=[LOOKUP]) as rt:
            ids = [f"c{index:03d}" for index in range(100)]
            await asyncio.gather(
                *(rt.create_conversation(model=MODEL, conversation_id=cid) for cid in ids)
            )

            async def talk(cid: str) -> ConversationState:
                await rt.send(cid, f"first from {cid}")
                return await rt.send(cid, f"second from {cid}")

            outcomes = await asyncio.gather(*(talk(cid) for cid in ids), return_exceptions=True)
            for index, (cid, outcome) in enumerate(zip(ids, outcomes, strict=True)):
                state = await rt.state(cid)
                texts = [(m.kind, m.text) for m in await rt.messages(cid)]
                if index % 2:
                    assert isinstance(outcome, ConversationExhaustedError), cid
                    assert isinstance(state.phase, ContextExhausted), cid
                    assert texts == [
                        ("user", f"first from {cid}"),
                        ("assistant", f"Big answer for {cid}."),
                        ("continuation", f"Summary of {cid}."),
                    ]
                else:
                    assert isinstance(outcome, ConversationState), outcome
                    assert outcome.phase.kind == state.phase.kind == "idle", cid
                    assert texts == [
                        ("user", f"first from {cid}"),
                        ("assistant", "Looking."),
                        ("tool_result", f"result for {cid}"),
                        ("assistant", f"Answer for {cid}."),
                        ("user", f"second from {cid}"),
                        ("assistant", f"Answer for {cid}."),
                    ]
            for request in model.requests:  # every request saw only its own conversation
                for message in request.messages:
                    if message.kind in ("user", "tool_result"):
                        assert message.text.endswith(request.conversation_id)

    asyncio.run(main())


HUGE_TASK = "Read all of this and report: " + "lorem ipsum dolor " * 25_000  # ~150k tokens
CHILD_MODEL = "claude-sonnet-4-5"  # 200k window: the sub-agent's threshold is 180,000
PARENT_MODEL = "claude-sonnet-4-6"  # 1M window: the huge task is nothing to the parent


def test_a_sub_agent_exhausts_and_the_parent_respawns_it(make_store: StoreFactory) -> None:
    big = ToolCall(id="toolu_big", name="subagent", input={"task": HUGE_TASK})
    small = ToolCall(id="toolu_small", name="subagent", input={"task": "Just the title."})

    async def main() -> None:
        model = ScriptedModel(
            [
                LlmReply(text="Delegating.", tool_calls=(big,), stop_reason="tool_use"),
                LlmReply(text="y" * 100_000),  # child 1: its answer crosses 180,000
                LlmReply(text="Narrower.", tool_calls=(small,), stop_reason="tool_use"),
                LlmReply(text="The title is Lorem."),  # child 2
                LlmReply(text="The sub-agent says: The title is Lorem."),
            ]
        )
        async with Runtime(store=make_store(), llm=model) as rt:
            rt.tools.add(subagent_tool(rt, model=CHILD_MODEL))
            parent = await rt.create_conversation(model=PARENT_MODEL)
            state = await rt.send(parent.id, "Summarise the document with a sub-agent.")
            assert state.phase.kind == "idle"

            results = [m.message for m in await rt.messages(parent.id) if m.kind == "tool_result"]
            assert [r.tool_call_id for r in results] == [big.id, small.id]
            assert results[0].is_error
            assert "context_exhausted" in results[0].text
            assert not results[1].is_error
            assert results[1].text == "The title is Lorem."

            children = [c.state for c in await rt.store.list_conversations() if c.state.parent_id]
            assert [c.parent_id for c in children] == [parent.id, parent.id]
            assert all(c.behavior is Behavior.INTENTIONALLY_UNHANDLED for c in children)
            first, second = children
            assert isinstance(first.phase, Failed)
            assert first.phase.error_kind is ErrorKind.CONTEXT_EXHAUSTED
            assert first.id in results[0].text
            assert second.phase.kind == "idle"

    asyncio.run(main())


def test_one_transition_log_entry_per_committed_transition(make_store: StoreFactory) -> None:
    async def main() -> None:
        model = ScriptedModel(window=WINDOW, tool_every=2)
        async with Runtime(store=make_store(), llm=model, tools=[LOOKUP]) as rt:
            conv = await rt.create_conversation(model=MODEL, system="secret-system-prompt")
            with capture_logs() as logs:
                await send_until(rt, conv.id, not_idle)
            records = await rt.store.transitions(conv.id)
            entries = [e for e in logs if e["event"] == "transition"]
            assert len(entries) == len(records) > 8
            for entry, record in zip(entries, records, strict=True):
                assert entry["conversation_id"] == conv.id
                assert entry["log_level"] == "info"
                assert entry["event_kind"] == record.event_kind
                assert (entry["from_phase"], entry["to_phase"]) == (
                    record.from_phase,
                    record.to_phase,
                )
                assert entry["context_tokens"] == record.context_tokens
                assert tuple(entry["effects"]) == record.effect_kinds
            assert entries[-1]["to_phase"] == "context_exhausted"
            assert any(e["context_tokens"] for e in entries)
            assert "secret-system-prompt" not in repr(logs)
            assert "Question 0" not in repr(logs)  # message text stays out of the logs

    asyncio.run(main())


# ------------------------------------------------------------------ regressions of fixed bugs


def test_pause_while_busy_takes_effect_at_the_next_turn_boundary() -> None:
    async def main() -> None:
        model = ScriptedModel(delay=0.2)
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL, behavior=Behavior.CHECKPOINT_RESTART)
            running = asyncio.create_task(rt.send(conv.id, "Work on it."))
            await wait_for_requests(model, 1)
            await rt.pause(conv.id, "operator asked")
            state = await asyncio.wait_for(running, 5)
            assert isinstance(state.phase, Paused)

    asyncio.run(main())


def test_a_callers_timeout_around_send_still_raises() -> None:
    async def main() -> None:
        model = ScriptedModel(delay=30)
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await rt.send(conv.id, "Hello.")

    asyncio.run(main())


def test_closing_while_summarising_leaves_the_summary_request_pending() -> None:
    async def main() -> None:
        store = MemoryStore()
        crossing = LlmReply(text="Answer.", usage=Usage(input_tokens=9_500))
        model = ScriptedModel([crossing], window=10_000, delay=0.05)
        rt = Runtime(store=store, llm=model)
        conv = await rt.create_conversation(model=MODEL)
        running = asyncio.create_task(rt.send(conv.id, "Hello."))
        await wait_for_requests(model, 2)  # the continuation request is in flight
        await rt.close()
        await asyncio.gather(running, return_exceptions=True)
        assert (await store.load(conv.id)).state.phase.kind == "awaiting_continuation"
        async with Runtime(store=store, llm=ScriptedModel(window=10_000)) as again:
            state = await again.state(conv.id)
        assert isinstance(state.phase, ContextExhausted)
        assert state.phase.summary.startswith("Continuation summary")

    asyncio.run(main())


def test_scripted_model_trims_an_overflowing_summary_request() -> None:
    history = [Message(kind="user", text="x" * 600) for _ in range(8)]  # ~1,660 tokens
    request = LlmRequest(
        conversation_id="c1",
        model=MODEL,
        purpose="continuation",
        system=None,
        messages=history,
        instruction=CONTINUATION_INSTRUCTION,
        trim_level=3,  # AnthropicModel drops 4 of the 8 messages here: ~830 tokens remain
    )
    reply = asyncio.run(ScriptedModel(window=1_000).complete(request))
    assert reply.text.startswith("Continuation summary")


class HookedSqliteStore(SqliteStore):
    """The real ``SqliteStore``; as the commit of an ``event_kind`` event (a tool result unless
    told) begins, it starts ``on_tool_result``.

    The started task's first step runs while the commit is still in the store's thread (its
    result can only be delivered on a later turn of the loop), so it lands exactly between
    two effects of the conversation: nothing is in flight, and the drive holds the lock.
    """

    def __init__(self, path: Path, event_kind: str = "tool_result") -> None:
        super().__init__(path)
        self.event_kind = event_kind
        self.on_tool_result: Callable[[], Coroutine[Any, Any, ConversationState]] | None = None
        self.started: list[asyncio.Task[ConversationState]] = []

    async def commit(self, commit: Commit) -> StoredConversation:
        if commit.event_kind == self.event_kind and self.on_tool_result is not None:
            self.started.append(asyncio.get_running_loop().create_task(self.on_tool_result()))
        return await super().commit(commit)


def test_cancel_between_two_effects_stops_the_turn(tmp_path: Path) -> None:
    async def main() -> None:
        model = ScriptedModel(
            [LlmReply(text="Checking.", tool_calls=(CALL,)), LlmReply(text="Too late.")]
        )
        store = HookedSqliteStore(tmp_path / "segue.db")
        async with Runtime(store=store, llm=model, tools=[LOOKUP]) as rt:
            conv = await rt.create_conversation(model=MODEL)
            store.on_tool_result = lambda: rt.cancel(conv.id)
            await asyncio.wait_for(rt.send(conv.id, "Look it up."), 5)
            (cancelling,) = store.started
            state = await asyncio.wait_for(cancelling, 5)
            assert state.phase.kind == "idle"
            assert kinds(await rt.messages(conv.id)) == ["user", "assistant", "tool_result"]
            assert len(model.requests) == 1  # no LLM call after the user pressed stop

    asyncio.run(main())


def test_a_second_runtime_on_the_same_store_sees_the_whole_history(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        model = ScriptedModel()
        async with (
            Runtime(store=make_store(), llm=model) as first,
            Runtime(store=make_store(), llm=model) as second,
        ):
            conv = await first.create_conversation(model=MODEL)
            await first.send(conv.id, "one")
            await second.send(conv.id, "two")  # e.g. the CLI, while a server holds the first
            await first.send(conv.id, "three")
            sent = [m.text for m in model.requests[-1].messages if m.kind == "user"]
            assert sent == ["one", "two", "three"]

    asyncio.run(main())


# ------------------------------------------------------------- cost per request, locks, views


class CountingStore(MemoryStore):
    """The real ``MemoryStore``, counting the calls a runtime makes and the messages it reads."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}
        self.messages_read = 0

    def reset(self) -> None:
        self.calls.clear()
        self.messages_read = 0

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    async def load(self, conversation_id: str) -> StoredConversation:
        self._count("load")
        return await super().load(conversation_id)

    async def commit(self, commit: Commit) -> StoredConversation:
        self._count("commit")
        return await super().commit(commit)

    async def messages(
        self, conversation_id: str, *, after_seq: int = 0, before_seq: int | None = None
    ) -> list[StoredMessage]:
        self._count("messages")
        read = await super().messages(conversation_id, after_seq=after_seq, before_seq=before_seq)
        self.messages_read += len(read)
        return read


def test_a_send_reads_nothing_it_knows_and_catches_up_with_other_writers() -> None:
    """Per-send store work does not grow with the transcript: a send commits twice and reads
    nothing back; after another runtime wrote, its stale copy is refused by the version check,
    and it loads the conversation and reads just the messages it has not seen."""

    async def main() -> None:
        store = CountingStore()
        model = ScriptedModel()
        async with (
            Runtime(store=store, llm=model) as first,
            Runtime(store=store, llm=model) as second,
        ):
            conv = await first.create_conversation(model=MODEL)
            for index in range(40):
                await first.send(conv.id, f"message {index}")
            store.reset()
            await first.send(conv.id, "one more")
            assert store.calls == {"commit": 2}  # its own commits tell it all it needs
            assert len(model.requests[-1].messages) == 81

            await second.send(conv.id, "from elsewhere")  # a cold runtime reads it all once
            assert store.messages_read == 83
            store.reset()
            await first.send(conv.id, "and back")
            # The two messages the other runtime wrote and its own new one, not all 85.
            assert store.messages_read == 3
            assert store.calls == {"commit": 3, "load": 1, "messages": 1}  # one commit refused
            users = [m.text for m in model.requests[-1].messages if m.kind == "user"]
            assert users[-3:] == ["one more", "from elsewhere", "and back"]
            assert len(users) == 43

    asyncio.run(main())


def test_locks_are_dropped_once_nobody_holds_or_awaits_them(make_store: StoreFactory) -> None:
    async def main() -> None:
        model = ScriptedModel(delay=0.01)
        async with Runtime(store=make_store(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            # Two sends at once: the second waits for the first, so the lock must outlive the
            # first drive; each send still sees the other's messages.
            await asyncio.gather(rt.send(conv.id, "first"), rt.send(conv.id, "second"))
            assert kinds(await rt.messages(conv.id)) == ["user", "assistant"] * 2
            assert [m.text for m in model.requests[1].messages if m.kind == "user"] == [
                "first",
                "second",
            ]
            await rt.pause(conv.id, "lunch")
            await rt.resume(conv.id)
            await rt.cancel(conv.id)
            others = [(await rt.create_conversation(model=MODEL)).id for _ in range(20)]
            await asyncio.gather(*(rt.send(cid, "hello") for cid in others))
            assert not rt._locks  # every conversation's lock was let go

    asyncio.run(main())


def test_a_cancel_of_an_idle_conversation_leaves_no_flag_behind(make_store: StoreFactory) -> None:
    async def main() -> None:
        model = ScriptedModel()
        async with Runtime(store=make_store(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            assert (await rt.cancel(conv.id)).phase.kind == "idle"
            state = await rt.send(conv.id, "Still there?")
            assert state.phase.kind == "idle"
            assert kinds(await rt.messages(conv.id)) == ["user", "assistant"]
            assert len(model.requests) == 1
            log = [t.event_kind for t in await rt.store.transitions(conv.id)]
            assert log == ["user_cancel", "user_message", "llm_response"]

    asyncio.run(main())


def _reference_view(transcript: Sequence[Message], session: int, generation: int) -> list[Message]:
    """The view computed from scratch, as ``current_view`` did before it was incremental."""
    in_session = [m for m in transcript if m.session == session]
    summary_at = None
    for index in range(len(in_session) - 1, -1, -1):
        if in_session[index].kind == "summary" and in_session[index].generation == generation:
            summary_at = index
            break
    if summary_at is None:
        return [m for m in in_session if m.generation == generation]
    summary = in_session[summary_at]
    before = [
        m for m in in_session[:summary_at] if m.generation == generation - 1 and m.kind != "summary"
    ]
    keep = summary.kept_messages
    kept = before[max(0, len(before) - keep) :] if keep else []
    after = [m for m in in_session[summary_at + 1 :] if m.generation == generation]
    return [summary, *kept, *after]


_transcripts = st.lists(
    st.builds(
        Message,
        kind=st.sampled_from(["user", "assistant", "tool_result", "summary"]),
        text=st.text(alphabet="abc", max_size=2),
        session=st.integers(1, 2),
        generation=st.integers(1, 3),
        kept_messages=st.integers(0, 4),
    ),
    max_size=30,
)


@given(transcript=_transcripts, session=st.integers(1, 2), generation=st.integers(1, 3))
def test_the_incremental_view_is_the_view_of_every_prefix(
    transcript: list[Message], session: int, generation: int
) -> None:
    view = TranscriptView(session, generation)
    taken: list[tuple[ViewSnapshot, list[Message]]] = []
    for seq, message in enumerate(transcript, 1):
        view.add(seq, message)
        snapshot = view.snapshot()
        expected = _reference_view(transcript[:seq], session, generation)
        assert list(snapshot) == expected
        assert snapshot == expected
        assert len(snapshot) == len(expected)
        assert [snapshot[i] for i in range(-len(expected), len(expected))] == expected * 2
        assert snapshot[1:] == expected[1:]
        taken.append((snapshot, expected))
    for snapshot, expected in taken:  # later messages never show up in an earlier request
        assert list(snapshot) == expected
    assert current_view(transcript, session, generation) == _reference_view(
        transcript, session, generation
    )
    with pytest.raises(ValueError, match="does not follow"):
        view.add(view.last_seq + 2, Message(kind="user"))


def test_a_runtime_whose_copy_is_behind_still_refuses_an_exhausted_conversation(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        model = ScriptedModel(window=WINDOW)
        async with (
            Runtime(store=make_store(), llm=model) as first,
            Runtime(store=make_store(), llm=model) as second,
        ):
            conv = await first.create_conversation(model=MODEL)
            await first.send(conv.id, "Hello.")  # first now holds an idle copy
            state = await send_until(second, conv.id, not_idle)
            assert isinstance(state.phase, ContextExhausted)
            transcript = await first.messages(conv.id)
            asked = len(model.requests)
            with pytest.raises(ConversationExhaustedError, match="start_new_from"):
                await first.send(conv.id, "One more thing.")
            assert await first.messages(conv.id) == transcript
            assert len(model.requests) == asked
            assert isinstance((await first.state(conv.id)).phase, ContextExhausted)

    asyncio.run(main())


def test_conversations_evicted_from_the_cache_are_read_back_whole(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("segue.executor.cache.CACHE_SIZE", 2)

    async def main() -> None:
        model = ScriptedModel()
        async with Runtime(store=make_store(), llm=model) as rt:
            ids = [(await rt.create_conversation(model=MODEL)).id for _ in range(3)]
            for turn in range(3):
                for cid in ids:  # each send evicts the conversation that comes next
                    await rt.send(cid, f"{cid} turn {turn}")
                    sent = [m.text for m in model.requests[-1].messages if m.kind == "user"]
                    assert sent == [f"{cid} turn {t}" for t in range(turn + 1)]
                    assert len(model.requests[-1].messages) == 2 * turn + 1
            assert len(rt._cache) == 2

    asyncio.run(main())


def test_cancel_after_the_model_asked_for_tools_runs_none_of_them(tmp_path: Path) -> None:
    """The cancel lands between the response that asks for a tool and the tool's run: the tool
    never runs, its call is answered as not run, and the request to run it leaves the outbox."""

    async def main() -> None:
        ran: list[str] = []

        async def recorded(tool_input: dict[str, Any]) -> str:
            ran.append(str(tool_input))
            return "ran"

        model = ScriptedModel([LlmReply(text="Checking.", tool_calls=(CALL,))])
        store = HookedSqliteStore(tmp_path / "segue.db", event_kind="llm_response")
        tool = Tool(name="lookup", description="Look something up.", function=recorded)
        async with Runtime(store=store, llm=model, tools=[tool]) as rt:
            conv = await rt.create_conversation(model=MODEL)
            store.on_tool_result = lambda: rt.cancel(conv.id)
            await asyncio.wait_for(rt.send(conv.id, "Look it up."), 5)
            (cancelling,) = store.started
            state = await asyncio.wait_for(cancelling, 5)
            assert state.phase.kind == "idle"
            assert ran == []
            transcript = await rt.messages(conv.id)
            assert kinds(transcript) == ["user", "assistant", "tool_result"]
            assert transcript[-1].message.tool_call_id == CALL.id
            assert (await rt.store.load(conv.id)).pending == ()
            assert len(model.requests) == 1

    asyncio.run(main())


def test_exact_preflight_counts_each_recorded_message_once(make_store: StoreFactory) -> None:
    """With exact pre-flight the model is asked to count the prompt each user message and tool
    result would make, and the projection it gives pre-flight is that count exactly."""

    async def main() -> None:
        model = ScriptedModel(window=50_000, tool_every=1, exact_preflight=True)
        async with Runtime(store=make_store(), llm=model, tools=[LOOKUP]) as rt:
            conv = await rt.create_conversation(model=MODEL)
            state = await rt.send(conv.id, "Look up the tides.")
            assert state.phase.kind == "idle"
            last = [request.messages[-1].kind for request in model.counted]
            assert last == ["user", "tool_result"]
            log = await rt.store.transitions(conv.id)
            recorded = [
                json.loads(t.event_json)["token_count"]
                for t in log
                if t.event_kind in ("user_message", "tool_result")
            ]
            assert len(recorded) == 2
            assert all(isinstance(tokens, int) for tokens in recorded)
            # The first count is the whole first prompt: nothing was measured before it.
            assert recorded[0] == prompt_tokens(model.counted[0])

    asyncio.run(main())


# --------------------------------------------------------------------------- cancel and pause flags


class SlowModel(ScriptedModel):
    """Takes 0.2 s to answer, and says when a request has reached it."""

    def __init__(self) -> None:
        super().__init__(delay=0.2)
        self.asked = asyncio.Event()

    async def complete(self, request: LlmRequest) -> LlmReply:
        self.asked.set()
        return await super().complete(request)


async def sending(store: Store) -> tuple[Runtime, SlowModel, str, asyncio.Task[Any]]:
    """A send whose LLM request is in flight when it returns: the runtime, its model, the
    conversation id and the send's task."""
    model = SlowModel()
    rt = Runtime(store=store, llm=model)
    conv = await rt.create_conversation(model=MODEL)
    task = asyncio.create_task(rt.send(conv.id, "a long question"))
    await model.asked.wait()
    return rt, model, conv.id, task


def test_a_cancel_whose_commit_loses_a_race_still_stops_the_turn() -> None:
    """The cancel's first commit is refused (another runtime wrote in between); the flag stays
    until a commit lands, so the request is never performed again."""

    async def main() -> None:
        store = MemoryStore()
        a, model, cid, send = await sending(store)
        b = Runtime(store=store, llm=ScriptedModel(delay=1.0))
        # Refused as busy (a's request is in flight), which moves the version.
        other = asyncio.create_task(b.send(cid, "from another tab", wait=False))
        await asyncio.sleep(0.01)
        state = await a.cancel(cid)
        assert state.phase.kind == "idle"
        _, refusal = await asyncio.gather(send, other, return_exceptions=True)
        assert isinstance(refusal, MessageRejectedError)
        assert refusal.cause == "busy"
        assert a.owner in str(refusal)  # who is busy
        assert len(model.requests) == 1
        kinds = [t.event_kind for t in await store.transitions(cid)]
        assert kinds[-1] == "user_cancel"
        assert "llm_response" not in kinds
        assert (await store.load(cid)).pending == ()

    asyncio.run(main())


def test_a_cancel_whose_caller_gives_up_still_stops_the_turn() -> None:
    async def main() -> None:
        store = MemoryStore()
        rt, _, cid, send = await sending(store)
        cancelling = asyncio.create_task(rt.cancel(cid))
        await asyncio.sleep(0)  # cancel() has flagged the turn and waits for the lock
        cancelling.cancel()  # its caller hung up
        with pytest.raises(asyncio.CancelledError):
            await cancelling
        assert (await send).phase.kind == "idle"
        loaded = await store.load(cid)
        assert (loaded.state.phase.kind, loaded.pending) == ("idle", ())

    asyncio.run(main())


class SlowSnapshots(MemoryStore):
    """A store whose snapshot write takes a while, like a round trip to a database."""

    async def save_snapshot(self, snapshot: SessionSnapshot) -> None:
        await asyncio.sleep(0.2)
        await super().save_snapshot(snapshot)


def test_a_cancel_during_a_snapshot_write_keeps_the_snapshot() -> None:
    """A notification in flight is let finish: cancelling it would lose the snapshot. The
    cancel then ends the pause it arrived during (REQ-SEG-046), and the snapshot stays."""

    async def main() -> None:
        store = SlowSnapshots()
        model = ScriptedModel()
        rt = Runtime(store=store, llm=model)
        conv = await rt.create_conversation(model=MODEL, system="SYS")
        await rt.send(conv.id, "hello")
        pausing = asyncio.create_task(rt.pause(conv.id, "break"))
        await asyncio.sleep(0.1)  # the drive is inside SaveSnapshot
        await rt.cancel(conv.id)
        assert (await pausing).phase.kind == "idle"
        (snapshot,) = await store.snapshots(conv.id)
        assert (snapshot.version, snapshot.reason) == (1, "break")
        assert snapshot.created_at is not None  # written whole, with what the runtime adds
        await rt.send(conv.id, "and now?")  # the same session goes on
        assert model.requests[-1].system == "SYS"

    asyncio.run(main())


def test_a_cancel_abandons_a_pause_asked_for_during_the_turn() -> None:
    async def main() -> None:
        store = MemoryStore()
        rt, _, cid, send = await sending(store)
        await rt.pause(cid, "later")  # taken at the next turn boundary...
        await rt.cancel(cid)  # ...unless the turn is cancelled first (REQ-SEG-021)
        assert (await send).phase.kind == "idle"
        kinds = [t.event_kind for t in await store.transitions(cid)]
        assert kinds == ["user_message", "user_cancel"]

    asyncio.run(main())


def test_a_pause_while_something_else_holds_the_lock_is_taken_at_once(tmp_path: Path) -> None:
    """Only a drive reads a pause request; while start_new_from holds the lock the pause waits
    for it, so it neither lingers nor pauses a later, unrelated turn. (SQLite: its reads yield,
    so start_new_from is still holding the lock when the pause arrives.)"""

    async def main() -> None:
        rt = Runtime(store=SqliteStore(tmp_path / "segue.db"), llm=ScriptedModel())
        conv = await rt.create_conversation(model=MODEL)
        await rt.send(conv.id, "hello")
        refusing = asyncio.create_task(rt.start_new_from(conv.id))  # idle: it will refuse
        await asyncio.sleep(0)
        assert (await rt.pause(conv.id, "lunch")).phase.kind == "paused"
        with pytest.raises(SegueError, match="only a conversation that ended"):
            await refusing
        await rt.resume(conv.id)
        assert (await rt.send(conv.id, "much later")).phase.kind == "idle"
        await rt.close()

    asyncio.run(main())


def test_the_scripted_model_keeps_only_its_latest_requests() -> None:
    """An offline server or a soak answers millions of requests: the scripted model remembers
    the latest ``remember`` of them (what a test reads), never every prompt it saw."""

    async def main() -> None:
        model = ScriptedModel(remember=3, exact_preflight=True)
        rt = Runtime(store=MemoryStore(), llm=model)
        conv = await rt.create_conversation(model=MODEL)
        for number in range(10):
            await rt.send(conv.id, f"message {number}")
        assert 3 <= len(model.requests) < 6
        assert len(model.counted) < 6
        last = [m.text for m in model.requests[-1].messages if m.kind == "user"]
        assert last[-1] == "message 9"  # the newest are the ones kept
        await rt.close()

    asyncio.run(main())
    with pytest.raises(ValueError, match="remember"):
        ScriptedModel(remember=0)
