"""The tail a compaction keeps verbatim fits the room it has: in a small window a few long
messages kept whole would leave the compacted context above the threshold, and a conversation
that could go on would fail as "compaction ineffective"."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from segue import ContextExhaustionBehavior, MemoryStore, Usage
from segue.executor.model_port import LlmReply
from segue.executor.models.scripted import ScriptedModel
from segue.executor.runtime import Runtime
from segue.executor.transcript import DEFAULT_KEEP_RECENT, split_for_compaction
from segue.statemachine import Message, ToolCall
from segue.statemachine.accounting import estimate_content, estimate_tool_calls


def _estimate(messages: list[Message]) -> int:
    return sum(
        estimate_content(m.text, m.content) + estimate_tool_calls(m.tool_calls) for m in messages
    )


@st.composite
def views(draw: st.DrawFn) -> list[Message]:
    """A generation's messages: exchanges, some with a tool call and its result."""
    messages: list[Message] = []
    for turn in range(draw(st.integers(0, 8))):
        messages.append(Message(kind="user", text="u" * draw(st.integers(0, 3_000))))
        if draw(st.booleans()):
            call = ToolCall(id=f"t{turn}", name="lookup", input={"q": turn})
            messages.append(Message(kind="assistant", text="", tool_calls=(call,)))
            text = "r" * draw(st.integers(0, 3_000))
            messages.append(Message(kind="tool_result", text=text, tool_call_id=call.id))
        messages.append(Message(kind="assistant", text="a" * draw(st.integers(0, 3_000))))
    return messages


@given(views(), st.integers(0, 8), st.one_of(st.none(), st.integers(0, 3_000)))
def test_the_tail_fits_its_budget_and_keeps_every_result_with_its_call(
    view: list[Message], keep: int, budget: int | None
) -> None:
    head, tail = split_for_compaction(view, 1, keep, budget)
    assert head + tail == view  # one generation: the tail is the view's end, in order
    if budget is not None:
        assert _estimate(tail) <= budget
    unbounded = split_for_compaction(view, 1, keep)[1]
    assert len(tail) <= len(unbounded)
    assert unbounded == tail or budget is not None
    if tail:
        assert tail[0].kind != "tool_result"
    called = {call.id for m in tail for call in m.tool_calls}
    assert all(m.tool_call_id in called for m in tail if m.kind == "tool_result")


def test_a_small_window_compacts_in_place_though_its_last_messages_are_long() -> None:
    """Window 10,000 (threshold 9,000), replies of ~3,000 tokens: the six messages a compaction
    keeps by default hold three of them, so whole they would leave the context above the
    threshold. The tail is cut to what fits, and the conversation goes on."""
    long = "word " * 1_800  # 9,000 bytes: about 3,000 tokens by the estimate
    script = [
        LlmReply(text=long, usage=Usage(input_tokens=100, output_tokens=3_000)),
        LlmReply(text=long, usage=Usage(input_tokens=3_150, output_tokens=3_000)),
        LlmReply(text=long, usage=Usage(input_tokens=6_200, output_tokens=3_000)),
        LlmReply(text="SUMMARY: three questions, three long answers."),
        LlmReply(text="Short now.", usage=Usage(input_tokens=3_300, output_tokens=10)),
    ]

    async def main() -> None:
        model = ScriptedModel(script, window=10_000)
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            behavior = ContextExhaustionBehavior.COMPACT_IN_PLACE
            conv = await rt.create_conversation(model="claude-sonnet-4-5", behavior=behavior)
            await rt.send(conv.id, "One?")
            await rt.send(conv.id, "Two?")
            state = await rt.send(conv.id, "Three?")
            assert (state.phase.kind, state.generation) == ("idle", 2), state.phase
            summary = [m for m in await rt.messages(conv.id) if m.kind == "summary"][-1]
            assert 0 < summary.message.kept_messages < DEFAULT_KEEP_RECENT
            state = await rt.send(conv.id, "Four?")
            assert (state.phase.kind, state.generation) == ("idle", 2)

    asyncio.run(main())
