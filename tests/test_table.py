"""``specs/transitions.toml`` and ``transition()`` describe the same machine.

Why four ways: the golden test keeps the committed diagram generated from the table; the row
tests build, for every row, a state its guard selects and check the exact target and effect
kinds; the pair tests check the table and ``HANDLED_PAIRS`` name the same handlers; and the
differential test rebuilds the machine from the rows with the ``transitions`` library, with guard
predicates written here from the guard meanings over counters of its own, and runs it beside
``transition()`` on random event sequences. A drift in the code or in the table fails one of them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, cast

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from transitions import Machine

from segue import (
    HANDLED_PAIRS,
    AwaitingCheckpoint,
    AwaitingContinuation,
    CheckpointFailed,
    CheckpointResponse,
    Compacting,
    CompactionFailed,
    CompactionResponse,
    ContextExhausted,
    ContextExhaustionBehavior,
    ContinuationFailed,
    ContinuationResponse,
    ConversationState,
    ErrorKind,
    Event,
    Failed,
    LlmError,
    LlmRequesting,
    LlmResponse,
    ManualContinuation,
    Paused,
    PauseRequested,
    ProviderCompacted,
    ResumeRequested,
    RetryDue,
    SessionSnapshot,
    ToolCall,
    ToolResult,
    Usage,
    UserCancel,
    UserMessage,
    checkpoint_sections,
    compile_resume_context,
    continuation_prompt,
    estimate_tokens,
    extract_checkpoint,
    new_conversation,
    transition,
)
from segue.statemachine.checkpoint import extract_decisions
from segue.statemachine.machine import RESUME_PROMPT, TOOL_NOT_RUN_CANCELLED, TOOL_NOT_RUN_LIMIT
from segue.statemachine.spec import (
    PHASE_KINDS,
    Row,
    SpecError,
    load_table,
    mermaid,
    parse_table,
)
from segue.testing.strategies import event_sequences

ROOT: Final = Path(__file__).resolve().parents[1]
TABLE = load_table()
ROWS: Final = TABLE.rows
B = ContextExhaustionBehavior
BEHAVIORS: Final = tuple(ContextExhaustionBehavior)

# One conversation shape for the row tests: exact integers, far from the estimates' noise.
WINDOW: Final = 10_000
WARNING: Final = 8_000
THRESHOLD: Final = 9_000
CHECKPOINT: Final = (
    "<checkpoint>\n## Goal\nShip the parser.\n\n## Remaining Tasks\n1. tests\n</checkpoint>"
)
SEED_FILLER: Final = THRESHOLD - estimate_tokens(continuation_prompt(""))
"""System tokens that leave room for a first request but put any restart seed exactly at the
threshold (the minimal "continue the previous work" seed) or above it."""


# =========================================================================== (a) the diagram


def test_the_committed_diagram_is_generated_from_the_table() -> None:
    committed = (ROOT / "specs" / "diagram.mmd").read_text(encoding="utf-8")
    assert committed == mermaid(ROWS), (
        "specs/diagram.mmd is stale: python -m segue.statemachine.spec > specs/diagram.mmd"
    )


def test_the_packaged_table_is_the_spec_file() -> None:
    spec = (ROOT / "specs" / "transitions.toml").read_text(encoding="utf-8")
    assert parse_table(spec) == TABLE


def test_the_diagram_merges_events_per_edge_and_ignores_row_order() -> None:
    rows = [
        Row("T1", "idle", "user_message", "fits", "*", "llm_requesting", (), ()),
        Row("T2", "llm_requesting", "user_cancel", "always", "*", "idle", (), ()),
        Row("T3", "llm_requesting", "llm_response", "ends_turn", "*", "idle", (), ()),
        Row("T4", "llm_requesting", "llm_response", "truncated", "*", "idle", (), ()),
        Row("T5", "idle", "llm_response", "unhandled", "*", "idle", (), ()),
    ]
    drawn = mermaid(rows)
    assert drawn.splitlines() == [
        "stateDiagram-v2",
        "    [*] --> idle",
        "    idle --> llm_requesting: user_message",
        "    llm_requesting --> idle: llm_response, user_cancel",
    ]
    for seed in range(5):
        shuffled = list(rows)
        random.Random(seed).shuffle(shuffled)
        assert mermaid(shuffled) == drawn


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('phase = "idle"', 'phase = "idling"'), "phase 'idling' is not one of"),
        (('guard = "fits"', 'guard = "roomy"'), "guard 'roomy' is not one of"),
        (('effects = ["append_message", "request_llm"]', 'effects = ["append_msg"]'), "unknown"),
        (('id = "T002"', 'id = "T001"'), "duplicate row ids"),
        (('behavior = "*"', 'behavior = "sometimes"'), "behavior 'sometimes'"),
    ],
)
def test_a_malformed_table_is_refused_with_the_row(change: tuple[str, str], message: str) -> None:
    spec = (ROOT / "specs" / "transitions.toml").read_text(encoding="utf-8")
    old, new = change
    assert old in spec
    with pytest.raises(SpecError, match=message):
        parse_table(spec.replace(old, new, 1))


# =========================================================================== the reference model


def _tokens(text: str, counted: int | None) -> int:
    return counted if counted is not None else estimate_tokens(text)


def _reported(usage: Usage | None) -> int | None:
    """Occupancy a usage report states: its four fields summed, ``None`` when it says nothing
    (absent, or no prompt tokens: every prompt holds at least one message)."""
    if usage is None:
        return None
    if usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens == 0:
        return None
    total = (
        usage.input_tokens
        + usage.output_tokens
        + usage.cache_creation_input_tokens
        + usage.cache_read_input_tokens
    )
    return total or None


def _checkpoint_text(event: Any) -> str:
    return str(event.text) if event.kind == "checkpoint_response" else ""


class _PhaseModel:
    """What ``transitions`` drives: it only holds the phase kind (``state``)."""

    state: str


class Reference:
    """The machine rebuilt from the table's rows, with its own simple counters.

    States are phase kinds, triggers are event kinds, each row is a transition whose condition
    is the guard predicate below (written from the guard's meaning, never from the handlers'
    helpers) and whose ``before`` callback keeps the counters: occupancy and what was appended
    since, the warning, the attempt and its retry timer, the tool calls awaiting results, the
    continuations used, the pause flag, the session and the last snapshot.
    """

    def __init__(self, state: ConversationState, rows: Sequence[Row]) -> None:
        config = state.config
        self.behavior = config.behavior.value
        self.conversation_id = config.id
        self.window = config.context_window
        self.warning = config.warning_tokens
        self.threshold = config.continuation_tokens
        self.max_attempts = config.max_attempts
        self.max_continuations = config.max_continuations
        self.system = config.system_tokens
        self.context = state.context_tokens
        self.pending = state.pending_tokens
        self.warned = state.warned
        self.continuations = state.continuations
        self.pause = state.pause_requested
        self.reason = state.pause_reason
        self.session = state.session
        self.snapshots = state.snapshots
        self.rounds = state.tool_rounds
        self.max_rounds = config.max_tool_rounds
        phase: Any = state.phase
        self.final: bool = getattr(phase, "final", False)
        self.alternate: bool = getattr(phase, "alternate", False)
        self.exhausted: bool = getattr(phase, "exhausted", False)
        self.attempt: int = getattr(phase, "attempt", 1)
        self.trim: int = getattr(phase, "trim_level", 0)
        self.retry: bool = getattr(phase, "retry_pending", False)
        self.purpose: str = getattr(phase, "purpose", "restart")
        self.resume_after: bool = getattr(phase, "resume_after", False)
        self.waiting: list[str] = list(getattr(phase, "pending", ()))
        self.recoverable = isinstance(phase, Failed) and phase.error_kind in (
            ErrorKind.LLM_ERROR,
            ErrorKind.RETRIES_EXHAUSTED,
        )
        self.snapshot: SessionSnapshot | None = (
            phase.snapshot if isinstance(phase, Paused) else None
        )
        self.rows = tuple(row for row in rows if not row.is_noop and row.applies_to(self.behavior))
        self.model = _PhaseModel()
        self.machine = Machine(
            model=self.model,
            states=list(PHASE_KINDS),
            initial=phase.kind,
            auto_transitions=False,
            ignore_invalid_triggers=True,
            send_event=True,
        )
        for row in self.rows:
            self.machine.add_transition(
                row.event,
                row.phase,
                row.target,
                conditions=[self._condition(row)],
                before=[self._action(row)],
            )

    # ------------------------------------------------------------------ driving

    @property
    def phase(self) -> str:
        """The phase kind the reference is in."""
        return str(self.model.state)

    def step(self, event: Any) -> bool:
        """Feed ``event``; whether a row fired (``False``: nothing changed)."""
        if event.kind not in self.machine.get_triggers(self.phase):
            return False  # no row for the pair: nothing changes (and transitions logs nothing)
        return bool(cast(Any, self.model).trigger(event.kind, event=event))

    def select(self, event: Any) -> Row | None:
        """The row ``event`` would take now, without taking it."""
        for row in self.rows:
            if row.pair == (self.phase, event.kind) and GUARDS[row.guard](self, event):
                return row
        return None

    def observed(self) -> tuple[object, ...]:
        """What is compared with a ``ConversationState`` (see ``observed()``)."""
        phase = self.phase
        requesting = phase in _REQUESTS
        return (
            phase,
            self.attempt if requesting else None,
            self.retry if requesting else None,
            self.trim if requesting and phase != "llm_requesting" else None,
            self.purpose if phase == "awaiting_checkpoint" else None,
            self.exhausted if phase == "awaiting_checkpoint" else None,
            self.resume_after if phase in ("awaiting_checkpoint", "compacting") else None,
            tuple(self.waiting) if phase == "tool_executing" else None,
            self.context,
            self.pending,
            self.warned,
            self.continuations,
            self.pause,
            self.session,
            self.snapshots,
            self.rounds,
            self.final if phase == "llm_requesting" else None,
            self.alternate if phase in ("awaiting_continuation", "compacting") else None,
        )

    def _condition(self, row: Row) -> Callable[[Any], bool]:
        guard = GUARDS[row.guard]
        return lambda event_data: guard(self, event_data.kwargs["event"])

    def _action(self, row: Row) -> Callable[[Any], None]:
        return lambda event_data: self._apply(row, event_data.kwargs["event"])

    # ------------------------------------------------------------------ figures guards read

    @property
    def projected(self) -> int:
        return (self.context or 0) + self.pending

    @property
    def at_bound(self) -> bool:
        return self.continuations >= self.max_continuations

    def projected_after(self, event: Any) -> int:
        """The projected prompt once ``event``'s part is appended (a new session's, on resume)."""
        if event.kind == "resume_requested":
            assert self.snapshot is not None
            prompt = event.prompt if event.prompt and event.prompt.strip() else RESUME_PROMPT
            context = compile_resume_context(self.snapshot)
            return self.system + estimate_tokens(context) + estimate_tokens(prompt)
        if event.kind == "user_message":
            return self.projected + _tokens(event.text, event.token_count)
        if event.kind == "tool_result":
            return self.projected + _tokens(event.output, event.token_count)
        return self.projected

    def over_the_limit(self, event: Any) -> bool:
        """The response asks for tools and the turn has used its tool rounds."""
        return bool(event.tool_calls) and self.rounds >= self.max_rounds

    def projected_after_limit(self, event: Any) -> int:
        """The projected prompt once the response is measured and its calls answered as not
        run: what the grace request's pre-flight compares with the threshold."""
        known = self.known(event)
        if known is not None:
            base = known
        else:
            base = (
                self.projected
                + estimate_tokens(event.text)
                + sum(estimate_tokens(call.name + repr(call.input)) for call in event.tool_calls)
            )
        return base + len(event.tool_calls) * estimate_tokens(TOOL_NOT_RUN_LIMIT)

    def seed_tokens(self, text: str) -> int:
        """A restarted session's first prompt: system tokens + the continuation prompt."""
        return self.system + estimate_tokens(continuation_prompt(extract_checkpoint(text)))

    def gives_up(self, event: Any) -> bool:
        return self.attempt >= self.max_attempts or not (event.retryable or event.context_overflow)

    def known(self, event: Any) -> int | None:
        """The response's occupancy when it is usable: stated, and within the window."""
        reported = _reported(event.usage)
        return reported if reported is not None and reported <= self.window else None

    # ------------------------------------------------------------------ counters

    def _apply(self, row: Row, event: Any) -> None:
        if row.guard in ("retry_pending", "stale_retry", "unknown_tool_call"):
            return  # answers nobody waits for any more
        if row.guard == "summary_unusable_first":
            self.alternate, self.attempt = True, 1  # the same request, asked another way
            if row.event == "continuation_response" and self.known(event) is not None:
                self.context, self.pending = self.known(event), 0  # its answer measured all
            return
        self._record(row, event)
        self._fresh_start(row, event)
        self._enter(row, event)

    def _record(self, row: Row, event: Any) -> None:
        """What the event itself adds: its tokens, its measurement, a flag, a timer, an attempt."""
        kind = row.event
        if kind == "user_message" and row.guard in _TAKES_MESSAGE:
            self.pending += _tokens(event.text, event.token_count)
            self.rounds = 0
        elif kind == "llm_response":
            self._measure(event)
            if row.guard.startswith(("tool_round_limit", "final_tool_calls")):
                self.pending += len(event.tool_calls) * estimate_tokens(TOOL_NOT_RUN_LIMIT)
            elif row.guard == "has_tool_calls":
                self.rounds += 1
        elif kind == "tool_result":
            self.pending += _tokens(event.output, event.token_count)
            self.waiting.remove(event.tool_call_id)
        elif kind == "user_cancel" and row.phase == "tool_executing":
            self.pending += len(self.waiting) * estimate_tokens(TOOL_NOT_RUN_CANCELLED)
        elif kind == "pause_requested" and not self.pause:
            self.pause, self.reason = True, event.reason
        elif kind == "retry_due":
            self.attempt, self.retry = event.attempt, False
        elif kind == "continuation_response" and self.known(event) is not None:
            self.context, self.pending = self.known(event), 0
        if row.guard == "retryable_attempts_left":
            self.retry = True
        elif row.guard == "overflow_attempts_left":
            self.attempt, self.trim = self.attempt + 1, self.trim + 1

    def _fresh_start(self, row: Row, event: Any) -> None:
        """A new session (restart, resume) or a new generation (compaction)."""
        if row.event == "resume_requested":
            assert self.snapshot is not None
            if self.snapshot.trigger == "exhaustion":
                self.continuations += 1
            self._new_session(self.projected_after(event))
        elif (
            row.phase == "awaiting_checkpoint"
            and row.guard in _RESTARTS
            and (row.event in _CHECKPOINT_OUTCOMES)
        ):
            self._new_session(self.seed_tokens(_checkpoint_text(event)))
            self.continuations += 1
        elif row.event == "compaction_response" and row.target != "failed":
            self.continuations += 1
            self.context, self.pending = None, event.retained_tokens
        elif row.event == "provider_compacted":  # not one of segue's continuations
            self.context = None
            self.pending = (
                self.system + estimate_tokens(event.summary)
                if event.post_tokens is None
                else event.post_tokens
            )

    def _measure(self, event: Any) -> None:
        known = self.known(event)
        if known is None:
            self.pending += estimate_tokens(event.text) + sum(
                estimate_tokens(call.name + repr(call.input)) for call in event.tool_calls
            )
        else:
            self.context, self.pending = known, 0
            self.warned = self.warned or known >= self.warning

    def _new_session(self, pending: int) -> None:
        self.session += 1
        self.context, self.pending, self.warned = None, pending, False
        self.rounds = 0

    def _enter(self, row: Row, event: Any) -> None:
        source, target = row.phase, row.target
        if row.event == "user_cancel":
            self.reason = ""  # a cancel abandons a pending pause, and its reason with it
        if target == "tool_executing" and source != target:
            self.waiting = list(dict.fromkeys(call.id for call in event.tool_calls))
        elif target == "failed" and (source != target or row.behavior != "*"):
            self.recoverable = row.event == "llm_error" and row.guard in (
                "retryable_attempts_spent",
                "not_retryable",
            )
        elif target == "paused" and source != target:
            checkpoint = extract_checkpoint(_checkpoint_text(event))
            self.snapshots += 1
            self.snapshot = SessionSnapshot(
                conversation_id=self.conversation_id,
                version=self.snapshots,
                session=self.session,
                trigger="exhaustion" if self.exhausted else "pause",
                reason=self.reason,
                checkpoint=checkpoint,
                sections=checkpoint_sections(checkpoint),
                context_tokens=self.context,
                context_window=self.window,
                decisions=extract_decisions(checkpoint),
            )
            self.reason = ""
        if target in ("idle", "failed", "context_exhausted", "paused"):
            self.pause = False
        grace = row.guard == "tool_round_limit" and target == "llm_requesting"
        new_request = target in _REQUESTS and (
            source != target
            or grace
            or (source == "awaiting_checkpoint" and "pause_pending" in row.guard)
        )
        if not new_request:
            return
        self.attempt, self.retry, self.trim = 1, False, 0
        self.final, self.alternate = grace, False
        self.exhausted = False
        if row.guard == "tool_round_limit_pause_pending":  # a pause before the grace request
            self.purpose, self.resume_after = "pause", True
        elif row.behavior != "*":  # the exhaustion path: a restart checkpoint or a compaction
            self.purpose = "restart"
            if row.behavior == "checkpoint_pause":  # or a pause at the limit
                self.purpose, self.exhausted = "pause", True
            # Mid-task (resume at once): tools were asked for, the provider overflowed, or
            # pre-flight stopped a request; not after a finished turn or a manual trigger.
            base = row.guard.removesuffix("_at_bound")
            overflowed = getattr(event, "stop_reason", "") == "model_context_window_exceeded"
            self.resume_after = (
                bool(event.tool_calls) or overflowed
                if base == "crosses_continuation"
                else base
                in (
                    "preflight_over",
                    "context_overflow",
                    "window_exceeded",
                    "tool_round_limit_preflight_over",
                )
            )
        elif target == "awaiting_checkpoint":  # a pause taken at a turn boundary
            self.purpose = "pause"
            if source == "tool_executing":
                self.resume_after = True
            elif source in ("idle", "llm_requesting") or row.event in (
                "user_cancel",
                "compaction_failed",
            ):
                self.resume_after = False


