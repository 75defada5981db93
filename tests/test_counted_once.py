"""The driver counts an event's tokens once, before it commits.

With a model that counts prompts (``exact_preflight``), a message and each tool result get an
exact token count from ``count_tokens``: a call to the provider. ``Commits`` decides a step
again when another writer moved the conversation on (a conflict), when the store was locked,
and when it checks a refusal on the store's own copy; none of these asks the model again, since
the driver counted the event before it handed it to ``Commits``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from segue import LlmReply, Runtime, ScriptedModel, ToolCall, Usage
from segue.executor.errors import ConcurrentUpdateError
from segue.executor.store_port import Commit, StoredConversation
from segue.executor.stores.sqlite import SqliteStore
from segue.executor.tools import Tool

MODEL = "claude-sonnet-4-5"


class WatchedStore(SqliteStore):
    """The real SQLite store, counting the commits it refused as conflicts."""

    conflicts = 0

    async def commit(self, commit: Commit) -> StoredConversation:
        try:
            return await super().commit(commit)
        except ConcurrentUpdateError:
            self.conflicts += 1
            raise


async def lookup(tool_input: dict[str, Any]) -> str:
    return f"found {tool_input.get('q')}"


def test_a_step_is_counted_once_when_its_commit_is_decided_again_after_a_conflict(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shared.db"
    model = ScriptedModel(
        [
            LlmReply(text="One."),
            LlmReply(
                text="Looking.",
                tool_calls=(ToolCall(id="toolu_1", name="lookup", input={"q": "tides"}),),
                usage=Usage(input_tokens=1_000, output_tokens=10),
                stop_reason="tool_use",
            ),
            LlmReply(text="High tide at noon."),
        ],
        exact_preflight=True,
    )

    async def scenario() -> None:
        store = WatchedStore(path)
        tools = [Tool(name="lookup", description="Look up.", function=lookup)]
        here = Runtime(store=store, llm=model, tools=tools)
        elsewhere = Runtime(store=SqliteStore(path), llm=ScriptedModel())
        try:
            cid = (await here.create_conversation(model=MODEL)).id
            await here.send(cid, "first")  # this runtime keeps the conversation as it left it
            await elsewhere.send(cid, "second")  # another moves it on: that copy is stale
            counted = len(model.counted)
            state = await here.send(cid, "When is high tide?")
        finally:
            await here.close()
            await elsewhere.close()
        assert store.conflicts >= 1  # the message's commit was refused and decided again
        assert state.phase.kind == "idle"
        # One count for the message (decided twice), one for the tool's result.
        asked = model.counted[counted:]
        assert len(asked) == 2
        assert asked[0].messages[-1].text == "When is high tide?"
        assert asked[1].messages[-1].kind == "tool_result"

    asyncio.run(scenario())
