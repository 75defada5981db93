"""The OpenAI adapter: segue's ``LlmModel`` over the real ``openai.AsyncOpenAI`` client, for
OpenAI, Azure OpenAI and any OpenAI-compatible server (vLLM, Ollama, a LiteLLM proxy...).

``OpenAIModel(client, api="chat")`` streams Chat Completions; ``api="responses"`` the
Responses API. Three jobs, each in its own place:

* **Payload** (``openai_payload``): the transcript as messages or input items, tools as
  function tools, images as data URLs, the model's settings as the model takes them.
* **Reply** (``openai_stream``): chunks or events read into an ``LlmReply``, text passed on as
  it arrives, usage mapped so the cached part of the prompt is counted once, a stream that did
  not end properly an error, never a reply.
* **Errors** (here): every failure an ``LlmCallError``: ``context_length_exceeded`` (or "maximum
  context length is N tokens") takes the exhaustion path; 429 and 5xx are retried by segue,
  honouring ``Retry-After``, with the client's own retries off; 401 names ``OPENAI_API_KEY``.
  The key never appears in a log entry, an error message or an exception chained below it.

Pre-flight: with ``exact_preflight=True`` ``count_tokens`` counts the payload with ``tiktoken``
(installed by ``segue[openai]``; its encoding files must be downloadable or cached, see
``TIKTOKEN_CACHE_DIR``), or with the ``encoding`` given; otherwise, or when no encoding loads,
segue's own conservative estimate is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final, Literal, Protocol

import openai

from segue.executor._log import get_logger
from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmReply, LlmRequest, TextSink
from segue.executor.models.calls import guarded
from segue.executor.models.helpers import (
    Meaning,
    http_error,
    redact,
    retry_after,
    secrets_of,
)
from segue.executor.models.openai_payload import (
    Api,
    Payload,
    UnsupportedContentError,
    build_payload,
    check_content,
)
from segue.executor.models.openai_stream import ChatReader, ResponsesReader, failure
from segue.statemachine.content import document_tokens, image_tokens

log = get_logger(__name__)

KEY_VARIABLE: Final = "OPENAI_API_KEY"
_OVERFLOW: Final = re.compile(
    r"maximum context length is \d+|context_length_exceeded|exceeds the context window|"
    r"input tokens exceed the configured limit",
    re.IGNORECASE,
)
_MEANINGS: Final[dict[str, Meaning]] = {
    "rate_limit_exceeded": "retryable",
    "server_error": "retryable",
    "server_is_overloaded": "retryable",
    "invalid_api_key": "auth",
    "invalid_authentication": "auth",
    "model_not_found": "not_found",
}
_TRANSPORTS: Final = frozenset({"httpx", "httpx2", "httpcore", "httpcore2", "h11", "anyio"})
_WINDOW_FIELDS: Final = (
    "context_window",
    "max_model_len",
    "context_length",
    "max_context_length",
    "max_input_tokens",
)
"""Fields some compatible servers add to ``GET /models/{id}`` (vLLM, LM Studio, OpenRouter)."""
_MESSAGE_TOKENS: Final = 4
"""What each message costs besides its content (role and separators), as OpenAI counts it."""
_REPLY_PRIMING: Final = 3


class Encoding(Protocol):
    """What ``count_tokens`` needs of a tokenizer: ``tiktoken.Encoding`` has it."""

    def encode(self, text: str, *, disallowed_special: Any = ...) -> list[int]:
        """The tokens of ``text``."""
        ...


# --------------------------------------------------------------------------- errors


def call_error(exc: BaseException, *, model: str, secrets: Sequence[str] = ()) -> LlmCallError:
    """Classify any failure of a call as an ``LlmCallError`` (see ``LlmCallError``'s fields)."""
    if isinstance(exc, LlmCallError):
        return exc
    if isinstance(exc, UnsupportedContentError):
        return LlmCallError(f"nothing was sent: {exc}", fatal=True)
    if isinstance(exc, openai.APIStatusError):
        return _status_error(exc, model=model, secrets=secrets)
    if isinstance(exc, openai.APIConnectionError):
        detail = redact(exc.message or type(exc).__name__, secrets)
        return LlmCallError(f"cannot reach the OpenAI API: {detail}", retryable=True)
    if isinstance(exc, openai.APIError):  # an error chunk in a stream that had started
        code, detail = _error_fields(exc.body, exc.message)
        return failure(code, redact(detail, secrets), where="stream error")
    if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in _TRANSPORTS:
        # The stream's lines come from the client's HTTP library (httpx, httpx2 in newer
        # clients): a connection dropped mid-stream is its error, not the client's.
        detail = redact(str(exc) or type(exc).__name__, secrets)
        return LlmCallError(f"cannot reach the OpenAI API: {detail}", retryable=True)
    detail = redact(str(exc) or type(exc).__name__, secrets)
    return LlmCallError(f"unexpected {type(exc).__name__} from the OpenAI client: {detail}")


def _error_fields(body: object, fallback: str) -> tuple[str | None, str]:
    if isinstance(body, dict):
        code = body.get("code")
        message = body.get("message")
        return (str(code) if code is not None else None), (
            message if isinstance(message, str) and message else fallback
        )
    return None, fallback


def _status_error(
    exc: openai.APIStatusError, *, model: str, secrets: Sequence[str]
) -> LlmCallError:
    status = exc.status_code
    code, message = _error_fields(exc.body, exc.message)
    detail = redact(message, secrets)
    return http_error(
        status,
        detail,
        provider="OpenAI",
        key_variable=KEY_VARIABLE,
        model=model,
        overflow=status == 400
        and (code == "context_length_exceeded" or bool(_OVERFLOW.search(detail))),
        kind=code or "",
        means=_MEANINGS.get(code or ""),
        wait=retry_after(exc.response.headers),
    )


async def _events(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """The JSON of each server-sent event (``data:`` lines joined; ``[DONE]`` ends it)."""
    data: list[str] = []
    async for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif not line and data:
            joined = "\n".join(data)
            data.clear()
            if joined.startswith("[DONE]"):
                return
            try:
                event = json.loads(joined)
            except ValueError:
                continue  # a comment or keep-alive a proxy added: not an event
            if isinstance(event, dict):
                yield event
    if data and not data[0].startswith("[DONE]"):
        with contextlib.suppress(ValueError):
            event = json.loads("\n".join(data))
            if isinstance(event, dict):
                yield event


def _not_a_stream(response: Any) -> LlmCallError:
    content_type = response.headers.get("content-type", "no content type")
    return LlmCallError(
        f"the server answered HTTP {response.status_code} with {content_type}, not an event "
        "stream: is the base URL an OpenAI-compatible API (ending in /v1)?",
        status_code=response.status_code,
    )


# --------------------------------------------------------------------------- the adapter


class OpenAIModel:
    """``LlmModel`` for OpenAI's Chat Completions (``api="chat"``) or Responses API.

    ``client``: a configured ``AsyncOpenAI`` (or ``AsyncAzureOpenAI``); the adapter uses a copy
    with the client's retries off (segue retries, honouring ``Retry-After``, and counts what it
    tried). ``max_tokens``: the output bound of a normal turn (None: the conversation's);
    ``summary_max_tokens``: the bound of the tool-less requests. ``reasoning``: whether the
    model is a reasoning model (``max_completion_tokens``, no temperature); None tells by its
    name (o-series, gpt-5). ``exact_preflight``: ``count_tokens`` counts with ``encoding`` (a
    ``tiktoken.Encoding``), or the model's ``tiktoken`` encoding; otherwise None (estimate).
    """

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        *,
        api: Literal["chat", "responses"] = "chat",
        max_tokens: int | None = None,
        summary_max_tokens: int = 4096,
        reasoning: bool | None = None,
        exact_preflight: bool = False,
        encoding: Encoding | None = None,
    ) -> None:
        if api not in ("chat", "responses"):
            raise ValueError(f'api must be "chat" or "responses", not {api!r}')
        if max_tokens is not None and max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if summary_max_tokens < 1:
            raise ValueError("summary_max_tokens must be at least 1")
        self._client = client.with_options(max_retries=0)
        self._api: Api = api
        self._max_tokens = max_tokens
        self._summary_max_tokens = summary_max_tokens
        self._reasoning = reasoning
        self._exact_preflight = exact_preflight
        self._encoding = encoding
        self._encodings: dict[str, Encoding | None] = {}
        self._windows: dict[str, int | None] = {}

    @property
    def api(self) -> Api:
        """Which API the adapter calls."""
        return self._api

    @property
    def exact_preflight(self) -> bool:
        """Whether ``count_tokens`` counts (see the class docstring)."""
        return self._exact_preflight

    def payload(self, request: LlmRequest) -> Payload:
        """What ``complete`` would send for ``request`` (``UnsupportedContentError`` for
        content the API cannot take)."""
        if request.purpose == "turn":
            bound = self._max_tokens if self._max_tokens is not None else request.max_tokens
        else:
            bound = min(request.max_tokens, self._summary_max_tokens)
        return build_payload(request, api=self._api, max_tokens=bound, reasoning=self._reasoning)

    def check_content(self, blocks: Sequence[Any]) -> None:
        """Raise ``UnsupportedContentError`` (a ``SegueError`` and ``ValueError``) if the API
        cannot take one of a message's ``blocks``: ``Runtime.send`` and ``stream`` call it, so
        such a message is refused (``InvalidMessageError``) before it is stored."""
        check_content(blocks, api=self._api)

    @property
    def _secrets(self) -> tuple[str, ...]:
        return secrets_of(self._client.api_key)

    async def _stream(
        self, request: LlmRequest, payload: Payload, on_text: TextSink | None
    ) -> LlmReply:
        """One streamed call read into a reply, its text passed to ``on_text`` as it comes.

        The client makes the request (auth, headers, status errors as its exceptions); the
        event stream's lines are read here (``openai_stream``). A 200 that is not an event
        stream at all is named for what it is."""
        arguments = payload.arguments()
        reader: ChatReader | ResponsesReader
        if self._api == "chat":
            call: Any = self._client.chat.completions.with_streaming_response.create(
                model=request.model,
                stream=True,
                stream_options={"include_usage": True},
                **arguments,
            )
            reader = ChatReader(on_text=on_text)
        else:
            call = self._client.responses.with_streaming_response.create(
                model=request.model, stream=True, **arguments
            )
            reader = ResponsesReader(on_text=on_text)
        async with call as response:
            if "event-stream" not in response.headers.get("content-type", ""):
                raise _not_a_stream(response.http_response)
            async for data in _events(response.iter_lines()):
                reader.feed(data)
        return reader.reply()

    async def complete(self, request: LlmRequest) -> LlmReply:
        """One streamed call, its text streamed to ``request.on_text``; every failure is raised as
        ``LlmCallError`` (with the API key scrubbed from the whole exception chain)."""
        secrets = self._secrets
        return await guarded(
            request,
            lambda: self._send(request, request.on_text),
            to_error=lambda exc: call_error(exc, model=request.model, secrets=secrets),
            secrets=secrets,
            log=log,
        )

    async def _send(self, request: LlmRequest, on_text: TextSink | None) -> LlmReply:
        payload = self.payload(request)
        log.debug(
            "llm.request",
            conversation_id=request.conversation_id,
            purpose=request.purpose,
            model=request.model,
            api=self._api,
            items=len(payload.items),
            tools=len(payload.tools),
            max_tokens=payload.max_tokens,
            trim_level=request.trim_level,
        )
        return await self._stream(request, payload, on_text)

    async def context_window(self, model: str) -> int | None:
        """The window a compatible server reports for ``model`` in ``GET /models/{id}``
        (vLLM's ``max_model_len``, ``context_length``...), cached per model; None when it says
        none (OpenAI itself does not) or cannot be asked: segue's table is used then."""
        if model in self._windows:
            return self._windows[model]
        try:
            info = await self._client.models.retrieve(model)
        except Exception as exc:  # noqa: BLE001  # None means "use the static table"
            error = call_error(exc, model=model, secrets=self._secrets)
            log.debug("llm.context_window_unavailable", model=model, error=error.message)
            self._windows[model] = None
            return None
        extra = info.model_extra or {}
        window = next(
            (
                value
                for name in _WINDOW_FIELDS
                if isinstance(value := extra.get(name), int)
                and not isinstance(value, bool)
                and value > 0
            ),
            None,
        )
        self._windows[model] = window
        return window

    async def count_tokens(self, request: LlmRequest) -> int | None:
        """The prompt's tokens as the model's tokenizer counts them, or None (not enabled, no
        encoding, content the API cannot take)."""
        if not self._exact_preflight:
            return None
        encoding = await self._encoding_for(request.model)
        if encoding is None:
            return None
        try:
            payload = self.payload(request)
        except UnsupportedContentError:
            return None
        return _count(payload, encoding)

    async def _encoding_for(self, model: str) -> Encoding | None:
        if self._encoding is not None:
            return self._encoding
        if model not in self._encodings:
            self._encodings[model] = await asyncio.to_thread(_load_encoding, model)
        return self._encodings[model]


def _load_encoding(model: str) -> Encoding | None:
    """The model's ``tiktoken`` encoding (``o200k_base`` for a model tiktoken does not know),
    None when tiktoken is not installed or its encoding cannot be loaded (offline, uncached)."""
    try:
        import tiktoken  # noqa: PLC0415  # optional: segue[openai]
    except ImportError:
        return None
    try:
        try:
            encoding: Encoding = tiktoken.encoding_for_model(model)
        except KeyError:
            encoding = tiktoken.get_encoding("o200k_base")
    except Exception as exc:  # noqa: BLE001  # no encoding: the estimate is used
        log.debug("llm.tokenizer_unavailable", model=model, error=type(exc).__name__)
        return None
    return encoding


def _tokens(encoding: Encoding, text: str) -> int:
    return len(encoding.encode(text, disallowed_special=()))


def _count(payload: Payload, encoding: Encoding) -> int:
    """The payload's prompt tokens: each message's text, images by segue's image formula, the
    tools' definitions, and what each message and the reply's start cost."""
    total = _REPLY_PRIMING
    instructions = payload.options.get("instructions")
    if isinstance(instructions, str):
        total += _MESSAGE_TOKENS + _tokens(encoding, instructions)
    for item in payload.items:
        total += _MESSAGE_TOKENS
        total += _content_tokens(encoding, item.get("content"))
        for key in ("tool_calls", "arguments", "output", "name"):
            value = item.get(key)
            if isinstance(value, str):
                total += _tokens(encoding, value)
            elif value is not None:
                total += (
                    _content_tokens(encoding, value)
                    if key == "output"
                    else _tokens(encoding, json.dumps(value))
                )
    if payload.tools:
        total += _tokens(encoding, json.dumps(payload.tools))
    return total


def _content_tokens(encoding: Encoding, content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return _tokens(encoding, content)
    total = 0
    for part in content:
        kind = part.get("type")
        if kind in ("text", "input_text"):
            total += _tokens(encoding, part["text"])
        elif kind in ("image_url", "input_image"):
            total += image_tokens(_DataSource.of(part.get("image_url")))
        elif kind == "input_file":
            source = _DataSource.of(part.get("file_data") or part.get("file_url"))
            total += document_tokens(source, lambda text: _tokens(encoding, text))
        else:
            total += _tokens(encoding, str(part))
    return total


class _DataSource:
    """A part's data URL (or URL) as the source ``image_tokens`` / ``document_tokens`` read."""

    def __init__(self, url: str) -> None:
        if url.startswith("data:") and ";base64," in url:
            self.type = "base64"
            header, self.data = url.split(",", 1)
            self.media_type = header.removeprefix("data:").split(";", 1)[0]
        else:
            self.type = "url"
            self.url = url

    @classmethod
    def of(cls, url: Any) -> _DataSource:
        if isinstance(url, dict):
            url = url.get("url")
        return cls(str(url or ""))


__all__ = ["KEY_VARIABLE", "OpenAIModel", "UnsupportedContentError", "call_error"]
