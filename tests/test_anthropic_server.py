"""Drive ``FakeAnthropicServer`` with the real ``anthropic.AsyncAnthropic`` client.

These tests pin down the SDK behaviours segue relies on (exception classes, retries, stream
accumulation, usage fields), so an SDK upgrade that changes them fails here first.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anthropic
import pytest
from anthropic.types import Message, MessageParam, ToolParam

from segue.testing.anthropic_server import (
    Disconnect,
    ErrorReply,
    FakeAnthropicServer,
    MessageReply,
    ModelSpec,
    ToolUse,
    Usage,
    authentication,
    context_limit,
    overloaded,
    prompt_too_long,
    rate_limited,
    server_error,
)

T = TypeVar("T")
MODEL = "claude-sonnet-4-6"  # not in the SDK's DEPRECATED_MODELS (that warns)
MESSAGES: list[MessageParam] = [{"role": "user", "content": "hello"}]
TOOLS: list[ToolParam] = [
    {"name": "lookup", "description": "d", "input_schema": {"type": "object", "properties": {}}}
]


def call(
    server: FakeAnthropicServer,
    fn: Callable[[anthropic.AsyncAnthropic], Awaitable[T]],
    *,
    max_retries: int = 0,
) -> T:
    """Run ``fn`` with a fresh client inside its own event loop (no pytest-asyncio here)."""

    async def main() -> T:
        async with anthropic.AsyncAnthropic(
            api_key="test-key", base_url=server.url, max_retries=max_retries
        ) as client:
            return await fn(client)

    return asyncio.run(main())


async def create(
    client: anthropic.AsyncAnthropic,
    *,
    tools: list[ToolParam] | anthropic.Omit = anthropic.omit,
    system: str | anthropic.Omit = anthropic.omit,
) -> Message:
    return await client.messages.create(
        model=MODEL, max_tokens=100, messages=MESSAGES, tools=tools, system=system
    )


async def stream_final(
    client: anthropic.AsyncAnthropic,
    *,
    tools: list[ToolParam] | anthropic.Omit = anthropic.omit,
    system: str | anthropic.Omit = anthropic.omit,
) -> Message:
    async with client.messages.stream(
        model=MODEL, max_tokens=100, messages=MESSAGES, tools=tools, system=system
    ) as stream:
        return await stream.get_final_message()


def fetch(client_fn: str) -> Callable[[anthropic.AsyncAnthropic], Awaitable[Message]]:
    """Pick non-streaming ``create`` or ``stream(...).get_final_message()`` by name."""
    return create if client_fn == "create" else stream_final


USAGE = Usage(
    input_tokens=1234,
    output_tokens=56,
    cache_creation_input_tokens=78,
    cache_read_input_tokens=910,
)


@pytest.mark.parametrize("mode", ["create", "stream"])
def test_text_and_all_usage_fields(mode: str) -> None:
    with FakeAnthropicServer() as server:
        server.enqueue(MessageReply(text="The quick brown fox jumps", usage=USAGE))
        message = call(server, fetch(mode))
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].type == "text"
    assert message.content[0].text == "The quick brown fox jumps"
    assert message.stop_reason == "end_turn"
    assert message.model == MODEL
    assert message.usage.input_tokens == 1234
    assert message.usage.output_tokens == 56
    assert message.usage.cache_creation_input_tokens == 78
    assert message.usage.cache_read_input_tokens == 910


def test_stream_sends_text_in_several_deltas() -> None:
    async def chunks(client: anthropic.AsyncAnthropic) -> list[str]:
        async with client.messages.stream(model=MODEL, max_tokens=9, messages=MESSAGES) as stream:
            return [text async for text in stream.text_stream]

    with FakeAnthropicServer() as server:
        server.enqueue(MessageReply(text="one two three four"))
        parts = call(server, chunks)
    assert len(parts) > 1
    assert "".join(parts) == "one two three four"


@pytest.mark.parametrize("mode", ["create", "stream"])
def test_cache_fields_can_be_absent(mode: str) -> None:
    usage = Usage(
        input_tokens=5,
        output_tokens=2,
        cache_creation_input_tokens=None,
        cache_read_input_tokens=None,
    )
    with FakeAnthropicServer() as server:
        server.enqueue(MessageReply(usage=usage))
        message = call(server, fetch(mode))
    assert message.usage.cache_creation_input_tokens is None
    assert message.usage.cache_read_input_tokens is None
    assert (message.usage.input_tokens, message.usage.output_tokens) == (5, 2)


@pytest.mark.parametrize("mode", ["create", "stream"])
def test_tool_use_blocks_round_trip(mode: str) -> None:
    first = ToolUse(name="lookup", input={"query": "segue", "limit": 3, "tags": ["a", "b"]})
    second = ToolUse(name="noop", input={}, id="toolu_fixed")
    with FakeAnthropicServer() as server:
        server.enqueue(
            MessageReply(text="Let me check.", tool_uses=[first, second], stop_reason="tool_use")
        )
        message = call(server, fetch(mode))
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["text", "tool_use", "tool_use"]
    tool_blocks = [block for block in message.content if block.type == "tool_use"]
    assert [(b.id, b.name, b.input) for b in tool_blocks] == [
        (first.id, "lookup", {"query": "segue", "limit": 3, "tags": ["a", "b"]}),
        ("toolu_fixed", "noop", {}),
    ]


@pytest.mark.parametrize("mode", ["create", "stream"])
@pytest.mark.parametrize("reason", ["max_tokens", "model_context_window_exceeded"])
def test_stop_reasons_pass_through(mode: str, reason: str) -> None:
    with FakeAnthropicServer() as server:
        server.enqueue(MessageReply(text="partial", stop_reason=reason))
        message = call(server, fetch(mode))
    assert message.stop_reason == reason


@pytest.mark.parametrize("mode", ["create", "stream"])
def test_prompt_too_long_is_bad_request_and_not_retried(mode: str) -> None:
    with FakeAnthropicServer() as server:
        server.enqueue(prompt_too_long(210_000, 200_000))
        with pytest.raises(anthropic.BadRequestError) as info:
            call(server, fetch(mode), max_retries=2)
        assert len(server.message_requests()) == 1
    err = info.value
    assert err.status_code == 400
    assert "prompt is too long: 210000 tokens > 200000 maximum" in err.message
    assert err.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 210000 tokens > 200000 maximum",
        },
    }
    assert err.type == "invalid_request_error"
    assert err.api_message == "prompt is too long: 210000 tokens > 200000 maximum"
    assert err.request_id is not None
    assert err.request_id.startswith("req_fake_")


def test_context_limit_message() -> None:
    with FakeAnthropicServer() as server:
        server.enqueue(context_limit(190_000, 20_000, 200_000))
        with pytest.raises(anthropic.BadRequestError) as info:
            call(server, create)
    assert "input length and `max_tokens` exceed context limit: 190000 + 20000 > 200000" in (
        info.value.message
    )


def test_rate_limit_then_success_with_sdk_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake's 429 says how long to wait (retry-after-ms), and the SDK waits that long:
    its own backoff would be at least 0.375 s per retry."""
    waits: list[float] = []
    calculate = anthropic._base_client.BaseClient._calculate_retry_timeout

    def recorded(self: Any, *args: Any, **kwargs: Any) -> float:
        wait: float = calculate(self, *args, **kwargs)
        waits.append(wait)
        return wait

    monkeypatch.setattr(anthropic._base_client.BaseClient, "_calculate_retry_timeout", recorded)
    with FakeAnthropicServer() as server:
        server.enqueue(rate_limited(), rate_limited(), MessageReply(text="finally"))
        message = call(server, create, max_retries=2)
        sent = server.message_requests()
    assert message.content[0].type == "text"
    assert message.content[0].text == "finally"
    assert [r.headers["x-stainless-retry-count"] for r in sent] == ["0", "1", "2"]
    assert len(waits) == 2
    assert all(0 < wait < 0.1 for wait in waits), waits


