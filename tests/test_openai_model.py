"""``OpenAIModel`` over the real ``openai`` client against ``FakeOpenAIServer``, both APIs.

Usage mapped from what the client parsed off real SSE, tool-call fragments joined, what was
sent read back from the server's record, every failure the ``LlmCallError`` the core acts on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import openai
import pytest
import tiktoken

from segue import MemoryStore, Runtime
from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmReply, LlmRequest, ToolSpec
from segue.executor.models.openai import OpenAIModel, UnsupportedContentError
from segue.statemachine import Message, ModelSettings, ToolCall
from segue.statemachine.content import (
    DocumentBlock,
    ImageBase64Source,
    ImageBlock,
    PdfBase64Source,
    PlainTextSource,
    TextBlock,
)
from segue.testing.openai_server import (
    ErrorReply,
    FakeOpenAIServer,
    RawReply,
    Reply,
)
from segue.testing.openai_server import ToolCall as FakeCall
from segue.testing.openai_server import Usage as FakeUsage

Api = Literal["chat", "responses"]
KEY = "sk-openai-model-test-NEVER-LEAK-31415926"
LOOKUP = ToolSpec(
    name="lookup",
    description="Look something up.",
    input_schema={"type": "object", "properties": {"query": {"type": "string"}}},
)
PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5E"
    "rkJggg=="
)


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture(params=["chat", "responses"])
def api(request: pytest.FixtureRequest) -> Api:
    chosen: Api = request.param
    return chosen


@contextlib.asynccontextmanager
async def adapter(
    server: FakeOpenAIServer, api: Api = "chat", *, max_retries: int = 0, **options: Any
) -> AsyncIterator[OpenAIModel]:
    async with openai.AsyncOpenAI(api_key=KEY, base_url=server.url, max_retries=max_retries) as c:
        yield OpenAIModel(c, api=api, **options)


def request(messages: list[Message] | None = None, **fields: Any) -> LlmRequest:
    return LlmRequest(
        conversation_id="c1",
        model=fields.pop("model", "gpt-4o"),
        purpose=fields.pop("purpose", "turn"),
        system=fields.pop("system", "Be brief."),
        messages=tuple(messages or [Message(kind="user", text="Hello?")]),
        **fields,
    )


def ask(server: FakeOpenAIServer, api: Api, req: LlmRequest, **options: Any) -> LlmReply:
    async def main() -> LlmReply:
        async with adapter(server, api, **options) as model:
            return await model.complete(req)

    return asyncio.run(main())


def fails(server: FakeOpenAIServer, api: Api, req: LlmRequest, **options: Any) -> LlmCallError:
    with pytest.raises(LlmCallError) as caught:
        ask(server, api, req, **options)
    return caught.value


def body(server: FakeOpenAIServer, index: int = -1) -> dict[str, Any]:
    sent: dict[str, Any] = server.model_requests()[index].body
    return sent


def items(sent: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = sent.get("messages") or sent["input"]
    return found


# --------------------------------------------------------------------------- usage


def test_usage_counts_the_cached_part_of_the_prompt_once(
    server: FakeOpenAIServer, api: Api
) -> None:
    server.enqueue(Reply(text="Hi.", usage=FakeUsage(10_000, 250, cached_tokens=8_000)))
    usage = ask(server, api, request()).usage
    assert usage is not None
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (
        2_000,
        8_000,
        250,
    )
    assert usage.cache_creation_input_tokens == 0
    assert usage.context_tokens == 10_250  # prompt + completion, never 18,250


def test_cache_writes_are_cache_creation_and_come_out_of_input(
    server: FakeOpenAIServer, api: Api
) -> None:
    reported = FakeUsage(10_000, 40, cached_tokens=6_000, cache_write_tokens=3_000)
    server.enqueue(Reply(usage=reported))
    usage = ask(server, api, request()).usage
    assert usage is not None
    assert usage.model_dump() == {
        "input_tokens": 1_000,
        "output_tokens": 40,
        "cache_creation_input_tokens": 3_000,
        "cache_read_input_tokens": 6_000,
    }


def test_reasoning_tokens_are_inside_the_completion(server: FakeOpenAIServer, api: Api) -> None:
    server.enqueue(Reply(usage=FakeUsage(500, 900, cached_tokens=0, reasoning_tokens=800)))
    usage = ask(server, api, request(model="o4-mini")).usage
    assert usage is not None
    assert (usage.output_tokens, usage.context_tokens) == (900, 1_400)


def test_a_stream_without_usage_says_nothing(server: FakeOpenAIServer, api: Api) -> None:
    server.enqueue(Reply(text="No figures.", usage=None))
    reply = ask(server, api, request())
    assert (reply.text, reply.usage) == ("No figures.", None)


def test_chat_asks_for_the_usage_chunk(server: FakeOpenAIServer) -> None:
    ask(server, "chat", request())
    sent = body(server)
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}


def test_a_chat_stream_cut_after_its_finish_reason_is_a_reply_of_unknown_usage(
    server: FakeOpenAIServer,
) -> None:
    """Finished but cut before the usage chunk and [DONE]: the reply stands, its usage is not
    known (the core keeps the last figure)."""
    server.enqueue(Reply(text="abc", pieces=1, cut_after=3))  # role, "abc", finish
    reply = ask(server, "chat", request())
    assert (reply.text, reply.stop_reason, reply.usage) == ("abc", "end_turn", None)


# --------------------------------------------------------------------------- text and tools


def test_text_streams_as_it_comes(server: FakeOpenAIServer, api: Api) -> None:
    server.enqueue(Reply(text="High tide is at noon today.", pieces=6))
    deltas: list[str] = []

    async def main() -> LlmReply:
        async with adapter(server, api) as model:
            return await model.complete(dataclasses.replace(request(), on_text=deltas.append))

    reply = asyncio.run(main())
    assert "".join(deltas) == reply.text == "High tide is at noon today."
    assert len(deltas) == 6


def test_tool_call_fragments_are_joined_by_index(server: FakeOpenAIServer, api: Api) -> None:
    calls = [
        FakeCall("lookup", {"query": "tides", "day": "today"}, id="call_1"),
        FakeCall("lookup", {"query": "winds"}, id="call_2"),
    ]
    server.enqueue(Reply(text="Checking both.", tool_calls=calls, arg_pieces=5))
    reply = ask(server, api, request(tools=(LOOKUP,)))
    assert [(c.id, c.name, c.input) for c in reply.tool_calls] == [
        ("call_1", "lookup", {"query": "tides", "day": "today"}),
        ("call_2", "lookup", {"query": "winds"}),
    ]
    assert reply.stop_reason == "tool_use"


@pytest.mark.parametrize("arguments", ['{"query": "ti', "", "[1, 2]", "not json"])
def test_arguments_that_are_not_a_json_object_are_never_run(
    server: FakeOpenAIServer, api: Api, arguments: str
) -> None:
    server.enqueue(Reply(text="", tool_calls=[FakeCall("lookup", arguments)]))
    error = fails(server, api, request(tools=(LOOKUP,)))
    assert error.retryable
    assert "lookup" in error.message


def history_with_a_tool_round() -> list[Message]:
    call = ToolCall(id="call_t", name="lookup", input={"query": "tides"})
    return [
        Message(kind="user", text="When is high tide?"),
        Message(kind="assistant", text="Checking.", tool_calls=(call,)),
        Message(kind="tool_result", text="noon", tool_call_id="call_t"),
        Message(kind="assistant", text="At noon."),
        Message(kind="user", text="And low tide?"),
    ]


def test_chat_sends_results_as_tool_messages_with_their_call_id(server: FakeOpenAIServer) -> None:
    ask(server, "chat", request(history_with_a_tool_round(), tools=(LOOKUP,)))
    sent = body(server)
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "When is high tide?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_t",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"query": "tides"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_t", "content": "noon"},
        {"role": "assistant", "content": "At noon."},
        {"role": "user", "content": "And low tide?"},
    ]
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look something up.",
                "parameters": LOOKUP.input_schema,
            },
        }
    ]
    assert "tool_choice" not in sent


def test_responses_sends_function_call_output_items_with_their_call_id(
    server: FakeOpenAIServer,
) -> None:
    ask(server, "responses", request(history_with_a_tool_round(), tools=(LOOKUP,)))
    sent = body(server)
    assert sent["instructions"] == "Be brief."
    assert sent["store"] is False
    assert sent["input"] == [
        {"role": "user", "content": "When is high tide?"},
        {"role": "assistant", "content": "Checking."},
        {
            "type": "function_call",
            "call_id": "call_t",
            "name": "lookup",
            "arguments": '{"query": "tides"}',
        },
        {"type": "function_call_output", "call_id": "call_t", "output": "noon"},
        {"role": "assistant", "content": "At noon."},
        {"role": "user", "content": "And low tide?"},
    ]
    assert sent["tools"][0]["name"] == "lookup"


def test_a_call_without_its_result_is_answered_and_a_stray_result_becomes_text(
    server: FakeOpenAIServer, api: Api
) -> None:
    call = ToolCall(id="call_open", name="lookup", input={})
    history = [
        Message(kind="user", text="Go."),
        Message(kind="assistant", text="", tool_calls=(call,)),
        Message(kind="user", text="Never mind."),
        Message(kind="tool_result", text="late", tool_call_id="call_gone"),
    ]
    ask(server, api, request(history, tools=(LOOKUP,)))
    sent = json.dumps(items(body(server)))
    assert "Not run: no result was recorded" in sent
    assert "call_gone" not in sent
    assert "[tool result from a tool: late]" in sent


def test_the_grace_request_says_tool_choice_none(server: FakeOpenAIServer, api: Api) -> None:
    grace = request(
        history_with_a_tool_round(), tools=(LOOKUP,), final=True, instruction="Answer now."
    )
    ask(server, api, grace)
    sent = body(server)
    assert sent["tool_choice"] == "none"
    assert sent["tools"]  # still declared: the history holds calls
    assert items(sent)[-1] == {"role": "user", "content": "Answer now."}


def test_a_request_at_the_limit_offers_no_tool(server: FakeOpenAIServer, api: Api) -> None:
    history = [Message(kind="user", text="The very first question.")]
    history += [Message(kind="assistant", text=f"Answer {i}.") for i in range(3)]
    history += history_with_a_tool_round()
    summary = request(
        history,
        purpose="continuation",
        tools=(LOOKUP,),  # even if declared by mistake
        instruction="Summarise.",
        rejected_tool_calls=(ToolCall(id="r1", name="delete_all", input={"where": "here"}),),
        trim_level=1,
        max_tokens=50_000,
    )
    ask(server, api, summary, summary_max_tokens=2_000)
    sent = body(server)
    assert "tools" not in sent
    assert "tool_choice" not in sent
    shown = json.dumps(items(sent))
    assert "tool_call" not in shown
    assert "function_call" not in shown
    assert "The very first question." not in shown  # trim_level 1 dropped the oldest
    assert "earlier messages were omitted" in shown
    assert "[tool result from lookup: noon]" in shown
    last = items(sent)[-1]
    assert last["role"] == "user"
    assert "delete_all" in last["content"]
    assert last["content"].endswith("Summarise.")
    bound = sent.get("max_tokens") or sent.get("max_output_tokens")
    assert bound == 2_000


@pytest.mark.parametrize("purpose", ["continuation", "checkpoint", "compaction"])
def test_a_request_at_the_limit_with_the_turns_tools_is_the_turns_prefix(
    server: FakeOpenAIServer, api: Api, purpose: str
) -> None:
    """REQ-SEG-047: the turn's tools and history unchanged, no tool callable, the rejected
    calls and the instruction last: a server that caches prompt prefixes reads it back."""
    history = history_with_a_tool_round()
    ask(server, api, request(history, tools=(LOOKUP,)))
    rejected = (ToolCall(id="r1", name="delete_all", input={}),)
    limit = request(
        history,
        purpose=purpose,
        tools=(LOOKUP,),
        instruction="Summarise.",
        rejected_tool_calls=rejected,
    )
    ask(server, api, limit)
    turn, sent = body(server, 0), body(server)
    assert (sent["tools"], sent["tool_choice"]) == (turn["tools"], "none")
    assert items(sent)[: len(items(turn))] == items(turn)
    closing = json.dumps(items(sent)[-1])
    assert "delete_all" in closing
    assert "Summarise." in closing


# --------------------------------------------------------------------------- model settings


@pytest.mark.parametrize("model", ["o3", "o4-mini", "gpt-5", "gpt-5-mini-2025-08-07", "o1"])
def test_reasoning_models_take_max_completion_tokens_and_no_temperature(
    server: FakeOpenAIServer, model: str
) -> None:
    ask(server, "chat", request(model=model, settings=ModelSettings(temperature=0.3)))
    ask(server, "chat", request(model=model, settings=ModelSettings(thinking_budget=20_000)))
    warm, thinking = body(server, 0), body(server, 1)
    assert warm["max_completion_tokens"] == 4096
    assert "max_tokens" not in warm
    assert "temperature" not in warm
    assert thinking["reasoning_effort"] == "high"


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4.1-mini", "llama3.1"])
def test_other_models_take_max_tokens_and_the_temperature(
    server: FakeOpenAIServer, model: str
) -> None:
    ask(server, "chat", request(model=model, settings=ModelSettings(temperature=0.3)))
    sent = body(server)
    assert (sent["max_tokens"], sent["temperature"]) == (4096, 0.3)
    assert "max_completion_tokens" not in sent


def test_responses_bounds_output_and_omits_a_reasoning_models_temperature(
    server: FakeOpenAIServer,
) -> None:
    settings = ModelSettings(temperature=0.5)
    ask(server, "responses", request(model="o3", settings=settings, max_tokens=900))
    sent = body(server)
    assert sent["max_output_tokens"] == 900
    assert "temperature" not in sent
    ask(server, "responses", request(model="gpt-4o", settings=settings))
    assert body(server)["temperature"] == 0.5


def test_a_model_told_to_reason_is_treated_as_one(server: FakeOpenAIServer) -> None:
    ask(server, "chat", request(model="deepseek-reasoner"), reasoning=True)
    assert "max_completion_tokens" in body(server)


@pytest.mark.parametrize(
    ("choice", "chat", "responses"),
    [
        ({"type": "any"}, "required", "required"),
        ({"type": "auto"}, "auto", "auto"),
        (
            {"type": "tool", "name": "lookup"},
            {"type": "function", "function": {"name": "lookup"}},
            {"type": "function", "name": "lookup"},
        ),
    ],
)
def test_the_conversations_tool_choice_goes_out_in_openais_shape(
    server: FakeOpenAIServer, api: Api, choice: dict[str, Any], chat: Any, responses: Any
) -> None:
    settings = ModelSettings(tool_choice=choice)
    ask(server, api, request(tools=(LOOKUP,), settings=settings))
    assert body(server)["tool_choice"] == (chat if api == "chat" else responses)


# --------------------------------------------------------------------------- content


def test_images_go_as_data_urls_in_each_apis_shape(server: FakeOpenAIServer, api: Api) -> None:
    image = ImageBlock(source=ImageBase64Source(media_type="image/png", data=PIXEL))
    message = Message(
        kind="user", text="What is it?", content=(TextBlock(text="What is it?"), image)
    )
    ask(server, api, request([message]))
    content = items(body(server))[-1]["content"]
    url = f"data:image/png;base64,{PIXEL}"
    if api == "chat":
        assert content == [
            {"type": "text", "text": "What is it?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]
    else:
        assert content == [
            {"type": "input_text", "text": "What is it?"},
            {"type": "input_image", "image_url": url},
        ]


def pdf_message() -> Message:
    pdf = DocumentBlock(
        source=PdfBase64Source(media_type="application/pdf", data="JVBERi0xLjQK"), title="report"
    )
    return Message(kind="user", text="Read it.", content=(TextBlock(text="Read it."), pdf))


def test_a_pdf_is_refused_on_chat_completions_before_anything_is_sent(
    server: FakeOpenAIServer,
) -> None:
    error = fails(server, "chat", request([pdf_message()]))
    assert error.fatal
    assert "PDF" in error.message
    assert 'api="responses"' in error.message
    assert server.model_requests() == []

    async def check() -> None:
        async with adapter(server, "chat") as model:
            with pytest.raises(UnsupportedContentError, match="PDF"):
                model.check_content(pdf_message().content)
            model.check_content((TextBlock(text="fine"),))

    asyncio.run(check())


def test_a_pdf_goes_as_an_input_file_on_the_responses_api(server: FakeOpenAIServer) -> None:
    ask(server, "responses", request([pdf_message()]))
    parts = items(body(server))[-1]["content"]
    assert parts[1] == {
        "type": "input_file",
        "filename": "report",
        "file_data": "data:application/pdf;base64,JVBERi0xLjQK",
    }


def test_a_text_document_goes_as_text(server: FakeOpenAIServer, api: Api) -> None:
    doc = DocumentBlock(source=PlainTextSource(data="Tides: noon."), title="notes")
    ask(server, api, request([Message(kind="user", text="", content=(doc,))]))
    assert "Tides: noon." in json.dumps(items(body(server))[-1])


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "refusal",
    [
        ErrorReply(
            400,
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130000 tokens.",
            code="context_length_exceeded",
        ),
        ErrorReply(400, "This model's maximum context length is 8192 tokens."),  # no code
        ErrorReply(400, "Your input exceeds the context window of this model.", code=None),
        ErrorReply(400, "Too long.", code="context_length_exceeded"),
    ],
)
def test_context_overflow_takes_the_exhaustion_path(
    server: FakeOpenAIServer, api: Api, refusal: ErrorReply
) -> None:
    server.enqueue(refusal)
    error = fails(server, api, request())
    assert error.context_overflow
    assert error.status_code == 400


def test_an_ordinary_400_is_not_an_overflow(server: FakeOpenAIServer, api: Api) -> None:
    server.enqueue(ErrorReply(400, "Invalid value for 'temperature'.", param="temperature"))
    error = fails(server, api, request())
    assert (error.context_overflow, error.retryable, error.fatal) == (False, False, False)


@pytest.mark.parametrize(("header", "seconds"), [("7", 7.0), ("0.5", 0.5), ("soon", None)])
def test_429_is_retryable_and_carries_retry_after(
    server: FakeOpenAIServer, api: Api, header: str, seconds: float | None
) -> None:
    server.enqueue(ErrorReply(429, "Slow down.", "requests", headers={"retry-after": header}))
    error = fails(server, api, request())
    assert (error.retryable, error.status_code, error.retry_after) == (True, 429, seconds)


@pytest.mark.parametrize("status", [500, 502, 503])
def test_5xx_is_retryable(server: FakeOpenAIServer, api: Api, status: int) -> None:
    server.enqueue(ErrorReply(status, "Try again.", "server_error"))
    assert fails(server, api, request()).retryable


def test_the_clients_own_retries_are_off(server: FakeOpenAIServer, api: Api) -> None:
    """A client built with retries on still makes one HTTP attempt per call: segue retries."""
    server.enqueue(ErrorReply(503, "Busy.", "server_error", headers={"retry-after": "0"}))
    fails(server, api, request(), max_retries=3)
    assert len(server.model_requests()) == 1


def test_401_names_the_variable_and_never_the_key(server: FakeOpenAIServer, api: Api) -> None:
    server.enqueue(ErrorReply(401, f"Incorrect API key provided: {KEY}.", code="invalid_api_key"))
    error = fails(server, api, request())
    assert error.fatal
    assert "OPENAI_API_KEY" in error.message
    assert KEY not in error.message


def test_an_error_in_a_started_stream_is_retryable(server: FakeOpenAIServer, api: Api) -> None:
    server.enqueue(ErrorReply(500, "Overloaded.", "server_error", code=None, mid_stream=True))
    assert fails(server, api, request()).retryable


def test_an_overflow_in_a_started_stream_takes_the_exhaustion_path(
    server: FakeOpenAIServer, api: Api
) -> None:
    overflow = ErrorReply(400, "Too long.", code="context_length_exceeded", mid_stream=True)
    server.enqueue(overflow)
    assert fails(server, api, request()).context_overflow


def test_a_chat_stream_cut_before_its_finish_reason_is_never_a_reply(
    server: FakeOpenAIServer,
) -> None:
    server.enqueue(Reply(text="A long answer cut off.", pieces=5, cut_after=3))
    error = fails(server, "chat", request())
    assert error.retryable
    assert "finish_reason" in error.message


@pytest.mark.parametrize("cut", [1, 2, 5])
def test_a_responses_stream_that_ends_before_completed_is_never_a_reply(
    server: FakeOpenAIServer, cut: int
) -> None:
    server.enqueue(Reply(text="A long answer cut off.", cut_after=cut))
    error = fails(server, "responses", request())
    assert error.retryable
    assert "response.completed" in error.message


def test_a_failed_response_is_an_error(server: FakeOpenAIServer) -> None:
    server.enqueue(Reply(text="Half an answer.", failed=True))
    error = fails(server, "responses", request())
    assert "response.failed" in error.message


def test_an_incomplete_response_is_a_reply_cut_by_its_bound_not_a_complete_one(
    server: FakeOpenAIServer,
) -> None:
    """``response.incomplete`` (max_output_tokens) is what ``finish_reason: length`` is on Chat
    Completions: the core records it as truncated and drops its calls, never as complete."""
    server.enqueue(Reply(text="Half an ans", finish_reason="length"))
    reply = ask(server, "responses", request())
    assert (reply.text, reply.stop_reason) == ("Half an ans", "max_tokens")
    server.enqueue(Reply(text="Half an ans", finish_reason="length"))
    assert ask(server, "chat", request()).stop_reason == "max_tokens"


def test_a_page_that_is_not_an_event_stream_is_named(server: FakeOpenAIServer, api: Api) -> None:
    server.enqueue(RawReply())
    error = fails(server, api, request())
    assert "not an event stream" in error.message
    assert not error.retryable


def test_an_unreachable_server_is_retryable(api: Api) -> None:
    with FakeOpenAIServer() as gone:
        url = gone.url

    async def main() -> LlmCallError:
        async with openai.AsyncOpenAI(api_key=KEY, base_url=url, max_retries=0) as client:
            with pytest.raises(LlmCallError) as caught:
                await OpenAIModel(client, api=api).complete(request())
            return caught.value

    assert asyncio.run(main()).retryable


# --------------------------------------------------------------------------- windows and counting


def byte_encoding() -> tiktoken.Encoding:
    """A real tiktoken encoding built here (one token per byte, plus one merge), so counting runs
    offline: the published encodings are downloaded on first use."""
    ranks = {bytes([i]): i for i in range(256)}
    ranks[b"ti"] = 256
    return tiktoken.Encoding(
        name="bytes", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens={}
    )


def test_exact_preflight_counts_the_payload_with_tiktoken(server: FakeOpenAIServer) -> None:
    short = request([Message(kind="user", text="tide")])
    longer = request([Message(kind="user", text="tide " * 100)])

    async def main() -> tuple[int | None, int | None, int | None]:
        async with adapter(server, exact_preflight=True, encoding=byte_encoding()) as model:
            first, second = await model.count_tokens(short), await model.count_tokens(longer)
        async with adapter(server) as off:
            return first, second, await off.count_tokens(short)

    first, second, off = asyncio.run(main())
    assert first is not None
    assert second is not None
    # "tide" is three tokens ("ti" merged), each space one: 100 * 4 against 3.
    assert second - first == 100 * 4 - 3
    assert off is None
    assert server.requests == []  # counting asks no one


def test_without_a_loadable_encoding_preflight_falls_back_to_the_estimate(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tiktoken downloads its encodings on first use: offline and uncached, count_tokens says
    None and the runtime estimates."""

    def offline(_name: str) -> tiktoken.Encoding:
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    monkeypatch.setattr(tiktoken, "encoding_for_model", offline)

    async def main() -> int | None:
        async with adapter(server, exact_preflight=True) as model:
            return await model.count_tokens(request())

    assert asyncio.run(main()) is None


