"""What ``FakeAnthropicServer`` can be scripted to answer, and how each answer looks on the wire:
a Messages API body, or its stream of server-sent events.

Kept apart from the HTTP server so the shapes can be read (and checked against the client) on
their own, as ``openai_replies`` is for the OpenAI fake; ``anthropic_server`` re-exports them.
Only the standard library is used.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from segue.testing.prompt_cache import MEASURED, Measured


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage reported for a reply.

    A cache field set to ``None`` is left out of the JSON entirely, which is how the SDK comes to
    report ``None`` for it; callers must cope with that, so tests need to be able to produce it.
    """

    input_tokens: int = 10
    output_tokens: int = 5
    cache_creation_input_tokens: int | None = 0
    cache_read_input_tokens: int | None = 0

    def to_json(self, *, output_tokens: int | None = None) -> dict[str, int]:
        """The ``usage`` object; ``output_tokens`` overrides the count (a stream starts near 1)."""
        data = {"input_tokens": self.input_tokens}
        if self.cache_creation_input_tokens is not None:
            data["cache_creation_input_tokens"] = self.cache_creation_input_tokens
        if self.cache_read_input_tokens is not None:
            data["cache_read_input_tokens"] = self.cache_read_input_tokens
        data["output_tokens"] = self.output_tokens if output_tokens is None else output_tokens
        return data


def _tool_use_id() -> str:
    return f"toolu_fake_{uuid.uuid4().hex[:20]}"


@dataclass(frozen=True, slots=True)
class ToolUse:
    """A ``tool_use`` content block the fake model "calls"."""

    name: str
    input: Mapping[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=_tool_use_id)


@dataclass(frozen=True, slots=True)
class Thinking:
    """A ``thinking`` block (``signature`` set) or, with ``redacted`` data, a
    ``redacted_thinking`` block, placed before the reply's text as the API places them."""

    thinking: str = ""
    signature: str = "sig_fake"
    redacted: str | None = None

    def block(self) -> dict[str, Any]:
        if self.redacted is not None:
            return {"type": "redacted_thinking", "data": self.redacted}
        return {"type": "thinking", "thinking": self.thinking, "signature": self.signature}


def _encrypted() -> str:
    return f"enc_fake_{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True, slots=True)
class Compacted:
    """The ``compaction`` block a reply starts with: the server puts one there when a request's
    ``compact_20260112`` edit triggers (``anthropic_managed``), or a test scripts one.

    ``content`` None is a compaction that failed (the API's null content: nothing was
    compacted). ``usage`` is what the compaction iteration cost (``MEASURED``: the server counts
    it: the whole prompt read, the summary written); it is reported in ``usage.iterations``,
    never in the top-level usage, which is the message iteration's."""

    content: str | None = "Summary of the conversation so far."
    encrypted_content: str = field(default_factory=_encrypted)
    signature: str = "sig_compaction_fake"
    usage: Usage | Measured = MEASURED

    def block(self) -> dict[str, Any]:
        """The block as the API returns it (no tool changed in the compacted range)."""
        return {
            "type": "compaction",
            "content": self.content,
            "encrypted_content": self.encrypted_content,
            "signature": self.signature,
            "tool_changes": [],
        }