def test_rate_limit_exhausts_retries() -> None:
    with FakeAnthropicServer() as server:
        server.enqueue(*[rate_limited()] * 3)
        with pytest.raises(anthropic.RateLimitError) as info:
            call(server, create, max_retries=2)
        assert len(server.requests) == 3
        assert server.pending == 0
    assert info.value.status_code == 429


@pytest.mark.parametrize(
    ("reply", "exc_type", "status"),
    [
        (overloaded(), anthropic.OverloadedError, 529),
        (server_error(), anthropic.InternalServerError, 500),
        (authentication(), anthropic.AuthenticationError, 401),
    ],
)
def test_status_error_classes(reply: ErrorReply, exc_type: type[Exception], status: int) -> None:
    with FakeAnthropicServer() as server:
        server.enqueue(reply)
        with pytest.raises(exc_type) as info:
            call(server, create)
    assert isinstance(info.value, anthropic.APIStatusError)
    assert info.value.status_code == status


def test_overloaded_is_an_internal_server_error_and_is_retried() -> None:
    assert issubclass(anthropic.OverloadedError, anthropic.InternalServerError)
    with FakeAnthropicServer() as server:
        server.enqueue(overloaded(), MessageReply(text="recovered"))
        message = call(server, stream_final, max_retries=1)
        assert len(server.message_requests()) == 2
    assert message.content[0].type == "text"
    assert message.content[0].text == "recovered"


