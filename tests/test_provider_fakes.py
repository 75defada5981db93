"""The fake servers compact and edit the context as the providers do, checked against the
providers' own types (REQ-SEG-048 to REQ-SEG-051).

An application tests its own code offline against ``segue.testing``'s fakes, so what they
answer must be what the official SDKs parse: every answer here is read with the SDK's own types
(``BetaMessage``, ``BetaRawMessageStreamEvent``, ``Response``, ``CompactedResponse``) or through
the SDK's own client, never by the fake's own reading of itself.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types.beta import (
    BetaClearThinking20251015EditResponse,
    BetaClearToolUses20250919EditResponse,
    BetaCompactionBlock,
    BetaCompactionIterationUsage,
    BetaMessage,
    BetaMessageIterationUsage,
    BetaRawMessageStreamEvent,
)
from openai.types.responses import Response, ResponseCompactionItem
from pydantic import TypeAdapter

from segue.testing.anthropic_managed import CLEARED, COMPACTION_BETA, CONTEXT_EDITING_BETA
from segue.testing.anthropic_server import Compacted, FakeAnthropicServer, MessageReply
from segue.testing.openai_compaction import summary_of
from segue.testing.openai_server import FakeOpenAIServer, Reply

MODEL = "claude-sonnet-4-6"
BIG = "lorem ipsum dolor " * 3_000  # about 18,000 tokens as the fakes count
BETAS = {"anthropic-beta": f"{COMPACTION_BETA},{CONTEXT_EDITING_BETA}", "x-api-key": "k"}
EVENTS: TypeAdapter[BetaRawMessageStreamEvent] = TypeAdapter(BetaRawMessageStreamEvent)


def compact(trigger: int = 50_000, *, pause: bool = False) -> dict[str, Any]:
    return {
        "type": "compact_20260112",
        "trigger": {"type": "input_tokens", "value": trigger},
        "pause_after_compaction": pause,
    }


def body(*edits: dict[str, Any], messages: list[Any] | None = None, **more: Any) -> dict[str, Any]:
    history = messages or [
        {"role": "user", "content": BIG},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": BIG},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": BIG + " And the tides?"},
    ]
    return {
        "model": MODEL,
        "max_tokens": 100,
        "messages": history,
        "context_management": {"edits": list(edits)},
        **more,
    }


def post_status(
    server: Any, path: str, payload: object, headers: dict[str, str]
) -> tuple[int, str]:
    """POST ``payload`` and return the status and body, whatever the status."""
    request = urllib.request.Request(  # noqa: S310  # the fake, on loopback
        f"{server.origin}{path}",
        data=json.dumps(payload).encode(),
        headers={"content-type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request) as answer:  # noqa: S310
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def sse(raw: str) -> list[BetaRawMessageStreamEvent]:
    """A Messages API stream's events, each read with the SDK's own event type."""
    events = [
        json.loads(line.removeprefix("data: "))
        for line in raw.splitlines()
        if line.startswith("data: ")
    ]
    return [
        EVENTS.validate_python(event)
        for event in (e for e in events if isinstance(e, dict))
        if event.get("type") != "ping"  # a keep-alive, outside the SDK's union
    ]


def test_a_triggered_compaction_is_the_apis_block_with_both_iterations() -> None:
    with FakeAnthropicServer(default=MessageReply(text="High tide at noon.")) as server:
        message = BetaMessage.model_validate_json(
            server.post("/v1/messages", body(compact()), BETAS)
        )
    block, text = message.content
    assert isinstance(block, BetaCompactionBlock)
    assert block.content is not None
    assert "And the tides?" in block.content  # the summary is of what was sent
    assert block.encrypted_content
    assert block.signature
    assert block.tool_changes == []
    assert text.type == "text"
    assert text.text == "High tide at noon."
    iterations = message.usage.iterations or []
    assert [type(i) for i in iterations] == [
        BetaCompactionIterationUsage,
        BetaMessageIterationUsage,
    ]
    compaction, answered = iterations
    assert isinstance(answered, BetaMessageIterationUsage)
    assert compaction.input_tokens + compaction.cache_read_input_tokens > 50_000  # it read all
    # The top-level usage is the message iteration's alone, read from the summary.
    assert message.usage.input_tokens == answered.input_tokens
    assert message.usage.output_tokens == answered.output_tokens
    assert answered.input_tokens + answered.cache_read_input_tokens < 1_000


def test_below_its_trigger_nothing_is_compacted() -> None:
    with FakeAnthropicServer() as server:
        message = BetaMessage.model_validate_json(
            server.post("/v1/messages", body(compact(200_000)), BETAS)
        )
    assert [block.type for block in message.content] == ["text"]
    assert message.usage.iterations is None


def test_a_paused_compaction_streams_the_block_alone_and_keeps_the_answer_for_later() -> None:
    with FakeAnthropicServer() as server:
        server.enqueue(MessageReply(text="The answer, after the pause."))
        raw = server.post("/v1/messages", body(compact(pause=True), stream=True), BETAS)
        events = sse(raw)
        again = BetaMessage.model_validate_json(server.post("/v1/messages", body(), {}))
    kinds = [event.type for event in events]
    assert kinds.count("content_block_start") == 1
    start = next(e for e in events if e.type == "content_block_start")
    delta = next(e for e in events if e.type == "content_block_delta")
    assert start.content_block.type == "compaction"
    assert delta.delta.type == "compaction_delta"
    assert delta.delta.content
    assert delta.delta.encrypted_content
    end = next(e for e in events if e.type == "message_delta")
    assert end.delta.stop_reason == "compaction"
    assert end.usage.input_tokens == 0  # no message iteration
    assert [i.type for i in end.usage.iterations or []] == ["compaction"]
    assert again.content[0].type == "text"
    assert again.content[0].text == "The answer, after the pause."


def test_a_failed_compaction_has_null_content_and_the_message_reads_everything() -> None:
    with FakeAnthropicServer(summarise=lambda _request: None) as server:
        message = BetaMessage.model_validate_json(
            server.post("/v1/messages", body(compact()), BETAS)
        )
        scripted = MessageReply(compaction=Compacted(content=None))
        server.enqueue(scripted)
        streamed = sse(server.post("/v1/messages", body(stream=True), {}))
    block = message.content[0]
    assert isinstance(block, BetaCompactionBlock)
    assert block.content is None
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > 50_000
    delta = next(e for e in streamed if e.type == "content_block_delta")
    assert delta.delta.type == "compaction_delta"
    assert delta.delta.content is None


def test_the_history_before_a_compaction_block_is_not_read() -> None:
    history = [
        {"role": "user", "content": BIG},
        {
            "role": "assistant",
            "content": [{"type": "compaction", "content": "Tides so far.", "signature": "s"}],
        },
        {"role": "user", "content": "And now?"},
    ]
    with FakeAnthropicServer() as server:
        message = BetaMessage.model_validate_json(
            server.post("/v1/messages", body(compact(), messages=history), BETAS)
        )
        refused = post_status(server, "/v1/messages", body(messages=history), {})
    assert message.content[0].type == "text"  # far below the trigger once the block is read
    assert message.usage.input_tokens < 100
    assert refused[0] == 400  # a compaction block without its beta


@pytest.mark.parametrize(
    ("edits", "headers", "said"),
    [
        ((compact(),), {"x-api-key": "k"}, COMPACTION_BETA),
        ((compact(10_000),), BETAS, "at least 50000"),
        (
            ({"type": "clear_tool_uses_20250919"},),
            {"anthropic-beta": COMPACTION_BETA},
            CONTEXT_EDITING_BETA,
        ),
        (({"type": "clear_everything"},), BETAS, "unknown type"),
    ],
)
def test_what_the_api_refuses_the_fake_refuses(
    edits: tuple[dict[str, Any], ...], headers: dict[str, str], said: str
) -> None:
    with FakeAnthropicServer() as server:
        status, raw = post_status(server, "/v1/messages", body(*edits), headers)
    assert status == 400
    error = anthropic.types.ErrorResponse.model_validate_json(raw)
    assert said in error.error.message


def test_a_model_that_cannot_compact_says_so() -> None:
    with FakeAnthropicServer() as server:
        server.refuse_compaction = True
        status, raw = post_status(server, "/v1/messages", body(compact()), BETAS)
    assert status == 400
    assert "compact_20260112 is not supported" in raw


def tool_turns(count: int) -> list[Any]:
    """``count`` tool rounds, each result large, then the user's question."""
    history: list[Any] = [{"role": "user", "content": "Read the logs."}]
    for index in range(count):
        use = {"type": "tool_use", "id": f"t{index}", "name": "read", "input": {"file": index}}
        history.append({"role": "assistant", "content": [use]})
        result = {"type": "tool_result", "tool_use_id": f"t{index}", "content": BIG[:6_000]}
        history.append({"role": "user", "content": [result]})
    history.append({"role": "user", "content": "What did they say?"})
    return history