def test_options_are_checked() -> None:
    client = openai.AsyncOpenAI(api_key=KEY, base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="api"):
        OpenAIModel(client, api="completions")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_tokens"):
        OpenAIModel(client, max_tokens=0)


def test_a_tools_images_reach_the_model_in_each_apis_shape(
    server: FakeOpenAIServer, api: Api
) -> None:
    """Chat Completions' tool messages hold text only: a tool's images follow the results in a
    user message. The Responses API takes them in the function_call_output itself."""
    image = ImageBlock(source=ImageBase64Source(media_type="image/png", data=PIXEL))
    call = ToolCall(id="call_img", name="lookup", input={})
    history = [
        Message(kind="user", text="Show me."),
        Message(kind="assistant", text="", tool_calls=(call,)),
        Message(
            kind="tool_result",
            text="a chart",
            tool_call_id="call_img",
            content=(TextBlock(text="a chart"), image),
        ),
    ]
    ask(server, api, request(history, tools=(LOOKUP,)))
    sent = items(body(server))
    url = f"data:image/png;base64,{PIXEL}"
    if api == "chat":
        assert sent[-2]["role"] == "tool"
        assert sent[-2]["content"].startswith("a chart")
        assert sent[-1] == {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": url}}],
        }
    else:
        assert sent[-1]["type"] == "function_call_output"
        assert sent[-1]["output"] == [
            {"type": "input_text", "text": "a chart"},
            {"type": "input_image", "image_url": url},
        ]