@dataclass(frozen=True, slots=True)
class MessageReply:
    """A successful ``/v1/messages`` reply, served as JSON or as SSE depending on the request.

    ``stop_reason`` is a plain string so that any value the API may send (``"end_turn"``,
    ``"tool_use"``, ``"max_tokens"``, ``"model_context_window_exceeded"``, ...) can be scripted.
    ``model=None`` echoes the request's model. ``delay`` seconds pass before the reply is sent.
    ``usage=None`` leaves usage out entirely (as some compatible servers do); by default
    (``MEASURED``) the server counts it from what it was sent, prompt cache included
    (``prompt_cache``). When streamed:
    ``pieces`` text deltas per text block, ``chunk_delay`` seconds between events, and
    ``cut_after`` ends the stream (closing the connection) after that many events, before
    ``message_stop``, as a dropped connection does. ``compaction``: the reply starts with that
    compaction block (the server sets it when a request's compaction triggers), and its usage
    is the message iteration's; ``applied_edits``: the context edits the server applied (None:
    the request asked for no context management).
    """

    text: str = "ok"
    tool_uses: Sequence[ToolUse] = ()
    usage: Usage | Measured | None = MEASURED
    stop_reason: str = "end_turn"
    model: str | None = None
    delay: float = 0.0
    thinking: Sequence[Thinking] = ()
    pieces: int = 3
    chunk_delay: float = 0.0
    cut_after: int | None = None
    compaction: Compacted | None = None
    applied_edits: Sequence[Mapping[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class RawReply:
    """Any HTTP answer at all: for servers that answer 200 with something that is not a
    message (an HTML error page from a proxy, an empty body)."""

    status: int = 200
    body: bytes = b"<html><body>Bad gateway</body></html>"
    content_type: str = "text/html"
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An HTTP error with an Anthropic error body ``{"type": "error", "error": {...}}``.

    ``headers`` are sent as well (e.g. ``retry-after-ms`` so the SDK's retries are immediate).
    ``mid_stream=True`` makes a *streaming* request get HTTP 200, ``message_start`` and then an SSE
    ``error`` event, as the API does when it overloads part-way through a stream.
    """

    status: int
    error_type: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    mid_stream: bool = False

    def body(self) -> dict[str, Any]:
        """The JSON error body exactly as the API shapes it."""
        return {"type": "error", "error": {"type": self.error_type, "message": self.message}}


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Close the connection without answering; the SDK sees a connection error (and retries)."""

    delay: float = 0.0


Reply = MessageReply | ErrorReply | Disconnect | RawReply
Responder = Callable[[dict[str, Any]], Reply]
"""Dynamic behaviour: called with the parsed JSON request body, returns the reply to send."""

# The SDK sleeps this long instead of >= 0.5 s of exponential backoff, keeping retry tests fast.
_FAST_RETRY = MappingProxyType({"retry-after-ms": "1"})


def prompt_too_long(actual: int, maximum: int) -> ErrorReply:
    """The 400 the API returns when the prompt alone exceeds the context window."""
    message = f"prompt is too long: {actual} tokens > {maximum} maximum"
    return ErrorReply(400, "invalid_request_error", message)


def context_limit(input_tokens: int, max_tokens: int, limit: int) -> ErrorReply:
    """The 400 the API returns when prompt plus requested ``max_tokens`` exceed the window."""
    message = (
        f"input length and `max_tokens` exceed context limit: {input_tokens} + {max_tokens} > "
        f"{limit}, decrease input length or `max_tokens` and try again"
    )
    return ErrorReply(400, "invalid_request_error", message)


def rate_limited(retry_after_ms: int = 1) -> ErrorReply:
    """A 429; the SDK retries it, waiting ``retry_after_ms`` (kept tiny so tests stay fast)."""
    message = "This request would exceed the rate limit for your organization."
    return ErrorReply(429, "rate_limit_error", message, {"retry-after-ms": str(retry_after_ms)})


def overloaded(*, mid_stream: bool = False) -> ErrorReply:
    """A 529 (the SDK's ``OverloadedError``); retried by the SDK."""
    return ErrorReply(529, "overloaded_error", "Overloaded", _FAST_RETRY, mid_stream=mid_stream)


def authentication() -> ErrorReply:
    """A 401 for a bad key; not retried by the SDK."""
    return ErrorReply(401, "authentication_error", "invalid x-api-key")


def server_error() -> ErrorReply:
    """A 500 (the SDK's ``InternalServerError``); retried by the SDK."""
    return ErrorReply(500, "api_error", "Internal server error", _FAST_RETRY)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What ``GET /v1/models/{id}`` reports; a ``None`` limit is left out of the JSON."""

    max_input_tokens: int | None = 200_000
    max_tokens: int | None = 64_000
    display_name: str | None = None


# Illustrative limits, not authoritative ones. Ids the SDK lists as deprecated are avoided: it
# emits a DeprecationWarning for them, which a warnings-as-errors test run turns into a failure.
DEFAULT_MODELS: Mapping[str, ModelSpec] = {
    "claude-sonnet-4-6": ModelSpec(200_000, 64_000, "Claude Sonnet 4.6"),
    "claude-opus-4-6": ModelSpec(200_000, 32_000, "Claude Opus 4.6"),
    "claude-haiku-4-5": ModelSpec(200_000, 64_000, "Claude Haiku 4.5"),
}


def estimate_tokens(request: dict[str, Any]) -> int:
    """Default ``count_tokens``: about four characters of JSON per token, at least one."""
    parts = [request.get(key) for key in ("system", "messages", "tools")]
    return max(1, len(json.dumps(parts, separators=(",", ":"))) // 4)


def _chunks(text: str, pieces: int = 3) -> list[str]:
    """Split text into a few deltas so clients must really accumulate them."""
    if not text:
        return []
    size = max(1, -(-len(text) // pieces))
    return [text[i : i + size] for i in range(0, len(text), size)]


def message_json(reply: MessageReply, message_id: str, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [reply.compaction.block()] if reply.compaction else []
    content += [thinking.block() for thinking in reply.thinking]
    content += [{"type": "text", "text": reply.text}] if reply.text else []
    content += [
        {"type": "tool_use", "id": t.id, "name": t.name, "input": dict(t.input)}
        for t in reply.tool_uses
    ]
    message: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
    }
    usage = _usage(reply)
    if usage is not None:
        message["usage"] = usage_json(reply, usage)
    if reply.applied_edits is not None:
        message["context_management"] = {"applied_edits": [dict(e) for e in reply.applied_edits]}
    return message


def _usage(reply: MessageReply) -> Usage | None:
    """The usage a reply reports (``MEASURED`` not counted, an error's: the defaults)."""
    return Usage() if isinstance(reply.usage, Measured) else reply.usage


def usage_json(reply: MessageReply, usage: Usage) -> dict[str, Any]:
    """The reply's ``usage``: the message iteration's counts at the top (zero when the reply
    stopped after its compaction), and, after a compaction, ``iterations``: the compaction's,
    then the message's."""
    paused = reply.compaction is not None and reply.stop_reason == "compaction"
    data: dict[str, Any] = (Usage(0, 0) if paused else usage).to_json()
    compaction = reply.compaction
    if compaction is not None:
        spent = compaction.usage if isinstance(compaction.usage, Usage) else Usage(0, 0)
        iterations = [_iteration("compaction", spent)]
        if not paused:
            iterations.append(_iteration("message", usage))
        data["iterations"] = iterations
    return data


def _iteration(kind: str, usage: Usage) -> dict[str, Any]:
    return {
        "type": kind,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens or 0,
        "cache_read_input_tokens": usage.cache_read_input_tokens or 0,
    }


def sse_events(
    reply: MessageReply, message_id: str, model: str, error: ErrorReply | None = None
) -> list[dict[str, Any]]:
    """The events the API streams for ``reply`` (or up to ``error``); SSE name = ``type``."""
    start = message_json(reply, message_id, model)
    start.update(content=[], stop_reason=None)
    start.pop("context_management", None)
    usage = _usage(reply)
    if usage is not None:
        start["usage"] = usage.to_json(output_tokens=1)
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}, {"type": "ping"}]
    if error is not None:
        return [*events, error.body()]
    blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    if reply.compaction is not None:  # its opaque fields first, then its summary whole
        whole = reply.compaction.block()
        begun = {**whole, "content": None, "encrypted_content": None}
        delta = {
            "type": "compaction_delta",
            "content": whole["content"],
            "encrypted_content": whole["encrypted_content"],
        }
        blocks.append((begun, [delta]))
    for thinking in reply.thinking:
        if thinking.redacted is not None:
            blocks.append((thinking.block(), []))
            continue
        parts = [{"type": "thinking_delta", "thinking": p} for p in _chunks(thinking.thinking)]
        parts.append({"type": "signature_delta", "signature": thinking.signature})
        blocks.append(({"type": "thinking", "thinking": "", "signature": ""}, parts))
    if reply.text:
        pieces = _chunks(reply.text, reply.pieces)
        deltas = [{"type": "text_delta", "text": part} for part in pieces]
        blocks.append(({"type": "text", "text": ""}, deltas))
    for tool in reply.tool_uses:
        block = {"type": "tool_use", "id": tool.id, "name": tool.name, "input": {}}
        raw = json.dumps(dict(tool.input))
        blocks.append(
            (block, [{"type": "input_json_delta", "partial_json": p} for p in _chunks(raw)])
        )
    for index, (block, deltas) in enumerate(blocks):
        events.append({"type": "content_block_start", "index": index, "content_block": block})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    delta = {"stop_reason": reply.stop_reason, "stop_sequence": None}
    # message_delta usage holds cumulative totals, as the API sends them.
    final: dict[str, Any] = {"type": "message_delta", "delta": delta}
    if usage is not None:
        final["usage"] = usage_json(reply, usage)
    if reply.applied_edits is not None:
        final["context_management"] = {"applied_edits": [dict(e) for e in reply.applied_edits]}
    events.append(final)
    events.append({"type": "message_stop"})
    if reply.cut_after is not None:
        return events[: reply.cut_after]
    return events


def named(events: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each event under its SSE name, which the Messages API makes its ``type``."""
    return ((event["type"], event) for event in events)


__all__ = [
    "DEFAULT_MODELS",
    "Compacted",
    "Disconnect",
    "ErrorReply",
    "MessageReply",
    "ModelSpec",
    "RawReply",
    "Reply",
    "Responder",
    "Thinking",
    "ToolUse",
    "Usage",
    "authentication",
    "context_limit",
    "estimate_tokens",
    "message_json",
    "named",
    "overloaded",
    "prompt_too_long",
    "rate_limited",
    "server_error",
    "sse_events",
    "usage_json",
]
