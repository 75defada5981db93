"""The runtime seen through OpenTelemetry: spans and metrics after the GenAI conventions.

Imported only when the ``otel`` extra (``opentelemetry-api``) is installed. What it emits:

- a ``segue.turn`` span per drive (conversation id, behaviour, phase and occupancy before and
  after), with events for the warning, the path at the limit, a compaction, a restart, a retry
  (with its delay) and a pause;
- an inference span per model call, named ``chat {model}`` and carrying the GenAI attributes
  (``gen_ai.usage.input_tokens`` counts the cached part too, as the conventions ask; Anthropic's
  ``input_tokens`` does not, so it is added back), ``segue.purpose`` saying which request it
  was (a turn, the continuation summary, a checkpoint, a compaction); message content only with
  ``capture_content``;
- an ``execute_tool {name}`` span per tool call;
- the metrics ``gen_ai.client.token.usage``, ``gen_ai.client.operation.duration``,
  ``segue.context.occupancy``, ``segue.limit.reached``, ``segue.limit.duration``,
  ``segue.turn.duration``, ``segue.store.commit.duration``, ``segue.conversations.active``,
  ``segue.retries`` and ``segue.refusals``.

Providers are resolved at each turn (the ones given, else the global ones): while the global
tracer provider is OpenTelemetry's default no-op, no span is even started, and the API's proxy
instruments cost a check each until a real meter provider is set.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from opentelemetry import context, metrics, trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.trace import (
    NoOpTracerProvider,
    ProxyTracerProvider,
    SpanKind,
    Status,
    StatusCode,
)

from segue.effects import (
    Effect,
    NotifyContextExhausted,
    NotifyContextWarning,
    SaveSnapshot,
    ScheduleRetry,
    StartGeneration,
    StartSession,
)
from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmModel, LlmReply, LlmRequest, NamedProvider
from segue.executor.telemetry import Telemetry
from segue.statemachine import (
    AwaitingCheckpoint,
    AwaitingContinuation,
    CheckpointResponse,
    Compacting,
    CompactionResponse,
    ContinuationResponse,
    ConversationState,
    ErrorKind,
    Event,
    Failed,
    LlmResponse,
    Phase,
    ProviderCompacted,
    ToolCall,
    ToolResult,
    Usage,
)

SCOPE: Final = "segue"
"""The instrumentation scope of every span and instrument."""
_ANSWERS: Final = (
    LlmResponse,
    ContinuationResponse,
    CheckpointResponse,
    CompactionResponse,
    ProviderCompacted,
)
"""Events after which the conversation's occupancy is a figure worth recording."""
_SECONDS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TOKENS: Final = tuple(4**n for n in range(1, 11))
_RATIO: Final = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)


@dataclasses.dataclass(slots=True)
class _Turn:
    """One drive while it lasts: what records it (a tracer, metric instruments: either may be
    None while its provider records nothing), its span and its figures."""

    conversation_id: str
    tracer: trace.Tracer | None
    meters: _Instruments | None
    started: float
    span: trace.Span | None = None
    token: object | None = None
    before: ConversationState | None = None
    """The conversation as the drive's first commit found it."""


_TURN: contextvars.ContextVar[_Turn | None] = contextvars.ContextVar("segue_turn", default=None)
"""The drive running in this context (the model calls and tools it starts see it too: a task
copies its context)."""


class _Instruments:
    """The metric instruments, made once per meter provider."""

    def __init__(self, meter: metrics.Meter, active: Callable[[], int]) -> None:
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Tokens per model call, by type (input, output)",
            explicit_bucket_boundaries_advisory=_TOKENS,
        )
        self.operation = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="Duration of a model call",
            explicit_bucket_boundaries_advisory=_SECONDS,
        )
        self.occupancy = meter.create_histogram(
            "segue.context.occupancy",
            unit="1",
            description="Occupancy of the context window after a response, as a ratio",
            explicit_bucket_boundaries_advisory=_RATIO,
        )
        self.limits = meter.create_counter(
            "segue.limit.reached",
            unit="{limit}",
            description="Conversations that reached their limit, by what happened",
        )
        self.limit_duration = meter.create_histogram(
            "segue.limit.duration",
            unit="s",
            description="How long the work at the limit took (a summary, a checkpoint, ...)",
            explicit_bucket_boundaries_advisory=_SECONDS,
        )
        self.turns = meter.create_histogram(
            "segue.turn.duration",
            unit="s",
            description="Duration of a turn, from the message to the conversation waiting again",
            explicit_bucket_boundaries_advisory=_SECONDS,
        )
        self.commits = meter.create_histogram(
            "segue.store.commit.duration",
            unit="s",
            description="Duration of a commit of one step to the store",
            explicit_bucket_boundaries_advisory=_SECONDS,
        )
        # Read when the metrics are collected, not counted at every turn.
        meter.create_observable_up_down_counter(
            "segue.conversations.active",
            callbacks=[lambda _options: [metrics.Observation(active())]],
            unit="{conversation}",
            description="Conversations with a turn running in this process",
        )
        self.retries = meter.create_counter(
            "segue.retries", unit="{retry}", description="Requests retried, by request"
        )
        self.refusals = meter.create_counter(
            "segue.refusals", unit="{message}", description="Messages refused, by cause"
        )


