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

What every streamed call does whatever the provider (the guard, the debug lines, the check that
a 200 is an event stream, feeding the reader) is ``calls.EventStreamModel``'s. Calls always
stream: the SDK refuses a non-streaming call whose ``max_tokens`` could outlast its timeout, and
long outputs are exactly what the large models allow. The API key never appears in a log entry
or an error message.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Final

import anthropic
import httpx2

from segue.executor._log import get_logger
from segue.executor.errors import LlmCallError
from segue.executor.model_port import ContextSupport, LlmReply, LlmRequest, TextSink
from segue.executor.models.anthropic_context import (
    anthropic_context_support,
    unexpected_compaction_stop,
)
from segue.executor.models.anthropic_payload import (
    MIN_COMPACTION_TRIGGER,
    Payload,
    build_payload,
)
from segue.executor.models.anthropic_stream import StreamReader
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
from segue.executor.models.calls import EventStreamModel, Opened
from segue.executor.models.windows import anthropic_model_name

if TYPE_CHECKING:  # the Vertex AI client: its module imports google-auth only when it is used
    from anthropic import AsyncAnthropicVertex

log = get_logger(__name__)

_CREDENTIALS: Final = (
    "api_key",
    "auth_token",
    "aws_secret_key",
    "aws_session_token",
    "access_token",
)
"""The attributes a client keeps a credential in: first-party, Bedrock and Vertex AI."""
_COUNTED_OPTIONS: Final = frozenset({"thinking", "tool_choice", "betas", "context_management"})
"""Request options ``count_tokens`` takes (it refuses ``temperature``; the beta endpoint takes
the context edits and the compaction, which it counts the prompt as sent without)."""

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


def _status_error(
    exc: anthropic.APIStatusError, *, model: str, secrets: Sequence[str]
) -> LlmCallError:
    status = exc.status_code if exc.status_code >= 400 else None
    kind = exc.type or ""
    detail = redact(exc.api_message or exc.message, secrets)
    return http_error(
        status,
        detail,
        provider="Anthropic",
        key_variable="ANTHROPIC_API_KEY",
        model=model,
        overflow=says_overflow(status, detail, kind),
        kind=kind,
        means=_MEANINGS.get(kind),
        wait=retry_after(exc.response.headers) if status is not None else None,
    )


# --------------------------------------------------------------------------- the adapter


def _provider_of(client: object) -> str:
    """The provider a client talks to, as the GenAI conventions' ``gen_ai.provider.name`` spells
    it. Vertex AI's client is looked up by name: importing its module imports google-auth."""
    if isinstance(client, anthropic.AsyncAnthropicBedrock):
        return "aws.bedrock"
    if type(client).__name__ == "AsyncAnthropicVertex":
        return "gcp.vertex_ai"
    return "anthropic"


