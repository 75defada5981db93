"""What real conversations carry: content blocks, model settings, prompt caching, lookups.

The core's part (values, derived text, conservative estimates) is checked on its own; the wire
is checked with the real ``anthropic`` client against ``FakeAnthropicServer``: what the server
received is the proof (images and documents sent as the API takes them, thinking blocks sent
back unchanged with their signatures, settings and cache breakpoints in the request body).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import pydantic
import pytest

from segue import (
    AnthropicModel,
    ImageBlock,
    InvalidMessageError,
    LlmReply,
    LlmRequest,
    MemoryStore,
    Message,
    Runtime,
    ScriptedModel,
    SqliteStore,
    Store,
    TextBlock,
    ThinkingBlock,
    ToolRegistry,
    UserMessage,
    estimate_content,
    estimate_tokens,
    new_conversation,
    transition,
)
from segue.effects import AppendMessage
from segue.executor.stores.codec import dump_message, load_message
from segue.executor.tools import Tool
from segue.statemachine.content import (
    DOCUMENT_PAGE_TOKENS,
    DOCUMENT_URL_PAGES,
    IMAGE_MAX_TOKENS,
    image_size,
    image_tokens,
)
from segue.testing.anthropic_server import FakeAnthropicServer, MessageReply, Thinking, ToolUse
from segue.testing.logs import capture_logs

KEY = "sk-ant-content-test-0000"
MODEL = "claude-sonnet-4-6"


def png(width: int, height: int) -> str:
    """A real (tiny, valid) PNG of the given size, base64-encoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (width + 1) * min(height, 4))
    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    return base64.b64encode(raw).decode()


def gif(width: int, height: int) -> str:
    return base64.b64encode(b"GIF89a" + struct.pack("<HH", width, height) + b"\x00" * 20).decode()


def jpeg(width: int, height: int) -> str:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + b"\x00" * 9
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return base64.b64encode(b"\xff\xd8" + app0 + sof + b"\xff\xd9").decode()