class OtelTelemetry(Telemetry):
    """``Telemetry`` through OpenTelemetry (see the module's docstring)."""

    enabled = True

    def __init__(
        self, *, tracer_provider: Any = None, meter_provider: Any = None, capture_content: bool
    ) -> None:
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._capture = capture_content
        self._tracers: dict[int, trace.Tracer | None] = {}
        self._instruments: dict[int, _Instruments | None] = {}
        self._active = 0
        """Turns running now (``segue.conversations.active`` reads it)."""
        self._limits: dict[str, float] = {}
        """When each conversation's path at the limit began (``perf_counter``)."""

    # ------------------------------------------------------------------ providers

    def _tracer(self) -> trace.Tracer | None:
        """The tracer to use now, None while the provider records nothing."""
        provider = self._tracer_provider or trace.get_tracer_provider()
        key = id(provider)
        if key not in self._tracers:
            quiet = isinstance(provider, ProxyTracerProvider | NoOpTracerProvider)
            self._tracers[key] = None if quiet else provider.get_tracer(SCOPE)
        return self._tracers[key]

    def _meters(self) -> _Instruments | None:
        """The instruments to use now, None while the provider records nothing."""
        provider = self._meter_provider or metrics.get_meter_provider()
        key = id(provider)
        if key not in self._instruments:
            quiet = isinstance(provider, NoOpMeterProvider) or type(provider).__name__ == (
                "_ProxyMeterProvider"  # the API's own, until the application sets one
            )
            self._instruments[key] = (
                None if quiet else _Instruments(provider.get_meter(SCOPE), lambda: self._active)
            )
        return self._instruments[key]

    # ------------------------------------------------------------------ turns

    def turn_begins(self, conversation_id: str, event: Event | None) -> Any:
        tracer, meters = self._tracer(), self._meters()
        if tracer is None and meters is None:
            return None  # nothing records: the turn costs no more than these two checks
        turn = _Turn(conversation_id, tracer, meters, time.perf_counter())
        if tracer is not None:
            turn.span = span = tracer.start_span(
                "segue.turn",
                kind=SpanKind.INTERNAL,
                attributes={
                    "gen_ai.conversation.id": conversation_id,
                    "segue.event": event.kind if event is not None else "recover",
                },
            )
            turn.token = context.attach(trace.set_span_in_context(span))
        self._active += 1
        return turn, _TURN.set(turn)

    def turn_ends(
        self, token: Any, state: ConversationState | None, error: BaseException | None
    ) -> None:
        if token is None:
            return
        turn, reset = token
        _TURN.reset(reset)
        self._active -= 1
        if turn.meters is not None:
            behavior = state.behavior.value if state is not None else "unknown"
            elapsed = time.perf_counter() - turn.started
            turn.meters.turns.record(elapsed, {"segue.behavior": behavior})
        span = turn.span
        if span is None:
            return
        context.detach(turn.token)
        if state is not None:
            span.set_attributes(_ending(turn.before, state))
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end()

    def committed(
        self,
        before: ConversationState,
        after: ConversationState,
        event: Event,
        effects: Sequence[Effect],
        *,
        seconds: float,
        store: str,
    ) -> None:
        turn = _TURN.get()
        if turn is None or turn.conversation_id != before.id:
            return  # not a step of a turn being observed
        if turn.before is None:
            turn.before = before
        meters, span = turn.meters, turn.span
        if meters is not None:
            meters.commits.record(seconds, {"segue.store": store})
            if isinstance(event, _ANSWERS) and after.context_tokens is not None:
                meters.occupancy.record(
                    after.context_tokens / after.context_window,
                    {"segue.behavior": after.behavior.value, "gen_ai.request.model": after.model},
                )
        for effect in effects:
            if meters is not None and isinstance(effect, ScheduleRetry):
                meters.retries.add(1, {"segue.request": effect.request})
            if span is not None:
                _tell(span, effect)
        if before.phase is not after.phase:
            self._limit(before, after, meters, span)

    def _limit(
        self,
        before: ConversationState,
        after: ConversationState,
        meters: _Instruments | None,
        span: trace.Span | None,
    ) -> None:
        """The path at the limit: when it starts, and what came of it when it ends."""
        cid = after.id
        was, now = _at_limit(before.phase), _at_limit(after.phase)
        if now and not was:
            self._limits[cid] = time.perf_counter()
            if span is not None:
                trigger = str(getattr(after.phase, "trigger", ""))
                span.add_event("segue.limit", {"segue.trigger": trigger})
            return
        failed_for_context = (
            isinstance(after.phase, Failed)
            and after.phase.error_kind is ErrorKind.CONTEXT_EXHAUSTED
            and not isinstance(before.phase, Failed)
        )
        if not (was and not now) and not failed_for_context:
            return
        started = self._limits.pop(cid, None)
        if meters is None:
            return
        said = {"segue.behavior": after.behavior.value, "segue.outcome": _outcome(before, after)}
        meters.limits.add(1, said)
        if started is not None:
            meters.limit_duration.record(time.perf_counter() - started, said)

    def refused(self, conversation_id: str, cause: str) -> None:
        turn = _TURN.get()
        if turn is not None and turn.meters is not None:
            turn.meters.refusals.add(1, {"segue.cause": cause})

    # ------------------------------------------------------------------ model calls, tools

    def inference_begins(self, request: LlmRequest, llm: LlmModel) -> Any:
        turn = _TURN.get()
        if turn is None:
            return None
        provider = llm.provider_name if isinstance(llm, NamedProvider) else "unknown"
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": request.model,
            "segue.purpose": request.purpose,
        }
        span = None
        if turn.tracer is not None:
            span = turn.tracer.start_span(
                f"chat {request.model}",
                kind=SpanKind.CLIENT,
                attributes={**attributes, "gen_ai.conversation.id": request.conversation_id},
            )
            if self._capture:
                span.set_attribute("gen_ai.input.messages", _input_messages(request))
        return turn.meters, span, attributes, time.perf_counter()

    def inference_ends(self, token: Any, outcome: LlmReply | LlmCallError) -> None:
        if token is None:
            return
        meters, span, labels, started = token
        elapsed = time.perf_counter() - started
        if isinstance(outcome, LlmCallError):
            error_type = _error_type(outcome)
            if meters is not None:
                meters.operation.record(elapsed, {**labels, "error.type": error_type})
            if span is not None:
                span.set_attribute("error.type", error_type)
                span.set_status(Status(StatusCode.ERROR, error_type))
                span.end()
            return
        if meters is not None:
            if outcome.response_model:
                labels["gen_ai.response.model"] = outcome.response_model
            meters.operation.record(elapsed, labels)
            usage = outcome.usage
            if usage is not None:
                meters.tokens.record(_input_tokens(usage), {**labels, "gen_ai.token.type": "input"})
                output = {**labels, "gen_ai.token.type": "output"}
                meters.tokens.record(usage.output_tokens, output)
        if span is None:
            return
        span.set_attributes(_response(outcome))
        if self._capture:
            span.set_attribute("gen_ai.output.messages", _output_messages(outcome))
        span.end()

    def tool_begins(self, conversation_id: str, call: ToolCall) -> Any:
        turn = _TURN.get()
        if turn is None or turn.tracer is None:
            return None
        return turn.tracer.start_span(
            f"execute_tool {call.name}",
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.id,
                "gen_ai.conversation.id": conversation_id,
            },
        )

    def tool_ends(self, token: Any, result: ToolResult) -> None:
        if token is None:
            return
        if result.is_error:
            token.set_attribute("error.type", "tool_error")
            token.set_status(Status(StatusCode.ERROR, "tool_error"))
        token.end()


