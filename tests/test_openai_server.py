"""Drive ``FakeOpenAIServer`` with the real ``openai.AsyncOpenAI`` client, for what the fake
does itself rather than what ``OpenAIModel`` makes of it (that is ``test_openai_model``)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from segue.statemachine import estimate_tokens
from segue.testing.openai_server import FakeOpenAIServer, Reply, ToolCall


def test_a_failing_responder_surfaces_as_an_unretried_500() -> None:
    def responder(body: dict[str, Any]) -> Reply:
        raise ValueError("scripted bug")

    async def ask(server: FakeOpenAIServer) -> None:
        async with openai.AsyncOpenAI(api_key="test", base_url=server.url, max_retries=2) as c:
            await c.chat.completions.create(
                model="gpt-4.1", messages=[{"role": "user", "content": "hi"}]
            )

    with FakeOpenAIServer(default=responder) as server:
        with pytest.raises(openai.InternalServerError) as info:
            asyncio.run(ask(server))
        assert len(server.requests) == 1
    assert "scripted bug" in info.value.message
    assert info.value.response.headers["x-request-id"].startswith("req_fake_")


# --------------------------------------------------------------------------- the SDK's own types


def _answers(api: str, stream: bool) -> list[Any]:
    """Every answer of the fake to two requests (a tool call, then text), as the JSON sent."""
    import json

    answers: list[Any] = []
    with FakeOpenAIServer() as server:
        server.enqueue(
            Reply(text="Let me check.", tool_calls=[ToolCall("lookup", {"q": "x"})]),
            Reply(text="Done."),  # usage counted by the fake from what it was sent
        )
        for _ in range(2):
            body: dict[str, Any] = {"model": "gpt-4o", "stream": stream}
            if api == "chat":
                body |= {
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream_options": {"include_usage": True},
                }
            else:
                body["input"] = "hi"
            path = "/v1/chat/completions" if api == "chat" else "/v1/responses"
            raw = server.post(path, body, {"authorization": "Bearer k"})
            if not stream:
                answers.append(json.loads(raw))
                continue
            answers += [
                json.loads(line[5:])
                for line in raw.splitlines()
                if line.startswith("data:") and line[5:].strip() != "[DONE]"
            ]
    return answers


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_every_answer_parses_as_the_sdks_own_type(api: str, stream: bool) -> None:
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    sent = _answers(api, stream)
    assert sent
    kind: Any = {
        ("chat", False): ChatCompletion,
        ("chat", True): ChatCompletionChunk,
        ("responses", False): Response,
        ("responses", True): ResponseStreamEvent,
    }[(api, stream)]
    adapter = TypeAdapter(kind)
    for data in sent:
        adapter.validate_python(data, strict=False)
    usages = [d.get("usage") or d.get("response", {}).get("usage") for d in sent]
    prompts = {u.get("prompt_tokens", u.get("input_tokens")) for u in usages if u}
    assert prompts == {estimate_tokens("hi")}  # counted from what was sent, as segue counts
