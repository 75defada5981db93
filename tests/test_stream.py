"""``Runtime.stream`` and ``Runtime.watch``: a turn's updates as they happen.

The model is the offline ``ScriptedModel`` (it streams its text in pieces), the stores are real.
What is checked is what a chat UI relies on: the text deltas of a response join to exactly what
was stored, the meter follows the thresholds, ``done`` comes last with the final state and reply,
a consumer that leaves does not stop the turn, ``cancel()`` does, and refusals raise before the
first update. A turn streamed over each provider's real client (``anthropic``, ``openai``) is in
``test_runtime_providers`` (``test_a_turn_streams_over_the_real_client_as_the_server_sends_it``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from segue import (
    ContextExhaustionBehavior,
    ConversationExhaustedError,
    ConversationNotFoundError,
    ErrorKind,
    InvalidMessageError,
    LlmCallError,
    LlmReply,
    MemoryStore,
    MessageRejectedError,
    Runtime,
    ScriptedModel,
    SqliteStore,
    Store,
    ToolCall,
)
from segue.executor.tools import Tool
from segue.executor.updates import (
    DoneUpdate,
    OccupancyUpdate,
    TextUpdate,
    ToolFinishedUpdate,
    ToolStartedUpdate,
    Update,
)

MODEL = "claude-sonnet-4-5"
WINDOW = 3_000
StoreFactory = Callable[[], Store]


async def lookup(tool_input: dict[str, Any]) -> str:
    return f"result for {tool_input.get('query', '?')}"


LOOKUP = Tool(name="lookup", description="Look something up.", function=lookup)


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "memory":
        memory = MemoryStore()
        return lambda: memory
    return lambda: SqliteStore(tmp_path / "segue.db")


async def collect(updates: AsyncIterator[Update]) -> list[Update]:
    return [update async for update in updates]


def texts_by_response(updates: list[Update]) -> dict[int, str]:
    joined: dict[int, str] = {}
    for update in updates:
        if isinstance(update, TextUpdate):
            joined[update.response] = joined.get(update.response, "") + update.text
    return joined


def test_a_streamed_turn_tells_what_happens_in_order(make_store: StoreFactory) -> None:
    async def main() -> None:
        model = ScriptedModel(tool_every=1, reply_chars=300, chunk_chars=7)
        async with Runtime(store=make_store(), llm=model, tools=[LOOKUP]) as rt:
            conv = await rt.create_conversation(model=MODEL)
            updates = await collect(rt.stream(conv.id, "Look it up, please."))
            kinds = [u.kind for u in updates]
            assert kinds[0] == "user_message"
            assert kinds[-1] == "done"
            assert kinds.count("done") == 1
            assert kinds.index("tool_started") < kinds.index("tool_finished")
            started = next(u for u in updates if isinstance(u, ToolStartedUpdate))
            finished = next(u for u in updates if isinstance(u, ToolFinishedUpdate))
            assert (started.name, started.input) == ("lookup", {"query": "x"})
            assert (finished.id, finished.is_error, finished.output) == (
                started.id,
                False,
                "result for x",
            )
            # Each response's deltas join to exactly the assistant message stored for it.
            stored = [m.text for m in await rt.messages(conv.id) if m.kind == "assistant"]
            assert list(texts_by_response(updates).values()) == stored
            assert len(stored) == 2
            assert sum(isinstance(u, TextUpdate) for u in updates) > 10  # really streamed
            done = updates[-1]
            assert isinstance(done, DoneUpdate)
            assert done.state.phase.kind == "idle"
            assert done.reply == stored[-1] == await rt.last_reply(conv.id)
            meters = [u for u in updates if isinstance(u, OccupancyUpdate)]
            assert meters
            assert meters[-1].measured
            assert meters[-1].tokens == done.state.context_tokens

    asyncio.run(main())


def test_the_meter_warns_then_turns_critical_and_the_turn_ends_exhausted(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        model = ScriptedModel(window=WINDOW)
        async with Runtime(store=make_store(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            seen: list[Update] = []
            for index in range(40):
                updates = await collect(rt.stream(conv.id, f"Question {index}: more."))
                seen += updates
                last = updates[-1]
                assert isinstance(last, DoneUpdate)
                if last.state.phase.kind == "context_exhausted":
                    break
            levels = [u.level for u in seen if isinstance(u, OccupancyUpdate) and u.measured]
            assert "ok" in levels
            assert "warning" in levels
            assert levels[-1] == "critical"
            assert levels.index("ok") < levels.index("warning") < levels.index("critical")
            kinds = [u.kind for u in seen]
            assert kinds.count("warning") == 1
            assert kinds.index("warning") < kinds.index("exhausted")
            exhausted = next(u for u in seen if u.kind == "exhausted")
            summary = [m.text for m in await rt.messages(conv.id) if m.kind == "continuation"]
            assert [getattr(exhausted, "summary", None)] == summary
            with pytest.raises(ConversationExhaustedError):
                await collect(rt.stream(conv.id, "One more?"))

    asyncio.run(main())


def test_a_consumer_that_leaves_does_not_stop_the_turn(make_store: StoreFactory) -> None:
    async def main() -> None:
        model = ScriptedModel(reply_chars=400, chunk_chars=10, chunk_delay=0.005)
        async with Runtime(store=make_store(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            async for update in rt.stream(conv.id, "Tell me a long story."):
                if update.kind == "text":
                    break  # the browser tab closed
            for _ in range(200):
                if (await rt.state(conv.id)).phase.kind == "idle":
                    break
                await asyncio.sleep(0.01)
            state = await rt.state(conv.id)
            assert state.phase.kind == "idle"
            reply = await rt.last_reply(conv.id)
            assert reply is not None
            assert len(reply) == 400

    asyncio.run(main())


def test_cancel_stops_a_streamed_turn() -> None:
    async def main() -> None:
        model = ScriptedModel(reply_chars=400, chunk_chars=10, chunk_delay=0.02)
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            updates: list[Update] = []
            async for update in rt.stream(conv.id, "Tell me a long story."):
                updates.append(update)
                if update.kind == "text":
                    await rt.cancel(conv.id)
            done = updates[-1]
            assert isinstance(done, DoneUpdate)
            assert done.state.phase.kind == "idle"
            assert done.reply is None
            assert [m.kind for m in await rt.messages(conv.id)] == ["user"]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", InvalidMessageError),
        ("  \n\t", InvalidMessageError),
        ("half a surrogate \ud800 here", InvalidMessageError),
        (b"bytes are not text", TypeError),
        (None, TypeError),
    ],
)
def test_a_message_that_cannot_be_one_is_refused_before_anything_happens(
    text: Any, error: type[Exception]
) -> None:
    async def main() -> None:
        model = ScriptedModel()
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            with pytest.raises(error):
                await rt.send(conv.id, text)
            with pytest.raises(error):
                await collect(rt.stream(conv.id, text))
            assert await rt.messages(conv.id) == []
            assert await rt.store.transitions(conv.id) == []
            assert model.requests == []
            # And the conversation is fine afterwards.
            assert (await rt.send(conv.id, "Hello.")).phase.kind == "idle"

    asyncio.run(main())
    assert issubclass(InvalidMessageError, ValueError)


def test_a_watcher_sees_every_turn_and_unknown_ids_are_refused() -> None:
    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel()) as rt:
            conv = await rt.create_conversation(model=MODEL)
            seen: list[Update] = []
            ready = asyncio.Event()

            async def second_tab() -> None:
                async with rt.watch(conv.id) as watching:
                    ready.set()
                    async for update in watching:
                        seen.append(update)
                        if sum(u.kind == "done" for u in seen) == 2:
                            return

            tab = asyncio.ensure_future(second_tab())
            await ready.wait()
            await rt.send(conv.id, "First.")
            await rt.send(conv.id, "Second.")
            await asyncio.wait_for(tab, 5)
            said = [getattr(u, "text", None) for u in seen if u.kind == "user_message"]
            assert said == ["First.", "Second."]
            replies = [m.text for m in await rt.messages(conv.id) if m.kind == "assistant"]
            assert list(texts_by_response(seen).values()) == replies
            with pytest.raises(ConversationNotFoundError):
                await collect(rt.watch("no-such-conversation"))

    asyncio.run(main())


def test_failures_and_retries_are_told() -> None:
    async def main() -> None:
        overloaded = LlmCallError("overloaded", retryable=True, status_code=529)
        refused = LlmCallError("bad request", status_code=400)

        async def no_wait(_seconds: float) -> None:
            return None

        model = ScriptedModel([overloaded, LlmReply(text="Fine."), refused])
        async with Runtime(store=MemoryStore(), llm=model, sleep=no_wait) as rt:
            conv = await rt.create_conversation(model=MODEL)
            first = await collect(rt.stream(conv.id, "Hello?"))
            retry = next(u for u in first if u.kind == "retry")
            assert (getattr(retry, "request", None), getattr(retry, "attempt", None)) == ("llm", 2)
            assert texts_by_response(first) == {max(texts_by_response(first)): "Fine."}
            second = await collect(rt.stream(conv.id, "And now?"))
            failed = next(u for u in second if u.kind == "failed")
            assert getattr(failed, "error_kind", None) is ErrorKind.LLM_ERROR
            done = second[-1]
            assert isinstance(done, DoneUpdate)
            assert done.state.phase.kind == "failed"
            assert done.reply is None

    asyncio.run(main())


def test_a_sub_agents_updates_stay_out_of_its_parents_stream() -> None:
    async def main() -> None:
        calls = [ToolCall(id="toolu_1", name="ask_child", input={})]

        def parent_turn(request: Any) -> LlmReply:
            if request.messages[-1].kind == "tool_result":
                return LlmReply(text="The child said its piece.")
            return LlmReply(text="Asking.", tool_calls=tuple(calls), stop_reason="tool_use")

        def child_turn(_request: Any) -> LlmReply:
            return LlmReply(text="CHILD-ONLY-TEXT")

        model = ScriptedModel()
        async with Runtime(store=MemoryStore(), llm=model) as rt:

            async def ask_child(_input: dict[str, Any]) -> str:
                child = await rt.create_conversation(model=MODEL, parent_id=parent.id)
                model.extend([child_turn])
                await rt.send(child.id, "Say something.")
                return "asked"

            rt.tools.add(Tool(name="ask_child", description="Ask a child.", function=ask_child))
            parent = await rt.create_conversation(model=MODEL)
            model.extend([parent_turn, parent_turn])
            updates = await collect(rt.stream(parent.id, "Go."))
            assert [u.kind for u in updates].count("done") == 1
            assert "CHILD-ONLY-TEXT" not in "".join(texts_by_response(updates).values())
            assert updates[-1].kind == "done"

    asyncio.run(main())


def test_a_manual_continuation_while_a_request_is_in_flight_changes_nothing() -> None:
    async def main() -> None:
        model = ScriptedModel(delay=0.1)
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            sending = asyncio.ensure_future(rt.send(conv.id, "A question."))
            await asyncio.sleep(0.02)
            during = await rt.continue_manually(conv.id)
            assert during.phase.kind == "llm_requesting"
            after = await sending
            assert after.phase.kind == "idle"
            assert (await rt.state(conv.id)).phase.kind == "idle"
            assert [r.purpose for r in model.requests] == ["turn"]

    asyncio.run(main())


def test_continue_manually_from_idle_still_takes_the_exhaustion_path() -> None:
    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel()) as rt:
            conv = await rt.create_conversation(
                model=MODEL, behavior=ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION
            )
            await rt.send(conv.id, "Hello.")
            state = await rt.continue_manually(conv.id)
            assert state.phase.kind == "context_exhausted"

    asyncio.run(main())


def test_a_second_message_waits_for_the_turn_unless_told_not_to() -> None:
    async def main() -> None:
        model = ScriptedModel(delay=0.05)
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            # A streamed turn counts as running from its first step, before it takes the lock.
            first = rt.stream(conv.id, "First.")
            await anext(first)
            with pytest.raises(MessageRejectedError) as refused:
                await rt.send(conv.id, "Second, now.", wait=False)
            assert refused.value.cause == "busy"
            with pytest.raises(MessageRejectedError):
                await anext(rt.stream(conv.id, "Second, streamed, now.", wait=False))
            queued = asyncio.ensure_future(rt.send(conv.id, "Second, when it is my turn."))
            assert [u.kind async for u in first][-1] == "done"
            assert (await queued).phase.kind == "idle"
            users = [m.text for m in await rt.messages(conv.id) if m.kind == "user"]
            assert users == ["First.", "Second, when it is my turn."]
            await rt.send(conv.id, "Third, alone.", wait=False)  # nothing runs: taken at once

    asyncio.run(main())
