"""The fake Anthropic server's prompt cache against hand-computed cases (issue 31): a hit, a
miss after a change in the prefix, the minimum length, the TTL, four breakpoints, what
``tool_choice`` invalidates, the 20-block lookback, and the bill.

Every figure below is worked out by hand from segue's estimate, which the fake uses: a text of
``n`` ASCII bytes is ``8 + ceil(n / 3)`` tokens. The requests go through the real ``anthropic``
client, so each answer is also parsed as the SDK's own ``Message``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from anthropic.types import Message

from segue.testing.anthropic_server import FakeAnthropicServer, MessageReply
from segue.testing.prompt_cache import PromptCache, price

KEY = "sk-ant-test-prompt-cache-0123456789"
SONNET = "claude-sonnet-4-6"  # caches prefixes of 1,024 tokens and more
HAIKU = "claude-haiku-4-5"  # 4,096 and more
CACHE = {"type": "ephemeral"}
SYSTEM = "s" * 3000  # 1,008 tokens
FIRST = "u" * 300  # 108
REPLY = "a" * 30  # 18
SECOND = "v" * 60  # 28


def text(value: str, *, cached: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": value}
    if cached:
        block["cache_control"] = CACHE
    return block


def body(*turns: str, system: str = SYSTEM, model: str = SONNET, **extra: Any) -> dict[str, Any]:
    """System and alternating turns, breakpoints on the system and on the last block: where
    ``AnthropicModel`` puts them."""
    roles = ["user", "assistant"]
    messages = [
        {"role": roles[i % 2], "content": [text(t, cached=i == len(turns) - 1)]}
        for i, t in enumerate(turns)
    ]
    return {
        "model": model,
        "max_tokens": 100,
        "system": [text(system, cached=True)],
        "messages": messages,
        **extra,
    }


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer(default=MessageReply(text="ok")) as fake:
        yield fake


def usage(server: FakeAnthropicServer, request: dict[str, Any]) -> tuple[int, int, int]:
    """``(input, cache write, cache read)`` of one real call, its answer parsed by the SDK."""

    async def main() -> Message:
        async with anthropic.AsyncAnthropic(api_key=KEY, base_url=server.url) as client:
            created: Message = await client.messages.create(**request)
            return created

    message = asyncio.run(main())
    assert isinstance(message, Message)
    said = message.usage
    return (
        said.input_tokens,
        said.cache_creation_input_tokens or 0,
        said.cache_read_input_tokens or 0,
    )


def test_a_hit_reads_the_prefix_written_before(server: FakeAnthropicServer) -> None:
    # 1,008 + 108 = 1,116: the system's prefix alone (1,008) is under the minimum, so only the
    # whole prompt is written.
    assert usage(server, body(FIRST)) == (0, 1_116, 0)
    # The next turn: the first 1,116 tokens are read back; 18 + 28 new ones are written.
    assert usage(server, body(FIRST, REPLY, SECOND)) == (0, 46, 1_116)
    # The same prompt again: all of it read.
    assert usage(server, body(FIRST, REPLY, SECOND)) == (0, 0, 1_162)


def test_a_change_in_the_prefix_misses_everything_after_it(server: FakeAnthropicServer) -> None:
    usage(server, body(FIRST))
    assert usage(server, body(FIRST, system="t" * 3000)) == (0, 1_116, 0)
    changed_first_turn = "w" * 300
    assert usage(server, body(changed_first_turn, REPLY, SECOND)) == (0, 1_162, 0)


def test_a_prefix_under_the_models_minimum_is_not_cached(server: FakeAnthropicServer) -> None:
    short = body("u" * 21, system="s" * 3003)  # 1,009 + 15 = 1,024: just long enough
    shorter = body("u" * 18, system="s" * 3003)  # 1,009 + 14 = 1,023: one short
    assert usage(server, shorter) == (1_023, 0, 0)
    assert usage(server, short) == (0, 1_024, 0)
    # Haiku 4.5 caches from 4,096 tokens: the same 1,024 are billed as plain input.
    assert usage(server, {**short, "model": HAIKU}) == (1_024, 0, 0)


def test_the_ttl_is_five_minutes_refreshed_by_each_hit() -> None:
    clock = Clock()
    cache = PromptCache(clock)

    def read() -> int:
        return cache.account(body(FIRST)).cache_read_input_tokens

    assert read() == 0  # written at 0
    clock.now = 299.0
    assert read() == 1_116  # a hit at 4'59", which refreshes it until 10'59"
    clock.now = 598.0
    assert read() == 1_116
    clock.now = 898.5  # five minutes and half a second after the last hit
    assert read() == 0
    hour = body(FIRST)
    hour["messages"][-1]["content"][-1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    written = cache.account(hour)
    assert (written.cache_read_input_tokens, written.written_1h) == (1_116, 0)  # same prefix


def test_an_hours_ttl_is_written_at_its_own_price() -> None:
    clock = Clock()
    cache = PromptCache(clock)
    hour = body(FIRST)
    hour["messages"][-1]["content"][-1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    written = cache.account(hour)
    assert (written.cache_creation_input_tokens, written.written_1h) == (1_116, 1_116)
    clock.now = 3_000.0  # 50 minutes later: still there
    assert cache.account(hour).cache_read_input_tokens == 1_116
    assert price(written, 0) == 1_116 * 2.0


def test_at_most_four_breakpoints(server: FakeAnthropicServer) -> None:
    four = body(FIRST, REPLY, SECOND)
    for message in four["messages"][:2]:
        message["content"][0]["cache_control"] = CACHE  # system + 3 messages: 4
    assert usage(server, four)[1] > 0
    five = {**four, "tools": [{"name": "t", "input_schema": {}, "cache_control": CACHE}]}
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks"):
        usage(server, five)


def test_tool_choice_keeps_the_tools_and_system_but_not_the_messages() -> None:
    """Anthropic's table of what invalidates the cache: a change of ``tool_choice`` (or of the
    thinking parameters) misses the messages' prefixes only."""
    cache = PromptCache(Clock())
    tools = [{"name": "lookup", "description": "d" * 3000, "input_schema": {}}]
    tools[0]["cache_control"] = CACHE
    turn = body(FIRST, REPLY, SECOND, tools=tools)
    first = cache.account(turn)
    assert first.cache_creation_input_tokens > 1_162 + 1_000  # the tools' 1,000 and more
    forced = cache.account({**turn, "tool_choice": {"type": "none"}})
    # read: the tools and the system (written at their breakpoints); the messages again.
    assert forced.cache_read_input_tokens == first.cache_creation_input_tokens - 154
    assert forced.cache_creation_input_tokens == 154  # 108 + 18 + 28


