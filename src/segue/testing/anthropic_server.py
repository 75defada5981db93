"""A local fake of the Anthropic Messages API for tests.

Why a fake HTTP server rather than mocking the SDK: segue's behaviour at the context limit
depends on what the *real* ``anthropic`` client does with real responses (which exception class a
400 becomes, how retries honour ``retry-after-ms``, how a stream is accumulated into a final
``Message``). Pointing the unmodified client at this server
(``AsyncAnthropic(api_key="test", base_url=server.url)``) tests that whole path with no network and
no API key.

Replies are scripted: ``enqueue`` pushes replies onto a FIFO; when it is empty the ``default`` reply
(or responder callable) answers. Every request is recorded in ``requests`` so tests can assert what
was sent. Only the standard library is used, so the server also runs in a child process
(``python -m segue.testing.anthropic_server`` prints its URL and serves default replies).

Claude on Amazon Bedrock and on Google Vertex AI is the same API under other paths: the
``AsyncAnthropicBedrock`` and ``AsyncAnthropicVertex`` clients pointed at the fake
(``base_url=server.url``) are answered too, Bedrock's stream in AWS event-stream frames.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote

from segue.testing._anthropic_clouds import aws_frame, cloud_call
from segue.testing._scripted_http import RecordedRequest as RecordedRequest  # noqa: PLC0414  # re-exported: this module's API since it was written here
from segue.testing._scripted_http import ScriptedHandler, ScriptedServer, serve_until_stopped
from segue.testing.prompt_cache import (
    MEASURED,
    Accounted,
    Bill,
    Measured,
    PromptCache,
    TooManyBreakpointsError,
    output_tokens,
)


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
    ``message_stop``, as a dropped connection does.
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


def _message_json(reply: MessageReply, message_id: str, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [thinking.block() for thinking in reply.thinking]
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
        message["usage"] = usage.to_json()
    return message


def _usage(reply: MessageReply) -> Usage | None:
    """The usage a reply reports (``MEASURED`` not counted, an error's: the defaults)."""
    return Usage() if isinstance(reply.usage, Measured) else reply.usage


def _sse_events(
    reply: MessageReply, message_id: str, model: str, error: ErrorReply | None = None
) -> list[dict[str, Any]]:
    """The events the API streams for ``reply`` (or up to ``error``); SSE name = ``type``."""
    start = _message_json(reply, message_id, model)
    start.update(content=[], stop_reason=None)
    usage = _usage(reply)
    if usage is not None:
        start["usage"] = usage.to_json(output_tokens=1)
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}, {"type": "ping"}]
    if error is not None:
        return [*events, error.body()]
    blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
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
        final["usage"] = usage.to_json()
    events.append(final)
    events.append({"type": "message_stop"})
    if reply.cut_after is not None:
        return events[: reply.cut_after]
    return events