def image(data: str, media_type: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def pdf(pages: int) -> str:
    page = b" 0 obj << /Type /Page /Parent 2 0 R >> endobj\n"
    objects = b"".join(str(n).encode() + page for n in range(pages))
    head = b"%PDF-1.7\n1 0 obj << /Type /Pages /Count " + str(pages).encode() + b" >> endobj\n"
    raw = head + objects + b"%%EOF"
    return base64.b64encode(raw).decode()


# --------------------------------------------------------------------------- the core's values


def test_a_user_message_with_blocks_derives_its_text() -> None:
    said = UserMessage.model_validate(
        {"content": [image(png(10, 10)), {"type": "text", "text": "What is this?"}]}
    )
    assert said.text == "What is this?"
    assert isinstance(said.content[0], ImageBlock)
    only = UserMessage.model_validate({"content": [image(png(10, 10))]})
    assert only.text == "[image]"
    titled = UserMessage.model_validate(
        {
            "content": [
                {
                    "type": "document",
                    "source": {"type": "text", "data": "Clause 1."},
                    "title": "contract.txt",
                }
            ]
        }
    )
    assert titled.text == "[document: contract.txt]"
    with pytest.raises(pydantic.ValidationError):
        UserMessage(text="Something else", content=(TextBlock(text="What is this?"),))
    with pytest.raises(pydantic.ValidationError):
        UserMessage.model_validate({"content": [image(png(1, 1), "image/bmp")]})
    with pytest.raises(pydantic.ValidationError):
        UserMessage(text="")


def test_images_are_estimated_from_their_header_and_never_below_the_providers_count() -> None:
    assert image_size(png(640, 480)) == (640, 480)
    assert image_size(gif(300, 200)) == (300, 200)
    assert image_size(jpeg(1024, 768)) == (1024, 768)
    small = image_tokens(ImageBlock.model_validate(image(png(640, 480))).source)
    assert small == -(-640 * 480 // 750)  # the provider's formula: width * height / 750
    huge = image_tokens(ImageBlock.model_validate(image(png(8000, 6000))).source)
    assert huge <= IMAGE_MAX_TOKENS
    assert huge >= 4_700  # downscaled, not free
    unreadable = ImageBlock.model_validate(image(base64.b64encode(b"not an image").decode()))
    assert image_tokens(unreadable.source) == IMAGE_MAX_TOKENS
    by_url = ImageBlock.model_validate({"type": "image", "source": {"type": "url", "url": "x"}})
    assert image_tokens(by_url.source) == IMAGE_MAX_TOKENS


def test_documents_are_estimated_per_page_or_as_text() -> None:
    three = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf"}}
    three["source"]["data"] = pdf(3)  # type: ignore[index]
    message = UserMessage.model_validate({"content": [three, {"type": "text", "text": "Read."}]})
    assert estimate_content(message.text, message.content) == (
        estimate_tokens("Read.") + 3 * DOCUMENT_PAGE_TOKENS
    )
    linked = UserMessage.model_validate(
        {"content": [{"type": "document", "source": {"type": "url", "url": "https://x/y.pdf"}}]}
    )
    assert estimate_content(linked.text, linked.content) >= DOCUMENT_URL_PAGES * 4_000


def test_the_core_records_blocks_and_counts_them_in_pre_flight() -> None:
    state = new_conversation(model="claude-sonnet-4-5", context_window=10_000)
    event = UserMessage.model_validate(
        {"content": [image(png(8000, 6000)), {"type": "text", "text": "hi"}]}
    )
    after, effects = transition(state, event)
    appended = effects[0]
    assert isinstance(appended, AppendMessage)
    recorded = appended.message
    assert recorded.content == event.content
    assert recorded.text == "hi"
    assert after.pending_tokens - state.pending_tokens > 4_000
    assert load_message(dump_message(recorded)) == recorded
    # Two such images fill this small window: the second is stopped before it is sent.
    images = [image(png(8000, 6000))] * 2
    too_big = UserMessage.model_validate({"content": images})
    _, refused = transition(state, too_big)
    assert [effect.kind for effect in refused] == ["reject_user_message"]


# --------------------------------------------------------------------------- over the wire


@pytest.fixture
def server() -> Any:
    with FakeAnthropicServer() as fake:
        yield fake


@contextlib.asynccontextmanager
async def connected(
    server: FakeAnthropicServer, store: Store | None = None, **options: Any
) -> AsyncIterator[Runtime]:
    model_options = {k: options.pop(k) for k in ("prompt_caching",) if k in options}
    async with (
        anthropic.AsyncAnthropic(api_key=KEY, base_url=server.url) as client,
        Runtime(
            store=store or MemoryStore(), llm=AnthropicModel(client, **model_options), **options
        ) as rt,
    ):
        yield rt


def bodies(server: FakeAnthropicServer) -> list[dict[str, Any]]:
    return [r.body for r in server.message_requests()]


def plain(value: Any) -> Any:
    """``value`` without cache marks (those have their own test)."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if k != "cache_control"}
    return value


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
def test_images_go_out_as_the_api_takes_them_and_round_trip_the_store(
    server: FakeAnthropicServer, store_kind: str, tmp_path: Path
) -> None:
    picture = png(64, 48)
    blocks = [image(picture), {"type": "text", "text": "What is in this picture?"}]

    async def main() -> None:
        store = MemoryStore() if store_kind == "memory" else SqliteStore(tmp_path / "s.db")
        async with connected(server, store) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.send(conv.id, blocks)
            stored = (await rt.messages(conv.id))[0]
            assert stored.text == "What is in this picture?"
            assert [b.model_dump(exclude_none=True) for b in stored.message.content] == blocks

    asyncio.run(main())
    sent = plain(bodies(server)[0]["messages"][0])
    assert sent == {"role": "user", "content": blocks}


def test_thinking_blocks_go_back_unchanged_whether_or_not_segue_asked_for_thinking(
    server: FakeAnthropicServer,
) -> None:
    thought = Thinking("The user wants the time; I should call the clock.", signature="sig-XYZ==")
    secret = Thinking(redacted="ENCRYPTED-BLOB")
    call = ToolUse("clock", {}, id="toolu_clock")
    server.enqueue(
        MessageReply(
            text="Let me check.",
            thinking=(thought, secret),
            tool_uses=(call,),
            stop_reason="tool_use",
        ),
        MessageReply(text="It is noon."),
    )

    async def clock(_input: dict[str, Any]) -> str:
        return "12:00"

    async def main() -> None:
        async with connected(
            server, tools=[Tool(name="clock", description="Time.", function=clock)]
        ) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.send(conv.id, "What time is it?")
            assistant = (await rt.messages(conv.id))[1].message
            assert isinstance(assistant.content[0], ThinkingBlock)
            assert assistant.content[0].signature == "sig-XYZ=="

    asyncio.run(main())
    second = plain(bodies(server)[1])
    assert "thinking" not in second  # segue did not ask for thinking
    assert second["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": thought.thinking, "signature": "sig-XYZ=="},
            {"type": "redacted_thinking", "data": "ENCRYPTED-BLOB"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_clock", "name": "clock", "input": {}},
        ],
    }
    assert second["messages"][2]["content"][0]["type"] == "tool_result"


def test_a_tool_result_can_carry_an_image(server: FakeAnthropicServer) -> None:
    shot = png(32, 32)
    server.enqueue(
        MessageReply(
            text="", tool_uses=(ToolUse("screenshot", {}, id="toolu_s"),), stop_reason="tool_use"
        ),
        MessageReply(text="A white square."),
    )

    async def screenshot(_input: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"type": "text", "text": "Here it is:"}, image(shot)]

    async def main() -> None:
        tool = Tool(name="screenshot", description="Take one.", function=screenshot)
        async with connected(server, tools=[tool]) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.send(conv.id, "Show me the screen.")
            result = (await rt.messages(conv.id))[2]
            assert result.kind == "tool_result"
            assert result.text == "Here it is:"

    asyncio.run(main())
    result_block = plain(bodies(server)[1]["messages"][2]["content"][0])
    assert result_block == {
        "type": "tool_result",
        "tool_use_id": "toolu_s",
        "content": [{"type": "text", "text": "Here it is:"}, image(shot)],
    }


def test_model_settings_reach_the_request_body(server: FakeAnthropicServer) -> None:
    async def main() -> None:
        async with connected(server) as rt:
            tempered = await rt.create_conversation(
                model=MODEL, temperature=0.2, tool_choice={"type": "auto"}, max_output_tokens=1234
            )
            await rt.send(tempered.id, "Hi.")
            thinking = await rt.create_conversation(model=MODEL, thinking_budget=2048)
            await rt.send(thinking.id, "Think.")

    asyncio.run(main())
    first, second = bodies(server)
    assert first["temperature"] == 0.2
    assert first["max_tokens"] == 1234
    assert "tool_choice" not in first  # no tools declared: a tool choice would be refused
    assert second["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert "temperature" not in second
    assert second["max_tokens"] > 2048


def test_a_tool_choice_goes_out_with_the_tools_it_chooses_among(
    server: FakeAnthropicServer,
) -> None:
    """With tools declared the conversation's tool choice is sent as given; the grace request
    after the tool-round limit overrides it with none."""
    server.enqueue(
        MessageReply(text="Looking.", tool_uses=[ToolUse("lookup", {"q": "x"}, id="toolu_1")]),
        MessageReply(text="Again.", tool_uses=[ToolUse("lookup", {"q": "y"}, id="toolu_2")]),
        MessageReply(text="Found it."),
    )
    tools = ToolRegistry()

    @tools.tool(description="Look something up.")
    async def lookup(tool_input: dict[str, object]) -> str:
        return "a fact"

    async def main() -> None:
        async with connected(server, tools=tools) as rt:
            chosen = await rt.create_conversation(
                model=MODEL, tool_choice={"type": "tool", "name": "lookup"}, max_tool_rounds=1
            )
            await rt.send(chosen.id, "Look it up.")

    asyncio.run(main())
    asked, again, grace = bodies(server)
    assert asked["tool_choice"] == again["tool_choice"] == {"type": "tool", "name": "lookup"}
    assert [tool["name"] for tool in asked["tools"]] == ["lookup"]
    assert grace["tool_choice"] == {"type": "none"}


def test_settings_the_api_refuses_are_refused_when_the_conversation_is_created() -> None:
    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=_NoModel()) as rt:
            with pytest.raises(pydantic.ValidationError):
                await rt.create_conversation(model=MODEL, thinking_budget=2048, temperature=0.5)
            with pytest.raises(pydantic.ValidationError):
                await rt.create_conversation(
                    model=MODEL, thinking_budget=2048, tool_choice={"type": "any"}
                )
            with pytest.raises(pydantic.ValidationError):
                await rt.create_conversation(
                    model=MODEL, thinking_budget=4096, max_output_tokens=2000
                )
            with pytest.raises(pydantic.ValidationError):
                await rt.create_conversation(model=MODEL, tool_choice={"type": "sometimes"})
            assert await rt.store.list_conversations() == []

    asyncio.run(main())


class _NoModel:
    exact_preflight = False

    async def complete(self, request: Any) -> Any:
        raise AssertionError("no request expected")

    async def context_window(self, model: str) -> int | None:
        return None

    async def count_tokens(self, request: Any) -> int | None:
        return None


def test_prompt_caching_marks_tools_system_and_the_latest_turn(server: FakeAnthropicServer) -> None:
    async def lookup(_input: dict[str, Any]) -> str:
        return "found"

    tool = Tool(name="lookup", description="Look up.", function=lookup)

    async def main() -> None:
        async with connected(server, tools=[tool]) as rt:
            conv = await rt.create_conversation(model=MODEL, system="You are terse.")
            await rt.send(conv.id, "First.")
            await rt.send(conv.id, "Second.")
        async with connected(server, tools=[tool], prompt_caching=False) as rt:
            conv = await rt.create_conversation(model=MODEL, system="You are terse.")
            await rt.send(conv.id, "Uncached.")

    asyncio.run(main())
    cached, later, uncached = bodies(server)
    ephemeral = {"type": "ephemeral"}
    for body in (cached, later):
        assert body["system"] == [
            {"type": "text", "text": "You are terse.", "cache_control": ephemeral}
        ]
        assert body["tools"][-1]["cache_control"] == ephemeral
        assert body["messages"][-1]["content"][-1]["cache_control"] == ephemeral
        assert str(body).count("cache_control") == 3  # the API allows at most four
    assert "cache_control" not in str(uncached)
    assert uncached["system"] == "You are terse."


def test_a_given_window_needs_no_lookup_and_a_failed_lookup_falls_back_with_a_warning(
    server: FakeAnthropicServer,
) -> None:
    async def main() -> None:
        async with connected(server) as rt:
            given = await rt.create_conversation(model="my-proxy-model", context_window=32_000)
            assert given.context_window == 32_000
            assert not server.requests  # no models lookup was made
            with capture_logs() as logs:
                named = await rt.create_conversation(model="claude-sonnet-4-5-proxy")
            assert named.context_window == 200_000  # the table's window, not "unknown model"
            assert not [e for e in logs if e["event"] == "model_window_unknown"]
            with capture_logs() as logs:
                guessed = await rt.create_conversation(model="house-model")
            assert guessed.context_window == 200_000  # Anthropic's smallest, said to be a guess
            warnings = [e for e in logs if e["event"] == "model_window_unknown"]
            assert [(w["model"], w["log_level"]) for w in warnings] == [("house-model", "warning")]

    asyncio.run(main())


def test_a_refused_connection_at_lookup_still_creates_the_conversation() -> None:
    async def main() -> None:
        async with anthropic.AsyncAnthropic(api_key=KEY, base_url="http://127.0.0.1:9") as client:
            rt = Runtime(store=MemoryStore(), llm=AnthropicModel(client))
            conv = await rt.create_conversation(model="claude-haiku-4-5")
            assert conv.context_window == 200_000
            await rt.close()

    asyncio.run(main())


def test_summaries_name_attachments_instead_of_sending_them(server: FakeAnthropicServer) -> None:
    server.enqueue(MessageReply(text="A picture of a cat."))

    async def main() -> None:
        async with connected(server) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.send(conv.id, [image(png(8, 8)), {"type": "text", "text": "A cat?"}])
            await rt.continue_manually(conv.id)

    asyncio.run(main())
    summary = bodies(server)[-1]
    assert "image" not in {b["type"] for m in summary["messages"] for b in m["content"]}
    assert "[attached: an image]" in str(summary["messages"])


def test_bad_blocks_are_the_callers_mistake() -> None:
    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=_NoModel()) as rt:
            conv = await rt.create_conversation(model=MODEL)
            with pytest.raises(InvalidMessageError):
                await rt.send(conv.id, [{"type": "video", "url": "x"}])
            with pytest.raises(InvalidMessageError):
                await rt.send(conv.id, [{"type": "text", "text": "   "}])
            with pytest.raises(InvalidMessageError):
                await rt.send(conv.id, [{"type": "text", "text": "bad \udc80 text"}])
            assert await rt.messages(conv.id) == []

    asyncio.run(main())
    assert Message(kind="user", text="x").content == ()


def test_a_scripted_reply_keeps_its_blocks_when_the_model_adds_usage() -> None:
    """ScriptedModel fills in the usage a provider would report; whatever else the script said
    (thinking blocks the transcript must send back, the provider's session) stays as it said."""
    thinking = ThinkingBlock(thinking="Six times seven.", signature="sig-1")
    said = LlmReply(text="42", content=(thinking, TextBlock(text="42")), session_ref="s-1")
    asked = LlmRequest(
        conversation_id="c",
        model=MODEL,
        purpose="turn",
        system=None,
        messages=(Message(kind="user", text="Six times seven?"),),
    )
    reply = asyncio.run(ScriptedModel([said]).complete(asked))
    assert reply.usage is not None
    assert (reply.text, reply.content, reply.session_ref) == ("42", said.content, "s-1")