_TAKES_MESSAGE: Final = frozenset({"preflight_over", "preflight_over_at_bound", "fits"})
"""The user_message guards under which the message is recorded (the rest reject it)."""
_RESTARTS: Final = frozenset(
    {
        "pause_pending",
        "resume_after",
        "no_resume_after",
        "always",
        "gives_up_pause_pending",
        "gives_up_resume_after",
        "gives_up_no_resume_after",
    }
)
"""The guards under which a restart checkpoint's outcome (in awaiting_checkpoint) starts a new
session."""
_CHECKPOINT_OUTCOMES: Final = ("checkpoint_response", "checkpoint_failed", "user_cancel")
_REQUESTS: Final = ("llm_requesting", "awaiting_continuation", "awaiting_checkpoint", "compacting")

Guard = Callable[[Reference, Any], bool]

GUARDS: Final[dict[str, Guard]] = {
    "always": lambda r, e: True,
    "unhandled": lambda r, e: True,
    "message_too_large": lambda r, e: _tokens(e.text, e.token_count) >= r.threshold,
    "preflight_over": lambda r, e: r.projected_after(e) >= r.threshold,
    "preflight_over_at_bound": lambda r, e: r.projected_after(e) >= r.threshold and r.at_bound,
    "fits": lambda r, e: r.projected_after(e) < r.threshold,
    "at_bound": lambda r, e: r.at_bound,
    "pause_pending": lambda r, e: r.pause,
    "retry_pending": lambda r, e: r.retry,
    "retry_due_current": lambda r, e: r.retry and e.attempt == r.attempt + 1,
    "stale_retry": lambda r, e: not (r.retry and e.attempt == r.attempt + 1),
    "context_overflow": lambda r, e: e.context_overflow,
    "context_overflow_at_bound": lambda r, e: e.context_overflow and r.at_bound,
    "retryable_attempts_left": lambda r, e: e.retryable and r.attempt < r.max_attempts,
    "retryable_attempts_spent": lambda r, e: e.retryable and r.attempt >= r.max_attempts,
    "not_retryable": lambda r, e: not (e.retryable or e.context_overflow),
    "crosses_continuation": lambda r, e: (r.known(e) or 0) >= r.threshold,
    "crosses_continuation_at_bound": lambda r, e: (r.known(e) or 0) >= r.threshold and r.at_bound,
    "window_exceeded": lambda r, e: e.stop_reason == "model_context_window_exceeded",
    "window_exceeded_at_bound": lambda r, e: (
        e.stop_reason == "model_context_window_exceeded" and r.at_bound
    ),
    "truncated_pause_pending": lambda r, e: e.stop_reason == "max_tokens" and r.pause,
    "truncated": lambda r, e: e.stop_reason == "max_tokens",
    "final_tool_calls_pause_pending": lambda r, e: r.final and bool(e.tool_calls) and r.pause,
    "final_tool_calls": lambda r, e: r.final and bool(e.tool_calls),
    "tool_round_limit": lambda r, e: r.over_the_limit(e),
    "tool_round_limit_preflight_over": lambda r, e: (
        r.over_the_limit(e) and r.projected_after_limit(e) >= r.threshold
    ),
    "tool_round_limit_preflight_over_at_bound": lambda r, e: (
        r.over_the_limit(e) and r.projected_after_limit(e) >= r.threshold and r.at_bound
    ),
    "tool_round_limit_pause_pending": lambda r, e: r.over_the_limit(e) and r.pause,
    "has_tool_calls": lambda r, e: bool(e.tool_calls),
    "ends_turn_pause_pending": lambda r, e: not e.tool_calls and r.pause,
    "crosses_warning": lambda r, e: not r.warned and (r.known(e) or 0) >= r.warning,
    "usage_unknown": lambda r, e: _reported(e.usage) is None,
    "accounting_anomaly": lambda r, e: (_reported(e.usage) or 0) > r.window,
    "ends_turn": lambda r, e: (
        not e.tool_calls and r.known(e) is not None and (r.warned or (r.known(e) or 0) < r.warning)
    ),
    "unknown_tool_call": lambda r, e: e.tool_call_id not in r.waiting,
    "other_tools_pending": lambda r, e: bool(set(r.waiting) - {e.tool_call_id}),
    "summary_unusable_first": lambda r, e: _unusable(e) and not r.alternate,
    "summary_unusable": lambda r, e: _unusable(e),
    "summary_usable": lambda r, e: bool(e.summary.strip()) and e.stop_reason != "refusal",
    "gives_up": lambda r, e: r.gives_up(e),
    "overflow_attempts_left": lambda r, e: e.context_overflow and r.attempt < r.max_attempts,
    "exhausted_pause": lambda r, e: r.purpose == "pause" and r.exhausted,
    "pause_purpose": lambda r, e: r.purpose == "pause",
    "seed_too_large": lambda r, e: r.seed_tokens(_checkpoint_text(e)) >= r.threshold,
    "resume_after": lambda r, e: r.resume_after,
    "no_resume_after": lambda r, e: not r.resume_after,
    "gives_up_pause_purpose": lambda r, e: r.gives_up(e) and r.purpose == "pause",
    "gives_up_seed_too_large": lambda r, e: r.gives_up(e) and r.seed_tokens("") >= r.threshold,
    "gives_up_pause_pending": lambda r, e: r.gives_up(e) and r.pause,
    "gives_up_resume_after": lambda r, e: r.gives_up(e) and r.resume_after,
    "gives_up_no_resume_after": lambda r, e: r.gives_up(e) and not r.resume_after,
    "retained_too_large": lambda r, e: e.retained_tokens >= r.threshold,
    "unrecoverable": lambda r, e: not r.recoverable,
}
"""Each guard of the table as a predicate over the reference's counters and the event, read
"given that no earlier row of the pair matched" as the table says."""