def test_authentication_error_is_not_retried() -> None:
    with FakeAnthropicServer() as server:
        server.enqueue(authentication(), MessageReply())
        with pytest.raises(anthropic.AuthenticationError):
            call(server, create, max_retries=2)
        assert server.pending == 1


def test_overloaded_mid_stream_is_a_plain_status_error() -> None:
    """The HTTP status was already 200, so the SDK cannot map it to OverloadedError."""
    with FakeAnthropicServer() as server:
        server.enqueue(overloaded(mid_stream=True), MessageReply())
        with pytest.raises(anthropic.APIStatusError) as info:
            call(server, stream_final, max_retries=2)
        assert server.pending == 1  # raised while iterating: no SDK retry
    assert not isinstance(info.value, anthropic.InternalServerError)
    assert info.value.type == "overloaded_error"


def test_disconnect_is_a_connection_error() -> None:
    with FakeAnthropicServer() as server:
        server.enqueue(Disconnect())
        with pytest.raises(anthropic.APIConnectionError):
            call(server, create)


def test_count_tokens_default_and_custom() -> None:
    async def count(client: anthropic.AsyncAnthropic) -> int:
        result = await client.messages.count_tokens(model=MODEL, messages=MESSAGES, tools=TOOLS)
        return result.input_tokens

    with FakeAnthropicServer() as server:
        assert call(server, count) >= 1
    with FakeAnthropicServer(count_tokens=lambda body: 1000 * len(body["messages"])) as server:
        assert call(server, count) == 1000
        (recorded,) = server.requests
    assert recorded.path == "/v1/messages/count_tokens"
    assert recorded.body["tools"] == TOOLS


def test_models_retrieve_reports_limits_and_404s_unknown_ids() -> None:
    models = {
        "big": ModelSpec(max_input_tokens=1_000_000, max_tokens=128_000),
        "bare": ModelSpec(max_input_tokens=None, max_tokens=None, display_name="Bare"),
    }
    with FakeAnthropicServer(models=models) as server:
        big = call(server, lambda c: c.models.retrieve("big"))
        bare = call(server, lambda c: c.models.retrieve("bare"))
        with pytest.raises(anthropic.NotFoundError) as info:
            call(server, lambda c: c.models.retrieve(MODEL))
    assert (big.type, big.id, big.max_input_tokens, big.max_tokens) == (
        "model",
        "big",
        1_000_000,
        128_000,
    )
    assert (bare.display_name, bare.max_input_tokens, bare.max_tokens) == ("Bare", None, None)
    assert info.value.type == "not_found_error"


def test_requests_are_recorded_with_auth_header_and_body() -> None:
    async def two_calls(client: anthropic.AsyncAnthropic) -> None:
        await create(client, tools=TOOLS)
        await stream_final(client, system="summarise")

    with FakeAnthropicServer() as server:
        call(server, two_calls)
        first, second = server.message_requests()
    assert first.method == "POST"
    assert first.headers["authorization"] == "Bearer test-key"
    assert first.headers["anthropic-version"]
    assert first.body["tools"] == TOOLS
    assert "stream" not in first.body
    assert "tools" not in second.body
    assert second.body["stream"] is True
    assert second.body["system"] == "summarise"
    assert "test-key" not in repr(first)