def test_a_breakpoint_looks_back_twenty_blocks_and_no_further() -> None:
    cache = PromptCache(Clock())
    base = body(FIRST)
    cache.account(base)
    turns = [FIRST] + [f"{i:02d}" + "x" * 28 for i in range(19)]  # 19 more blocks: 20 back
    near = cache.account(body(*turns))
    assert near.cache_read_input_tokens == 1_116
    cache.clear()
    cache.account(base)
    far = cache.account(body(*([FIRST] + [f"{i:02d}" + "x" * 28 for i in range(20)])))
    assert far.cache_read_input_tokens == 0


def test_the_bill_prices_each_answer(server: FakeAnthropicServer) -> None:
    usage(server, body(FIRST))
    usage(server, body(FIRST, REPLY, SECOND))
    bill = server.bill
    output = 8 + 1  # "ok": 2 bytes
    assert bill.requests == 2
    assert bill.cost == pytest.approx(
        1_116 * 1.25 + output * 5 + (1_116 * 0.1 + 46 * 1.25 + output * 5)
    )
    assert bill.read_share == pytest.approx(1_116 / (1_116 + 1_162))


def test_scripted_usage_is_left_as_scripted(server: FakeAnthropicServer) -> None:
    from segue.testing.anthropic_server import Usage

    server.enqueue(MessageReply(usage=Usage(10, 5)))
    assert usage(server, body(FIRST)) == (10, 0, 0)
    assert usage(server, body(FIRST)) == (0, 1_116, 0)  # the script did not touch the cache
