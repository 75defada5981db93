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
Responses stream that ends ``failed`` or ``incomplete`` (the replies and their wire shapes are
in ``openai_replies``, importable from here too). ``AsyncAzureOpenAI`` with the fake's origin
as its ``azure_endpoint`` is answered too, under Azure's paths. Every request is recorded;
``repr`` of a recorded request hides the credential. Only the standard library is used
(``python -m segue.testing.openai_server`` prints its base URL and serves default replies).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Final, Literal
from urllib.parse import unquote

from segue.testing._measured import Measured
from segue.testing._scripted_http import (
    RecordedRequest,
    ScriptedHandler,
    ScriptedServer,
    serve_until_stopped,
)
from segue.testing.openai_compaction import (
    compaction_item,
    from_last_compaction,
    input_tokens,
    summarise,
    threshold_of,
    user_messages,
)
from segue.testing.openai_local import OVERFLOWS, llama_cpp_props, ollama_show
from segue.testing.openai_replies import (
    DEFAULT_MODELS,
    Disconnect,
    ErrorReply,
    RawReply,
    Reply,
    Responder,
    Scripted,
    ToolCall,
    Usage,
    chat_chunks,
    chat_completion,
    context_length_exceeded,
    invalid_api_key,
    output_items,
    rate_limited,
    response_events,
    response_object,
    server_error,
)
from segue.testing.prompt_cache import output_tokens

# --------------------------------------------------------------------------- HTTP


Api = Literal["chat", "responses"]
_APIS: dict[str, Api] = {"/v1/chat/completions": "chat", "/v1/responses": "responses"}
_AZURE_DEPLOYMENT: Final = re.compile(r"^/openai/deployments/[^/]+(?P<rest>/.+)$")


def _unazured(path: str) -> str:
    """Azure OpenAI's paths as OpenAI's (``AsyncAzureOpenAI`` pointed at the fake as its
    ``azure_endpoint``): ``/openai/deployments/{name}/chat/completions``, ``/openai/responses``
    and the v1 API's ``/openai/v1/...`` answer as ``/v1/...`` do (the deployment is the model
    the client names in the body too)."""
    deployed = _AZURE_DEPLOYMENT.match(path)
    if deployed is not None:
        return f"/v1{deployed['rest']}"
    if path.startswith("/openai/v1/"):
        return path.removeprefix("/openai")
    if path.startswith("/openai/"):
        return f"/v1{path.removeprefix('/openai')}"
    return path


