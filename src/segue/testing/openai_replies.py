"""What ``FakeOpenAIServer`` can be scripted to answer, and how each answer looks on the wire in
either API: a Chat Completions body or chunk stream, a Responses object or event stream.

Kept apart from the HTTP server so the shapes can be read (and checked against the client) on
their own. Only the standard library is used.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from segue.testing._measured import MEASURED, Measured


@dataclass(frozen=True, slots=True)
class Usage:
    """A reply's usage as OpenAI counts it: ``prompt_tokens`` is the WHOLE prompt, the cached
    part (``cached_tokens``) and what was written to the cache (``cache_write_tokens``) inside
    it. A detail set to None is left out of the JSON, as many compatible servers leave it."""

    prompt_tokens: int = 10
    completion_tokens: int = 5
    cached_tokens: int | None = 0
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None

    def chat(self) -> dict[str, Any]:
        """The Chat Completions ``usage`` object."""
        data: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
        details = self._details()
        if details:
            data["prompt_tokens_details"] = details
        if self.reasoning_tokens is not None:
            data["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return data

    def responses(self) -> dict[str, Any]:
        """The Responses API ``usage`` object."""
        details = {"cached_tokens": 0, "cache_write_tokens": 0, **self._details()}
        return {
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": details,
            "output_tokens": self.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens or 0},
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def _details(self) -> dict[str, int]:
        details: dict[str, int] = {}
        if self.cached_tokens is not None:
            details["cached_tokens"] = self.cached_tokens
        if self.cache_write_tokens is not None:
            details["cache_write_tokens"] = self.cache_write_tokens
        return details


def said(reply: Reply) -> Usage | None:
    """The usage a reply reports (``MEASURED`` not counted, an error's: the defaults)."""
    return Usage() if isinstance(reply.usage, Measured) else reply.usage


def _call_id() -> str:
    return f"call_fake_{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call the fake model makes. ``arguments`` as a mapping is sent as its JSON; as
    a string it is sent as it is (``'{"query": "ti'`` for arguments that are not JSON)."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str = field(default_factory=_call_id)

    def raw(self) -> str:
        """The arguments as the API sends them: a JSON string."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(dict(self.arguments))


@dataclass(frozen=True, slots=True)
class Reply:
    """A successful reply, in the shape of the API that was asked, streamed or whole.

    ``finish_reason`` None: ``tool_calls`` when the reply calls a tool, else ``stop``;
    ``length`` makes a Responses reply end ``incomplete`` (``max_output_tokens``).
    ``usage=None`` sends none (a server that does not count); by default (``MEASURED``) the
    server counts it from what it was sent, as segue estimates it. When streamed: ``pieces`` text
    deltas, ``arg_pieces`` fragments per call's arguments, ``chunk_delay`` seconds between
    events, ``cut_after`` ends the stream after that many events (closing the connection before
    its end, as a dropped connection does), ``failed`` ends a Responses stream with
    ``response.failed``. ``delay`` seconds pass before the reply starts.
    """

    text: str = "ok"
    tool_calls: Sequence[ToolCall] = ()
    usage: Usage | Measured | None = MEASURED
    finish_reason: str | None = None
    model: str | None = None
    delay: float = 0.0
    pieces: int = 3
    arg_pieces: int = 3
    chunk_delay: float = 0.0
    cut_after: int | None = None
    failed: bool = False
    compaction: Mapping[str, Any] | None = None
    """A ``compaction`` item the output starts with (the server puts one there when a request's
    ``context_management`` compacts, ``openai_compaction``; a test may script one)."""

    @property
    def finish(self) -> str:
        """The ``finish_reason`` sent."""
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An HTTP error with OpenAI's body ``{"error": {"message", "type", "param", "code"}}``.

    ``headers`` are sent as well (``retry-after``). ``mid_stream=True`` makes a streaming
    request get HTTP 200, the first events, and then the error: an ``error`` chunk on Chat
    Completions, an ``error`` event on the Responses API.
    """

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    mid_stream: bool = False

    def error(self) -> dict[str, Any]:
        """The ``error`` object."""
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Close the connection without answering (the client sees a connection error)."""

    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class RawReply:
    """Any HTTP answer at all (a proxy's HTML page, an empty body)."""

    status: int = 200
    body: bytes = b"<html><body>Bad gateway</body></html>"
    content_type: str = "text/html"
    delay: float = 0.0


Scripted = Reply | ErrorReply | Disconnect | RawReply
Responder = Callable[[dict[str, Any]], Scripted]
"""Dynamic behaviour: called with the parsed JSON request body, returns the reply to send."""


def context_length_exceeded(actual: int, maximum: int) -> ErrorReply:
    """The 400 OpenAI returns when the messages do not fit the model's window."""
    message = (
        f"This model's maximum context length is {maximum} tokens. However, your messages "
        f"resulted in {actual} tokens. Please reduce the length of the messages."
    )
    return ErrorReply(400, message, code="context_length_exceeded", param="messages")


def rate_limited(retry_after: str = "1") -> ErrorReply:
    """A 429 with ``retry-after`` (seconds)."""
    message = "Rate limit reached for requests. Please try again later."
    return ErrorReply(
        429,
        message,
        type="requests",
        code="rate_limit_exceeded",
        headers={"retry-after": retry_after},
    )


def server_error(status: int = 500) -> ErrorReply:
    """A 5xx."""
    return ErrorReply(
        status, "The server had an error while processing your request.", "server_error"
    )


def invalid_api_key(key: str = "sk-...") -> ErrorReply:
    """The 401 for a bad key; OpenAI's message quotes (part of) the key it was given."""
    message = f"Incorrect API key provided: {key}. You can find your API key in your account."
    return ErrorReply(401, message, code="invalid_api_key")


DEFAULT_MODELS: Mapping[str, Mapping[str, Any]] = {
    "gpt-4o": {"owned_by": "system"},
    "gpt-4o-mini": {"owned_by": "system"},
    "o4-mini": {"owned_by": "system"},
}
"""What ``GET /v1/models/{id}`` knows; a server may add fields (vLLM's ``max_model_len``)."""


def pieces(text: str, count: int) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // max(1, count)))
    return [text[i : i + size] for i in range(0, len(text), size)]


# --------------------------------------------------------------------------- Chat Completions


def chat_completion(reply: Reply, reply_id: str, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.raw()}}
            for c in reply.tool_calls
        ]
    data: dict[str, Any] = {
        "id": reply_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish}],
    }
    usage = said(reply)
    if usage is not None:
        data["usage"] = usage.chat()
    return data