_METRIC_LABELS: Final = (
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "segue.purpose",
)


def _at_limit(phase: Phase) -> bool:
    """Whether the conversation is on its path at the limit (not a pause's checkpoint)."""
    if isinstance(phase, AwaitingContinuation | Compacting):
        return True
    return isinstance(phase, AwaitingCheckpoint) and (phase.purpose == "restart" or phase.exhausted)


def _outcome(before: ConversationState, after: ConversationState) -> str:
    """What came of the path at the limit, as ``segue.limit.reached`` counts it."""
    kind = after.phase.kind
    if kind == "context_exhausted":
        return "summarised"
    if kind == "failed":
        return "failed"
    if kind == "paused":
        return "paused"
    if after.session > before.session:
        return "restarted"
    if after.generation > before.generation:
        return "compacted"
    return "cancelled"


def _tell(span: trace.Span, effect: Effect) -> None:
    """The span event a performed step stands for, if it is one an operator looks for."""
    if isinstance(effect, NotifyContextWarning):
        span.add_event(
            "segue.warning",
            {"segue.tokens": effect.context_tokens, "segue.window": effect.context_window},
        )
    elif isinstance(effect, ScheduleRetry):
        span.add_event(
            "segue.retry",
            {
                "segue.request": effect.request,
                "segue.attempt": effect.attempt,
                "segue.delay_seconds": effect.delay_seconds,
            },
        )
    elif isinstance(effect, StartGeneration):
        span.add_event("segue.compaction", {"segue.generation": effect.generation})
    elif isinstance(effect, StartSession):
        span.add_event(
            "segue.session", {"segue.session": effect.session, "segue.reason": effect.reason}
        )
    elif isinstance(effect, SaveSnapshot):
        snapshot = effect.snapshot
        span.add_event(
            "segue.pause", {"segue.snapshot": snapshot.version, "segue.reason": snapshot.reason}
        )
    elif isinstance(effect, NotifyContextExhausted):
        span.add_event("segue.exhausted")