def test_default_reply_and_responder() -> None:
    def responder(body: dict[str, Any]) -> MessageReply:
        return MessageReply(text=f"{len(body['messages'])} messages")

    with FakeAnthropicServer(default=MessageReply(text="default")) as server:
        assert call(server, create).content[0].type == "text"
        message = call(server, create)
        assert message.content[0].type == "text"
        assert message.content[0].text == "default"
        server.enqueue(responder)
        message = call(server, create)
        assert message.content[0].type == "text"
        assert message.content[0].text == "1 messages"
        server.default = lambda body: prompt_too_long(300_000, 200_000)
        with pytest.raises(anthropic.BadRequestError):
            call(server, create)


def test_delay_slows_the_reply() -> None:
    with FakeAnthropicServer() as server:
        server.enqueue(MessageReply(delay=0.3))
        started = time.monotonic()
        call(server, create)
    assert time.monotonic() - started >= 0.3


def test_stop_abandons_a_slow_reply_promptly() -> None:
    errors: list[BaseException] = []
    server = FakeAnthropicServer().start()
    server.enqueue(MessageReply(delay=60))

    def client_thread() -> None:
        try:
            call(server, create)
        except anthropic.APIConnectionError as err:
            errors.append(err)

    thread = threading.Thread(target=client_thread)
    thread.start()
    assert server.wait_for_requests(1)
    started = time.monotonic()
    server.stop()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert time.monotonic() - started < 5
    assert len(errors) == 1


@pytest.mark.slow
def test_runs_as_a_subprocess() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}  # import segue as we do
    proc = subprocess.Popen(
        [sys.executable, "-m", "segue.testing.anthropic_server", "--text", "from child"],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")

        async def main() -> Message:
            async with anthropic.AsyncAnthropic(api_key="k", base_url=url, max_retries=0) as c:
                return await create(c)

        message = asyncio.run(main())
        assert message.content[0].type == "text"
        assert message.content[0].text == "from child"
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        assert proc.stdout is not None
        proc.stdout.close()


def test_invalid_requests_and_unknown_paths_get_api_errors() -> None:
    async def bad_body(client: anthropic.AsyncAnthropic) -> object:
        return await client.post("/v1/messages", body={"model": MODEL}, cast_to=object)

    async def bad_path(client: anthropic.AsyncAnthropic) -> object:
        return await client.get("/v1/nothing-here", cast_to=object)

    with FakeAnthropicServer() as server:
        with pytest.raises(anthropic.BadRequestError) as bad_request:
            call(server, bad_body)
        with pytest.raises(anthropic.NotFoundError):
            call(server, bad_path)
        assert server.pending == 0
    assert bad_request.value.type == "invalid_request_error"


def test_a_failing_responder_surfaces_as_an_unretried_500() -> None:
    def responder(body: dict[str, Any]) -> MessageReply:
        raise ValueError("scripted bug")

    with FakeAnthropicServer(default=responder) as server:
        with pytest.raises(anthropic.InternalServerError) as info:
            call(server, create, max_retries=2)
        assert len(server.requests) == 1
    assert "scripted bug" in info.value.message


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_every_answer_parses_as_the_sdks_own_type(stream: bool) -> None:
    """The fake's JSON (usage it measured, a tool call, thinking) validates as the SDK's
    ``Message`` and ``RawMessageStreamEvent``, not only as what the SDK tolerates."""
    import json

    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    from segue.testing.anthropic_server import Thinking

    reply = MessageReply(
        text="Let me look.", tool_uses=[ToolUse("read", {"p": 1})], thinking=[Thinking("hm")]
    )
    body = {"model": "claude-sonnet-4-6", "max_tokens": 100, "stream": stream}
    body["messages"] = [{"role": "user", "content": "hi"}]
    with FakeAnthropicServer(default=reply) as server:
        raw = server.post("/v1/messages", body, {"x-api-key": "k"})
    if not stream:
        message = Message.model_validate(json.loads(raw))
        assert message.usage.input_tokens == 9  # "hi", as segue estimates it
        return
    events = [json.loads(line[5:]) for line in raw.splitlines() if line.startswith("data:")]
    events = [e for e in events if e["type"] != "ping"]  # the API's keep-alive, no type of it
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    assert [adapter.validate_python(e).type for e in events][-1] == "message_stop"