class AnthropicModel(EventStreamModel[Payload, Any]):
    """``LlmModel`` for Anthropic's Messages API.

    ``client``: a configured ``AsyncAnthropic``, or ``AsyncAnthropicBedrock`` /
    ``AsyncAnthropicVertex`` (Claude on Amazon Bedrock or Google Vertex AI: their model ids map
    onto segue's table of windows, ``windows.anthropic_model_name``); the adapter uses a copy
    with the SDK's retries off (segue's core retries, honouring ``retry-after``, and counts
    what it tried).
    ``max_tokens``: the output bound of a normal turn; None uses the request's (the
    conversation's ``max_output_tokens``). ``summary_max_tokens``: the bound for the tool-less
    requests. ``exact_preflight``: let ``count_tokens`` ask the API (one extra request per
    pre-flight) instead of answering None. ``prompt_caching``: mark cache breakpoints on the
    tools, the system prompt and the latest turn (on by default). ``provider_name``: what
    traces and metrics call the provider (``gen_ai.provider.name``); None names it by the
    client, as OpenTelemetry's GenAI conventions spell it: ``aws.bedrock``, ``gcp.vertex_ai``,
    else ``anthropic``.
    """

    _log = log
    _not_its_api = "is the base URL an Anthropic Messages API?"
    _provider = "anthropic"
    _stream_types = ("event-stream", "vnd.amazon.eventstream")  # Bedrock's binary frames
    reuses_prefix: bool = True
    """It sends the limit's requests as the turn's request repeated when asked
    (``summary_request="reuse_prefix"``, REQ-SEG-055; ``PrefixReusing``)."""

    def __init__(
        self,
        client: anthropic.AsyncAnthropic | anthropic.AsyncAnthropicBedrock | AsyncAnthropicVertex,
        *,
        max_tokens: int | None = None,
        summary_max_tokens: int = 4096,
        exact_preflight: bool = False,
        prompt_caching: bool = True,
        provider_name: str | None = None,
    ) -> None:
        if provider_name is not None and not provider_name.strip():
            raise ValueError("provider_name must name the provider (or be None: by the client)")
        super().__init__(
            max_tokens=max_tokens,
            summary_max_tokens=summary_max_tokens,
            exact_preflight=exact_preflight,
        )
        # segue retries (the core schedules each attempt and reports how many it made), so the
        # SDK's own retries are off: on top of segue's they multiplied the HTTP attempts.
        self._client = client.with_options(max_retries=0)
        self._caching = prompt_caching
        self._provider_name = provider_name or _provider_of(client)

    @property
    def provider_name(self) -> str:
        """The provider as OpenTelemetry's GenAI conventions name it (``NamedProvider``)."""
        return self._provider_name

    def payload(self, request: LlmRequest) -> Payload:
        """What ``complete`` would send for ``request`` (public so callers can inspect it)."""
        return build_payload(request, max_tokens=self.output_bound(request), caching=self._caching)

    def _secrets(self) -> tuple[str, ...]:
        # A credential too short to be real (a test's "k") would blank out letters of messages.
        # Bedrock signs with an AWS secret key and Vertex AI sends an access token: both are
        # credentials too, and neither client has the first-party ``auth_token``.
        client = self._client
        return secrets_of(
            *(getattr(client, name, None) for name in _CREDENTIALS),
        )

    def _error(self, exc: Exception, *, model: str, secrets: Sequence[str]) -> LlmCallError:
        return call_error(exc, model=model, secrets=secrets)

    def _described(self, payload: Payload) -> dict[str, object]:
        return {"messages": len(payload.messages)}

    @contextlib.asynccontextmanager
    async def _open(self, request: LlmRequest, payload: Payload) -> AsyncIterator[Opened[Any]]:
        """The raw event stream (``anthropic_stream`` says why not the SDK's accumulator); the
        beta endpoint when the payload needs a beta (the provider's compaction, context
        editing)."""
        messages: Any = self._client.beta.messages if "betas" in payload.options else None
        stream = await (messages or self._client.messages).create(
            model=request.model,
            max_tokens=payload.max_tokens,
            stream=True,
            **payload.arguments(),
            **payload.options,
        )
        async with stream:
            yield Opened(stream.response, aiter(stream))

    async def complete(self, request: LlmRequest) -> LlmReply:
        """One streamed call (``EventStreamModel.complete``). A provider that refuses to
        compact (its model or account cannot), or answers a compaction in a way segue did not
        ask for, raises ``LlmCallError`` with ``compaction_refused`` (REQ-SEG-049)."""
        try:
            reply = await super().complete(request)
        except LlmCallError as error:
            if request.compaction is not None and refuses_compaction(error):
                raise refusal(error) from error
            raise
        unexpected = unexpected_compaction_stop(request, reply)
        if unexpected is not None:
            raise LlmCallError(unexpected, compaction_refused=True)
        return reply

    def context_support(self, model: str) -> ContextSupport:
        """What Anthropic's API does to the context of ``model`` on its own side: the
        compaction of the models that have it, context editing from Claude 4 on."""
        return anthropic_context_support(anthropic_model_name(model))

    async def compact_now(self, request: LlmRequest) -> LlmReply | None:
        """A request whose trigger is the context's current size, paused after the compaction;
        None when that size is below the API's minimum trigger (segue compacts), or when the
        provider answered without compacting (the estimate was above the real size)."""
        asked = request.compaction
        if asked is None or asked.trigger_tokens < MIN_COMPACTION_TRIGGER:
            return None
        reply = await self.complete(request)
        if not reply.compactions:
            log.info("llm.compaction_not_made", model=request.model)
            return None
        return reply

    def _reader(self, on_text: TextSink | None) -> StreamReader:
        return StreamReader(on_text=on_text)

    def _table_name(self, model: str) -> str:
        return anthropic_model_name(model)

    async def _ask_window(self, model: str) -> int | None:
        """``max_input_tokens`` from ``models.retrieve``; Bedrock's and Vertex AI's clients have
        no models endpoint (their ids map onto segue's table instead)."""
        models = getattr(self._client, "models", None)
        if models is None:
            return None
        window = (await models.retrieve(model)).max_input_tokens
        return window if isinstance(window, int) and window > 0 else None

    async def count_tokens(self, request: LlmRequest) -> int | None:
        """The API's exact count of the prompt ``complete`` would send; None if not enabled."""
        if not self.exact_preflight:
            return None
        try:
            payload = self.payload(request)
            counting = {k: v for k, v in payload.options.items() if k in _COUNTED_OPTIONS}
            messages: Any = self._client.beta.messages if "betas" in counting else None
            counted = await (messages or self._client.messages).count_tokens(
                model=request.model, **payload.arguments(), **counting
            )
        except Exception as exc:  # noqa: BLE001  # None means "use the estimate"
            self._unanswered("llm.count_tokens_failed", request.model, exc)
            return None
        log.debug("llm.count_tokens", model=request.model, input_tokens=counted.input_tokens)
        return counted.input_tokens
