"""A local fake of OpenAI's Chat Completions and Responses APIs for tests.

As ``anthropic_server`` is for Anthropic: the unmodified ``openai`` client pointed at it
(``AsyncOpenAI(api_key="test", base_url=server.url)``) goes through its whole path, real HTTP
and real server-sent events, with no network and no API key. The same scripted reply is served
in the shape of whichever API was called: ``POST /v1/chat/completions`` (chunks, tool-call
arguments split in fragments by index, the usage chunk only when the request asked for it with
``stream_options.include_usage``, ``[DONE]``) or ``POST /v1/responses`` (typed events, function
calls as output items, usage in ``response.completed``).

What a test can script: text in pieces, tool calls (with arguments that are not JSON, too),
usage with cached and cache-write tokens or none at all, a ``finish_reason``, errors with
OpenAI's bodies (``context_length_exceeded``, 401, 429 with ``Retry-After``, 5xx), an error
event in a stream that had started, a stream cut before its end, a dropped connection, a
Responses stream that ends ``failed`` or ``incomplete``. Every request is recorded; ``repr``
of a recorded request hides the credential. Only the standard library is used
(``python -m segue.testing.openai_server`` prints its base URL and serves default replies).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import signal
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, Literal, NamedTuple, Self, cast
from urllib.parse import unquote

_SECRET_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})


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
    ``usage=None`` sends none (a server that does not count). When streamed: ``pieces`` text
    deltas, ``arg_pieces`` fragments per call's arguments, ``chunk_delay`` seconds between
    events, ``cut_after`` ends the stream after that many events (closing the connection before
    its end, as a dropped connection does), ``failed`` ends a Responses stream with
    ``response.failed``. ``delay`` seconds pass before the reply starts.
    """

    text: str = "ok"
    tool_calls: Sequence[ToolCall] = ()
    usage: Usage | None = field(default_factory=Usage)
    finish_reason: str | None = None
    model: str | None = None
    delay: float = 0.0
    pieces: int = 3
    arg_pieces: int = 3
    chunk_delay: float = 0.0
    cut_after: int | None = None
    failed: bool = False

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


