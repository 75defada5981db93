"""The OpenAI adapter: segue's ``LlmModel`` over the real ``openai.AsyncOpenAI`` client, for
OpenAI, Azure OpenAI and any OpenAI-compatible server (vLLM, Ollama, a LiteLLM proxy...).

``OpenAIModel(client, api="chat")`` streams Chat Completions; ``api="responses"`` the
Responses API. Three jobs, each in its own place (what every streamed call does whatever the
provider, the guard, the debug lines, the check that a 200 is an event stream, is
``calls.EventStreamModel``'s):

* **Payload** (``openai_payload``): the transcript as messages or input items, tools as
  function tools, images as data URLs, the model's settings as the model takes them.
* **Reply** (``openai_stream``): chunks or events read into an ``LlmReply``, text passed on as
  it arrives, usage mapped so the cached part of the prompt is counted once, a stream that did
  not end properly an error, never a reply.
* **Errors** (here): every failure an ``LlmCallError``: ``context_length_exceeded``, or an
  overflow as vLLM, llama.cpp, Ollama, LM Studio or LiteLLM word it
  (``call_errors.OVERFLOW_WORDINGS``), takes the exhaustion path; 429 and 5xx are retried by segue,
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
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final, Literal, Protocol

import openai

from segue.executor._log import get_logger
from segue.executor.errors import LlmCallError
from segue.executor.model_port import ContextSupport, LlmReply, LlmRequest, TextSink
from segue.executor.models.call_errors import (
    Meaning,
    http_error,
    redact,
    refusal,
    refuses_compaction,
    retry_after,
    says_overflow,
    secrets_of,
)
from segue.executor.models.calls import EventStreamModel, Opened, guarded
from segue.executor.models.openai_context import compacted_reply, openai_context_support
from segue.executor.models.openai_payload import (
    Api,
    Payload,
    UnsupportedContentError,
    build_payload,
    check_content,
)
from segue.executor.models.openai_stream import ChatReader, ResponsesReader, failure
from segue.executor.models.openai_windows import served_window
from segue.statemachine.content import ContentBlock, document_tokens, image_tokens

log = get_logger(__name__)

KEY_VARIABLE: Final = "OPENAI_API_KEY"
_MEANINGS: Final[dict[str, Meaning]] = {
    "rate_limit_exceeded": "retryable",
    "server_error": "retryable",
    "server_is_overloaded": "retryable",
    "invalid_api_key": "auth",
    "invalid_authentication": "auth",
    "model_not_found": "not_found",
}
_TRANSPORTS: Final = frozenset({"httpx", "httpx2", "httpcore", "httpcore2", "h11", "anyio"})
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
    kind = exc.body.get("type") if isinstance(exc.body, dict) else None
    return http_error(
        status,
        detail,
        provider="OpenAI",
        key_variable=KEY_VARIABLE,
        model=model,
        overflow=says_overflow(status, code, detail, kind if isinstance(kind, str) else None),
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


# --------------------------------------------------------------------------- the adapter


class OpenAIModel(EventStreamModel[Payload, dict[str, Any]]):
    """``LlmModel`` for OpenAI's Chat Completions (``api="chat"``) or Responses API.

    ``client``: a configured ``AsyncOpenAI`` (or ``AsyncAzureOpenAI``); the adapter uses a copy
    with the client's retries off (segue retries, honouring ``Retry-After``, and counts what it
    tried). ``max_tokens``: the output bound of a normal turn (None: the conversation's);
    ``summary_max_tokens``: the bound of the tool-less requests. ``reasoning``: whether the
    model is a reasoning model (``max_completion_tokens``, no temperature); None tells by its
    name (o-series, gpt-5). ``exact_preflight``: ``count_tokens`` counts with ``encoding`` (a
    ``tiktoken.Encoding``), or the model's ``tiktoken`` encoding; otherwise None (estimate).
    A ``ContentChecker``: a message the API cannot take is refused before it is stored.
    ``provider_name``: what traces and metrics call the provider (``gen_ai.provider.name``),
    the name to give for an OpenAI-compatible server (``"vllm"``, ``"ollama"``...); None names
    it by the client as OpenTelemetry's GenAI conventions spell it: ``azure.ai.openai`` for
    ``AsyncAzureOpenAI``, else ``openai``.
    """

    _log = log
    _not_its_api = "is the base URL an OpenAI-compatible API (ending in /v1)?"
    _provider = "openai"
    reuses_prefix: bool = True
    """It sends the limit's requests as the turn's request repeated when asked
    (``summary_request="reuse_prefix"``, REQ-SEG-055; ``PrefixReusing``)."""

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
        provider_name: str | None = None,
    ) -> None:
        if api not in ("chat", "responses"):
            raise ValueError(f'api must be "chat" or "responses", not {api!r}')
        if provider_name is not None and not provider_name.strip():
            raise ValueError("provider_name must name the provider (or be None: by the client)")
        super().__init__(
            max_tokens=max_tokens,
            summary_max_tokens=summary_max_tokens,
            exact_preflight=exact_preflight,
        )
        self._client = client.with_options(max_retries=0)
        self._api: Api = api
        self._reasoning = reasoning
        self._encoding = encoding
        self._encodings: dict[str, Encoding | None] = {}
        azure = isinstance(client, openai.AsyncAzureOpenAI)
        self._provider_name = provider_name or ("azure.ai.openai" if azure else "openai")

    @property
    def provider_name(self) -> str:
        """The provider as OpenTelemetry's GenAI conventions name it (``NamedProvider``)."""
        return self._provider_name

    @property
    def api(self) -> Api:
        """Which API the adapter calls."""
        return self._api

    def payload(self, request: LlmRequest) -> Payload:
        """What ``complete`` would send for ``request`` (``UnsupportedContentError`` for
        content the API cannot take)."""
        return build_payload(
            request, api=self._api, max_tokens=self.output_bound(request), reasoning=self._reasoning
        )

    def check_content(self, blocks: Sequence[ContentBlock]) -> None:
        """Raise ``UnsupportedContentError`` (a ``SegueError`` and ``ValueError``) if the API
        cannot take one of a message's ``blocks``: ``Runtime.send`` and ``stream`` call it, so
        such a message is refused (``InvalidMessageError``) before it is stored."""
        check_content(blocks, api=self._api)

    def _secrets(self) -> tuple[str, ...]:
        return secrets_of(self._client.api_key)

    def _error(self, exc: Exception, *, model: str, secrets: Sequence[str]) -> LlmCallError:
        return call_error(exc, model=model, secrets=secrets)

    def _described(self, payload: Payload) -> dict[str, object]:
        return {"api": self._api, "items": len(payload.items)}

    @contextlib.asynccontextmanager
    async def _open(
        self, request: LlmRequest, payload: Payload
    ) -> AsyncIterator[Opened[dict[str, Any]]]:
        """The client makes the request (auth, headers, status errors as its exceptions); the
        event stream's lines are read as JSON here (``openai_stream`` says why)."""
        arguments = payload.arguments()
        call: Any
        if self._api == "chat":
            call = self._client.chat.completions.with_streaming_response.create(
                model=request.model,
                stream=True,
                stream_options={"include_usage": True},
                **arguments,
            )
        else:
            call = self._client.responses.with_streaming_response.create(
                model=request.model, stream=True, **arguments
            )
        async with call as response:
            yield Opened(response.http_response, _events(response.iter_lines()))

    def _reader(self, on_text: TextSink | None) -> ChatReader | ResponsesReader:
        if self._api == "chat":
            return ChatReader(on_text=on_text)
        return ResponsesReader(on_text=on_text)

    async def complete(self, request: LlmRequest) -> LlmReply:
        """One streamed call (``EventStreamModel.complete``); a provider that refuses the
        compaction asked raises ``LlmCallError`` with ``compaction_refused`` (REQ-SEG-049)."""
        try:
            return await super().complete(request)
        except LlmCallError as error:
            if request.compaction is not None and refuses_compaction(error):
                raise refusal(error) from error
            raise

    def context_support(self, model: str) -> ContextSupport:
        """The Responses API compacts OpenAI's models (``openai_context``); nothing else."""
        return openai_context_support(self._api, model)

    async def compact_now(self, request: LlmRequest) -> LlmReply | None:
        """``responses.compact`` on the conversation's history: the reply's compaction holds
        the item, the window before it and what the pass cost (None on Chat Completions)."""
        if self._api != "responses" or request.compaction is None:
            return None
        secrets = self._secrets()

        async def compact() -> LlmReply:
            items: Any = self.payload(request).items
            compacted = await self._client.responses.compact(
                model=request.model, input=items, instructions=request.system or None
            )
            return compacted_reply(compacted)

        try:
            return await guarded(
                request,
                compact,
                to_error=lambda exc: self._error(exc, model=request.model, secrets=secrets),
                secrets=secrets,
                log=self._log,
            )
        except LlmCallError as error:
            if refuses_compaction(error):
                raise refusal(error) from error
            raise

    async def _ask_window(self, model: str) -> int | None:
        """The window the server serves ``model`` with (``openai_windows``: vLLM, llama.cpp,
        Ollama and the fields other compatible servers add); OpenAI itself reports none."""
        return await served_window(self._client, model)

    async def count_tokens(self, request: LlmRequest) -> int | None:
        """The prompt's tokens as the model's tokenizer counts them, or None (not enabled, no
        encoding, content the API cannot take)."""
        if not self.exact_preflight:
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
