"""A third-party OpenAI-compatible server that nobody here wrote holds a conversation through
the threshold with ``OpenAIModel``.

The server is ``fakellm`` (PyPI, MIT; a dev dependency), a FastAPI mock of the OpenAI and
Anthropic APIs answering from YAML rules, run here in-process on a loopback port. It streams
Chat Completions word by word and, like many compatible servers, sends no usage at all, so the
meter runs on segue's pre-flight estimate alone: the conversation must still reach 90% of its
window, ask for the tool-less summary (which the server's own rule answers) and turn read-only.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import tiktoken

from segue import ContextExhausted, MemoryStore, OpenAIModel, Runtime
from segue.executor.instructions import CONTINUATION_INSTRUCTION
from segue.testing.live import live_server

ANSWER = " ".join(f"observation-{i:02d}-of-the-tides" for i in range(40))  # streamed per word
SUMMARY = "Summary: the user asked many questions about tides."
WINDOW = 3_000


def rules() -> str:
    """fakellm's YAML: the summary request (its instruction is unique to it) gets the summary,
    everything else a long answer. JSON is YAML, so json.dumps quotes the texts safely."""
    return "\n".join(
        [
            "version: 1",
            "rules:",
            "  - name: summary",
            "    when:",
            f"      messages_contain: {json.dumps(CONTINUATION_INSTRUCTION[:40])}",
            "    respond:",
            f"      content: {json.dumps(SUMMARY)}",
            "  - name: answer",
            "    when:",
            '      model_matches: "*"',  # a glob: every model
            "    respond:",
            f"      content: {json.dumps(ANSWER)}",
        ]
    )


@pytest.fixture
def fakellm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """fakellm's own ASGI app on a free loopback port; its base URL for the openai client."""
    config = tmp_path / "fakellm.yaml"
    config.write_text(rules(), encoding="utf-8")
    monkeypatch.setenv("FAKELLM_CONFIG", str(config))

    def no_download(name: str) -> Any:
        raise OSError(f"{name}: tests never download tiktoken's encodings")

    # fakellm counts with tiktoken when an encoding loads (else len // 4); loading one would
    # try to download it, and tests stay off the network.
    monkeypatch.setattr(tiktoken, "get_encoding", no_download)
    server: Any = importlib.import_module("fakellm.server")
    with live_server(server.app) as url:
        reloaded = httpx2.post(f"{url}/_fakellm/reload", timeout=30).json()
        assert reloaded == {"reloaded": True, "rules": 2}
        httpx2.post(f"{url}/_fakellm/reset", timeout=30)
        yield f"{url}/v1"


def test_a_third_party_server_holds_a_conversation_through_the_threshold(fakellm: str) -> None:
    async def main() -> None:
        async with (
            openai.AsyncOpenAI(api_key="anything", base_url=fakellm, max_retries=0) as client,
            Runtime(store=MemoryStore(), llm=OpenAIModel(client)) as rt,
        ):
            conversation = await rt.create_conversation(model="local-model", context_window=WINDOW)
            state = conversation
            sent = 0
            while not isinstance(state.phase, ContextExhausted):
                sent += 1
                assert sent < 30, f"never reached the threshold: {state}"
                state = await rt.send(conversation.id, f"Tell me about tides, part {sent}.")
                assert state.phase.kind in ("idle", "context_exhausted"), state.phase
            assert state.phase.summary == SUMMARY
            transcript = await rt.messages(conversation.id)
            answers = [m for m in transcript if m.kind == "assistant"]
            assert answers
            assert all(m.text == ANSWER for m in answers)  # streamed word by word, joined
            assert transcript[-1].kind == "continuation"
            assert sent >= 3  # it took several turns: the estimate grew with the transcript
            child = await rt.start_new_from(conversation.id, seed_with_summary=True)
            assert child.parent_id == conversation.id

    asyncio.run(main())
