"""Drive ``FakeOpenAIServer`` with the real ``openai.AsyncOpenAI`` client, for what the fake
does itself rather than what ``OpenAIModel`` makes of it (that is ``test_openai_model``)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from segue.testing.openai_server import FakeOpenAIServer, Reply


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
