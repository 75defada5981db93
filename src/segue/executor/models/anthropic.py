"""The Anthropic adapter: segue's ``LlmModel`` over the real ``anthropic.AsyncAnthropic`` client.

Three jobs, each in its own place so it can be read and tested alone:

* **Payload** (``anthropic_payload``): segue's transcript as a Messages API request, with
  content blocks, prompt-cache breakpoints and the conversation's model settings.
* **Reply** (``anthropic_stream``): the raw event stream read into an ``LlmReply``, text passed
  on as it arrives, usage copied field by field (a missing field is "not said",
  ``docs/design.md`` section 1), ``stop_reason`` untouched (the core decides what
  ``max_tokens`` or ``model_context_window_exceeded`` mean), and a stream cut off before
  ``message_stop`` an error, never a reply.
* **Errors** (here): every failure becomes an ``LlmCallError`` that says whether retrying,
  trimming or nothing can help, and how long the provider asked to wait. The SDK's own retries
  are off: segue's core retries, so the attempts it reports are the HTTP attempts made.

Calls always stream: the SDK refuses a non-streaming call whose ``max_tokens`` could outlast its
timeout, and long outputs are exactly what the large models allow. The API key never appears in
a log entry or an error message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import anthropic
import httpx2

from segue.executor._log import get_logger
from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmReply, LlmRequest, TextSink
from segue.executor.models.anthropic_payload import Payload, build_payload
from segue.executor.models.anthropic_stream import read_stream
from segue.executor.models.calls import guarded
from segue.executor.models.helpers import (
    Meaning,
    http_error,
    redact,
    retry_after,
    secrets_of,
)

log = get_logger(__name__)

_COUNTED_OPTIONS: Final = frozenset({"thinking", "tool_choice"})
"""Request options ``count_tokens`` takes (it refuses ``temperature``)."""

_OVERFLOW_MARKERS: Final = ("prompt is too long", "exceed context limit", "exceeds context limit")
# A stream that already got HTTP 200 carries its failure as an SSE ``error`` event: the SDK raises
# a plain APIStatusError with status 200, so only the error type says what happened.
_MEANINGS: Final[dict[str, Meaning]] = {
    "rate_limit_error": "retryable",
    "overloaded_error": "retryable",
    "api_error": "retryable",
    "authentication_error": "auth",
    "permission_error": "auth",
    "not_found_error": "not_found",
}


# --------------------------------------------------------------------------- errors


def call_error(exc: BaseException, *, model: str, secrets: Sequence[str] = ()) -> LlmCallError:
    """Classify any failure of a call as an ``LlmCallError`` (see ``LlmCallError``'s fields)."""
    if isinstance(exc, LlmCallError):
        return exc
    if isinstance(exc, anthropic.APIStatusError):
        return _status_error(exc, model=model, secrets=secrets)
    if isinstance(exc, anthropic.APIConnectionError | httpx2.TransportError):
        detail = redact(getattr(exc, "message", None) or str(exc) or type(exc).__name__, secrets)
        return LlmCallError(f"cannot reach the Anthropic API: {detail}", retryable=True)
    detail = redact(str(exc) or type(exc).__name__, secrets)
    return LlmCallError(f"unexpected {type(exc).__name__} from the Anthropic client: {detail}")


def _not_a_stream(response: httpx2.Response) -> LlmCallError:
    content_type = response.headers.get("content-type", "no content type")
    return LlmCallError(
        f"the server answered HTTP {response.status_code} with {content_type}, not a message "
        "stream: is the base URL an Anthropic Messages API?",
        status_code=response.status_code,
    )


def _status_error(
    exc: anthropic.APIStatusError, *, model: str, secrets: Sequence[str]
) -> LlmCallError:
    status = exc.status_code if exc.status_code >= 400 else None
    kind = exc.type or ""
    detail = redact(exc.api_message or exc.message, secrets)
    lowered = detail.lower()
    return http_error(
        status,
        detail,
        provider="Anthropic",
        key_variable="ANTHROPIC_API_KEY",
        model=model,
        overflow=status in (400, None) and any(m in lowered for m in _OVERFLOW_MARKERS),
        kind=kind,
        means=_MEANINGS.get(kind),
        wait=retry_after(exc.response.headers) if status is not None else None,
    )


# --------------------------------------------------------------------------- the adapter


class AnthropicModel:
    """``LlmModel`` for Anthropic's Messages API.

    ``client``: a configured ``AsyncAnthropic``; the adapter uses a copy with the SDK's retries
    off (segue's core retries, honouring ``retry-after``, and counts what it tried).
    ``max_tokens``: the output bound of a normal turn; None uses the request's (the
    conversation's ``max_output_tokens``). ``summary_max_tokens``: the bound for the tool-less
    requests. ``exact_preflight``: let ``count_tokens`` ask the API (one extra request per
    pre-flight) instead of answering None. ``prompt_caching``: mark cache breakpoints on the
    tools, the system prompt and the latest turn (on by default).
    """

    def __init__(
        self,
        client: anthropic.AsyncAnthropic,
        *,
        max_tokens: int | None = None,
        summary_max_tokens: int = 4096,
        exact_preflight: bool = False,
        prompt_caching: bool = True,
    ) -> None:
        if max_tokens is not None and max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if summary_max_tokens < 1:
            raise ValueError("summary_max_tokens must be at least 1")
        # segue retries (the core schedules each attempt and reports how many it made), so the
        # SDK's own retries are off: on top of segue's they multiplied the HTTP attempts.
        self._client = client.with_options(max_retries=0)
        self._max_tokens = max_tokens
        self._summary_max_tokens = summary_max_tokens
        self._exact_preflight = exact_preflight
        self._caching = prompt_caching
        self._windows: dict[str, int | None] = {}

    @property
    def exact_preflight(self) -> bool:
        """Whether ``count_tokens`` asks the API (see the class docstring)."""
        return self._exact_preflight

    def payload(self, request: LlmRequest) -> Payload:
        """What ``complete`` would send for ``request`` (public so callers can inspect it)."""
        if request.purpose == "turn":
            max_tokens = self._max_tokens if self._max_tokens is not None else request.max_tokens
        else:
            max_tokens = min(request.max_tokens, self._summary_max_tokens)
        return build_payload(request, max_tokens=max_tokens, caching=self._caching)

    @property
    def _secrets(self) -> tuple[str, ...]:
        # A credential too short to be real (a test's "k") would blank out letters of messages.
        return secrets_of(self._client.api_key, getattr(self._client, "auth_token", None))

    async def _stream(
        self, request: LlmRequest, payload: Payload, on_text: TextSink | None
    ) -> LlmReply:
        """One streamed call read into a reply, its text passed to ``on_text`` as it comes.

        A stream is complete only with ``message_stop``: one that ends before it (a dropped
        connection, a proxy timeout) holds a partial reply whose tool inputs may be cut off,
        so it is a retryable error, never a reply. A 200 that is not an event stream at all
        is named for what it is.
        """
        stream = await self._client.messages.create(
            model=request.model,
            max_tokens=payload.max_tokens,
            messages=payload.messages,
            system=payload.system if payload.system is not None else anthropic.omit,
            tools=payload.tools or anthropic.omit,
            stream=True,
            **payload.options,
        )
        try:
            reader = await read_stream(stream, on_text)
        finally:
            await stream.close()
        if not reader.started:
            raise _not_a_stream(stream.response)
        return reader.reply()

    async def complete(self, request: LlmRequest) -> LlmReply:
        """One streamed call, its text streamed to ``request.on_text``; every failure is raised as
        ``LlmCallError``."""
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
            messages=len(payload.messages),
            tools=len(payload.tools),
            max_tokens=payload.max_tokens,
            trim_level=request.trim_level,
        )
        return await self._stream(request, payload, on_text)

    async def context_window(self, model: str) -> int | None:
        """``max_input_tokens`` from ``models.retrieve`` (cached per model); None on any error."""
        if model in self._windows:
            return self._windows[model]
        try:
            info = await self._client.models.retrieve(model)
        except Exception as exc:  # noqa: BLE001  # None means "use the static table"
            error = call_error(exc, model=model, secrets=self._secrets)
            log.debug("llm.context_window_unavailable", model=model, error=error.message)
            return None
        window = info.max_input_tokens
        self._windows[model] = window if isinstance(window, int) and window > 0 else None
        return self._windows[model]

    async def count_tokens(self, request: LlmRequest) -> int | None:
        """The API's exact count of the prompt ``complete`` would send; None if not enabled."""
        if not self._exact_preflight:
            return None
        try:
            payload = self.payload(request)
            counting = {k: v for k, v in payload.options.items() if k in _COUNTED_OPTIONS}
            counted = await self._client.messages.count_tokens(
                model=request.model,
                messages=payload.messages,
                system=payload.system if payload.system is not None else anthropic.omit,
                tools=payload.tools or anthropic.omit,
                **counting,
            )
        except Exception as exc:  # noqa: BLE001  # None means "use the estimate"
            error = call_error(exc, model=request.model, secrets=self._secrets)
            log.debug("llm.count_tokens_failed", model=request.model, error=error.message)
            return None
        log.debug("llm.count_tokens", model=request.model, input_tokens=counted.input_tokens)
        return counted.input_tokens
