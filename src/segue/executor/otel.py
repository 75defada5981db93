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
  ``segue.retries`` and ``segue.refusals``: made when the telemetry is (the active gauge and
  the counters whose labels are known read 0 before the first turn); a model labelled from a
  bounded set of names (``otel_terms.ModelLabels``: the models segue's table knows, their
  families, ``other``; a client's made-up names make no series of their own); the commit
  durations a sample
  (``store_metrics_rate``, one commit in ten by default).

Providers are resolved at each turn (the ones given, else the global ones): while the global
tracer provider is OpenTelemetry's default no-op, no span is even started, and the API's proxy
instruments cost a check each until a real meter provider is set.
"""

from __future__ import annotations

import contextvars
import dataclasses
import random
import time
from collections.abc import Sequence
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
    ScheduleRetry,
)
from segue.executor.errors import LlmCallError
from segue.executor.model_port import (
    LlmModel,
    LlmReply,
    LlmRequest,
    knows_models,
    names_provider,
)
from segue.executor.otel_terms import (
    Instruments,
    ModelLabels,
    add_event_for,
    at_limit,
    error_type_of,
    input_messages,
    input_tokens,
    limit_outcome,
    output_messages,
    response_attributes,
    turn_attributes,
)
from segue.executor.telemetry import Telemetry
from segue.statemachine import (
    CheckpointResponse,
    CompactionResponse,
    ContinuationResponse,
    ConversationState,
    ErrorKind,
    Event,
    Failed,
    LlmResponse,
    ProviderCompacted,
    ToolCall,
    ToolResult,
)

SCOPE: Final = "segue"
RECHECK: Final = 1.0
"""Seconds between two lookups of the global tracer and meter providers."""
"""The instrumentation scope of every span and instrument."""
_ANSWERS: Final = (
    LlmResponse,
    ContinuationResponse,
    CheckpointResponse,
    CompactionResponse,
    ProviderCompacted,
)
"""Events after which the conversation's occupancy is a figure worth recording."""


@dataclasses.dataclass(slots=True)
class _Turn:
    """One drive while it lasts: what records it (a tracer, metric instruments: either may be
    None while its provider records nothing), its span and its figures."""

    conversation_id: str
    tracer: trace.Tracer | None
    meters: Instruments | None
    started: float
    span: trace.Span | None = None
    token: object | None = None
    before: ConversationState | None = None
    """The conversation as the drive's first commit found it."""


_TURN: contextvars.ContextVar[_Turn | None] = contextvars.ContextVar("segue_turn", default=None)
"""The drive running in this context (the model calls and tools it starts see it too: a task
copies its context)."""


class OtelTelemetry(Telemetry):
    """``Telemetry`` through OpenTelemetry (see the module's docstring)."""

    enabled = True

    def __init__(
        self,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        capture_content: bool,
        store_metrics_rate: float = 0.1,
    ) -> None:
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._capture = capture_content
        self._commit_share = store_metrics_rate
        """The share of commits whose duration is recorded (a uniform sample)."""
        self._models = ModelLabels()
        """What metrics label a model with: a bounded set of names, else ``other``."""
        self._tracers: dict[int, trace.Tracer | None] = {}
        self._instruments: dict[int, Instruments | None] = {}
        self._active = 0
        """Turns running now (``segue.conversations.active`` reads it)."""
        self._limits: dict[str, float] = {}
        """When each conversation's path at the limit began (``perf_counter``)."""
        self._recording: tuple[trace.Tracer | None, Instruments | None] = (None, None)
        self._checked = -RECHECK
        """When the providers were last looked up (``monotonic``)."""
        # The instruments exist from the start, so that a scrape before the first turn shows
        # the gauges at 0 (Prometheus treats an absent series apart from a zero one); the first
        # turn still looks the providers up (an application may set the global ones after).
        self._providers()
        self._checked = -RECHECK

    # ------------------------------------------------------------------ providers

    def _tracer(self) -> trace.Tracer | None:
        """The tracer to use now, None while the provider records nothing."""
        provider = self._tracer_provider or trace.get_tracer_provider()
        key = id(provider)
        if key not in self._tracers:
            quiet = isinstance(provider, ProxyTracerProvider | NoOpTracerProvider)
            self._tracers[key] = None if quiet else provider.get_tracer(SCOPE)
        return self._tracers[key]

    def _meters(self) -> Instruments | None:
        """The instruments to use now, None while the provider records nothing."""
        provider = self._meter_provider or metrics.get_meter_provider()
        key = id(provider)
        if key not in self._instruments:
            quiet = isinstance(provider, NoOpMeterProvider) or type(provider).__name__ == (
                "_ProxyMeterProvider"  # the API's own, until the application sets one
            )
            self._instruments[key] = (
                None if quiet else Instruments(provider.get_meter(SCOPE), lambda: self._active)
            )
        return self._instruments[key]

    # ------------------------------------------------------------------ turns

    def _providers(self) -> tuple[trace.Tracer | None, Instruments | None]:
        """The tracer and instruments to use now, the global providers looked up again at most
        every ``RECHECK`` seconds (an application that sets them after making the runtime is
        heard that soon; looking them up at every turn was most of what a quiet turn cost)."""
        now = time.monotonic()
        if now - self._checked >= RECHECK:
            self._checked = now
            self._recording = (self._tracer(), self._meters())
        return self._recording

    def turn_begins(self, conversation_id: str, event: Event | None) -> Any:
        tracer, meters = self._providers()
        # Nothing records while both providers are OpenTelemetry's no-op ones: the runtime then
        # skips even the timing of its commits (``enabled``) until an application sets one.
        self.enabled = tracer is not None or meters is not None
        if not self.enabled:
            return None
        turn = _Turn(conversation_id, tracer, meters, time.perf_counter())
        if tracer is not None:
            span = tracer.start_span(
                "segue.turn",
                kind=SpanKind.INTERNAL,
                attributes={
                    "gen_ai.conversation.id": conversation_id,
                    "segue.event": event.kind if event is not None else "recover",
                },
            )
            turn.token = context.attach(trace.set_span_in_context(span))
            if span.is_recording():
                turn.span = span
            else:
                # A turn the sampler left out: its model calls and tools are left out with it
                # (as ``ParentBased`` samplers decide), and nothing is built for any of them.
                turn.tracer = None
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
        if turn.token is not None:
            context.detach(turn.token)
        span = turn.span
        if span is None:
            return
        if state is not None:
            span.set_attributes(turn_attributes(turn.before, state))
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
        meters, span = turn.meters, turn.span
        if meters is None and span is None:
            return  # an unsampled turn, and no metrics
        if turn.before is None:
            turn.before = before
        if meters is not None:
            share = self._commit_share
            if share >= 1.0 or (share > 0.0 and random.random() < share):  # noqa: S311  # a sample
                meters.commits.record(seconds, {"segue.store": store})
            if isinstance(event, _ANSWERS) and after.context_tokens is not None:
                meters.occupancy.record(
                    after.context_tokens / after.context_window,
                    {
                        "segue.behavior": after.behavior.value,
                        "gen_ai.request.model": self._models(after.model),
                    },
                )
        for effect in effects:
            if meters is not None and isinstance(effect, ScheduleRetry):
                meters.retries.add(1, {"segue.request": effect.request})
            if span is not None:
                add_event_for(span, effect)
        if before.phase is not after.phase:
            self._limit(before, after, meters, span)

    def _limit(
        self,
        before: ConversationState,
        after: ConversationState,
        meters: Instruments | None,
        span: trace.Span | None,
    ) -> None:
        """The path at the limit: when it starts, and what came of it when it ends."""
        cid = after.id
        was, now = at_limit(before.phase), at_limit(after.phase)
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
        said = {
            "segue.behavior": after.behavior.value,
            "segue.outcome": limit_outcome(before, after),
        }
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
        if turn is None or (turn.tracer is None and turn.meters is None):
            return None  # not observed, or an unsampled turn without metrics
        provider = llm.provider_name if names_provider(llm) else "unknown"
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
                span.set_attribute("gen_ai.input.messages", input_messages(request))
        # A span names the model as asked; a metric's label from a bounded set (ModelLabels).
        served = knows_models(llm) and llm.knows_model(request.model)
        labels = {**attributes, "gen_ai.request.model": self._models(request.model, served)}
        return turn.meters, span, labels, time.perf_counter()

    def inference_ends(self, token: Any, outcome: LlmReply | LlmCallError) -> None:
        if token is None:
            return
        meters, span, labels, started = token
        elapsed = time.perf_counter() - started
        if isinstance(outcome, LlmCallError):
            error_type = error_type_of(outcome)
            if meters is not None:
                meters.operation.record(elapsed, {**labels, "error.type": error_type})
            if span is not None:
                span.set_attribute("error.type", error_type)
                span.set_status(Status(StatusCode.ERROR, error_type))
                span.end()
            return
        if meters is not None:
            if outcome.response_model:
                labels["gen_ai.response.model"] = self._models(outcome.response_model)
            meters.operation.record(elapsed, labels)
            usage = outcome.usage
            if usage is not None:
                meters.tokens.record(input_tokens(usage), {**labels, "gen_ai.token.type": "input"})
                output = {**labels, "gen_ai.token.type": "output"}
                meters.tokens.record(usage.output_tokens, output)
        if span is None:
            return
        span.set_attributes(response_attributes(outcome))
        if self._capture:
            span.set_attribute("gen_ai.output.messages", output_messages(outcome))
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