def _unusable(event: Any) -> bool:
    return not event.summary.strip() or event.stop_reason == "refusal"


def observed(state: ConversationState) -> tuple[object, ...]:
    """The figures of a state the reference keeps too: the phase and its request data, then
    occupancy, the warning, continuations, the pause flag, the session and the snapshots."""
    phase: Any = state.phase
    return (
        phase.kind,
        getattr(phase, "attempt", None),
        getattr(phase, "retry_pending", None),
        getattr(phase, "trim_level", None),
        getattr(phase, "purpose", None),
        getattr(phase, "exhausted", None),
        getattr(phase, "resume_after", None),
        getattr(phase, "pending", None),
        state.context_tokens,
        state.pending_tokens,
        state.warned,
        state.continuations,
        state.pause_requested,
        state.session,
        state.snapshots,
        state.tool_rounds,
        getattr(phase, "final", None),
        getattr(phase, "alternate", None),
    )


# =========================================================================== fixtures


def call(call_id: str) -> ToolCall:
    return ToolCall(id=call_id, name="read_file", input={"path": f"{call_id}.py"})


def reply(tokens: int, *calls: ToolCall, stop: str = "end_turn") -> LlmResponse:
    return LlmResponse(
        text="ok", tool_calls=calls, usage=Usage(input_tokens=tokens), stop_reason=stop
    )


