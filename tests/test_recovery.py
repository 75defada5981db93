"""A summary that is refused is asked for again, and a compaction that fails leaves the
conversation usable: through ``Runtime`` and the real ``anthropic`` client, checked on the wire.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic

from segue import AnthropicModel, ContextExhaustionBehavior, MemoryStore, Runtime
from segue.executor.instructions import (
    ALTERNATE_COMPACTION_INSTRUCTION,
    ALTERNATE_CONTINUATION_INSTRUCTION,
    COMPACTION_INSTRUCTION,
    CONTINUATION_INSTRUCTION,
)
from segue.testing.anthropic_server import ErrorReply, FakeAnthropicServer, MessageReply, Usage

MODEL = "claude-sonnet-4-6"  # the fake reports a 200k window
FULL = Usage(input_tokens=1_000, output_tokens=100, cache_read_input_tokens=180_000)


def last_text(body: dict[str, Any]) -> str:
    content = body["messages"][-1]["content"]
    return content[-1]["text"] if isinstance(content, list) else str(content)


async def run(server: FakeAnthropicServer, behavior: ContextExhaustionBehavior) -> Runtime:
    client = anthropic.AsyncAnthropic(api_key="sk-test-recovery", base_url=server.url)
    return Runtime(store=MemoryStore(), llm=AnthropicModel(client), sleep=lambda _s: _no_wait())


async def _no_wait() -> None:
    return None


def test_a_refused_continuation_summary_is_asked_for_again_in_other_words() -> None:
    with FakeAnthropicServer() as server:
        server.enqueue(
            MessageReply(text="A long answer.", usage=FULL),
            MessageReply(text="I can't do that.", stop_reason="refusal"),
            MessageReply(text="They asked about tides; answered; nothing open."),
        )

        async def main() -> None:
            rt = await run(server, ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION)
            async with rt:
                conv = await rt.create_conversation(model=MODEL)
                state = await rt.send(conv.id, "Tides?")
                assert state.phase.kind == "context_exhausted"
                assert getattr(state.phase, "summary", "").startswith("They asked about tides")

        asyncio.run(main())
        asks = [last_text(r.body) for r in server.message_requests()[1:]]
    assert asks == [CONTINUATION_INSTRUCTION, ALTERNATE_CONTINUATION_INSTRUCTION]


def test_a_failed_compaction_leaves_the_conversation_usable_and_compaction_is_retried() -> None:
    refused = ErrorReply(400, "invalid_request_error", "summaries are not allowed today")
    with FakeAnthropicServer() as server:
        server.enqueue(
            MessageReply(text="A long answer.", usage=FULL),
            refused,
            MessageReply(text="", usage=Usage(input_tokens=500)),  # empty: asked again
            MessageReply(text="Older work: tides.", usage=Usage(input_tokens=400)),
            MessageReply(text="Still here.", usage=Usage(input_tokens=2_000)),
        )

        async def main() -> None:
            rt = await run(server, ContextExhaustionBehavior.COMPACT_IN_PLACE)
            async with rt:
                conv = await rt.create_conversation(
                    model=MODEL, behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE
                )
                state = await rt.send(conv.id, "Tides?")
                assert (state.phase.kind, state.generation) == ("idle", 1)  # rolled back
                notices = [t for t in await rt.store.transitions(conv.id) if t.to_phase == "idle"]
                assert "notify_compaction_failed" in notices[-1].effect_kinds
                state = await rt.send(conv.id, "Are you there?")
                assert (state.phase.kind, state.generation) == ("idle", 2)  # compacted now
                usage = await rt.usage(conv.id)
                # The empty answer that was asked again was paid for too.
                assert usage.by_purpose["compaction"].input_tokens == 500 + 400

        asyncio.run(main())
        asks = [last_text(r.body) for r in server.message_requests()]
    assert asks[1] == COMPACTION_INSTRUCTION
    assert asks[2] == COMPACTION_INSTRUCTION
    assert asks[3] == ALTERNATE_COMPACTION_INSTRUCTION