class _Handler(ScriptedHandler):
    """Routes one connection's requests to the owning ``FakeOpenAIServer``."""

    fake: FakeOpenAIServer
    request_id_header = "x-request-id"

    def _failure_body(self, exc: Exception) -> object:
        return {"error": ErrorReply(500, f"fake server error: {exc!r}", "server_error").error()}

    def _route(self, path: str, body: Any) -> None:
        fake = self.fake
        path = _unazured(path)
        api = _APIS.get(path)
        if self.command == "POST" and path == "/v1/responses/compact":
            self._compact(body)
            return
        if self.command == "POST" and api is not None:
            wanted = {"chat": "messages", "responses": "input"}[api]
            if not isinstance(body, dict) or not {"model", wanted} <= body.keys():
                self._send_error(ErrorReply(400, f"model and {wanted} are required"))
                return
            self._answer(api, body, fake._next_reply(body))
        elif self.command == "GET" and path.startswith("/v1/models/") and fake.retrieve:
            model_id = unquote(path.removeprefix("/v1/models/"))
            spec = fake.models.get(model_id)
            if spec is None:
                message = f"The model '{model_id}' does not exist"
                self._send_error(ErrorReply(404, message, code="model_not_found"))
                return
            self._send_json(200, _model(model_id, spec))
        elif self.command == "GET" and path == "/v1/models":
            data = [_model(model_id, spec) for model_id, spec in fake.models.items()]
            self._send_json(200, {"object": "list", "data": data})
        elif self.command == "GET" and path == "/props" and fake.props is not None:
            self._send_json(200, fake.props)
        elif self.command == "POST" and path == "/api/show" and fake.shown is not None:
            name = body.get("model") if isinstance(body, dict) else None
            shown = fake.shown.get(str(name))
            if shown is None:  # Ollama's own error shape, not OpenAI's
                self._send_json(404, {"error": f"model '{name}' not found"})
                return
            self._send_json(200, shown)
        else:
            self._send_error(ErrorReply(404, f"Not found: {path}", code="not_found"))

    def _answer(self, api: Api, request: dict[str, Any], reply: Scripted) -> None:
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
        model = str(request["model"])
        reading = request
        if api == "responses" and isinstance(reply, Reply):
            if threshold_of(request) is not None and self.fake.refuse_compaction:
                self._send_error(_COMPACTION_REFUSED)
                return
            reply, reading = _compacting(request, reply)
        if isinstance(reply, Reply) and isinstance(reply.usage, Measured):
            reply = replace(reply, usage=_measured(reading, reply))
        if api == "chat":
            self._send_chat(request, reply, model, stream=stream)
        else:
            self._send_response(reply, model, stream=stream)

    def _send_chat(
        self, request: dict[str, Any], reply: Reply | ErrorReply, model: str, *, stream: bool
    ) -> None:
        reply_id = f"chatcmpl-fake{uuid.uuid4().hex[:20]}"
        options = request.get("stream_options")
        with_usage = isinstance(options, dict) and options.get("include_usage") is True
        if isinstance(reply, ErrorReply):
            chunks = chat_chunks(Reply(), reply_id, model, with_usage=False, error=reply)
            self._send_sse((None, c) for c in chunks)
        elif stream:
            chunks = chat_chunks(reply, reply_id, reply.model or model, with_usage=with_usage)
            done = reply.cut_after is None
            self._send_sse(((None, c) for c in chunks), reply.chunk_delay, done=done)
        else:
            self._send_json(200, chat_completion(reply, reply_id, reply.model or model))

    def _send_response(self, reply: Reply | ErrorReply, model: str, *, stream: bool) -> None:
        reply_id = f"resp_fake{uuid.uuid4().hex[:20]}"
        if isinstance(reply, ErrorReply):
            events = response_events(Reply(), reply_id, model, reply)
            self._send_sse((e["type"], e) for e in events)
        elif stream:
            events = response_events(reply, reply_id, reply.model or model)
            self._send_sse(((e["type"], e) for e in events), reply.chunk_delay)
        else:
            items = output_items(reply, reply_id)
            status = "incomplete" if reply.finish == "length" else "completed"
            self._send_json(
                200, response_object(reply, reply_id, reply.model or model, status, items)
            )

    def _send_error(self, error: ErrorReply) -> None:
        self._send_json(error.status, {"error": error.error()}, error.headers)

    def _compact(self, body: Any) -> None:
        """``POST /v1/responses/compact``: the input's user messages, then one compaction
        item, and what the compaction pass cost."""
        if not isinstance(body, dict) or "model" not in body:
            self._send_error(ErrorReply(400, "model is required"))
            return
        if self.fake.refuse_compaction:
            self._send_error(_COMPACTION_REFUSED)
            return
        given = body.get("input") or []
        items = from_last_compaction(
            [{"role": "user", "content": given}] if isinstance(given, str) else given
        )
        summary = summarise(items)
        usage = Usage(
            prompt_tokens=input_tokens(body, items), completion_tokens=output_tokens(summary)
        )
        self._send_json(
            200,
            {
                "id": f"resp_fake{uuid.uuid4().hex[:20]}",
                "object": "response.compaction",
                "created_at": int(time.time()),
                "output": [*user_messages(items), compaction_item(summary)],
                "usage": usage.responses(),
            },
        )


_COMPACTION_REFUSED = ErrorReply(
    400,
    "context_management compaction is not supported for this model",
    code="unsupported_parameter",
)
"""What the fake answers a compaction when it is told to refuse them (``refuse_compaction``)."""