def test_clearing_tool_uses_reports_what_it_cleared_and_the_usage_follows() -> None:
    clear = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 5_000},
        "keep": {"type": "tool_uses", "value": 2},
    }
    with FakeAnthropicServer() as server:
        plain = BetaMessage.model_validate_json(
            server.post("/v1/messages", body(messages=tool_turns(6)), {})
        )
        cleared = BetaMessage.model_validate_json(
            server.post("/v1/messages", body(clear, messages=tool_turns(6)), BETAS)
        )
        sent = server.requests[-1].body
    assert cleared.context_management is not None
    (applied,) = cleared.context_management.applied_edits
    assert isinstance(applied, BetaClearToolUses20250919EditResponse)
    assert applied.cleared_tool_uses == 4
    before = plain.usage.input_tokens + (plain.usage.cache_creation_input_tokens or 0)
    after = cleared.usage.input_tokens + (cleared.usage.cache_creation_input_tokens or 0)
    assert before - after == applied.cleared_input_tokens > 0
    assert CLEARED not in json.dumps(sent)  # what the client sent is untouched: the fake cleared


def test_clearing_thinking_keeps_the_latest_turns() -> None:
    history: list[Any] = []
    for index in range(3):
        history.append({"role": "user", "content": f"Question {index}"})
        thought = {"type": "thinking", "thinking": BIG[:3_000], "signature": "s"}
        history.append({"role": "assistant", "content": [thought, {"type": "text", "text": "A"}]})
    history.append({"role": "user", "content": "Last one."})
    edit = {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}
    with FakeAnthropicServer() as server:
        message = BetaMessage.model_validate_json(
            server.post("/v1/messages", body(edit, messages=history), BETAS)
        )
    assert message.context_management is not None
    (applied,) = message.context_management.applied_edits
    assert isinstance(applied, BetaClearThinking20251015EditResponse)
    assert applied.cleared_thinking_turns == 2
    assert applied.cleared_input_tokens > 1_000


