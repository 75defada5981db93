"""Content a model's API cannot take is refused when the message is sent, before anything is
stored: ``Runtime.send()`` and ``stream()`` ask the adapter's optional ``check_content(blocks)``.

Over the real clients against their fake servers: a PDF on OpenAI's Chat Completions raises
``InvalidMessageError`` with the adapter's reason, the fake server receives nothing and the
store holds nothing (the conversation stays idle and takes the next message); the same PDF goes
out on the Responses API and to Anthropic. An adapter of one's own is asked the same way, and
one without the method is not asked at all.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from segue import InvalidMessageError, Runtime, ScriptedModel, SqliteStore
from segue.testing.conformance import Said
from segue.testing.harnesses import HARNESSES

PDF: list[dict[str, Any]] = [
    {"type": "text", "text": "Read the report."},
    {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK"},
        "title": "report",
    },
]


async def refused_or_sent(name: str, db: Path, how: str) -> tuple[str | None, int, list[str]]:
    """Send the PDF with ``how`` (``send`` or ``stream``): the refusal's message (None if it
    went), how many model requests the fake received, and the kinds stored."""
    with HARNESSES[name]() as harness:
        harness.default(Said(text="It says hello."))
        async with (
            harness.model() as llm,
            Runtime(store=SqliteStore(db), llm=llm) as rt,
        ):
            cid = (await rt.create_conversation(model="gpt-4o")).id
            refusal = None
            try:
                if how == "send":
                    await rt.send(cid, PDF)
                else:
                    async for _ in rt.stream(cid, PDF):
                        pass
            except InvalidMessageError as error:
                refusal = str(error)
                assert (await rt.state(cid)).phase.kind == "idle"
                await rt.send(cid, "Then just say hello.")  # it takes the next message
                assert await rt.last_reply(cid) == "It says hello."
                requests = len(harness.sent()) - 1
                kinds = [m.kind for m in await rt.messages(cid)][:-2]
                return refusal, requests, kinds
            kinds = [m.kind for m in await rt.messages(cid)]
            return refusal, len(harness.sent()), kinds


@pytest.mark.parametrize("how", ["send", "stream"])
def test_a_pdf_on_chat_completions_is_refused_before_anything_is_stored_or_sent(
    how: str, tmp_path: Path
) -> None:
    refusal, requests, kinds = asyncio.run(refused_or_sent("openai-chat", tmp_path / "c.db", how))
    assert refusal is not None
    assert "PDF" in refusal
    assert 'api="responses"' in refusal  # the adapter's reason says what to do instead
    assert requests == 0  # the fake server was never asked
    assert kinds == []  # nothing stored


@pytest.mark.parametrize("name", ["openai-responses", "anthropic"])
def test_the_same_pdf_goes_out_where_the_api_takes_it(name: str, tmp_path: Path) -> None:
    refusal, requests, kinds = asyncio.run(refused_or_sent(name, tmp_path / "p.db", "send"))
    assert refusal is None
    assert requests == 1
    assert kinds == ["user", "assistant"]


class Picky(ScriptedModel):
    """An adapter of one's own that takes no images."""

    def __init__(self) -> None:
        super().__init__(window=50_000)
        self.checked: list[tuple[Any, ...]] = []

    def check_content(self, blocks: Any) -> None:
        self.checked.append(tuple(blocks))
        if any(getattr(block, "type", None) == "image" for block in blocks):
            raise ValueError("this model reads no images: describe the picture in words")


IMAGE: list[dict[str, Any]] = [
    {"type": "text", "text": "What is it?"},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw=="}},
]


def test_an_adapter_of_ones_own_is_asked_and_one_without_the_method_is_not(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        picky = Picky()
        async with Runtime(store=SqliteStore(tmp_path / "own.db"), llm=picky) as rt:
            cid = (await rt.create_conversation(model="picky")).id
            with pytest.raises(InvalidMessageError, match="reads no images"):
                await rt.send(cid, IMAGE)
            assert await rt.messages(cid) == []
            assert picky.requests == []
            await rt.send(cid, "Plain text is not checked.")
            await rt.send(cid, [{"type": "text", "text": "Blocks are."}])
            assert [len(blocks) for blocks in picky.checked] == [2, 1]
        plain = ScriptedModel(window=50_000)
        async with Runtime(store=SqliteStore(tmp_path / "plain.db"), llm=plain) as rt:
            cid = (await rt.create_conversation(model="plain")).id
            await rt.send(cid, IMAGE)  # no check_content: taken, as before
            assert [m.kind for m in await rt.messages(cid)] == ["user", "assistant"]

    asyncio.run(scenario())