def _compacting(request: dict[str, Any], reply: Reply) -> tuple[Reply, dict[str, Any]]:
    """``reply``, starting with a compaction item when the request's threshold is reached,
    and the request as the model reads it (from the last compaction item on)."""
    given = request.get("input") or []
    items = from_last_compaction(
        [{"role": "user", "content": given}] if isinstance(given, str) else given
    )
    threshold = threshold_of(request)
    if (
        reply.compaction is None
        and threshold is not None
        and input_tokens(request, items) >= threshold
    ):
        item = compaction_item(summarise(items))
        return replace(reply, compaction=item), {**request, "input": from_last_compaction([item])}
    return reply, {**request, "input": items}


def _measured(request: dict[str, Any], reply: Reply) -> Usage:
    """The usage of ``reply`` counted from ``request`` as segue estimates tokens: each
    message's or input item's content, tool calls and outputs, the instructions and tools."""
    items = request.get("messages") or request.get("input") or []
    if isinstance(items, str):
        items = [{"content": items}]
    prompt = input_tokens(request, items)
    calls = [(c.name, c.raw()) for c in reply.tool_calls]
    return Usage(prompt_tokens=prompt, completion_tokens=output_tokens(reply.text, calls))


def _model(model_id: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "system", **spec}


class FakeOpenAIServer(ScriptedServer[Scripted]):
    """The fake API on ``127.0.0.1`` at an ephemeral port; see the module docstring.

    ``default`` answers when the script is empty; ``models`` maps model ids to the extra fields
    ``GET /v1/models/{id}`` and the list ``GET /v1/models`` report (others get 404; a field
    such as ``max_model_len`` plays vLLM). What a local server adds, each switchable per test
    (the attributes of the same names): ``retrieve=False`` answers ``/v1/models/{id}`` 404, as
    vLLM does; ``props`` is llama.cpp's ``GET /props`` (``openai_replies.llama_cpp_props``);
    ``shown`` maps model names to Ollama's ``POST /api/show`` (``openai_replies.ollama_show``);
    None: the route is not there (404). All methods are safe from any thread.
    """

    handler = _Handler
    thread_name = "fake-openai"

    def __init__(
        self,
        *,
        default: Scripted | Responder | None = None,
        models: Mapping[str, Mapping[str, Any]] | None = None,
        retrieve: bool = True,
        props: Mapping[str, Any] | None = None,
        shown: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(Reply() if default is None else default)
        self.models: dict[str, Mapping[str, Any]] = dict(
            DEFAULT_MODELS if models is None else models
        )
        self.retrieve = retrieve
        self.props = props
        self.shown = shown
        self.refuse_compaction = False
        """Refuse every compaction (400), as for a model that cannot compact."""

    @property
    def url(self) -> str:
        """Base URL for the client, with the ``/v1`` it expects: ``http://127.0.0.1:PORT/v1``."""
        return f"{self.origin}/v1"

    def model_requests(self) -> list[RecordedRequest]:
        """Only the requests that ask the model (chat completions and responses)."""
        paths = ("/v1/chat/completions", "/v1/responses")
        return [r for r in self.requests if r.method == "POST" and r.path.split("?", 1)[0] in paths]


def main(argv: Sequence[str] | None = None) -> int:
    """Serve default replies until SIGTERM/SIGINT, writing the base URL as the first stdout line."""
    description = __doc__.splitlines()[0] if __doc__ else None
    return serve_until_stopped(
        lambda text, delay: FakeOpenAIServer(default=Reply(text=text, delay=delay)),
        argv,
        description,
    )


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [  # the scripted replies are importable from here, beside the server they script
    "DEFAULT_MODELS",
    "OVERFLOWS",
    "Disconnect",
    "ErrorReply",
    "FakeOpenAIServer",
    "RawReply",
    "RecordedRequest",
    "Reply",
    "Responder",
    "Scripted",
    "ToolCall",
    "Usage",
    "context_length_exceeded",
    "invalid_api_key",
    "llama_cpp_props",
    "main",
    "ollama_show",
    "rate_limited",
    "server_error",
]