def test_a_seeded_childs_summary_request_extends_the_prompt_its_turns_sent() -> None:
    """The limit's request of a tool-less conversation keeps the turns' own messages, the
    instruction last: llama.cpp's server (the real-model tier) caches a slot's prompt prefix,
    and a request that joined the child's summary and first message into one was read anew."""

    async def main(fake: FakeOpenAIServer) -> None:
        client = openai.AsyncOpenAI(base_url=fake.url, api_key="sk-test")
        model = OpenAIModel(client, max_tokens=24, summary_max_tokens=48)
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            parent = await rt.create_conversation(model="local", context_window=2_000)
            await rt.send(parent.id, "hello")
            await rt.continue_manually(parent.id)
            child = await rt.start_new_from(parent.id)
            await rt.send(child.id, "and on")
            await rt.continue_manually(child.id)
        await client.close()

    with FakeOpenAIServer(default=Reply(text="noted", usage=FakeUsage(100, 5))) as fake:
        asyncio.run(main(fake))
        *_, turn, summary = [r.body["messages"] for r in fake.model_requests()]
    assert [m["role"] for m in turn] == ["user", "user"]  # the seed, then the first message
    assert summary[: len(turn)] == turn
    assert summary[-2] == {"role": "assistant", "content": "noted"}
    assert summary[-1]["role"] == "user"
