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

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import unquote

from segue.testing._anthropic_clouds import aws_frame, cloud_call, served
from segue.testing._scripted_http import RecordedRequest as RecordedRequest  # noqa: PLC0414  # re-exported: this module's API since it was written here
from segue.testing._scripted_http import ScriptedHandler, ScriptedServer, serve_until_stopped
from segue.testing.anthropic_managed import (
    ContextManagementError,
    betas_of,
    compacted,
    manage,
    prompt_tokens,
    summarise,
    trigger_of,
)
from segue.testing.anthropic_replies import (
    DEFAULT_MODELS,
    Compacted,
    Disconnect,
    ErrorReply,
    MessageReply,
    ModelSpec,
    RawReply,
    Reply,
    Responder,
    Thinking,
    ToolUse,
    Usage,
    authentication,
    context_limit,
    estimate_tokens,
    overloaded,
    prompt_too_long,
    rate_limited,
    server_error,
)
from segue.testing.anthropic_replies import message_json as _message_json
from segue.testing.anthropic_replies import named as _named
from segue.testing.anthropic_replies import sse_events as _sse_events
from segue.testing.prompt_cache import (
    Accounted,
    Bill,
    Measured,
    PromptCache,
    TooManyBreakpointsError,
    output_tokens,
)


class _Handler(ScriptedHandler):
    """Routes one connection's requests to the owning ``FakeAnthropicServer``."""

    fake: FakeAnthropicServer
    request_id_header = "request-id"

    def _failure_body(self, exc: Exception) -> object:
        return ErrorReply(500, "api_error", f"fake server error: {exc!r}").body()

    def _route(self, path: str, body: Any) -> None:
        fake = self.fake
        cloud = cloud_call(path)
        self._served = None  # a connection kept alive may carry another client's next request
        if self.command == "POST" and cloud is not None and isinstance(body, dict):
            # Bedrock and Vertex AI name the model (and whether to stream) in the path.
            model, stream, self._aws_frames = cloud
            self._served = served(model, bedrock=self._aws_frames)
            body = {**body, "model": model, "stream": stream}
            scripted = fake.pending > 0
            self._messages(body, fake._next_reply(body), scripted=scripted)
        elif self.command == "POST" and path == "/v1/messages":
            if not isinstance(body, dict) or not {"model", "messages", "max_tokens"} <= body.keys():
                msg = "model, messages and max_tokens are required"
                self._send_error(ErrorReply(400, "invalid_request_error", msg))
                return
            scripted = fake.pending > 0
            self._messages(body, fake._next_reply(body), scripted=scripted)
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

    def _messages(self, request: dict[str, Any], reply: Reply, *, scripted: bool = False) -> None:
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
        prefix, model = self._served or ("msg_", str(request["model"]))
        message_id = f"{prefix}fake{uuid.uuid4().hex[:20]}"
        if isinstance(reply, MessageReply):
            betas = betas_of({k.lower(): v for k, v in self.headers.items()}, request)
            try:
                reply = self.fake._measured(request, reply, betas=betas, scripted=scripted)
            except (TooManyBreakpointsError, ContextManagementError) as exc:
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
    _served: tuple[str, str] | None = None
    """A cloud's request: the prefix of its message ids and the model its answer names."""

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
        summarise: Callable[[dict[str, Any]], str | None] = summarise,
    ) -> None:
        super().__init__(MessageReply() if default is None else default)
        self.cache = PromptCache()
        self.bill = Bill()
        self.count_tokens = count_tokens
        self.models: dict[str, ModelSpec] = dict(DEFAULT_MODELS if models is None else models)
        self.summarise = summarise
        """Writes the summary of a compaction the server makes (None: the compaction fails,
        as the API's null content says)."""
        self.refuse_compaction = False
        """Refuse every compaction edit (400), as for a model or an account that cannot."""

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

    def _measured(
        self,
        request: dict[str, Any],
        reply: MessageReply,
        *,
        betas: set[str] | None = None,
        scripted: bool = False,
    ) -> MessageReply:
        """``reply`` with its usage counted from ``request`` (the cache read and written) when
        the script left it to the server; every answer with usage goes on the bill. The
        context is first managed as the request asks (``anthropic_managed``): edits applied
        and reported, and a compaction made when its trigger is reached (a reply paused after
        it puts a scripted answer back for the request that goes on)."""
        managed = manage(request, betas or set())
        if managed.compaction is not None and self.refuse_compaction:
            msg = f"compact_20260112 is not supported for the model {request.get('model')}"
            raise ContextManagementError(msg)
        reading = managed.request
        if managed.applied is not None:
            reply = replace(reply, applied_edits=managed.applied)
        compaction = reply.compaction
        asked = managed.compaction
        made = (
            compaction is None and asked is not None and prompt_tokens(reading) >= trigger_of(asked)
        )
        if made:
            compaction = Compacted(content=self.summarise(reading))
        if compaction is not None:
            if made and asked is not None and asked.get("pause_after_compaction"):
                if scripted:  # the answer is given after the pause, to the next request
                    self._put_back(reply)
                reply = replace(reply, text="", tool_uses=(), thinking=(), stop_reason="compaction")
            compaction = self._compaction_billed(reading, compaction)
            reply = replace(reply, compaction=compaction)
            if compaction.content is not None:  # the message reads the summary alone
                reading = compacted(reading, compaction.block())
            if reply.stop_reason == "compaction":
                return replace(reply, usage=Usage(0, 0)) if reply.usage is not None else reply
        return self._billed(reading, reply)

    def _compaction_billed(self, reading: dict[str, Any], compaction: Compacted) -> Compacted:
        """``compaction`` with what its iteration cost: the whole prompt read, the summary
        written (unless scripted), on the bill."""
        if isinstance(compaction.usage, Measured):
            prompt = self.cache.account(reading)
            written = output_tokens(compaction.content or "")
            self.bill.add(prompt, written)
            spent = Usage(
                prompt.input_tokens,
                written,
                prompt.cache_creation_input_tokens,
                prompt.cache_read_input_tokens,
            )
            return replace(compaction, usage=spent)
        said = compaction.usage
        written_cache = said.cache_creation_input_tokens or 0
        read = said.cache_read_input_tokens or 0
        self.bill.add(Accounted(said.input_tokens, read, written_cache), said.output_tokens)
        return compaction

    def _put_back(self, reply: MessageReply) -> None:
        """A scripted answer the provider has not given yet (it paused after compacting)
        answers the next request."""
        with self._lock:
            self._script.appendleft(reply)

    def _billed(self, request: dict[str, Any], reply: MessageReply) -> MessageReply:
        """``reply`` with its usage counted from ``request`` when the script left it to the
        server, on the bill."""
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


__all__ = [  # the scripted replies are importable from here, beside the server they script
    "DEFAULT_MODELS",
    "Compacted",
    "Disconnect",
    "ErrorReply",
    "FakeAnthropicServer",
    "MessageReply",
    "ModelSpec",
    "RawReply",
    "RecordedRequest",
    "Reply",
    "Responder",
    "Thinking",
    "ToolUse",
    "Usage",
    "authentication",
    "context_limit",
    "estimate_tokens",
    "main",
    "overloaded",
    "prompt_too_long",
    "rate_limited",
    "server_error",
]