def drive(state: ConversationState, *events: Event) -> ConversationState:
    for event in events:
        state, _ = transition(state, event)
    return state


def failure(kind: str, *, retryable: bool = False, overflow: bool = False) -> Event:
    """The failure event of a request of ``kind`` (its answer kind or its failure kind)."""
    flags: dict[str, Any] = {"retryable": retryable, "context_overflow": overflow}
    if kind.startswith("llm"):
        return LlmError(message="boom", **flags)
    if kind.startswith("continuation"):
        return ContinuationFailed(error="boom", **flags)
    if kind.startswith("checkpoint"):
        return CheckpointFailed(error="boom", **flags)
    return CompactionFailed(error="boom", **flags)


_ANSWERS: Final = {
    "llm_requesting": "llm_error",
    "awaiting_continuation": "continuation_failed",
    "awaiting_checkpoint": "checkpoint_failed",
    "compacting": "compaction_failed",
}


def default_event(kind: str) -> Event:
    """The plain event of each kind: small, successful, for the first pending tool call."""
    plain: dict[str, Event] = {
        "user_message": UserMessage(text="next", token_count=10),
        "llm_response": reply(100),
        "tool_result": ToolResult(tool_call_id="t1", output="out", token_count=10),
        "continuation_response": ContinuationResponse(summary="What happened so far."),
        "checkpoint_response": CheckpointResponse(text=CHECKPOINT),
        "compaction_response": CompactionResponse(summary="Older work.", retained_tokens=1_000),
        "provider_compacted": ProviderCompacted(summary="What the provider kept.", post_tokens=900),
        "retry_due": RetryDue(attempt=2),
        "user_cancel": UserCancel(),
        "manual_continuation": ManualContinuation(),
        "pause_requested": PauseRequested(reason="nightly stop"),
        "resume_requested": ResumeRequested(),
    }
    return plain[kind] if kind in plain else failure(kind)


