"""What a backend needs is importable from ``segue`` and reachable through ``Runtime``.

Checked as a user writes it (mypy checks this file too): the stores, the ports, the update types,
the id of the conversation running a tool, a failed state's error, the scripted model's reply
type, listing conversations, and the fake server from ``segue.testing``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import segue
from segue import (
    ContextExhaustionBehavior,
    ErrorKind,
    LlmCallError,
    LlmReply,
    MemoryStore,
    PostgresStore,
    Runtime,
    ScriptedModel,
    SqliteStore,
    Tool,
    current_conversation_id,
    failure_of,
)
from segue.testing import FakeAnthropicServer, capture_logs

MODEL = "claude-sonnet-4-5"


def test_the_public_surface_is_importable_from_segue() -> None:
    for name in segue.__all__:
        assert getattr(segue, name) is not None, name
    assert PostgresStore.__module__ == "segue.executor.stores.postgres"
    assert SqliteStore is segue.SqliteStore
    assert FakeAnthropicServer.__name__ == "FakeAnthropicServer"
    assert callable(capture_logs)


def test_conversations_are_listed_newest_first_with_their_child() -> None:
    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel()) as rt:
            first = await rt.create_conversation(model=MODEL)
            second = await rt.create_conversation(model=MODEL)
            assert [c.state.id for c in await rt.conversations()] == [second.id, first.id]
            await rt.send(first.id, "Hello.")
            await rt.continue_manually(first.id)
            child = await rt.start_new_from(first.id)
            stored = await rt.conversation(first.id)
            assert stored.child_id == child.id
            newest = await rt.conversations()
            assert newest[0].state.id == child.id

    asyncio.run(main())


def test_a_tool_knows_its_conversation_and_a_failure_is_readable() -> None:
    seen: list[str | None] = []

    async def where(_input: dict[str, Any]) -> str:
        seen.append(current_conversation_id.get())
        return "here"

    def ask_tool(_request: Any) -> LlmReply:
        call = segue.ToolCall(id="toolu_1", name="where", input={})
        return LlmReply(text="", tool_calls=(call,), stop_reason="tool_use")

    async def main() -> None:
        broken = LlmCallError("the model is gone", status_code=400)
        model = ScriptedModel([ask_tool, LlmReply(text="Done."), broken])
        tool = Tool(name="where", description="Where am I?", function=where)
        async with Runtime(store=MemoryStore(), llm=model, tools=[tool]) as rt:
            conv = await rt.create_conversation(
                model=MODEL, behavior=ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION
            )
            state = await rt.send(conv.id, "Where?")
            assert failure_of(state) is None
            assert seen == [conv.id]
            assert await rt.last_reply(conv.id) == "Done."
            failed = await rt.send(conv.id, "Again?")
            failure = failure_of(failed)
            assert failure is not None
            assert failure[0] is ErrorKind.LLM_ERROR
            assert "the model is gone" in failure[1]

    asyncio.run(main())
