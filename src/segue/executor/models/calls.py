"""One call of an adapter, the way the port asks for it, whatever the provider.

* ``guarded``: the call and its reply logged at debug level (what was asked, what it cost, how
  long it took; never text), and whatever it raises coming out as an ``LlmCallError`` (the port
  promises nothing else), with the API key scrubbed from the error and from every exception
  chained below it. Any adapter does this in one line.
* ``EventStreamModel``: the rest of a streamed HTTP call, written once for both real adapters
  (``AnthropicModel``, ``OpenAIModel``) so that each holds only what its provider differs in:
  the payload, opening the stream, reading its events, naming its errors, asking for a window.
  What is the same is here: the output bound of each purpose, the debug line of what is sent,
  a 200 that is not an event stream named for what it is, each event fed to the reader as it
  comes, the windows asked once per model and cached, with where each came from (a server's
  report, segue's table, or the provider's smallest window assumed: ``windows``).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, Generic, NamedTuple, Protocol, TypeVar

from segue.executor._log import get_logger
from segue.executor.errors import LlmCallError
from segue.executor.model_port import BaseLlmModel, LlmReply, LlmRequest, TextSink
from segue.executor.models.call_errors import scrub_secrets
from segue.executor.models.windows import Window, table_window
from segue.statemachine.models import Provider

_log = get_logger(__name__)


async def guarded(
    request: LlmRequest,
    call: Callable[[], Awaitable[LlmReply]],
    *,
    to_error: Callable[[Exception], LlmCallError],
    secrets: Sequence[str],
    log: Any = _log,
) -> LlmReply:
    """``await call()``, logged (to ``log``, a segue logger: the adapter's own, or this
    module's); any failure raised as ``to_error(exc)`` from ``exc``, or as itself when it is
    already an ``LlmCallError`` (a cut stream), ``secrets`` scrubbed from the whole chain."""
    started = time.monotonic()
    try:
        reply = await call()
    except Exception as exc:  # the port promises LlmCallError and nothing else
        error = exc if isinstance(exc, LlmCallError) else to_error(exc)
        scrub_secrets(exc, secrets)  # the chain below the error must not hold the key
        log.debug(
            "llm.error",
            conversation_id=request.conversation_id,
            purpose=request.purpose,
            model=request.model,
            status_code=error.status_code,
            retryable=error.retryable,
            context_overflow=error.context_overflow,
            fatal=error.fatal,
            error=error.message,
            duration_s=round(time.monotonic() - started, 3),
        )
        if error is exc:  # already ours (a cut stream): never its own cause
            raise
        raise error from exc
    log.debug(
        "llm.reply",
        conversation_id=request.conversation_id,
        purpose=request.purpose,
        model=request.model,
        usage=reply.usage.model_dump() if reply.usage is not None else None,
        stop_reason=reply.stop_reason,
        tool_calls=len(reply.tool_calls),
        duration_s=round(time.monotonic() - started, 3),
    )
    return reply


# --------------------------------------------------------------------------- streamed calls

Event = TypeVar("Event")
Event_contra = TypeVar("Event_contra", contravariant=True)


class Payload(Protocol):
    """What ``EventStreamModel`` reads of an adapter's payload (to log what is sent)."""

    @property
    def max_tokens(self) -> int:
        """The output bound sent."""
        ...

    @property
    def tools(self) -> Sequence[object]:
        """The tools declared."""
        ...


PayloadT = TypeVar("PayloadT", bound=Payload)


class Reader(Protocol[Event_contra]):
    """Accumulates the events of one streamed answer (``anthropic_stream``, ``openai_stream``)."""

    def feed(self, event: Event_contra) -> None:
        """Take one event, passing its text on as it comes."""
        ...

    def reply(self) -> LlmReply:
        """The complete reply; ``LlmCallError`` when the stream carried an error or ended
        before the provider's end marker."""
        ...


class HttpResponse(Protocol):
    """The HTTP response a stream came in (the client's ``httpx`` response)."""

    @property
    def status_code(self) -> int:
        """Its status."""
        ...

    @property
    def headers(self) -> Mapping[str, str]:
        """Its headers."""
        ...


class Opened(NamedTuple, Generic[Event]):
    """A streamed call once the provider answered: its response and the events it carries."""

    response: HttpResponse
    events: AsyncIterator[Event]


class EventStreamModel(BaseLlmModel, ABC, Generic[PayloadT, Event]):
    """An adapter whose provider answers each call with server-sent events (see the module
    docstring); a subclass gives the hooks below and the port's optional members it has.

    ``max_tokens``: the output bound of a normal turn (None: the request's, which is the
    conversation's); ``summary_max_tokens``: the bound of the tool-less requests;
    ``exact_preflight``: whether ``count_tokens`` answers.
    """

    _log: ClassVar[Any]
    """The adapter's logger (events under its own module's name)."""
    _not_its_api: ClassVar[str]
    """The question a 200 that is not an event stream raises, about the base URL."""
    _provider: ClassVar[Provider]
    """Whose models the adapter serves: an unknown model gets this provider's smallest window."""
    _stream_types: ClassVar[tuple[str, ...]] = ("event-stream",)
    """What the content type of a stream holds (any of them)."""

    def __init__(
        self,
        *,
        max_tokens: int | None = None,
        summary_max_tokens: int = 4096,
        exact_preflight: bool = False,
    ) -> None:
        if max_tokens is not None and max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if summary_max_tokens < 1:
            raise ValueError("summary_max_tokens must be at least 1")
        self._max_tokens = max_tokens
        self._summary_max_tokens = summary_max_tokens
        self.exact_preflight = exact_preflight
        self._windows: dict[str, Window] = {}

    # ------------------------------------------------------------------ what a provider gives

    @abstractmethod
    def payload(self, request: LlmRequest) -> PayloadT:
        """What ``complete`` would send for ``request`` (public so callers can inspect it);
        its output bound is ``self.output_bound(request)``."""

    @abstractmethod
    def _open(
        self, request: LlmRequest, payload: PayloadT
    ) -> AbstractAsyncContextManager[Opened[Event]]:
        """Make the streamed call; the stream is closed when the block ends."""

    @abstractmethod
    def _reader(self, on_text: TextSink | None) -> Reader[Event]:
        """A new reader of one answer's events, passing its text to ``on_text``."""

    @abstractmethod
    def _error(self, exc: Exception, *, model: str, secrets: Sequence[str]) -> LlmCallError:
        """Any failure of a call as the ``LlmCallError`` it means, ``secrets`` redacted."""

    @abstractmethod
    def _secrets(self) -> tuple[str, ...]:
        """The client's credentials to keep out of every message and exception chain."""

    @abstractmethod
    async def _ask_window(self, model: str) -> int | None:
        """The window the provider reports for ``model`` (None: it reports none); may raise."""

    def _described(self, payload: PayloadT) -> dict[str, object]:
        """The provider's own fields of the ``llm.request`` debug line."""
        return {}

    def _table_name(self, model: str) -> str:
        """The name segue's table knows ``model`` by (a cloud's spelling mapped back)."""
        return model

    # ------------------------------------------------------------------ written once

    def output_bound(self, request: LlmRequest) -> int:
        """The output bound sent for ``request``: the adapter's for a normal turn (else the
        conversation's); for the tool-less requests the smaller of the conversation's and
        ``summary_max_tokens``."""
        if request.purpose == "turn":
            return self._max_tokens if self._max_tokens is not None else request.max_tokens
        return min(request.max_tokens, self._summary_max_tokens)

    async def complete(self, request: LlmRequest) -> LlmReply:
        """One streamed call, its text streamed to ``request.on_text``; every failure is raised
        as ``LlmCallError``, with the API key scrubbed from the whole exception chain."""
        secrets = self._secrets()
        return await guarded(
            request,
            lambda: self._send(request),
            to_error=lambda exc: self._error(exc, model=request.model, secrets=secrets),
            secrets=secrets,
            log=self._log,
        )

    async def _send(self, request: LlmRequest) -> LlmReply:
        """The call itself. A 200 that is not an event stream (a proxy's error page, another
        API's JSON) is named for what it is before anything is read; a stream that ends before
        the provider's end marker is the reader's to refuse, never a reply."""
        payload = self.payload(request)
        self._log.debug(
            "llm.request",
            conversation_id=request.conversation_id,
            purpose=request.purpose,
            model=request.model,
            tools=len(payload.tools),
            max_tokens=payload.max_tokens,
            trim_level=request.trim_level,
            **self._described(payload),
        )
        reader = self._reader(request.on_text)
        async with self._open(request, payload) as (response, events):
            content_type = response.headers.get("content-type", "")
            if not any(kind in content_type for kind in self._stream_types):
                raise self._not_a_stream(response)
            async for event in events:
                reader.feed(event)
        return reader.reply()

    def _not_a_stream(self, response: HttpResponse) -> LlmCallError:
        content_type = response.headers.get("content-type", "no content type")
        return LlmCallError(
            f"the server answered HTTP {response.status_code} with {content_type}, not an "
            f"event stream: {self._not_its_api}",
            status_code=response.status_code,
        )

    async def context_window(self, model: str) -> int:
        """The model's window in tokens (``window`` says where it came from)."""
        return (await self.window(model)).tokens

    async def window(self, model: str) -> Window:
        """The window the provider's server reports for ``model``, else segue's table, else
        the provider's smallest (logged as ``model_window_unknown``), asked once per model and
        cached. A failure another attempt may not meet (unreachable, overloaded) is not
        cached: the table answers now and the next conversation asks again."""
        if model in self._windows:
            return self._windows[model]
        try:
            served = await self._ask_window(model)
        except Exception as exc:  # noqa: BLE001  # the table answers instead
            if self._unanswered("llm.context_window_unavailable", model, exc).retryable:
                return table_window(self._table_name(model), self._provider)
            served = None
        window = (
            Window(served, "server")
            if served is not None
            else table_window(self._table_name(model), self._provider)
        )
        self._windows[model] = window
        return window

    def knows_model(self, model: str) -> bool:
        """Whether the provider's server reported ``model``'s window (``KnowsModels``): a
        model it serves, which metrics may label by its name."""
        window = self._windows.get(model)
        return window is not None and window.source == "server"

    def _unanswered(self, event: str, model: str, exc: Exception) -> LlmCallError:
        """A side question's failure (a window, a count), logged as ``event`` and returned: its
        answer is None, and the conversation goes on."""
        error = self._error(exc, model=model, secrets=self._secrets())
        self._log.debug(event, model=model, error=error.message)
        return error


__all__ = ["EventStreamModel", "HttpResponse", "Opened", "Payload", "Reader", "guarded"]