def _named(events: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each event under its SSE name, which the Messages API makes its ``type``."""
    return ((event["type"], event) for event in events)


class _Handler(ScriptedHandler):
    """Routes one connection's requests to the owning ``FakeAnthropicServer``."""

    fake: FakeAnthropicServer
    request_id_header = "request-id"

    def _failure_body(self, exc: Exception) -> object:
        return ErrorReply(500, "api_error", f"fake server error: {exc!r}").body()

    def _route(self, path: str, body: Any) -> None:
        fake = self.fake
        cloud = cloud_call(path)
        if self.command == "POST" and cloud is not None and isinstance(body, dict):
            # Bedrock and Vertex AI name the model (and whether to stream) in the path.
            model, stream, self._aws_frames = cloud
            body = {**body, "model": model, "stream": stream}
            self._messages(body, fake._next_reply(body))
        elif self.command == "POST" and path == "/v1/messages":
            if not isinstance(body, dict) or not {"model", "messages", "max_tokens"} <= body.keys():
                msg = "model, messages and max_tokens are required"
                self._send_error(ErrorReply(400, "invalid_request_error", msg))
                return
            self._messages(body, fake._next_reply(body))
        elif self.command == "POST" and path == "/v1/messages/count_tokens":
            if not isinstance(body, dict):
                self._send_error(ErrorReply(400, "invalid_request_error", "body must be JSON"))
                return
            self._send_json(200, {"input_tokens": fake.count_tokens(body)})
        elif self.command == "GET" and path.startswith("/v1/models/"):
            model_id = unquote(path.removeprefix("/v1/models/"))
            spec = fake.models.get(model_id)
            if spec is None:
                self._send_error(ErrorReply(404, "not_found_error", f"model: {model_id}"))
                return
            self._send_json(200, fake._model_json(model_id, spec))
        else:
            self._send_error(ErrorReply(404, "not_found_error", f"Not found: {path}"))

    def _messages(self, request: dict[str, Any], reply: Reply) -> None:
        if self._held_back(reply.delay):
            return
        if isinstance(reply, Disconnect):
            self._drop()
            return
        if isinstance(reply, RawReply):
            self._send_raw(reply)
            return
        stream = request.get("stream") is True
        if isinstance(reply, ErrorReply) and not (reply.mid_stream and stream):
            self._send_error(reply)
            return
        message_id = f"msg_fake_{uuid.uuid4().hex[:20]}"
        model = str(request["model"])
        if isinstance(reply, MessageReply):
            try:
                reply = self.fake._measured(request, reply)
            except TooManyBreakpointsError as exc:
                self._send_error(ErrorReply(400, "invalid_request_error", str(exc)))
                return
        if isinstance(reply, ErrorReply):
            self._send_sse(_named(_sse_events(MessageReply(), message_id, model, reply)))
        elif stream and self._aws_frames:
            self._send_aws_events(_sse_events(reply, message_id, reply.model or model))
        elif stream:
            events = _sse_events(reply, message_id, reply.model or model)
            self._send_sse(_named(events), reply.chunk_delay)
        else:
            self._send_json(200, _message_json(reply, message_id, reply.model or model))

    def _send_error(self, error: ErrorReply) -> None:
        self._send_json(error.status, error.body(), error.headers)

    _aws_frames = False
    """This request came as Bedrock's: its stream is AWS event-stream frames, not SSE."""

    def _send_aws_events(self, events: list[dict[str, Any]]) -> None:
        """Bedrock's ``invoke-with-response-stream``: each event a binary frame whose payload
        is ``{"bytes": base64(event JSON)}``, then EOF."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("content-type", "application/vnd.amazon.eventstream")
        self.send_header("connection", "close")
        self.send_header("x-amzn-requestid", self.fake._request_id())
        self.end_headers()
        for event in events:
            self.wfile.write(aws_frame(event))
            self.wfile.flush()


class FakeAnthropicServer(ScriptedServer[Reply]):
    """The fake API on ``127.0.0.1`` at an ephemeral port; see the module docstring.

    ``default`` answers when the script is empty; ``count_tokens`` computes
    ``/v1/messages/count_tokens`` from the request body; ``models`` maps model ids to what
    ``/v1/models/{id}`` reports (others get 404). All methods are safe to call from any thread.
    """

    handler = _Handler
    thread_name = "fake-anthropic"

    def __init__(
        self,
        *,
        default: Reply | Responder | None = None,
        count_tokens: Callable[[dict[str, Any]], int] = estimate_tokens,
        models: Mapping[str, ModelSpec] | None = None,
    ) -> None:
        super().__init__(MessageReply() if default is None else default)
        self.cache = PromptCache()
        self.bill = Bill()
        self.count_tokens = count_tokens
        self.models: dict[str, ModelSpec] = dict(DEFAULT_MODELS if models is None else models)

    @property
    def url(self) -> str:
        """Base URL for the SDK, e.g. ``http://127.0.0.1:54321``."""
        return self.origin

    def message_requests(self) -> list[RecordedRequest]:
        """Only the Messages requests (not count_tokens or models), with or without a query
        string (the Claude Code CLI sends ``/v1/messages?beta=true``), Bedrock's and Vertex
        AI's included (their model named in the path, not the body)."""
        return [
            r
            for r in self.requests
            if r.method == "POST"
            and (
                r.path.split("?", 1)[0] == "/v1/messages"
                or cloud_call(r.path.split("?", 1)[0]) is not None
            )
        ]

    def _measured(self, request: dict[str, Any], reply: MessageReply) -> MessageReply:
        """``reply`` with its usage counted from ``request`` (the cache read and written) when
        the script left it to the server; every answer with usage goes on the bill."""
        if isinstance(reply.usage, Measured):
            prompt = self.cache.account(request)
            thinking = "".join(t.thinking for t in reply.thinking)
            calls = [(t.name, dict(t.input)) for t in reply.tool_uses]
            output = output_tokens(reply.text, calls, thinking)
            usage = Usage(
                prompt.input_tokens,
                output,
                prompt.cache_creation_input_tokens,
                prompt.cache_read_input_tokens,
            )
            self.bill.add(prompt, output)
            return replace(reply, usage=usage)
        if isinstance(reply.usage, Usage):
            said = reply.usage
            written = said.cache_creation_input_tokens or 0
            read = said.cache_read_input_tokens or 0
            self.bill.add(Accounted(said.input_tokens, read, written), said.output_tokens)
        return reply

    def _model_json(self, model_id: str, spec: ModelSpec) -> dict[str, Any]:
        data: dict[str, Any] = {
            "type": "model",
            "id": model_id,
            "display_name": spec.display_name or model_id,
            "created_at": "2025-01-01T00:00:00Z",
            "lifecycle": "active",
        }
        if spec.max_input_tokens is not None:
            data["max_input_tokens"] = spec.max_input_tokens
        if spec.max_tokens is not None:
            data["max_tokens"] = spec.max_tokens
        return data


def main(argv: Sequence[str] | None = None) -> int:
    """Serve default replies until SIGTERM/SIGINT, writing the base URL as the first stdout line.

    For tests that need the fake in another process than the one holding the client.
    """
    description = __doc__.splitlines()[0] if __doc__ else None
    return serve_until_stopped(
        lambda text, delay: FakeAnthropicServer(default=MessageReply(text=text, delay=delay)),
        argv,
        description,
    )


if __name__ == "__main__":
    raise SystemExit(main())
