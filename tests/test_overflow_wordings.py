"""Every server's way of saying "the prompt does not fit" takes the exhaustion path (issue 27):
the table of wordings in the adapter helpers, one by one, then each server's own error body
through the real clients."""

from __future__ import annotations

import asyncio

import anthropic
import openai
import pytest

from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmRequest
from segue.executor.models.anthropic import AnthropicModel
from segue.executor.models.call_errors import OVERFLOW_WORDINGS, says_overflow
from segue.executor.models.openai import OpenAIModel
from segue.statemachine import Message
from segue.testing import anthropic_server
from segue.testing.openai_server import OVERFLOWS, ErrorReply, FakeOpenAIServer

KEY = "sk-test-overflow-wordings-0123456789"
REQUEST = LlmRequest(
    conversation_id="c",
    model="local",
    purpose="turn",
    system=None,
    messages=(Message(kind="user", text="hi"),),
)


@pytest.mark.parametrize(
    ("who", "wording"), OVERFLOW_WORDINGS, ids=[w for _, w in OVERFLOW_WORDINGS]
)
def test_each_wording_is_an_overflow(who: str, wording: str) -> None:
    said = f"Error from {who}: {wording.upper()} (details follow)"
    assert says_overflow(400, said)
    assert says_overflow(None, "stream error", said)  # an error event in a started stream
    assert not says_overflow(401, said)  # a refused key is a refused key, whatever it says


@pytest.mark.parametrize(
    "message",
    [
        "Rate limit reached for requests",
        "The server had an error while processing your request.",
        "Invalid value for 'temperature'",
        "context is fine",
    ],
)
def test_other_errors_are_not(message: str) -> None:
    assert not says_overflow(400, message)


def test_every_server_fake_body_is_recognised_by_the_table() -> None:
    for name, reply in OVERFLOWS.items():
        assert says_overflow(reply.status, reply.message, reply.type, reply.code), name


async def _complete_openai(server: FakeOpenAIServer, api: str) -> LlmCallError:
    async with openai.AsyncOpenAI(api_key=KEY, base_url=server.url, max_retries=0) as client:
        with pytest.raises(LlmCallError) as caught:
            await OpenAIModel(client, api=api).complete(REQUEST)  # type: ignore[arg-type]
    return caught.value


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("name", sorted(OVERFLOWS))
def test_each_servers_overflow_body_through_the_openai_client(name: str, api: str) -> None:
    with FakeOpenAIServer() as server:
        server.enqueue(OVERFLOWS[name])
        error = asyncio.run(_complete_openai(server, api))
    assert error.context_overflow, error.message
    assert not error.retryable


@pytest.mark.parametrize("name", ["llama.cpp", "vllm"])
def test_an_overflow_in_a_started_stream_is_one_too(name: str) -> None:
    said = OVERFLOWS[name]
    mid = ErrorReply(said.status, said.message, type=said.type, code=said.code, mid_stream=True)
    with FakeOpenAIServer() as server:
        server.enqueue(mid)
        error = asyncio.run(_complete_openai(server, "chat"))
    assert error.context_overflow, error.message


def test_a_litellm_proxy_in_anthropics_shape_overflows_too() -> None:
    message = "litellm.ContextWindowExceededError: AnthropicException - prompt exceeds window"
    with anthropic_server.FakeAnthropicServer() as server:
        server.enqueue(anthropic_server.ErrorReply(400, "invalid_request_error", message))

        async def main() -> LlmCallError:
            client = anthropic.AsyncAnthropic(api_key=KEY, base_url=server.url, max_retries=0)
            async with client:
                with pytest.raises(LlmCallError) as caught:
                    await AnthropicModel(client).complete(REQUEST)
            return caught.value

        assert asyncio.run(main()).context_overflow