def test_the_sdks_beta_stream_accumulates_the_fakes_compaction() -> None:
    async def main() -> None:
        with FakeAnthropicServer(default=MessageReply(text="Noted.")) as server:
            async with anthropic.AsyncAnthropic(api_key="k", base_url=server.url) as client:
                payload = body(compact())
                async with client.beta.messages.stream(
                    model=MODEL,
                    max_tokens=100,
                    messages=payload["messages"],
                    context_management=payload["context_management"],
                    betas=[COMPACTION_BETA],
                ) as stream:
                    message = await stream.get_final_message()
        block = message.content[0]
        assert block.type == "compaction"
        assert block.content is not None
        assert block.encrypted_content
        assert [i.type for i in message.usage.iterations or []] == ["compaction", "message"]

    asyncio.run(main())


# --------------------------------------------------------------------------- OpenAI


def responses_body(threshold: int | None, items: list[Any], **more: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"model": "gpt-4o", "input": items, "store": False, **more}
    if threshold is not None:
        data["context_management"] = [{"type": "compaction", "compact_threshold": threshold}]
    return data


ITEMS: list[Any] = [
    {"role": "user", "content": BIG},
    {"role": "assistant", "content": "Noted."},
    {"role": "user", "content": BIG + " And the tides?"},
]


def test_a_responses_call_at_its_threshold_starts_with_an_opaque_compaction_item() -> None:
    with FakeOpenAIServer(default=Reply(text="High tide at noon.")) as server:
        raw = server.post("/v1/responses", responses_body(20_000, ITEMS), {"authorization": "k"})
        below = server.post("/v1/responses", responses_body(90_000, ITEMS), {"authorization": "k"})
    response = Response.model_validate_json(raw)
    item, message = response.output
    assert isinstance(item, ResponseCompactionItem)
    assert "And the tides?" in summary_of(item.encrypted_content)
    assert message.type == "message"
    assert response.usage is not None
    assert response.usage.input_tokens < 1_000  # answered from the item alone
    assert [o.type for o in Response.model_validate_json(below).output] == ["message"]


def test_an_input_is_read_from_its_last_compaction_item() -> None:
    with FakeOpenAIServer() as server:
        first = Response.model_validate_json(
            server.post("/v1/responses", responses_body(20_000, ITEMS), {})
        )
        item = first.output[0].model_dump(mode="json", exclude_none=True)
        again = [*ITEMS, item, {"role": "user", "content": "Next?"}]
        response = Response.model_validate_json(
            server.post("/v1/responses", responses_body(20_000, again), {})
        )
    assert [o.type for o in response.output] == ["message"]  # the item stands for what precedes
    assert response.usage is not None
    assert response.usage.input_tokens < 1_000


def test_the_clients_compact_returns_the_user_messages_then_the_item() -> None:
    async def main() -> None:
        with FakeOpenAIServer() as server:
            async with openai.AsyncOpenAI(api_key="k", base_url=server.url) as client:
                compacted = await client.responses.compact(model="gpt-4o", input=ITEMS)
                server.refuse_compaction = True
                with pytest.raises(openai.BadRequestError, match="compaction is not supported"):
                    await client.responses.compact(model="gpt-4o", input=ITEMS)
        *users, item = compacted.output
        assert item.type == "compaction"
        assert [u.type for u in users] == ["message", "message"]
        assert compacted.usage.input_tokens > 10_000
        assert compacted.usage.output_tokens > 0

    asyncio.run(main())


def test_the_streamed_compaction_item_is_an_output_item_event() -> None:
    async def main() -> None:
        with FakeOpenAIServer() as server:
            async with openai.AsyncOpenAI(api_key="k", base_url=server.url) as client:
                stream = await client.responses.create(
                    model="gpt-4o",
                    input=ITEMS,
                    store=False,
                    stream=True,
                    context_management=[{"type": "compaction", "compact_threshold": 20_000}],
                )
                done = [e async for e in stream if e.type == "response.output_item.done"]
        assert done[0].item.type == "compaction"
        assert isinstance(done[0].item, ResponseCompactionItem)

    asyncio.run(main())
