"""Claude on Amazon Bedrock and Google Vertex AI: ``AnthropicModel`` over the SDK's
``AsyncAnthropicBedrock`` and ``AsyncAnthropicVertex``, each pointed at the fake server through
its ``base_url`` (Bedrock's stream in AWS event-stream frames, parsed by botocore as in
production), and their model ids mapped onto segue's table of windows."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import anthropic
import pytest

from segue import ContextExhausted, MemoryStore, Runtime
from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmReply, LlmRequest
from segue.executor.models.anthropic import AnthropicModel
from segue.executor.models.windows import Window, anthropic_model_name
from segue.statemachine import Message
from segue.testing.anthropic_server import (
    FakeAnthropicServer,
    MessageReply,
    ToolUse,
    Usage,
    prompt_too_long,
)

AWS_SECRET = "aws-secret-NEVER-LEAK-0123456789"  # noqa: S105  # a test credential
VERTEX_TOKEN = "ya29.vertex-NEVER-LEAK-0123456789"  # noqa: S105
BEDROCK_MODEL = "anthropic.claude-sonnet-4-6-20260101-v1:0"
VERTEX_MODEL = "claude-sonnet-4-6@20260101"

Client = anthropic.AsyncAnthropicBedrock | anthropic.AsyncAnthropicVertex


def bedrock(url: str) -> Client:
    pytest.importorskip("botocore", reason='Bedrock needs pip install "segue[bedrock]"')
    return anthropic.AsyncAnthropicBedrock(
        aws_access_key="AKIDEXAMPLE",
        aws_secret_key=AWS_SECRET,
        aws_region="us-east-1",
        base_url=url,
    )


def vertex(url: str) -> Client:
    return anthropic.AsyncAnthropicVertex(
        access_token=VERTEX_TOKEN, project_id="proj", region="us-east5", base_url=url
    )


CLOUDS: dict[str, tuple[Callable[[str], Client], str]] = {
    "bedrock": (bedrock, BEDROCK_MODEL),
    "vertex": (vertex, VERTEX_MODEL),
}


def request(model: str) -> LlmRequest:
    return LlmRequest(
        conversation_id="c",
        model=model,
        purpose="turn",
        system="Be brief.",
        messages=(Message(kind="user", text="What is in the file?"),),
    )


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_a_streamed_turn_with_a_tool_call(cloud: str) -> None:
    make, model = CLOUDS[cloud]
    reply = MessageReply(
        text="Let me look.",
        tool_uses=[ToolUse("read", {"path": "a.txt"}, id="toolu_1")],
        usage=Usage(100, 20, 0, 900),
        stop_reason="tool_use",
    )
    texts: list[str] = []
    with FakeAnthropicServer() as server:
        server.enqueue(reply)

        async def main() -> LlmReply:
            async with make(server.url) as client:
                asked = dataclasses.replace(request(model), on_text=texts.append)
                return await AnthropicModel(client).complete(asked)

        answered = asyncio.run(main())
        (sent,) = server.message_requests()
    assert answered.text == "Let me look." == "".join(texts)
    assert [(c.id, c.name, c.input) for c in answered.tool_calls] == [
        ("toolu_1", "read", {"path": "a.txt"})
    ]
    assert answered.usage is not None
    assert answered.usage.context_tokens == 1_020
    assert model.replace(":", "%3A") in sent.path or model in sent.path
    assert "model" not in sent.body  # the clouds name it in the path
    assert sent.body["anthropic_version"]


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_cloud_model_ids_map_onto_the_window_table(cloud: str) -> None:
    make, model = CLOUDS[cloud]
    with FakeAnthropicServer() as server:

        async def main() -> Window:
            async with make(server.url) as client:
                return await AnthropicModel(client).window(model)

        assert asyncio.run(main()) == Window(1_000_000, "table")
        assert server.requests == []  # neither cloud has a models endpoint to ask


@pytest.mark.parametrize(
    ("model", "name"),
    [
        (BEDROCK_MODEL, "claude-sonnet-4-6-20260101"),
        ("us.anthropic.claude-haiku-4-5-20251001-v1:0", "claude-haiku-4-5-20251001"),
        ("global.anthropic.claude-opus-4-6-v1", "claude-opus-4-6"),
        (
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/"
            "eu.anthropic.claude-sonnet-4-5-20250929-v1:0",
            "claude-sonnet-4-5-20250929",
        ),
        (VERTEX_MODEL, "claude-sonnet-4-6"),
        ("claude-haiku-4-5@default", "claude-haiku-4-5"),
        ("claude-sonnet-4-6", "claude-sonnet-4-6"),
        ("my-proxy-model", "my-proxy-model"),
    ],
)
def test_anthropic_model_name(model: str, name: str) -> None:
    assert anthropic_model_name(model) == name


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_an_overflow_takes_the_exhaustion_path_and_no_credential_leaks(cloud: str) -> None:
    make, model = CLOUDS[cloud]
    with FakeAnthropicServer() as server:
        server.enqueue(prompt_too_long(1_200_000, 1_000_000))

        async def main() -> tuple[LlmCallError, Any]:
            async with make(server.url) as client:
                llm = AnthropicModel(client)
                with pytest.raises(LlmCallError) as caught:
                    await llm.complete(request(model))
                async with Runtime(store=MemoryStore(), llm=llm) as rt:
                    conversation = await rt.create_conversation(model=model)
                    server.enqueue(
                        prompt_too_long(1_200_000, 1_000_000), MessageReply(text="Summary.")
                    )
                    state = await rt.send(conversation.id, "A whole book.")
                return caught.value, state

        error, state = asyncio.run(main())
    assert error.context_overflow
    assert isinstance(state.phase, ContextExhausted)
    assert state.context_window == 1_000_000
    shown = f"{error!r} {error.__cause__!r} {state!r}"
    assert AWS_SECRET not in shown
    assert VERTEX_TOKEN not in shown