class RecordedRequest(NamedTuple):
    """One request as received: ``(method, path, headers, body)``, header names lower-cased;
    ``repr`` hides credentials, so a failing assertion never prints the API key."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any

    def __repr__(self) -> str:
        shown = {k: ("<redacted>" if k in _SECRET_HEADERS else v) for k, v in self.headers.items()}
        return (
            f"RecordedRequest({self.method!r}, {self.path!r}, "
            f"headers={shown!r}, body={self.body!r})"
        )


def _pieces(text: str, count: int) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // max(1, count)))
    return [text[i : i + size] for i in range(0, len(text), size)]


# --------------------------------------------------------------------------- Chat Completions


def _chat_completion(reply: Reply, reply_id: str, model: str) -> dict[str, Any]:
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
    if reply.usage is not None:
        data["usage"] = reply.usage.chat()
    return data


def _chat_chunks(
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
    chunks += [chunk({"content": part}) for part in _pieces(reply.text, reply.pieces)]
    for index, call in enumerate(reply.tool_calls):
        head = {"index": index, "id": call.id, "type": "function"}
        chunks.append(
            chunk({"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]})
        )
        for part in _pieces(call.raw(), reply.arg_pieces):
            chunks.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
            )
    chunks.append(chunk({}, reply.finish))
    if with_usage and reply.usage is not None:
        chunks.append(
            {
                "id": reply_id,
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [],
                "usage": reply.usage.chat(),
            }
        )
    if reply.cut_after is not None:
        return chunks[: reply.cut_after]
    return chunks


# --------------------------------------------------------------------------- Responses


def _response_object(
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
    if status != "in_progress" and reply.usage is not None:
        data["usage"] = reply.usage.responses()
    return data


def _output_items(reply: Reply, reply_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
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


def _response_events(
    reply: Reply, reply_id: str, model: str, error: ErrorReply | None = None
) -> list[dict[str, Any]]:
    """The typed events of a streamed response (SSE name = ``type``)."""
    events: list[dict[str, Any]] = [
        {
            "type": "response.created",
            "response": _response_object(reply, reply_id, model, "in_progress", []),
        },
        {
            "type": "response.in_progress",
            "response": _response_object(reply, reply_id, model, "in_progress", []),
        },
    ]
    if error is not None:
        events.append(
            {"type": "error", "code": error.code, "message": error.message, "param": error.param}
        )
        return _numbered(events)
    items = _output_items(reply, reply_id)
    for index, item in enumerate(items):
        if item["type"] == "message":
            events += _message_events(reply, item, index)
        else:
            events += _function_events(reply, item, index)
    status = "failed" if reply.failed else "incomplete" if reply.finish == "length" else "completed"
    final = _response_object(reply, reply_id, model, status, items)
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
        for part in _pieces(reply.text, reply.pieces)
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
        for part in _pieces(item["arguments"], reply.arg_pieces)
    ]
    events += [
        {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]
    return events


def _numbered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]


# --------------------------------------------------------------------------- HTTP


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a handler stuck in a long delay must never keep the process alive
    fake: FakeOpenAIServer


Api = Literal["chat", "responses"]
_APIS: dict[str, Api] = {"/v1/chat/completions": "chat", "/v1/responses": "responses"}


class _Handler(BaseHTTPRequestHandler):
    """Routes one connection's requests to the owning ``FakeOpenAIServer``."""

    protocol_version = "HTTP/1.1"  # keep-alive, like the real API; the client pools connections

    @property
    def fake(self) -> FakeOpenAIServer:
        return cast(_HTTPServer, self.server).fake

    def setup(self) -> None:
        super().setup()
        self.fake._track(self.connection, add=True)

    def finish(self) -> None:
        self.fake._track(self.connection, add=False)
        with contextlib.suppress(OSError):  # the client vanished; nothing to flush
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging: stderr noise, and headers must never be echoed."""

    def do_GET(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        path = self.path.split("?", 1)[0]
        self.fake._record(RecordedRequest(self.command, self.path, headers, body))
        try:
            self._route(path, body)
        except OSError:
            self.close_connection = True  # the client went away mid-reply
        except Exception as exc:  # noqa: BLE001  # a broken responder must surface in the test
            failure = ErrorReply(500, f"fake server error: {exc!r}", "server_error")
            self._send_json(500, {"error": failure.error()}, {"x-should-retry": "false"})

    def _route(self, path: str, body: Any) -> None:
        fake = self.fake
        api = _APIS.get(path)
        if self.command == "POST" and api is not None:
            wanted = {"chat": "messages", "responses": "input"}[api]
            if not isinstance(body, dict) or not {"model", wanted} <= body.keys():
                self._send_error(ErrorReply(400, f"model and {wanted} are required"))
                return
            self._answer(api, body, fake._next_reply(body))
        elif self.command == "GET" and path.startswith("/v1/models/"):
            model_id = unquote(path.removeprefix("/v1/models/"))
            spec = fake.models.get(model_id)
            if spec is None:
                message = f"The model '{model_id}' does not exist"
                self._send_error(ErrorReply(404, message, code="model_not_found"))
                return
            self._send_json(200, {"id": model_id, "object": "model", "created": 0, **spec})
        else:
            self._send_error(ErrorReply(404, f"Not found: {path}", code="not_found"))

    def _answer(self, api: Api, request: dict[str, Any], reply: Scripted) -> None:
        if reply.delay > 0 and self.fake._stopping.wait(reply.delay):
            self.close_connection = True  # the server is stopping; abandon the slow reply
            return
        if isinstance(reply, Disconnect):
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if isinstance(reply, RawReply):
            self._send_raw(reply)
            return
        stream = request.get("stream") is True
        if isinstance(reply, ErrorReply) and not (reply.mid_stream and stream):
            self._send_error(reply)
            return
        model = str(request["model"])
        if api == "chat":
            reply_id = f"chatcmpl-fake{uuid.uuid4().hex[:20]}"
            options = request.get("stream_options")
            with_usage = isinstance(options, dict) and options.get("include_usage") is True
            if isinstance(reply, ErrorReply):
                chunks = _chat_chunks(Reply(), reply_id, model, with_usage=False, error=reply)
                self._send_sse((None, c) for c in chunks)
            elif stream:
                chunks = _chat_chunks(reply, reply_id, reply.model or model, with_usage=with_usage)
                done = reply.cut_after is None
                self._send_sse(((None, c) for c in chunks), reply.chunk_delay, done=done)
            else:
                self._send_json(200, _chat_completion(reply, reply_id, reply.model or model))
            return
        reply_id = f"resp_fake{uuid.uuid4().hex[:20]}"
        if isinstance(reply, ErrorReply):
            events = _response_events(Reply(), reply_id, model, reply)
            self._send_sse((e["type"], e) for e in events)
        elif stream:
            events = _response_events(reply, reply_id, reply.model or model)
            self._send_sse(((e["type"], e) for e in events), reply.chunk_delay)
        else:
            items = _output_items(reply, reply_id)
            status = "incomplete" if reply.finish == "length" else "completed"
            self._send_json(
                200, _response_object(reply, reply_id, reply.model or model, status, items)
            )

    def _send_error(self, error: ErrorReply) -> None:
        self._send_json(error.status, {"error": error.error()}, error.headers)

    def _send_json(self, status: int, data: object, extra: Mapping[str, str] | None = None) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.send_header("x-request-id", self.fake._request_id())
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _send_raw(self, reply: RawReply) -> None:
        self.send_response(reply.status)
        self.send_header("content-type", reply.content_type)
        self.send_header("content-length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)

    def _send_sse(
        self,
        events: Iterator[tuple[str | None, dict[str, Any]]],
        chunk_delay: float = 0.0,
        *,
        done: bool = False,
    ) -> None:
        """Stream events, then close: with no content-length the body ends at EOF. Chat
        Completions ends with ``data: [DONE]`` (``done``); a cut stream ends without it."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.send_header("x-request-id", self.fake._request_id())
        self.end_headers()
        for name, data in events:
            if chunk_delay > 0 and self.fake._stopping.wait(chunk_delay):
                return
            line = f"event: {name}\n" if name else ""
            self.wfile.write(f"{line}data: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()
        if done:
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()


class FakeOpenAIServer:
    """The fake API on ``127.0.0.1`` at an ephemeral port; see the module docstring.

    ``default`` answers when the script is empty; ``models`` maps model ids to the extra fields
    ``GET /v1/models/{id}`` reports (others get 404). All methods are safe from any thread.
    """

    def __init__(
        self,
        *,
        default: Scripted | Responder | None = None,
        models: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.default: Scripted | Responder = Reply() if default is None else default
        self.models: dict[str, Mapping[str, Any]] = dict(
            DEFAULT_MODELS if models is None else models
        )
        self._lock = threading.Condition()
        self._script: deque[Scripted | Responder] = deque()
        self._requests: list[RecordedRequest] = []
        self._connections: set[socket.socket] = set()
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        """Bind an ephemeral loopback port and serve from a daemon thread."""
        if self._httpd is not None:
            raise RuntimeError("FakeOpenAIServer is already running")
        self._stopping.clear()
        httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        httpd.fake = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-openai",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, cut open keep-alive connections and abandon delayed replies."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):  # already closed by the peer
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL for the client, with the ``/v1`` it expects: ``http://127.0.0.1:PORT/v1``."""
        if self._httpd is None:
            raise RuntimeError("FakeOpenAIServer is not running")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def enqueue(self, *replies: Scripted | Responder) -> None:
        """Append replies to the script; each chat or responses request consumes the first."""
        with self._lock:
            self._script.extend(replies)

    @property
    def pending(self) -> int:
        """How many scripted replies are still unused."""
        with self._lock:
            return len(self._script)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def model_requests(self) -> list[RecordedRequest]:
        """Only the requests that ask the model (chat completions and responses)."""
        paths = ("/v1/chat/completions", "/v1/responses")
        return [r for r in self.requests if r.method == "POST" and r.path.split("?", 1)[0] in paths]

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> bool:
        """Block until ``count`` requests have arrived."""
        with self._lock:
            return self._lock.wait_for(lambda: len(self._requests) >= count, timeout)

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)
            self._lock.notify_all()

    def _next_reply(self, request: dict[str, Any]) -> Scripted:
        with self._lock:
            item = self._script.popleft() if self._script else self.default
        return item(request) if callable(item) else item

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _request_id(self) -> str:
        return f"req_fake_{next(self._ids):06d}"


def main(argv: Sequence[str] | None = None) -> int:
    """Serve default replies until SIGTERM/SIGINT, writing the base URL as the first stdout line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--text", default="ok", help="text of every reply")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each reply")
    args = parser.parse_args(argv)
    done = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    with FakeOpenAIServer(default=Reply(text=args.text, delay=args.delay)) as server:
        sys.stdout.write(server.url + "\n")
        sys.stdout.flush()
        while not done.wait(0.2):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
