"""Token accounting: occupancy from usage, and a conservative estimate for pre-flight.

The laws (``docs/design.md`` section 1): occupancy is the four usage fields of the LATEST
response, summed; usage is never added across requests; an unknown report (absent, or no prompt
tokens) keeps the last figure; a figure above the window is an accounting error, never
exhaustion.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import ceil
from typing import Any

from segue.statemachine.content import estimate_blocks
from segue.statemachine.models import ToolCall, Usage

MESSAGE_OVERHEAD_TOKENS = 8
"""Role markers and block framing the provider adds around each message."""

BYTES_PER_TOKEN = 3
"""English prose runs near 4 bytes a token and code near 3; CJK near 3 bytes a character and a
token. Dividing UTF-8 bytes by 3 over-estimates the first two and matches the third: pre-flight
would rather continue a little early than send a prompt the provider refuses."""


def estimate_tokens(text: str) -> int:
    """A conservative token estimate of one message's text, overhead included."""
    return ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS


def estimate_content(text: str, content: Sequence[Any]) -> int:
    """A conservative estimate of a message with blocks: its text, plus its images, documents
    and thinking (its text blocks are its ``text``; its tool_use blocks are counted with the
    tool calls)."""
    tokens = estimate_tokens(text)
    if content:
        extra = [block for block in content if block.type not in ("text", "tool_use")]
        tokens += estimate_blocks(extra, estimate_tokens)
    return tokens


def estimate_tool_calls(tool_calls: tuple[ToolCall, ...]) -> int:
    """A conservative estimate of ``tool_use`` blocks (name plus the repr of the input)."""
    return sum(estimate_tokens(call.name + repr(call.input)) for call in tool_calls)


def reported_occupancy(usage: Usage | None) -> int | None:
    """The occupancy a usage report states, or ``None`` when it states nothing."""
    if usage is None:
        return None
    prompt = usage.prompt_tokens  # read once: this runs on every response
    return prompt + usage.output_tokens if prompt > 0 else None
