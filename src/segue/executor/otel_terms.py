"""What segue says in OpenTelemetry's terms: its metric instruments, and the attributes and
events of its spans after the GenAI conventions (``otel`` uses them; the pure mappings live here so
that they read apart from the bookkeeping of turns)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final, get_args

from opentelemetry import metrics, trace

from segue.effects import (
    Effect,
    NotifyContextExhausted,
    NotifyContextWarning,
    RejectionCause,
    RequestKind,
    SaveSnapshot,
    ScheduleRetry,
    StartGeneration,
    StartSession,
)
from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmReply, LlmRequest
from segue.executor.models.windows import anthropic_model_name
from segue.statemachine import (
    AwaitingCheckpoint,
    AwaitingContinuation,
    Compacting,
    ConversationState,
    Phase,
    Usage,
)
from segue.statemachine.models import table_name

_SECONDS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TOKENS: Final = tuple(4**n for n in range(1, 11))
_RATIO: Final = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)


class Instruments:
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
        # Counters whose labels are known from the start begin at 0: a rate over a series that
        # appears with its first increment misses that increment.
        for request in get_args(RequestKind):
            self.retries.add(0, {"segue.request": request})
        for cause in get_args(RejectionCause):
            self.refusals.add(0, {"segue.cause": cause})


OTHER_MODEL: Final = "other"
"""The label of a model metrics do not name (see ``ModelLabels``)."""
MAX_MODEL_LABELS: Final = 64
"""At most this many model names label metrics in one process; the rest are ``other``."""


class ModelLabels:
    """What a metric labels a model with, from a bounded set of names: a model segue's table
    knows by its exact name (a date or ``-latest`` after it allowed; Bedrock's and Vertex AI's
    ids read as the Messages API's names), or one the adapter knows its server serves
    (``KnowsModels``: a vLLM or Ollama model), as it was given, while fewer than
    ``MAX_MODEL_LABELS`` such names are in use; any other name of a table entry's family (a
    made-up suffix, a fine-tune, a name past the limit) as the entry's name
    (``claude-sonnet-4-6``); any other model as ``other``. A model name is the client's to
    choose (``segue serve``'s REST create takes any): labelled as given, 300 made-up names made
    17,700 series. Spans keep the name as given (a span is one record, not a series)."""

    def __init__(self, limit: int = MAX_MODEL_LABELS) -> None:
        self._limit = limit
        self._names: set[str] = set()
        """The names labelled as given so far (at most ``limit``)."""
        self._seen: dict[str, str] = {}
        """Labels of names already asked (bounded too: made-up names are not all kept)."""

    def __call__(self, model: str, served: bool = False) -> str:
        """``model``'s label; ``served``: the adapter knows its server serves it."""
        label = self._seen.get(model)
        if label is not None and not (served and label == OTHER_MODEL):
            return label
        label = self._label(model, served)
        if len(self._seen) < 4 * self._limit or model in self._seen:
            self._seen[model] = label
        return label

    def _label(self, model: str, served: bool) -> str:
        named = anthropic_model_name(model).lower()
        entry = table_name(named)
        exact = (
            entry is not None
            and named.startswith(entry)
            and _DATED.fullmatch(named[len(entry) :]) is not None
        )
        given = model.strip()
        if (exact or served) and (given in self._names or len(self._names) < self._limit):
            self._names.add(given)
            return given
        return entry or OTHER_MODEL


_DATED: Final = re.compile(r"(?:-\d{8}|-\d{4}-\d{2}-\d{2}|-latest|@\d{8})?")
"""What may follow a table entry's name in an exact name: a date, or ``-latest``."""


METRIC_LABELS: Final = (
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "segue.purpose",
)


def at_limit(phase: Phase) -> bool:
    """Whether the conversation is on its path at the limit (not a pause's checkpoint)."""
    if isinstance(phase, AwaitingContinuation | Compacting):
        return True
    return isinstance(phase, AwaitingCheckpoint) and (phase.purpose == "restart" or phase.exhausted)


def limit_outcome(before: ConversationState, after: ConversationState) -> str:
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


def add_event_for(span: trace.Span, effect: Effect) -> None:
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


def occupancy(state: ConversationState) -> float:
    """What the meter shows, as a ratio of the window: measured, else projected."""
    tokens = state.context_tokens if state.context_tokens is not None else state.projected_tokens
    return tokens / state.context_window


def turn_attributes(before: ConversationState | None, after: ConversationState) -> dict[str, Any]:
    """The turn span's attributes once it is over: the phase and occupancy (a ratio of the
    window) it ended in, and those it began in (as its first commit found them). Few on
    purpose: the SDK validates every attribute, which is most of what a span costs."""
    shown: dict[str, Any] = {
        "segue.behavior": after.behavior.value,
        "segue.phase.end": after.phase.kind,
        "segue.occupancy.after": occupancy(after),
    }
    if before is not None:
        shown["segue.phase.start"] = before.phase.kind
        shown["segue.occupancy.before"] = occupancy(before)
    return shown


def input_tokens(usage: Usage) -> int:
    """The prompt's tokens as the conventions count them: the cached part included."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def response_attributes(reply: LlmReply) -> dict[str, Any]:
    shown: dict[str, Any] = {"gen_ai.response.finish_reasons": [reply.stop_reason]}
    if reply.response_id:
        shown["gen_ai.response.id"] = reply.response_id
    if reply.response_model:
        shown["gen_ai.response.model"] = reply.response_model
    usage = reply.usage
    if usage is not None:
        shown |= {
            "gen_ai.usage.input_tokens": input_tokens(usage),
            "gen_ai.usage.output_tokens": usage.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": usage.cache_read_input_tokens,
            "gen_ai.usage.cache_creation.input_tokens": usage.cache_creation_input_tokens,
        }
    return shown


def error_type_of(error: LlmCallError) -> str:
    if error.context_overflow:
        return "context_overflow"
    if error.status_code is not None:
        return str(error.status_code)
    return "retryable" if error.retryable else "llm_error"


def input_messages(request: LlmRequest) -> str:
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


def output_messages(reply: LlmReply) -> str:
    parts: list[dict[str, Any]] = [{"type": "text", "content": reply.text}] if reply.text else []
    parts += [
        {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.input}
        for call in reply.tool_calls
    ]
    return json.dumps([{"role": "assistant", "parts": parts, "finish_reason": reply.stop_reason}])
