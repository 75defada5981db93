"""Claude compacts its own context, and clears old tool results, offline.

Runs offline: ``python examples/provider_context.py``. The unmodified ``anthropic`` client talks
to segue's fake of the Messages API (``segue.testing.anthropic_server``), which does what the
API does with a request's ``context_management``: it compacts the conversation once the prompt
reaches the compaction edit's trigger (the reply starts with the ``compaction`` block, which
segue keeps and sends back verbatim), and it clears old tool uses past a ``clear_tool_uses``
edit's trigger (the reply says how many, and the input tokens it saved).

Two conversations show the two:

- ``compaction="provider"`` on a ``COMPACT_IN_PLACE`` conversation: segue asks Claude to compact
  at the conversation's threshold (60% of a 100,000-token window here) in the same call that
  answers, rather than in a summary request of its own; each compaction is a new generation.
- ``context_edits=[...]``: the API's own edit objects, sent with every request; a turn's stream
  tells what was cleared (``context_edited``) and the meter follows the usage that no longer
  counts it.

With Claude, pass ``AsyncAnthropic()`` (your ``ANTHROPIC_API_KEY``) instead of the fake's URL.
"""

from __future__ import annotations

import asyncio

import anthropic

from segue import AnthropicModel, ContextExhaustionBehavior, MemoryStore, Runtime, Tool
from segue.testing.anthropic_server import FakeAnthropicServer, MessageReply, ToolUse

PART = "lorem ipsum dolor " * 2_000
"""About 12,000 tokens: five of them pass the 60,000-token threshold."""
CLEAR_OLD_TOOL_USES = {
    "type": "clear_tool_uses_20250919",
    "trigger": {"type": "input_tokens", "value": 20_000},
    "keep": {"type": "tool_uses", "value": 1},
}


async def read_log(tool_input: dict[str, object]) -> str:
    """A tool whose results are long: what context editing clears first."""
    return PART[:18_000]


async def compaction(client: anthropic.AsyncAnthropic) -> None:
    async with Runtime(store=MemoryStore(), llm=AnthropicModel(client)) as rt:
        conversation = await rt.create_conversation(
            model="claude-sonnet-4-6",
            behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE,
            compaction="provider",  # Claude compacts at the threshold, in its own call
            context_window=100_000,
            warning_threshold=0.5,
            continuation_threshold=0.6,
        )
        turns = 0
        state = conversation
        while state.generation == 1:
            turns += 1
            async for update in rt.stream(conversation.id, f"Part {turns}: {PART}"):
                if update.kind == "compacted":
                    print(f"turn {turns}: Claude compacted the context (generation 2)")
            state = await rt.state(conversation.id)
        report = await rt.usage(conversation.id)
        print(
            f"after it: {state.context_tokens:,} of 100,000 tokens, {state.phase.kind}; "
            f"the compaction wrote {report.by_purpose['provider_compaction'].output_tokens:,} "
            "tokens, in the call that answered"
        )


async def context_editing(client: anthropic.AsyncAnthropic) -> None:
    tools = [Tool(name="read_log", description="Read a log.", function=read_log)]
    async with Runtime(store=MemoryStore(), llm=AnthropicModel(client), tools=tools) as rt:
        conversation = await rt.create_conversation(
            model="claude-sonnet-4-6", context_window=100_000, context_edits=[CLEAR_OLD_TOOL_USES]
        )
        async for update in rt.stream(conversation.id, "Read the four logs."):
            if update.kind == "context_edited":
                print(
                    f"Claude cleared {update.cleared} old tool use(s), "
                    f"{update.cleared_input_tokens:,} input tokens"
                )
        state = await rt.state(conversation.id)
        print(f"the meter reads {state.context_tokens:,} tokens: the cleared ones are not counted")


async def main() -> None:
    with FakeAnthropicServer(default=MessageReply(text="Noted.")) as server:
        async with anthropic.AsyncAnthropic(api_key="offline", base_url=server.url) as client:
            await compaction(client)
            # The model reads four logs, one tool call a reply, then answers.
            reading = [
                MessageReply(text="", tool_uses=(ToolUse("read_log", {"n": n}),)) for n in range(4)
            ]
            server.enqueue(*reading, MessageReply(text="All four logs read."))
            await context_editing(client)


if __name__ == "__main__":
    asyncio.run(main())