_REACHED_BY: Final = {
    "awaiting_continuation": B.THRESHOLD_BASED_CONTINUATION,
    "awaiting_checkpoint": B.CHECKPOINT_RESTART,
    "compacting": B.COMPACT_IN_PLACE,
    "context_exhausted": B.THRESHOLD_BASED_CONTINUATION,
}
"""Phases of the exhaustion path, and the behaviour whose conversations really get there."""


def _at_the_limit(
    phase: str,
    behavior: ContextExhaustionBehavior,
    asking: ConversationState,
    mid_task: tuple[ToolCall, ...],
) -> ConversationState:
    """A phase of the exhaustion path: reached by a crossing response where ``behavior`` gets
    there, else set with ``with_phase`` (those handlers do not look at the behaviour)."""
    if behavior is _REACHED_BY[phase]:
        crossed = drive(asking, reply(9_500, *mid_task))
        if phase == "context_exhausted":
            return drive(crossed, default_event("continuation_response"))
        return crossed
    resume_after = bool(mid_task)
    phases: dict[str, Any] = {
        "awaiting_continuation": AwaitingContinuation(),
        "awaiting_checkpoint": AwaitingCheckpoint(resume_after=resume_after),
        "compacting": Compacting(resume_after=resume_after),
        "context_exhausted": ContextExhausted(summary="What happened so far."),
    }
    return asking.with_phase(phases[phase])