def chat_chunks(
    reply: Reply, reply_id: str, model: str, *, with_usage: bool, error: ErrorReply | None = None
) -> list[dict[str, Any]]:
    """The chunks of a streamed completion (``data:`` lines; ``[DONE]`` is added on sending)."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": reply_id,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if with_usage:
            data["usage"] = None
        return data

    chunks = [chunk({"role": "assistant", "content": ""})]
    if error is not None:
        return [*chunks, {"error": error.error()}]
    chunks += [chunk({"content": part}) for part in pieces(reply.text, reply.pieces)]
    for index, call in enumerate(reply.tool_calls):
        head = {"index": index, "id": call.id, "type": "function"}
        chunks.append(
            chunk({"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]})
        )
        for part in pieces(call.raw(), reply.arg_pieces):
            chunks.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
            )
    chunks.append(chunk({}, reply.finish))
    usage = said(reply)
    if with_usage and usage is not None:
        chunks.append(
            {
                "id": reply_id,
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [],
                "usage": usage.chat(),
            }
        )
    if reply.cut_after is not None:
        return chunks[: reply.cut_after]
    return chunks


# --------------------------------------------------------------------------- Responses


def response_object(
    reply: Reply, reply_id: str, model: str, status: str, output: list[dict[str, Any]]
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": reply_id,
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": status,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
    }
    if status == "incomplete":
        data["incomplete_details"] = {"reason": "max_output_tokens"}
    if status == "failed":
        data["error"] = {"code": "server_error", "message": "The model failed to answer."}
    usage = said(reply)
    if status != "in_progress" and usage is not None:
        data["usage"] = usage.responses()
    return data


def output_items(reply: Reply, reply_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [dict(reply.compaction)] if reply.compaction else []
    if reply.text:
        items.append(
            {
                "type": "message",
                "id": f"msg_{reply_id}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    items += [
        {
            "type": "function_call",
            "id": f"fc_{call.id}",
            "call_id": call.id,
            "name": call.name,
            "arguments": call.raw(),
            "status": "completed",
        }
        for call in reply.tool_calls
    ]
    return items


def response_events(
    reply: Reply, reply_id: str, model: str, error: ErrorReply | None = None
) -> list[dict[str, Any]]:
    """The typed events of a streamed response (SSE name = ``type``)."""
    events: list[dict[str, Any]] = [
        {
            "type": "response.created",
            "response": response_object(reply, reply_id, model, "in_progress", []),
        },
        {
            "type": "response.in_progress",
            "response": response_object(reply, reply_id, model, "in_progress", []),
        },
    ]
    if error is not None:
        events.append(
            {"type": "error", "code": error.code, "message": error.message, "param": error.param}
        )
        return _numbered(events)
    items = output_items(reply, reply_id)
    for index, item in enumerate(items):
        if item["type"] == "message":
            events += _message_events(reply, item, index)
        elif item["type"] == "compaction":
            events += [
                {"type": "response.output_item.added", "output_index": index, "item": item},
                {"type": "response.output_item.done", "output_index": index, "item": item},
            ]
        else:
            events += _function_events(reply, item, index)
    status = "failed" if reply.failed else "incomplete" if reply.finish == "length" else "completed"
    final = response_object(reply, reply_id, model, status, items)
    events.append({"type": f"response.{status}", "response": final})
    if reply.cut_after is not None:
        events = events[: reply.cut_after]
    return _numbered(events)


def _message_events(reply: Reply, item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    started = {**item, "status": "in_progress", "content": []}
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": index, "item": started},
        {
            "type": "response.content_part.added",
            **where,
            "part": {"type": "output_text", "text": "", "annotations": []},
        },
    ]
    events += [
        {"type": "response.output_text.delta", **where, "delta": part, "logprobs": []}
        for part in pieces(reply.text, reply.pieces)
    ]
    events += [
        {"type": "response.output_text.done", **where, "text": reply.text, "logprobs": []},
        {"type": "response.content_part.done", **where, "part": item["content"][0]},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]
    return events


def _function_events(reply: Reply, item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    where = {"item_id": item["id"], "output_index": index}
    started = {**item, "status": "in_progress", "arguments": ""}
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": index, "item": started}
    ]
    events += [
        {"type": "response.function_call_arguments.delta", **where, "delta": part}
        for part in pieces(item["arguments"], reply.arg_pieces)
    ]
    events += [
        {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]
    return events


def _numbered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]


__all__ = [
    "DEFAULT_MODELS",
    "Disconnect",
    "ErrorReply",
    "RawReply",
    "Reply",
    "Responder",
    "Scripted",
    "ToolCall",
    "Usage",
    "chat_chunks",
    "chat_completion",
    "context_length_exceeded",
    "invalid_api_key",
    "output_items",
    "rate_limited",
    "response_events",
    "response_object",
    "server_error",
]
