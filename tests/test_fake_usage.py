"""The fakes report the usage of what they are sent (issue 29): an offline conversation's meter
moves as it would against the real API, counted with segue's own estimate, unless a test
scripts its usage."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import anthropic
import openai
import pytest

from segue import MemoryStore, Runtime
from segue.executor.model_port import LlmModel
from segue.executor.models.anthropic import AnthropicModel
from segue.executor.models.openai import OpenAIModel
from segue.statemachine import estimate_tokens
from segue.testing.anthropic_server import FakeAnthropicServer
from segue.testing.openai_server import FakeOpenAIServer

KEY = "sk-test-fake-usage-0123456789"


@contextlib.asynccontextmanager
async def model(provider: str, url: str) -> AsyncIterator[LlmModel]:
    if provider == "anthropic":
        async with anthropic.AsyncAnthropic(api_key=KEY, base_url=url) as client:
            yield AnthropicModel(client)
    else:
        async with openai.AsyncOpenAI(api_key=KEY, base_url=url) as client:
            yield OpenAIModel(client)


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_the_meter_moves_with_what_is_sent(provider: str) -> None:
    fake = FakeAnthropicServer() if provider == "anthropic" else FakeOpenAIServer()
    question = "Tell me about context windows. " * 40  # 1,240 bytes: 422 tokens

    async def main(url: str) -> list[int]:
        meters = []
        async with model(provider, url) as llm, Runtime(store=MemoryStore(), llm=llm) as rt:
            conversation = await rt.create_conversation(
                model="claude-sonnet-4-6" if provider == "anthropic" else "gpt-4o",
                context_window=3_000,
                system="Be brief.",
            )
            for _ in range(3):
                state = await rt.send(conversation.id, question)
                meters.append(state.context_tokens or 0)
        return meters

    with fake:
        meters = asyncio.run(main(fake.url))
    reply = estimate_tokens("ok")
    first = estimate_tokens("Be brief.") + estimate_tokens(question) + reply
    assert meters[0] == first  # system, question, the answer
    assert meters[0] < meters[1] < meters[2]  # each turn adds its question and answer
    assert meters[2] - meters[1] == meters[1] - meters[0] == estimate_tokens(question) + reply