def _pausing(
    behavior: ContextExhaustionBehavior,
    idle: ConversationState,
    asking: ConversationState,
    calls: tuple[ToolCall, ...],
    resume_after: bool,
    *,
    exhausted: bool,
) -> ConversationState:
    """Waiting for a pause's checkpoint: one asked for by an orchestrator (at the boundary
    after tools when ``resume_after``), or, ``exhausted``, a pause at the limit."""
    if exhausted:
        if behavior is B.CHECKPOINT_PAUSE:
            return drive(asking, reply(9_500))
        return asking.with_phase(AwaitingCheckpoint(purpose="pause", exhausted=True))
    pause_event = PauseRequested(reason="nightly stop")
    if resume_after:
        return drive(asking, reply(100, *calls), pause_event, default_event("tool_result"))
    return drive(idle, pause_event)


def _failed_state(
    asking: ConversationState, behavior: ContextExhaustionBehavior, *, recoverable: bool
) -> ConversationState:
    if recoverable:
        return drive(asking, LlmError(message="boom"))
    if behavior is B.INTENTIONALLY_UNHANDLED:
        return drive(asking, reply(9_500))
    return asking.with_phase(Failed(error_kind=ErrorKind.CHECKPOINT_OVERFLOW, message="x"))


def reach(
    phase: str,
    behavior: ContextExhaustionBehavior,
    *,
    parent: bool = False,
    bound: bool = False,
    system_tokens: int = 0,
    max_attempts: int = 3,
    purpose: str = "restart",
    resume_after: bool = False,
    pause: bool = False,
    retry: bool = False,
    high: bool = False,
    tools: tuple[str, ...] = ("t1",),
    recoverable: bool = True,
    rounds_spent: bool = False,
    final: bool = False,
    alternate: bool = False,
    exhausted_pause: bool = False,
) -> ConversationState:
    """A conversation in ``phase``, driven there by real events where its behaviour can get
    there, else put there with ``with_phase`` (the handlers of those phases ignore behaviour).

    ``high``: occupancy was measured at 8,500 (warned) before the last request. ``pause``,
    ``retry``: a pause is then requested, a retryable failure then arrives. ``rounds_spent``:
    the turn has run its one tool round (``max_tool_rounds=1``); ``final``: the request in flight
    is the grace request after the limit.
    """
    start = new_conversation(
        model="claude-sonnet-4-5",
        behavior=behavior,
        context_window=WINDOW,
        parent_id="parent-1" if parent else None,
        system_tokens=system_tokens,
        max_attempts=max_attempts,
        max_continuations=0 if bound else 2,
        max_tool_rounds=1 if rounds_spent else 50,
    )
    idle = drive(start, UserMessage(text="hi", token_count=10), reply(8_500)) if high else start
    asking = drive(idle, UserMessage(text="next", token_count=10))
    if rounds_spent:
        first_round = reply(8_500 if high else 100, call("t0"))
        asking = drive(asking, first_round, ToolResult(tool_call_id="t0", output="x"))
    if final:
        asking = asking.with_phase(LlmRequesting(final=True))
    calls = tuple(call(call_id) for call_id in tools)
    state: ConversationState
    if phase == "idle":
        state = idle
    elif phase == "llm_requesting":
        state = asking
    elif phase == "tool_executing":
        state = drive(asking, reply(8_600 if high else 100, *calls))
    elif phase == "awaiting_checkpoint" and (exhausted_pause or purpose == "pause"):
        state = _pausing(behavior, idle, asking, calls, resume_after, exhausted=exhausted_pause)
    elif phase == "paused":
        state = drive(
            idle, PauseRequested(reason="nightly stop"), default_event("checkpoint_response")
        )
    elif phase == "failed":
        state = _failed_state(asking, behavior, recoverable=recoverable)
    else:
        state = _at_the_limit(phase, behavior, asking, calls if resume_after else ())
    if alternate:  # the summary was asked for again, with the other instruction
        state = drive(state, _blank(f"{phase.removeprefix('awaiting_')}_response"))
    if pause:
        state = drive(state, PauseRequested(reason="nightly stop"))
    if retry:
        state = drive(state, failure(_ANSWERS[phase], retryable=True))
    assert state.phase.kind == phase, f"could not reach {phase}: in {state.phase.kind}"
    return state


Fixture = Callable[[Row, ContextExhaustionBehavior, bool], tuple[ConversationState, Event]]
EventFor = Callable[[str, ConversationState], Event]
"""An event of the given kind for the given state."""


def case(event: EventFor | None = None, **options: Any) -> Fixture:
    """A fixture: ``reach(row.phase, ...)`` with ``options``, then ``event`` (the plain event of
    the row's kind when absent) for that state."""

    def build(
        row: Row, behavior: ContextExhaustionBehavior, parent: bool
    ) -> tuple[ConversationState, Event]:
        state = reach(row.phase, behavior, parent=parent, **options)
        return state, (event(row.event, state) if event else default_event(row.event))

    return build


def _projecting(tokens: int) -> EventFor:
    """The user message, tool result or resume that makes the projected prompt exactly
    ``tokens`` below the threshold (0: exactly at it)."""

    def build(kind: str, state: ConversationState) -> Event:
        needed = THRESHOLD - tokens - state.projected_tokens
        if kind == "user_message":
            return UserMessage(text="more", token_count=needed)
        if kind == "tool_result":
            return ToolResult(tool_call_id="t1", output="big", token_count=needed)
        assert isinstance(state.phase, Paused)
        fresh = state.config.system_tokens + estimate_tokens(
            compile_resume_context(state.phase.snapshot)
        )
        prompt_tokens = THRESHOLD - tokens - fresh
        return ResumeRequested(prompt="x" * (3 * (prompt_tokens - estimate_tokens(""))))

    return build