def _occupancy(state: ConversationState) -> tuple[int, float]:
    tokens = state.context_tokens if state.context_tokens is not None else state.projected_tokens
    return tokens, tokens / state.context_window


def _ending(before: ConversationState | None, after: ConversationState) -> dict[str, Any]:
    """The turn span's attributes once it is over."""
    tokens, ratio = _occupancy(after)
    shown: dict[str, Any] = {
        "segue.behavior": after.behavior.value,
        "segue.phase.end": after.phase.kind,
        "segue.occupancy.after": ratio,
        "segue.tokens.after": tokens,
    }
    if before is not None:
        tokens, ratio = _occupancy(before)
        shown |= {
            "segue.phase.start": before.phase.kind,
            "segue.occupancy.before": ratio,
            "segue.tokens.before": tokens,
        }
    return shown


def _input_tokens(usage: Usage) -> int:
    """The prompt's tokens as the conventions count them: the cached part included."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def _response(reply: LlmReply) -> dict[str, Any]:
    shown: dict[str, Any] = {"gen_ai.response.finish_reasons": [reply.stop_reason]}
    if reply.response_id:
        shown["gen_ai.response.id"] = reply.response_id
    if reply.response_model:
        shown["gen_ai.response.model"] = reply.response_model
    usage = reply.usage
    if usage is not None:
        shown |= {
            "gen_ai.usage.input_tokens": _input_tokens(usage),
            "gen_ai.usage.output_tokens": usage.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": usage.cache_read_input_tokens,
            "gen_ai.usage.cache_creation.input_tokens": usage.cache_creation_input_tokens,
        }
    return shown


def _error_type(error: LlmCallError) -> str:
    if error.context_overflow:
        return "context_overflow"
    if error.status_code is not None:
        return str(error.status_code)
    return "retryable" if error.retryable else "llm_error"


def _input_messages(request: LlmRequest) -> str:
    """The request's messages as the conventions' ``gen_ai.input.messages`` (text parts)."""
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "parts": [{"type": "text", "content": request.system}]})
    for message in request.messages:
        role = "assistant" if message.kind == "assistant" else "user"
        messages.append({"role": role, "parts": [{"type": "text", "content": message.text}]})
    if request.instruction:
        messages.append(
            {"role": "user", "parts": [{"type": "text", "content": request.instruction}]}
        )
    return json.dumps(messages)


def _output_messages(reply: LlmReply) -> str:
    parts: list[dict[str, Any]] = [{"type": "text", "content": reply.text}] if reply.text else []
    parts += [
        {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.input}
        for call in reply.tool_calls
    ]
    return json.dumps([{"role": "assistant", "parts": parts, "finish_reason": reply.stop_reason}])
