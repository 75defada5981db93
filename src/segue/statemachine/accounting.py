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
    # -(-n // d) is ceil(n / d) in integers (no float, no call): this runs on every message.
    return MESSAGE_OVERHEAD_TOKENS - (-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


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
    # ``Usage.prompt_tokens`` spelled out: a property call costs more than the sum, every response
    prompt = usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens
    return prompt + usage.output_tokens if prompt > 0 else None


def cap_text(text: str, max_tokens: int, *, saved_as: str | None = None) -> str:
    """``text`` if its estimate fits ``max_tokens``; else its head and tail with a note between
    them saying how much was cut (and, with ``saved_as``, where the whole text is kept).

    The result's estimate (``estimate_tokens``) is at most ``max_tokens``. The head and the tail
    get half of the room each (a tool's output tends to say what it is at the start and how it
    ended at the end), and each is cut at a line break when one is near.
    """
    data = text.encode("utf-8")
    room = (max_tokens - MESSAGE_OVERHEAD_TOKENS) * BYTES_PER_TOKEN
    if len(data) <= room:
        return text
    # The note's length depends on the figures in it; sized with the largest they can be, the
    # kept part only grows shorter, so the final note never needs more room than was left.
    keep = max(0, room - len(_cut_note(len(data), len(data), saved_as).encode("utf-8")))
    head = _whole_lines(data[: keep // 2].decode("utf-8", "ignore"), from_end=True)
    tail = _whole_lines(data[len(data) - (keep - keep // 2) :].decode("utf-8", "ignore"))
    cut = len(data) - len(head.encode("utf-8")) - len(tail.encode("utf-8"))
    return f"{head}{_cut_note(cut, len(data), saved_as)}{tail}"


def _cut_note(cut_bytes: int, total_bytes: int, saved_as: str | None) -> str:
    where = (
        f" The whole output is saved in {saved_as}."
        if saved_as
        else " Ask for a narrower result if the cut part matters."
    )
    return (
        f"\n\n[... about {ceil(cut_bytes / BYTES_PER_TOKEN):,} tokens ({cut_bytes:,} of "
        f"{total_bytes:,} bytes) of this output were cut here to fit the context window.{where}]"
        "\n\n"
    )


def _whole_lines(part: str, *, from_end: bool = False) -> str:
    """``part`` without the broken line at its cut edge, when a line break is near that edge
    (within a fifth of it); otherwise as it is (one long line is cut where it must be)."""
    near = max(1, len(part) // 5)
    if from_end:
        index = part.rfind("\n", len(part) - near)
        return part[: index + 1] if index >= 0 else part
    index = part.find("\n", 0, near)
    return part[index + 1 :] if index >= 0 else part