def _failed(**flags: bool) -> EventFor:
    return lambda kind, _state: failure(kind, **flags)


def _event(event: Event) -> EventFor:
    return lambda _kind, _state: event


def _answered_twice(
    behavior: ContextExhaustionBehavior, parent: bool
) -> tuple[ConversationState, Event]:
    """A duplicate result: its call is one of the response's, but already answered."""
    state = reach("tool_executing", behavior, parent=parent, tools=("t1", "t2"))
    answer = ToolResult(tool_call_id="t1", output="out", token_count=10)
    return drive(state, answer), answer


_TRUNCATED = LlmResponse(
    text="partial",
    tool_calls=(call("t1"),),
    usage=Usage(input_tokens=100),
    stop_reason="max_tokens",
)
_CUT = LlmResponse(text="cut", stop_reason="model_context_window_exceeded")
_CROSSING = reply(THRESHOLD, call("t1"))


def _blank(kind: str) -> Event:
    """An answer with no summary in it, of ``kind``."""
    if kind == "compaction_response":
        return CompactionResponse(summary="  ", retained_tokens=1_000)
    return ContinuationResponse(summary="   ")


_AT_THE_LIMIT = reply(THRESHOLD - estimate_tokens(TOOL_NOT_RUN_LIMIT), call("t1"))
"""A response just below the threshold whose one not-run result brings the prompt to it."""

FIXTURES: Final[dict[str, Fixture]] = {
    # resume_after=True where it matters: cancels and pauses must not take it over.
    "always": case(resume_after=True),
    "unhandled": case(),
    "message_too_large": case(_event(UserMessage(text="a paste", token_count=THRESHOLD))),
    "preflight_over": case(_projecting(0), high=True),
    "preflight_over_at_bound": case(_projecting(0), high=True, bound=True),
    "fits": case(_projecting(1)),
    "at_bound": case(bound=True),
    "pause_pending": case(pause=True, resume_after=True),
    "retry_pending": case(retry=True),
    "retry_due_current": case(_event(RetryDue(attempt=2)), retry=True),
    "stale_retry": case(_event(RetryDue(attempt=3)), retry=True),
    "context_overflow": case(_failed(overflow=True)),
    "context_overflow_at_bound": case(_failed(overflow=True), bound=True),
    "retryable_attempts_left": case(_failed(retryable=True)),
    "retryable_attempts_spent": case(_failed(retryable=True), max_attempts=1),
    "not_retryable": case(_failed()),
    "crosses_continuation": case(_event(_CROSSING), high=True),
    "crosses_continuation_at_bound": case(_event(_CROSSING), high=True, bound=True),
    "window_exceeded": case(_event(_CUT)),
    "window_exceeded_at_bound": case(_event(_CUT), bound=True),
    "truncated_pause_pending": case(_event(_TRUNCATED), pause=True),
    "truncated": case(_event(_TRUNCATED)),
    "final_tool_calls_pause_pending": case(_event(reply(100, call("t1"))), final=True, pause=True),
    "final_tool_calls": case(_event(reply(100, call("t1"))), final=True),
    "tool_round_limit": case(_event(reply(100, call("t1"))), rounds_spent=True),
    "tool_round_limit_preflight_over": case(_event(_AT_THE_LIMIT), rounds_spent=True, high=True),
    "tool_round_limit_preflight_over_at_bound": case(
        _event(_AT_THE_LIMIT), rounds_spent=True, high=True, bound=True
    ),
    "tool_round_limit_pause_pending": case(
        _event(reply(100, call("t1"))), rounds_spent=True, pause=True
    ),
    "has_tool_calls": case(_event(reply(100, call("t1")))),
    "ends_turn_pause_pending": case(pause=True),
    "crosses_warning": case(_event(reply(WARNING))),
    "usage_unknown": case(_event(LlmResponse(text="ok"))),
    "accounting_anomaly": case(_event(reply(WINDOW + 1))),
    "ends_turn": case(_event(reply(WARNING - 1))),
    "unknown_tool_call": lambda row, behavior, parent: _answered_twice(behavior, parent),
    "other_tools_pending": case(tools=("t1", "t2")),
    "summary_unusable_first": case(lambda kind, _state: _blank(kind)),
    "summary_unusable": case(_event(ContinuationResponse(summary="   ")), alternate=True),
    "summary_usable": case(),
    "gives_up": case(),
    "overflow_attempts_left": case(_failed(overflow=True)),
    "exhausted_pause": case(exhausted_pause=True),
    "pause_purpose": case(purpose="pause"),
    "seed_too_large": case(system_tokens=SEED_FILLER, resume_after=True),
    "resume_after": case(resume_after=True),
    "no_resume_after": case(),
    "gives_up_pause_purpose": case(purpose="pause"),
    "gives_up_seed_too_large": case(system_tokens=SEED_FILLER),
    "gives_up_pause_pending": case(pause=True),
    "gives_up_resume_after": case(resume_after=True),
    "gives_up_no_resume_after": case(),
    "retained_too_large": case(
        _event(CompactionResponse(summary="Older work.", retained_tokens=THRESHOLD))
    ),
    "unrecoverable": case(recoverable=False),
}
"""For each guard, how to build a state in a row's phase and an event that satisfy it: at the
exact threshold where the guard compares with one."""


def _canonical_parent(row: Row) -> bool:
    """The table's convention: intentionally_unhandled rows describe a sub-agent."""
    return row.behavior == B.INTENTIONALLY_UNHANDLED.value


