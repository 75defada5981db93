"""The generic families of "the prompt does not fit" that other libraries' detectors match
(issue 35): on a 400 or a 413 each takes the exhaustion path, through the real SDK clients
against segue's fake servers, where the conversation used to end ``failed``; on a 429 ("too many
tokens" is a rate limit) or a 5xx the same words are retried, never an overflow. And llama.cpp's
own error body, exactly as its server sends it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import openai
import pytest

from segue import ContextExhausted, MemoryStore, Runtime
from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmModel, LlmRequest
from segue.executor.models.anthropic import AnthropicModel
from segue.executor.models.call_errors import GENERIC_OVERFLOW_WORDINGS, says_overflow
from segue.executor.models.openai import OpenAIModel
from segue.statemachine import Failed, Idle, Message
from segue.testing import anthropic_server as fake_anthropic
from segue.testing import openai_server as fake_openai

KEY = "sk-test-overflow-families-0123456789"
WINDOW = 8_192

FAMILIES: dict[str, str] = {
    "maximum context length": (
        "Requested token count exceeds the model's maximum context length of 8192 tokens. "
        "You requested a total of 9100 tokens: 8100 tokens from the input messages and 1000 "
        "tokens for the completion."
    ),
    "context length exceeded": "Context length exceeded: 9100 tokens > 8192 tokens.",
    "input is too long": "Input is too long for requested model.",
    "exceeds token limit": "The prompt exceeds token limit of the deployment (8192).",
    "context window full": "Context window full: reduce the conversation and try again.",
}
"""A message of each family, as a server would put it (none is one of segue's exact
wordings, ``OVERFLOW_WORDINGS``, so the family alone must carry it)."""


def test_the_messages_cover_every_family_and_no_exact_wording() -> None:
    assert sorted(FAMILIES) == sorted(GENERIC_OVERFLOW_WORDINGS)
    for message in FAMILIES.values():
        assert not says_overflow(500, message)  # a 5xx with it: the exact table does not hold it


class Provider:
    """A provider's fake server, the real SDK client over it, and its error replies."""

    def __init__(self, name: str) -> None:
        self.name = name

    def server(self) -> Any:
        if self.name == "anthropic":
            return fake_anthropic.FakeAnthropicServer()
        return fake_openai.FakeOpenAIServer()

    def llm(self, server: Any) -> tuple[Any, LlmModel]:
        if self.name == "anthropic":
            client: Any = anthropic.AsyncAnthropic(api_key=KEY, base_url=server.url)
            return client, AnthropicModel(client)
        client = openai.AsyncOpenAI(api_key=KEY, base_url=server.url)
        return client, OpenAIModel(client, api="chat")

    def error(self, status: int, message: str, **headers: str) -> Any:
        if self.name == "anthropic":
            kind = "rate_limit_error" if status == 429 else "invalid_request_error"
            return fake_anthropic.ErrorReply(status, kind, message, headers=headers)
        code = "rate_limit_exceeded" if status == 429 else None
        return fake_openai.ErrorReply(status, message, code=code, headers=headers)

    def answer(self, text: str) -> Any:
        if self.name == "anthropic":
            return fake_anthropic.MessageReply(text=text)
        return fake_openai.Reply(text=text)

    @property
    def model(self) -> str:
        return "claude-sonnet-4-6" if self.name == "anthropic" else "local-model"


PROVIDERS = [Provider("anthropic"), Provider("openai")]


def converse(provider: Provider, *replies: Any) -> tuple[Any, list[str]]:
    """A conversation's first message, answered by ``replies`` in order: its final state and
    the purpose of each model request the fake received."""
    with provider.server() as server:
        server.enqueue(*replies)

        async def main() -> Any:
            client, llm = provider.llm(server)
            async with client, Runtime(store=MemoryStore(), llm=llm) as rt:
                conversation = await rt.create_conversation(
                    model=provider.model, context_window=WINDOW, retry_base_delay=0.0
                )
                return await rt.send(conversation.id, "A whole book, please summarise it.")

        state = asyncio.run(main())
        asked = [r for r in server.requests if r.method == "POST"]
    return state, [json.dumps(r.body) for r in asked]


@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_on_a_400_takes_the_exhaustion_path(provider: Provider, family: str) -> None:
    overflow = provider.error(400, FAMILIES[family])
    state, sent = converse(provider, overflow, provider.answer("Summary of the book."))
    assert isinstance(state.phase, ContextExhausted), state.phase
    assert len(sent) == 2  # the turn, then the continuation's summary request: no retry
    assert "summar" in sent[1].lower()


@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_on_a_413_is_an_overflow(provider: Provider, family: str) -> None:
    with provider.server() as server:
        server.enqueue(provider.error(413, FAMILIES[family]))
        error = asyncio.run(_complete(provider, server))
    assert error.context_overflow, error.message
    assert not error.retryable


@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
@pytest.mark.parametrize("status", [429, 500, 503])
def test_the_same_words_on_a_429_or_a_5xx_are_retried_not_an_overflow(
    provider: Provider, status: int
) -> None:
    said = "Too many tokens: the request exceeds token limit of 30000 tokens per minute."
    busy = provider.error(status, said, **{"retry-after": "0"})
    state, sent = converse(provider, busy, provider.answer("Here is the summary."))
    assert isinstance(state.phase, Idle), state.phase
    assert len(sent) == 2  # the same turn asked again, not a summary request
    assert sent[0] == sent[1]
    with provider.server() as server:
        server.enqueue(busy)
        error = asyncio.run(_complete(provider, server))
    assert not error.context_overflow
    assert error.retryable


def test_a_429_never_ends_the_conversation_at_the_limit() -> None:
    """Retried until the attempts run out: the turn fails as a rate limit, not as exhausted."""
    provider = Provider("openai")
    busy = provider.error(429, FAMILIES["context window full"], **{"retry-after": "0"})
    state, sent = converse(provider, *[busy] * 4)
    assert isinstance(state.phase, Failed)
    assert state.phase.error_kind.value != "context_exhausted"
    assert len(sent) == 4


LLAMA_CPP = fake_openai.RawReply(
    status=400,
    body=json.dumps(
        {
            "error": {
                "code": 400,
                "message": "request (6031 tokens) exceeds the available context size "
                "(2048 tokens), try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 6031,
                "n_ctx": 2048,
            }
        }
    ).encode(),
    content_type="application/json; charset=utf-8",
)
"""llama.cpp's server's answer to a prompt larger than its slot's context, byte for byte."""


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_llama_cpps_own_body_takes_the_exhaustion_path(api: str) -> None:
    with fake_openai.FakeOpenAIServer() as server:
        server.enqueue(LLAMA_CPP, fake_openai.Reply(text="Summary."))

        async def main() -> Any:
            client = openai.AsyncOpenAI(api_key=KEY, base_url=server.url)
            llm = OpenAIModel(client, api=api)  # type: ignore[arg-type]
            async with client, Runtime(store=MemoryStore(), llm=llm) as rt:
                conversation = await rt.create_conversation(model="local", context_window=2048)
                return await rt.send(conversation.id, "A long file.")

        state = asyncio.run(main())
    assert isinstance(state.phase, ContextExhausted), state.phase


async def _complete(provider: Provider, server: Any) -> LlmCallError:
    client, llm = provider.llm(server)
    request = LlmRequest(
        conversation_id="c",
        model=provider.model,
        purpose="turn",
        system=None,
        messages=(Message(kind="user", text="hi"),),
    )
    async with client:
        with pytest.raises(LlmCallError) as caught:
            await llm.complete(request)
    return caught.value