def _cases() -> list[Any]:
    cases = []
    for row in ROWS:
        behaviors = BEHAVIORS if row.behavior == "*" else (B(row.behavior),)
        for behavior in behaviors:
            label = f"{row.id}-{row.phase}-{row.event}-{row.guard}-{behavior.value}"
            cases.append(pytest.param(row, behavior, id=label))
    return cases


# =========================================================================== (b) row by row


@pytest.mark.parametrize(("row", "behavior"), _cases())
def test_each_row_is_what_transition_does(row: Row, behavior: ContextExhaustionBehavior) -> None:
    parent = _canonical_parent(row)
    state, event = FIXTURES[row.guard](row, behavior, parent)
    assert state.phase.kind == row.phase
    assert event.kind == row.event
    reference = Reference(state, ROWS)
    selected = reference.select(event)
    if row.is_noop:
        assert selected is None
        assert row.pair not in HANDLED_PAIRS
    else:
        assert selected is not None, "the fixture satisfies no row of the pair"
        assert selected.id == row.id, f"the fixture selects {selected.id}: {selected.guard}"
    after, effects = transition(state, event)
    assert after.phase.kind == row.target
    assert [effect.kind for effect in effects] == list(row.effects)
    if row.is_noop:
        assert after is state
    assert reference.step(event) is not row.is_noop
    assert reference.phase == row.target
    assert reference.observed() == observed(after)


_FAILING_ROWS: Final = [
    pytest.param(row, behavior, id=f"{row.id}-{behavior.value}")
    for row in ROWS
    if "notify_failed" in row.effects
    for behavior in (BEHAVIORS if row.behavior == "*" else (B(row.behavior),))
]


@pytest.mark.parametrize(("row", "behavior"), _FAILING_ROWS)
def test_only_a_sub_agent_notifies_its_parent(
    row: Row, behavior: ContextExhaustionBehavior
) -> None:
    """The other half of the table's parent convention: flip parent_id, see notify_parent move."""
    parent = not _canonical_parent(row)
    state, event = FIXTURES[row.guard](row, behavior, parent)
    _, effects = transition(state, event)
    expected = [kind for kind in row.effects if kind != "notify_parent"]
    if parent and behavior is B.INTENTIONALLY_UNHANDLED:
        expected.insert(expected.index("notify_failed") + 1, "notify_parent")
    assert [effect.kind for effect in effects] == expected


# =========================================================================== (c) the pairs


def test_every_handled_pair_has_a_row_and_every_row_a_handler() -> None:
    pairs = {row.pair for row in ROWS if not row.is_noop}
    assert sorted(HANDLED_PAIRS - pairs) == [], "handled pairs the table does not describe"
    assert sorted(pairs - HANDLED_PAIRS) == [], "rows for pairs that have no handler"
    declared = {row.pair for row in ROWS if row.is_noop}
    assert sorted(declared & HANDLED_PAIRS) == [], "no-op declarations for handled pairs"
    for row in ROWS:
        if row.is_noop:
            assert (row.target, row.effects) == (row.phase, ()), row.id


def test_every_handled_pair_answers_every_behaviour() -> None:
    for phase, event in sorted(HANDLED_PAIRS):
        for behavior in BEHAVIORS:
            rows = [row for row in ROWS if row.pair == (phase, event)]
            assert any(row.applies_to(behavior.value) for row in rows), (phase, event, behavior)


def test_the_guard_vocabulary_is_used_defined_and_built() -> None:
    used = {row.guard for row in ROWS}
    assert set(TABLE.guards) == used
    assert set(GUARDS) == used
    assert set(FIXTURES) == used


def test_rows_are_numbered_in_order_and_cite_declared_requirements() -> None:
    assert [row.id for row in ROWS] == [f"T{index:03d}" for index in range(1, len(ROWS) + 1)]
    spec = (ROOT / "specs" / "requirements.md").read_text(encoding="utf-8")
    for row in ROWS:
        assert row.requirements, f"{row.id} cites no requirement"
        for requirement in row.requirements:
            assert f"### {requirement}:" in spec, f"{row.id} cites undeclared {requirement}"


def test_rows_of_a_pair_are_kept_together() -> None:
    """Order matters inside a pair (first match wins), so a pair's rows must be contiguous."""
    seen: list[tuple[str, str]] = []
    for row in ROWS:
        if not seen or seen[-1] != row.pair:
            assert row.pair not in seen, f"{row.id}: rows of {row.pair} are split"
            seen.append(row.pair)


# =========================================================================== (d) differential


_ROW_CASES: Final = [
    (row, behavior)
    for row in ROWS
    for behavior in (BEHAVIORS if row.behavior == "*" else (B(row.behavior),))
]
Run = tuple[ConversationState, tuple[Event, ...]]


@st.composite
def runs(draw: st.DrawFn) -> Run:
    """A start state and the events fed to it: half from a new conversation, half from a row's
    fixture (its event first), so rare corners of the table get random walks of their own."""
    if draw(st.booleans()):
        sequence = draw(event_sequences(max_size=40))
        return sequence.start, sequence.events
    row, behavior = draw(st.sampled_from(_ROW_CASES))
    state, event = FIXTURES[row.guard](row, behavior, _canonical_parent(row))
    after, _ = transition(state, event)
    sequence = draw(event_sequences(st.just(after), max_size=30))
    return state, (event, *sequence.events)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_the_reference_model_follows_transition(run: Run) -> None:
    state, events = run
    reference = Reference(state, ROWS)
    note(f"{state.config!r}")
    for index, event in enumerate(events):
        pair = (state.phase.kind, event.kind)
        chosen = reference.select(event)
        note(f"{index}: {pair[0]} + {event!r} -> {chosen.id if chosen else 'no row'}")
        fired = reference.step(event)
        state, _ = transition(state, event)
        assert fired == (pair in HANDLED_PAIRS), f"rows and handlers disagree on {pair}"
        assert reference.phase == state.phase.kind
        assert reference.observed() == observed(state)
