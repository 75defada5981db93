"""One or more scenario tests per requirement of ``specs/requirements.md``.

Every test is tagged with ``@requirement("REQ-...")`` and named after its id (``test_seg001_...``);
the last test parses the spec and fails when an id has no test here. Scenarios use exact integers
at the thresholds of a 200,000-token window: warning 160,000, continuation 180,000.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pydantic
import pytest

import test_chains
import test_control
import test_deleted_streams
import test_imports
import test_redo_summary
from scenario import Playbook, requirement, requirements_of, unpaired_tool_uses
from segue import (
    CANCELLED_SUMMARY,
    EVENT_TYPES,
    FALLBACK_SUMMARY,
    HANDLED_PAIRS,
    PHASE_TYPES,
    AwaitingCheckpoint,
    AwaitingContinuation,
    CheckpointFailed,
    CheckpointResponse,
    Compacting,
    CompactionBlock,
    CompactionFailed,
    CompactionResponse,
    CompactionUndoRequested,
    ContextExhausted,
    ContextExhaustionBehavior,
    ContinuationFailed,
    ContinuationRedone,
    ContinuationResponse,
    ConversationState,
    ErrorKind,
    Failed,
    GitState,
    Idle,
    LlmError,
    LlmRequesting,
    LlmResponse,
    ManualContinuation,
    Message,
    Paused,
    PauseRequested,
    ProviderCompacted,
    ResumeRequested,
    RetryDue,
    SessionSnapshot,
    SummaryRedoRequested,
    ToolCall,
    ToolExecuting,
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
    threshold_tokens,
    transition,
)
from segue.effects import (
    AppendMessage,
    ArchiveTranscript,
    CancelRequest,
    Effect,
    NotifyCompactionFailed,
    NotifyCompactionFallback,
    NotifyContextExhausted,
    NotifyContextWarning,
    NotifyFailed,
    NotifyParent,
    NotifyToolRoundLimit,
    NotifyTruncated,
    RejectUserMessage,
    ReportAccountingAnomaly,
    RequestCheckpoint,
    RequestCompaction,
    RequestContinuation,
    RequestLlm,
    SaveSnapshot,
    ScheduleRetry,
    StartGeneration,
    StartSession,
)
from segue.statemachine.checkpoint import (
    CONTINUE_PREVIOUS_WORK,
    extract_decisions,
)
from segue.statemachine.machine import (
    COMPACTION_FALLBACK_SUMMARY,
    RESUME_PROMPT,
    TOOL_NOT_RUN_CANCELLED,
    TOOL_NOT_RUN_CONTEXT,
    TOOL_NOT_RUN_LIMIT,
)

B = ContextExhaustionBehavior
MODEL = "claude-sonnet-4-5"
WINDOW = 200_000
WARNING = 160_000
THRESHOLD = 180_000
SPEC = Path(__file__).resolve().parents[1] / "specs" / "requirements.md"

# --------------------------------------------------------------------------- builders


def conversation(
    behavior: ContextExhaustionBehavior = B.THRESHOLD_BASED_CONTINUATION, **settings: Any
) -> ConversationState:
    """A new 200k-window conversation."""
    return new_conversation(model=MODEL, behavior=behavior, **settings)


def usage(tokens: int) -> Usage:
    return Usage(input_tokens=tokens)


def call(number: int) -> ToolCall:
    return ToolCall(id=f"toolu_{number}", name="bash", input={"cmd": f"step {number}"})


def reply(
    tokens: int | None, *calls: ToolCall, text: str = "ok", stop: str = "end_turn"
) -> LlmResponse:
    """An LLM response whose usage states ``tokens`` of occupancy (``None``: no usage)."""
    return LlmResponse(
        text=text,
        tool_calls=calls,
        usage=None if tokens is None else usage(tokens),
        stop_reason=stop,
    )


def assistant(
    tokens: int | None, *calls: ToolCall, text: str = "ok", **where: Any
) -> AppendMessage:
    return AppendMessage(
        message=Message(
            kind="assistant",
            text=text,
            tool_calls=calls,
            usage=None if tokens is None else usage(tokens),
            **where,
        )
    )


def user(text: str, **where: Any) -> AppendMessage:
    return AppendMessage(message=Message(kind="user", text=text, **where))


def tool_result(
    call_id: str, output: str, *, is_error: bool = False, **where: Any
) -> AppendMessage:
    return AppendMessage(
        message=Message(
            kind="tool_result", text=output, tool_call_id=call_id, is_error=is_error, **where
        )
    )


def not_run(tool: ToolCall, why: str = TOOL_NOT_RUN_CONTEXT) -> AppendMessage:
    return tool_result(tool.id, why, is_error=True)


def continuation(summary: str) -> AppendMessage:
    return AppendMessage(message=Message(kind="continuation", text=summary))


def warning(tokens: int, window: int = WINDOW) -> NotifyContextWarning:
    return NotifyContextWarning(context_tokens=tokens, context_window=window)


def asking(
    behavior: ContextExhaustionBehavior = B.THRESHOLD_BASED_CONTINUATION, **settings: Any
) -> Playbook:
    """A conversation whose first request is in flight."""
    return Playbook(conversation(behavior, **settings)).given(UserMessage(text="hello"))


def idle_at(
    tokens: int,
    behavior: ContextExhaustionBehavior = B.THRESHOLD_BASED_CONTINUATION,
    **settings: Any,
) -> Playbook:
    """A conversation back in Idle after a response that measured ``tokens``."""
    return asking(behavior, **settings).given(reply(tokens)).in_phase("idle")


def summarising(*calls: ToolCall) -> Playbook:
    """A THRESHOLD_BASED_CONTINUATION conversation waiting for its summary."""
    playbook = asking().given(reply(THRESHOLD, *calls))
    return playbook.in_phase("awaiting_continuation")


def effects_text(effects: list[Effect]) -> str:
    return "\n".join(repr(effect) for effect in effects)


# =========================================================================== bedrock


@requirement("REQ-BED-019", "REQ-SEG-025")
def test_bed019_one_token_below_the_threshold_continues_normally() -> None:
    playbook = asking() >> reply(179_999) << [warning(179_999), assistant(179_999)]
    playbook.in_phase("idle")
    assert playbook.state.context_tokens == 179_999


@requirement("REQ-BED-019", "REQ-SEG-025")
def test_bed019_exactly_at_the_threshold_starts_the_continuation_flow() -> None:
    playbook = (
        asking()
        >> reply(THRESHOLD)
        << [
            warning(THRESHOLD),
            assistant(THRESHOLD),
            RequestContinuation(rejected_tool_calls=()),
        ]
    )
    assert playbook.phase == AwaitingContinuation(
        trigger="threshold", trigger_usage=usage(THRESHOLD)
    )
    assert playbook.state.context_tokens == THRESHOLD


@requirement("REQ-BED-019")
def test_bed019_the_check_runs_after_every_response_of_a_tool_turn() -> None:
    playbook = asking() >> reply(100_000, call(1)) << ["append_message", "execute_tools"]
    playbook >> ToolResult(tool_call_id="toolu_1", output="done", token_count=50)
    playbook << ["append_message", RequestLlm(attempt=1)]
    (
        playbook
        >> reply(185_000, text="more")
        << [
            warning(185_000),
            assistant(185_000, text="more"),
            RequestContinuation(),
        ]
    )
    playbook.in_phase("awaiting_continuation")


@requirement("REQ-BED-019")
def test_bed019_user_messages_are_refused_once_the_flow_started() -> None:
    playbook = summarising()
    before = playbook.state
    playbook >> UserMessage(text="one more thing") << [RejectUserMessage]
    assert playbook.state is before


@requirement("REQ-BED-020")
def test_bed020_the_summary_is_stored_as_a_continuation_message() -> None:
    playbook = summarising()
    assert playbook.effects[-1] == RequestContinuation()
    playbook >> ContinuationResponse(summary="  We built the parser; tests pass.  ")
    summary = "We built the parser; tests pass."
    playbook << [continuation(summary), NotifyContextExhausted(summary=summary)]
    assert playbook.phase == ContextExhausted(summary=summary, trigger_usage=usage(THRESHOLD))
    assert playbook.messages[-1].kind == "continuation"


@requirement("REQ-BED-021")
def test_bed021_exhausted_conversation_rejects_user_messages_with_an_explanation() -> None:
    playbook = summarising().given(ContinuationResponse(summary="S"))
    before = playbook.state
    playbook >> UserMessage(text="hello?") << [RejectUserMessage]
    reason = playbook.effects[0].reason  # type: ignore[union-attr]  # checked: RejectUserMessage
    assert "context limit" in reason
    assert "new conversation" in reason
    assert playbook.state is before


@requirement("REQ-BED-021", "REQ-SEG-022")
@pytest.mark.parametrize(
    "event",
    [
        reply(10),
        LlmError(message="x"),
        ToolResult(tool_call_id="toolu_1", output="x"),
        ContinuationResponse(summary="a second summary"),
        ContinuationFailed(error="x"),
        CheckpointResponse(text="x"),
        CompactionResponse(summary="x", retained_tokens=1),
        RetryDue(attempt=2),
        UserCancel(),
        ManualContinuation(),
        PauseRequested(),
        ResumeRequested(),
    ],
    ids=lambda event: event.kind,
)
def test_bed021_every_other_event_changes_nothing_when_exhausted(event: Any) -> None:
    state = summarising().given(ContinuationResponse(summary="S")).state
    assert transition(state, event) == (state, ())


@requirement("REQ-BED-021")
def test_bed021_a_new_conversation_links_to_its_parent() -> None:
    parent = summarising().given(ContinuationResponse(summary="S")).state
    child = new_conversation(model=parent.model, parent_id=parent.id)
    assert child.parent_id == parent.id
    assert child.id == f"{parent.id}.child"
    assert (child.phase, child.context_tokens) == (Idle(), None)


@requirement("REQ-BED-022")
def test_bed022_unknown_model_uses_the_smallest_known_window() -> None:
    state = new_conversation(model="some-future-model")
    assert (state.context_window, state.config.continuation_tokens) == (200_000, 180_000)
    below = Playbook(state).given(UserMessage(text="hi")) >> reply(179_999)
    below << ["notify_context_warning", "append_message"]
    below.in_phase("idle")
    at = Playbook(state).given(UserMessage(text="hi")) >> reply(180_000)
    at << ["notify_context_warning", "append_message", "request_continuation"]


@requirement("REQ-BED-022")
def test_bed022_an_unknown_model_of_a_known_provider_gets_its_smallest_window() -> None:
    """gpt-4o's 128,000, not 200,000: guessed larger, the provider's limit comes first."""
    state = new_conversation(model="gpt-9-preview")
    assert (state.context_window, state.config.continuation_tokens) == (128_000, 115_200)
    at = Playbook(state).given(UserMessage(text="hi")) >> reply(115_200)
    at << ["notify_context_warning", "append_message", "request_continuation"]


@requirement("REQ-BED-022", "REQ-SEG-025")
def test_bed022_a_1m_model_continues_at_900000() -> None:
    state = new_conversation(model="claude-opus-4-6")
    below = Playbook(state).given(UserMessage(text="hi")) >> reply(899_999)
    below << [warning(899_999, 1_000_000), assistant(899_999)]
    below.in_phase("idle")
    at = Playbook(state).given(UserMessage(text="hi")) >> reply(900_000)
    at << [warning(900_000, 1_000_000), assistant(900_000), RequestContinuation()]
    # 180,000 is nothing special on a 1M window: no warning, no continuation.
    small = Playbook(state).given(UserMessage(text="hi")) >> reply(180_000)
    small << [assistant(180_000)]


@requirement("REQ-BED-022")
def test_bed022_window_reported_by_the_provider_overrides_the_table() -> None:
    state = new_conversation(model="some-future-model", context_window=500_000)
    playbook = Playbook(state).given(UserMessage(text="hi")) >> reply(449_999)
    playbook << [warning(449_999, 500_000), assistant(449_999)]


@requirement("REQ-BED-023", "REQ-SEG-025")
def test_bed023_warning_at_exactly_80_percent_and_only_once() -> None:
    playbook = asking() >> reply(159_999) << [assistant(159_999)]
    playbook.given(UserMessage(text="next")) >> reply(WARNING)
    playbook << [warning(WARNING), assistant(WARNING)]
    assert playbook.state.warned
    playbook.given(UserMessage(text="next")) >> reply(170_000) << [assistant(170_000)]
    playbook.in_phase("idle")


@requirement("REQ-BED-023")
def test_bed023_warning_ratio() -> None:
    assert warning(WARNING).ratio == 0.8


@requirement("REQ-BED-023")
def test_bed023_manual_continuation_behaves_like_the_automatic_one() -> None:
    manual = idle_at(170_000) >> ManualContinuation() << [RequestContinuation()]
    automatic = asking().given(reply(170_000), UserMessage(text="go on"))
    automatic >> reply(180_000) << [assistant(180_000), RequestContinuation()]
    assert manual.phase == AwaitingContinuation(trigger="manual")
    assert automatic.phase == AwaitingContinuation(
        trigger="threshold", trigger_usage=usage(180_000)
    )
    for playbook in (manual, automatic):
        playbook >> ContinuationResponse(summary="S")
        playbook << [continuation("S"), NotifyContextExhausted(summary="S")]
        assert isinstance(playbook.phase, ContextExhausted)
        assert playbook.phase.summary == "S"
    failing = idle_at(10).given(ManualContinuation()) >> ContinuationFailed(error="e")
    failing << [continuation(FALLBACK_SUMMARY), NotifyContextExhausted(summary=FALLBACK_SUMMARY)]


@requirement("REQ-BED-023")
@pytest.mark.parametrize("behavior", list(B))
def test_bed023_manual_continuation_takes_each_behaviours_path(
    behavior: ContextExhaustionBehavior,
) -> None:
    expected: dict[ContextExhaustionBehavior, list[Any]] = {
        B.THRESHOLD_BASED_CONTINUATION: [RequestContinuation()],
        B.INTENTIONALLY_UNHANDLED: [NotifyFailed],
        B.CHECKPOINT_RESTART: [RequestCheckpoint(purpose="restart")],
        B.COMPACT_IN_PLACE: [ArchiveTranscript(generation=1), RequestCompaction()],
        B.CHECKPOINT_PAUSE: [RequestCheckpoint(purpose="pause")],
    }
    idle_at(10, behavior) >> ManualContinuation() << expected[behavior]


@requirement("REQ-BED-023", "REQ-SEG-022")
def test_bed023_manual_continuation_while_busy_changes_nothing() -> None:
    for playbook in (asking(), asking().given(reply(10, call(1)))):
        state = playbook.state
        assert transition(state, ManualContinuation()) == (state, ())


# =========================================================================== accounting


@requirement("REQ-SEG-003")
def test_seg003_a_summary_answer_above_the_window_is_an_anomaly() -> None:
    playbook = summarising() >> ContinuationResponse(summary="done", usage=usage(WINDOW + 5))
    recorded = AppendMessage(
        message=Message(kind="continuation", text="done", usage=usage(WINDOW + 5))
    )
    playbook << [ReportAccountingAnomaly, recorded, NotifyContextExhausted]
    assert playbook.state.context_tokens == THRESHOLD


@requirement("REQ-SEG-001")
def test_seg001_occupancy_sums_the_four_usage_fields() -> None:
    def four(cache_read: int) -> Usage:
        return Usage(
            input_tokens=1_000,
            output_tokens=2_000,
            cache_creation_input_tokens=7_000,
            cache_read_input_tokens=cache_read,
        )

    below = asking() >> LlmResponse(text="ok", usage=four(169_999))
    below << ["notify_context_warning", "append_message"]
    assert below.state.context_tokens == 179_999
    at = asking() >> LlmResponse(text="ok", usage=four(170_000))
    at << [warning(180_000), "append_message", "request_continuation"]
    assert at.state.context_tokens == 180_000


@requirement("REQ-SEG-001")
def test_seg001_a_three_call_turn_does_not_read_three_times_too_full() -> None:
    playbook = asking()
    for number, tokens in enumerate((60_000, 62_000), start=1):
        (
            playbook
            >> reply(tokens, call(number))
            << [assistant(tokens, call(number)), "execute_tools"]
        )
        playbook >> ToolResult(tool_call_id=f"toolu_{number}", output="ok", token_count=100)
        playbook << ["append_message", "request_llm"]
    playbook >> reply(64_000) << [assistant(64_000)]  # 186,000 if summed: would continue
    playbook.in_phase("idle")
    assert playbook.state.context_tokens == 64_000
    assert not playbook.state.warned


@requirement("REQ-SEG-001")
def test_seg001_a_later_figure_replaces_the_earlier_one() -> None:
    playbook = idle_at(150_000).given(UserMessage(text="next")) >> reply(90_000)
    playbook << [assistant(90_000)]
    assert (playbook.state.context_tokens, playbook.state.pending_tokens) == (90_000, 0)


UNKNOWN_USAGE = [None, Usage(), Usage(output_tokens=120)]
"""Reports that say nothing about occupancy: no prompt can hold zero tokens."""


@requirement("REQ-SEG-002")
@pytest.mark.parametrize("unknown", UNKNOWN_USAGE, ids=["absent", "all-zero", "output-only"])
def test_seg002_unknown_usage_keeps_the_last_figure(unknown: Usage | None) -> None:
    playbook = idle_at(100_000).given(UserMessage(text="next", token_count=40))
    playbook >> LlmResponse(text="answer", usage=unknown)
    playbook << [AppendMessage(message=Message(kind="assistant", text="answer", usage=unknown))]
    assert playbook.state.context_tokens == 100_000
    assert playbook.state.pending_tokens == 40 + estimate_tokens("answer")


@requirement("REQ-SEG-002")
@pytest.mark.parametrize("unknown", UNKNOWN_USAGE, ids=["absent", "all-zero", "output-only"])
def test_seg002_unknown_usage_never_triggers(unknown: Usage | None) -> None:
    playbook = idle_at(179_000).given(UserMessage(text="next", token_count=10))
    playbook >> LlmResponse(text="x" * 30_000, usage=unknown) << ["append_message"]
    playbook.in_phase("idle")
    fresh = asking() >> LlmResponse(text="first", usage=unknown) << ["append_message"]
    fresh.in_phase("idle")
    assert fresh.state.context_tokens is None


@requirement("REQ-SEG-003")
def test_seg003_one_token_above_the_window_is_an_anomaly_not_exhaustion() -> None:
    playbook = idle_at(100_000).given(UserMessage(text="next", token_count=10))
    (
        playbook
        >> reply(WINDOW + 1)
        << [
            ReportAccountingAnomaly(reported_tokens=200_001, context_window=200_000),
            assistant(WINDOW + 1),
        ]
    )
    playbook.in_phase("idle")
    assert playbook.state.context_tokens == 100_000
    assert not playbook.state.warned


@requirement("REQ-SEG-003")
def test_seg003_aggregated_sdk_usage_is_an_anomaly() -> None:
    aggregated = Usage(input_tokens=12, output_tokens=3_400, cache_read_input_tokens=1_432_262)
    playbook = asking() >> LlmResponse(text="ok", usage=aggregated)
    playbook << [
        ReportAccountingAnomaly(reported_tokens=1_435_674, context_window=WINDOW),
        "append_message",
    ]
    playbook.in_phase("idle")
    assert playbook.state.context_tokens is None


@requirement("REQ-SEG-003")
def test_seg003_exactly_the_window_is_occupancy_not_an_anomaly() -> None:
    asking() >> reply(WINDOW) << [warning(WINDOW), assistant(WINDOW), RequestContinuation()]


@requirement("REQ-SEG-004", "REQ-SEG-025")
def test_seg004_preflight_on_a_user_message() -> None:
    below = idle_at(170_000) >> UserMessage(text="next", token_count=9_999)
    below << [user("next"), RequestLlm()]
    assert below.state.projected_tokens == 179_999
    at = idle_at(170_000) >> UserMessage(text="next", token_count=10_000)
    at << [user("next"), RequestContinuation()]
    assert at.phase == AwaitingContinuation(trigger="preflight")


@requirement("REQ-SEG-004")
def test_seg004_preflight_uses_the_estimate_when_no_count_is_given() -> None:
    text = "a" * 30
    assert estimate_tokens(text) == 18  # 30 bytes / 3 + 8 tokens of framing
    (idle_at(179_981) >> UserMessage(text=text)) << [user(text), RequestLlm()]
    (idle_at(179_982) >> UserMessage(text=text)) << [user(text), RequestContinuation()]


@requirement("REQ-SEG-004")
def test_seg004_preflight_after_the_last_tool_result() -> None:
    for output_tokens, expected in ((9_999, RequestLlm()), (10_000, RequestContinuation())):
        playbook = asking().given(reply(170_000, call(1), call(2)))
        playbook >> ToolResult(tool_call_id="toolu_2", output="b", token_count=5_000)
        playbook << [tool_result("toolu_2", "b")]  # one still pending: no request yet
        playbook >> ToolResult(
            tool_call_id="toolu_1", output="a", token_count=output_tokens - 5_000
        )
        playbook << [tool_result("toolu_1", "a"), expected]


@requirement("REQ-SEG-004")
def test_seg004_the_system_prompt_counts_before_the_first_response() -> None:
    start = conversation(system_tokens=179_990)
    (Playbook(start) >> UserMessage(text="hi", token_count=9)) << [user("hi"), RequestLlm()]
    (Playbook(start) >> UserMessage(text="hi", token_count=10)) << [
        user("hi"),
        RequestContinuation(),
    ]


@requirement("REQ-SEG-004", "REQ-SEG-013")
def test_seg004_preflight_fails_a_sub_agent() -> None:
    playbook = idle_at(175_000, B.INTENTIONALLY_UNHANDLED, parent_id="parent")
    playbook >> UserMessage(text="next", token_count=5_000)
    playbook << [user("next"), NotifyFailed, NotifyParent]
    assert playbook.phase.error_kind is ErrorKind.CONTEXT_EXHAUSTED


@requirement("REQ-SEG-005")
def test_seg005_a_message_at_the_threshold_is_rejected_and_not_recorded() -> None:
    start = conversation()
    playbook = Playbook(start) >> UserMessage(text="huge", token_count=180_000)
    playbook << [RejectUserMessage]
    assert playbook.state is start
    assert "180,000" in playbook.effects[0].reason  # type: ignore[union-attr]  # checked above
    fits = Playbook(start) >> UserMessage(text="big", token_count=179_999)
    fits << [user("big"), RequestLlm()]


@requirement("REQ-SEG-005")
def test_seg005_an_estimated_oversize_message_is_rejected() -> None:
    start = conversation()
    text = "a" * (3 * (THRESHOLD - 8))  # estimate: exactly 180,000 tokens
    assert estimate_tokens(text) == THRESHOLD
    (Playbook(start) >> UserMessage(text=text)) << [RejectUserMessage]
    (Playbook(start) >> UserMessage(text=text[:-3])) << ["append_message", "request_llm"]


# =========================================================================== exhaustion path


@requirement("REQ-SEG-006")
def test_seg006_tools_at_the_threshold_are_rejected_not_run() -> None:
    playbook = asking() >> reply(THRESHOLD, call(1), call(2), text="running two tools")
    playbook << [
        warning(THRESHOLD),
        assistant(THRESHOLD, call(1), call(2), text="running two tools"),
        not_run(call(1)),
        not_run(call(2)),
        RequestContinuation(rejected_tool_calls=(call(1), call(2))),
    ]
    assert playbook.phase.rejected_tool_calls == (call(1), call(2))
    assert unpaired_tool_uses(playbook.messages) == []
    assert TOOL_NOT_RUN_CONTEXT == "Not run: the context window is nearly full."


@requirement("REQ-SEG-006")
def test_seg006_rejected_tools_are_named_to_checkpoint_and_compaction_requests() -> None:
    restart = asking(B.CHECKPOINT_RESTART) >> reply(THRESHOLD, call(1))
    restart << [
        "notify_context_warning",
        "append_message",
        not_run(call(1)),
        RequestCheckpoint(purpose="restart", rejected_tool_calls=(call(1),)),
    ]
    compact = asking(B.COMPACT_IN_PLACE) >> reply(THRESHOLD, call(1))
    compact << [
        "notify_context_warning",
        "append_message",
        not_run(call(1)),
        ArchiveTranscript(generation=1),
        RequestCompaction(rejected_tool_calls=(call(1),)),
    ]


@requirement("REQ-SEG-006")
def test_seg006_rejected_tools_are_kept_across_retries_of_the_summary() -> None:
    playbook = summarising(call(7))
    playbook >> ContinuationFailed(error="overloaded", retryable=True) << [ScheduleRetry]
    playbook >> RetryDue(attempt=2)
    playbook << [RequestContinuation(rejected_tool_calls=(call(7),), attempt=2)]


@requirement("REQ-SEG-007")
@pytest.mark.parametrize("retryable", [False, True])
def test_seg007_provider_overflow_takes_the_exhaustion_path(retryable: bool) -> None:
    error = LlmError(
        message="prompt is too long: 210000 tokens > 200000 maximum",
        retryable=retryable,
        context_overflow=True,
    )
    playbook = idle_at(150_000).given(UserMessage(text="next", token_count=10)) >> error
    playbook << [RequestContinuation()]
    assert playbook.phase == AwaitingContinuation(trigger="overflow")


@requirement("REQ-SEG-007")
def test_seg007_window_exceeded_stop_reason_below_the_threshold() -> None:
    event = reply(150_000, call(1), text="cut", stop="model_context_window_exceeded")
    playbook = asking() >> event
    playbook << [
        assistant(150_000, call(1), text="cut"),
        not_run(call(1)),
        RequestContinuation(rejected_tool_calls=(call(1),)),
    ]
    assert playbook.phase.trigger == "overflow"


@requirement("REQ-SEG-007", "REQ-SEG-013")
def test_seg007_provider_overflow_fails_a_sub_agent() -> None:
    playbook = asking(B.INTENTIONALLY_UNHANDLED) >> LlmError(
        message="too long", context_overflow=True
    )
    playbook << [NotifyFailed]
    assert playbook.phase.error_kind is ErrorKind.CONTEXT_EXHAUSTED


@requirement("REQ-SEG-008")
def test_seg008_max_tokens_keeps_the_text_and_drops_the_tools() -> None:
    playbook = asking() >> reply(50_000, call(1), text="partial", stop="max_tokens")
    playbook << [assistant(50_000, text="partial"), NotifyTruncated(dropped_tool_calls=(call(1),))]
    playbook.in_phase("idle")
    assert playbook.messages[-1].tool_calls == ()
    assert unpaired_tool_uses(playbook.messages) == []


@requirement("REQ-SEG-008")
def test_seg008_max_tokens_without_tools_still_says_so() -> None:
    playbook = asking() >> reply(50_000, text="partial", stop="max_tokens")
    playbook << [assistant(50_000, text="partial"), NotifyTruncated(dropped_tool_calls=())]


@requirement("REQ-SEG-009")
def test_seg009_llm_retries_are_bounded_with_growing_delays() -> None:
    playbook = asking()
    for attempt, delay in ((2, 1.0), (3, 2.0), (4, 4.0)):
        playbook >> LlmError(message="overloaded", retryable=True)
        playbook << [ScheduleRetry(request="llm", attempt=attempt, delay_seconds=delay)]
        assert playbook.phase == LlmRequesting(attempt=attempt - 1, retry_pending=True)
        playbook >> RetryDue(attempt=attempt) << [RequestLlm(attempt=attempt)]
    playbook >> LlmError(message="overloaded", retryable=True)
    message = "The LLM request failed 4 times; last error: overloaded"
    playbook << [NotifyFailed(error_kind=ErrorKind.RETRIES_EXHAUSTED, message=message)]
    assert playbook.phase == Failed(error_kind=ErrorKind.RETRIES_EXHAUSTED, message=message)


@requirement("REQ-SEG-009")
def test_seg009_backoff_is_capped() -> None:
    playbook = asking(max_attempts=10)
    delays: list[float] = []
    for attempt in range(2, 11):
        playbook >> LlmError(message="429", retryable=True) << [ScheduleRetry]
        delays.append(playbook.effects[0].delay_seconds)  # type: ignore[union-attr]  # checked
        playbook >> RetryDue(attempt=attempt) << [RequestLlm(attempt=attempt)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]


@requirement("REQ-SEG-009")
def test_seg009_a_retry_waits_at_least_what_the_provider_asked() -> None:
    playbook = asking()
    playbook >> LlmError(message="429", retryable=True, retry_after=12.5)
    playbook << [ScheduleRetry(request="llm", attempt=2, delay_seconds=12.5)]
    playbook >> RetryDue(attempt=2) << [RequestLlm(attempt=2)]
    playbook >> LlmError(message="429", retryable=True, retry_after=0.25)  # shorter: backoff
    playbook << [ScheduleRetry(request="llm", attempt=3, delay_seconds=2.0)]
    summary = summarising() >> ContinuationFailed(error="529", retryable=True, retry_after=40)
    summary << [ScheduleRetry(request="continuation", attempt=2, delay_seconds=40.0)]
    with pytest.raises(pydantic.ValidationError):
        LlmError(message="x", retryable=True, retry_after=-1)


@requirement("REQ-SEG-009")
def test_seg009_a_non_retryable_error_fails_at_once() -> None:
    playbook = asking() >> LlmError(message="invalid api key")
    message = "The LLM request failed: invalid api key"
    playbook << [NotifyFailed(error_kind=ErrorKind.LLM_ERROR, message=message)]
    assert playbook.phase == Failed(error_kind=ErrorKind.LLM_ERROR, message=message)


@requirement("REQ-SEG-009", "REQ-SEG-022")
def test_seg009_stale_timers_and_late_answers_are_ignored() -> None:
    playbook = asking().given(LlmError(message="overloaded", retryable=True))
    waiting = playbook.state
    for stale in (
        RetryDue(attempt=1),
        RetryDue(attempt=3),
        reply(10),
        LlmError(message="late"),
        LlmError(message="late", context_overflow=True),
    ):
        assert transition(waiting, stale) == (waiting, ()), stale
    playbook >> RetryDue(attempt=2) << [RequestLlm(attempt=2)]
    sent = playbook.state
    assert transition(sent, RetryDue(attempt=2)) == (sent, ())  # the same timer twice


@requirement("REQ-SEG-009", "REQ-SEG-021")
def test_seg009_answers_after_a_cancel_are_ignored() -> None:
    playbook = asking().given(LlmError(message="overloaded", retryable=True))
    playbook >> UserCancel() << [CancelRequest()]
    playbook.in_phase("idle")
    idle = playbook.state
    for late in (reply(10), LlmError(message="late"), RetryDue(attempt=2)):
        assert transition(idle, late) == (idle, ()), late


@requirement("REQ-SEG-009")
def test_seg009_summary_retries_are_bounded_and_wait_for_their_timer() -> None:
    playbook = summarising()
    for attempt, delay in ((2, 1.0), (3, 2.0), (4, 4.0)):
        playbook >> ContinuationFailed(error="overloaded", retryable=True)
        playbook << [ScheduleRetry(request="continuation", attempt=attempt, delay_seconds=delay)]
        waiting = playbook.state
        assert transition(waiting, ContinuationResponse(summary="late")) == (waiting, ())
        assert transition(waiting, RetryDue(attempt=attempt + 1)) == (waiting, ())
        playbook >> RetryDue(attempt=attempt) << [RequestContinuation(attempt=attempt)]
    playbook >> ContinuationFailed(error="overloaded", retryable=True)
    playbook << [continuation(FALLBACK_SUMMARY), NotifyContextExhausted(summary=FALLBACK_SUMMARY)]


@requirement("REQ-SEG-009")
def test_seg009_checkpoint_and_compaction_retries_name_their_request() -> None:
    checkpoint = asking(B.CHECKPOINT_RESTART).given(reply(THRESHOLD))
    checkpoint >> CheckpointFailed(error="503", retryable=True)
    checkpoint << [ScheduleRetry(request="checkpoint", attempt=2, delay_seconds=1.0)]
    checkpoint >> RetryDue(attempt=2) << [RequestCheckpoint(attempt=2)]
    compaction = asking(B.COMPACT_IN_PLACE).given(reply(THRESHOLD))
    compaction >> CompactionFailed(error="503", retryable=True)
    compaction << [ScheduleRetry(request="compaction", attempt=2, delay_seconds=1.0)]
    compaction >> RetryDue(attempt=2) << [RequestCompaction(attempt=2)]


@requirement("REQ-SEG-010")
def test_seg010_summary_overflow_trims_more_history_each_time() -> None:
    playbook = summarising(call(1))
    for attempt in (2, 3, 4):
        playbook >> ContinuationFailed(error="prompt is too long", context_overflow=True)
        playbook << [
            RequestContinuation(
                rejected_tool_calls=(call(1),), attempt=attempt, trim_level=attempt - 1
            )
        ]
        assert playbook.phase.trim_level == attempt - 1
    playbook >> ContinuationFailed(error="prompt is too long", context_overflow=True)
    playbook << [continuation(FALLBACK_SUMMARY), NotifyContextExhausted(summary=FALLBACK_SUMMARY)]


@requirement("REQ-SEG-010")
def test_seg010_trim_level_survives_a_retry() -> None:
    playbook = summarising()
    playbook >> ContinuationFailed(error="too long", context_overflow=True)
    playbook << [RequestContinuation(attempt=2, trim_level=1)]
    playbook >> ContinuationFailed(error="overloaded", retryable=True) << [ScheduleRetry]
    playbook >> RetryDue(attempt=3) << [RequestContinuation(attempt=3, trim_level=1)]


@requirement("REQ-SEG-010")
def test_seg010_checkpoint_and_compaction_overflow_trim_too() -> None:
    checkpoint = asking(B.CHECKPOINT_RESTART).given(reply(THRESHOLD))
    checkpoint >> CheckpointFailed(error="too long", context_overflow=True)
    checkpoint << [RequestCheckpoint(attempt=2, trim_level=1)]
    compaction = asking(B.COMPACT_IN_PLACE).given(reply(THRESHOLD))
    compaction >> CompactionFailed(error="too long", context_overflow=True)
    compaction << [RequestCompaction(attempt=2, trim_level=1)]


@requirement("REQ-SEG-011")
def test_seg011_fallback_summary_text() -> None:
    assert FALLBACK_SUMMARY == (
        "Context limit reached. The continuation summary could not be generated. "
        "Please start a new conversation."
    )


@requirement("REQ-SEG-011")
@pytest.mark.parametrize(
    "event",
    [
        ContinuationFailed(error="SECRET-ERROR-42: invalid request"),
        ContinuationFailed(error="SECRET-ERROR-42", retryable=False, context_overflow=False),
    ],
    ids=["failed", "failed-plain"],
)
def test_seg011_final_failure_gives_the_fallback(event: Any) -> None:
    playbook = summarising() >> event
    playbook << [continuation(FALLBACK_SUMMARY), NotifyContextExhausted(summary=FALLBACK_SUMMARY)]
    assert playbook.phase == ContextExhausted(
        summary=FALLBACK_SUMMARY, trigger_usage=usage(THRESHOLD)
    )
    assert "SECRET-ERROR-42" not in effects_text(playbook.all_effects())
    assert "SECRET-ERROR-42" not in repr(playbook.state)


@requirement("REQ-SEG-011", "REQ-SEG-031")
@pytest.mark.parametrize(
    "event",
    [
        ContinuationResponse(summary=""),
        ContinuationResponse(summary="  \n\t "),
        ContinuationResponse(
            summary="SECRET-ERROR-42 I can't help with that.", stop_reason="refusal"
        ),
    ],
    ids=["empty", "blank", "refused"],
)
def test_seg011_an_empty_or_refused_summary_twice_gives_the_fallback(event: Any) -> None:
    playbook = summarising() >> event << [RequestContinuation(alternate=True)]
    playbook >> event
    playbook << [continuation(FALLBACK_SUMMARY), NotifyContextExhausted(summary=FALLBACK_SUMMARY)]
    assert isinstance(playbook.phase, ContextExhausted)
    assert playbook.phase.summary == FALLBACK_SUMMARY
    assert "SECRET-ERROR-42" not in effects_text(playbook.all_effects())
    assert "SECRET-ERROR-42" not in repr(playbook.state)


@requirement("REQ-SEG-011")
def test_seg011_the_error_text_never_becomes_the_summary_after_retries() -> None:
    playbook = summarising()
    for attempt in (2, 3, 4):
        playbook.given(ContinuationFailed(error="SECRET-ERROR-42", retryable=True))
        playbook.given(RetryDue(attempt=attempt))
    playbook >> ContinuationFailed(error="SECRET-ERROR-42", retryable=True)
    playbook << [continuation(FALLBACK_SUMMARY), NotifyContextExhausted(summary=FALLBACK_SUMMARY)]
    assert "SECRET-ERROR-42" not in effects_text(playbook.all_effects())


@requirement("REQ-SEG-012")
def test_seg012_cancel_while_summarising() -> None:
    playbook = summarising() >> UserCancel()
    playbook << [
        CancelRequest(),
        continuation(CANCELLED_SUMMARY),
        NotifyContextExhausted(summary=CANCELLED_SUMMARY),
    ]
    assert playbook.phase == ContextExhausted(
        summary=CANCELLED_SUMMARY, trigger_usage=usage(THRESHOLD)
    )
    assert "cancelled" in CANCELLED_SUMMARY
    exhausted = playbook.state
    assert transition(exhausted, ContinuationResponse(summary="late")) == (exhausted, ())


@requirement("REQ-SEG-012")
def test_seg012_cancel_while_a_summary_retry_is_pending() -> None:
    playbook = summarising().given(ContinuationFailed(error="503", retryable=True))
    (
        playbook
        >> UserCancel()
        << [CancelRequest(), continuation(CANCELLED_SUMMARY), "notify_context_exhausted"]
    )
    exhausted = playbook.state
    assert transition(exhausted, RetryDue(attempt=2)) == (exhausted, ())


@requirement("REQ-SEG-013")
def test_seg013_sub_agent_fails_and_notifies_its_parent() -> None:
    playbook = asking(B.INTENTIONALLY_UNHANDLED, parent_id="parent-1")
    playbook >> reply(THRESHOLD, call(1))
    message = "Context window exhausted: 180,000 of 200,000 tokens (threshold 180,000)."
    playbook << [
        warning(THRESHOLD),
        assistant(THRESHOLD, call(1)),
        not_run(call(1)),
        NotifyFailed(error_kind=ErrorKind.CONTEXT_EXHAUSTED, message=message),
        NotifyParent(parent_id="parent-1", error_kind=ErrorKind.CONTEXT_EXHAUSTED, message=message),
    ]
    assert playbook.phase == Failed(error_kind=ErrorKind.CONTEXT_EXHAUSTED, message=message)
    assert ErrorKind.CONTEXT_EXHAUSTED.value == "context_exhausted"
    assert unpaired_tool_uses(playbook.messages) == []


@requirement("REQ-SEG-013")
def test_seg013_sub_agent_without_parent_just_fails() -> None:
    playbook = asking(B.INTENTIONALLY_UNHANDLED) >> reply(THRESHOLD)
    playbook << [warning(THRESHOLD), assistant(THRESHOLD), NotifyFailed]
    playbook.in_phase("failed")
    below = asking(B.INTENTIONALLY_UNHANDLED) >> reply(179_999)
    below << [warning(179_999), assistant(179_999)]
    below.in_phase("idle")


@requirement("REQ-SEG-014")
def test_seg014_checkpoint_restart_seeds_a_new_session() -> None:
    playbook = asking(B.CHECKPOINT_RESTART) >> reply(THRESHOLD, call(1))
    playbook << [
        "notify_context_warning",
        "append_message",
        not_run(call(1)),
        RequestCheckpoint(purpose="restart", rejected_tool_calls=(call(1),)),
    ]
    assert playbook.phase == AwaitingCheckpoint(
        purpose="restart", rejected_tool_calls=(call(1),), resume_after=True
    )
    answer = (
        "```markdown\n<checkpoint>\n## Goal\nShip v1\n## Remaining Tasks\n1. docs\n"
        "</checkpoint>\n```"
    )
    seed = continuation_prompt("## Goal\nShip v1\n## Remaining Tasks\n1. docs")
    playbook >> CheckpointResponse(text=answer)
    playbook << [
        AppendMessage(message=Message(kind="checkpoint", text=answer)),
        StartSession(session=2, reason="checkpoint_restart"),
        user(seed, session=2),
        RequestLlm(),
    ]
    state = playbook.state
    assert (state.session, state.continuations, state.context_tokens) == (2, 1, None)
    assert state.pending_tokens == estimate_tokens(seed)
    assert "<checkpoint>\n## Goal\nShip v1" in seed


@requirement("REQ-SEG-014", "REQ-BED-023")
def test_seg014_the_new_session_may_warn_again() -> None:
    playbook = asking(B.CHECKPOINT_RESTART).given(
        reply(THRESHOLD), CheckpointResponse(text="<checkpoint>x</checkpoint>")
    )
    playbook.in_phase("idle")  # the agent had ended its turn: nothing to resume
    assert not playbook.state.warned
    playbook.given(UserMessage(text="next")) >> reply(WARNING)
    playbook << [warning(WARNING), assistant(WARNING, session=2)]


@requirement("REQ-SEG-014")
@pytest.mark.parametrize(
    ("text", "checkpoint"),
    [
        ("<checkpoint>\n## Goal\nA\n</checkpoint>", "## Goal\nA"),
        ("```\n<checkpoint>\n## Goal\nA\n</checkpoint>\n```", "## Goal\nA"),
        ("```xml\n<checkpoint>\n## Goal\nA\n</checkpoint>\n```", "## Goal\nA"),
        ("<checkpoint>\n```markdown\n## Goal\nA\n```\n</checkpoint>", "## Goal\nA"),
        ("Sure, here it is.\n<checkpoint>\n## Goal\nA\n</checkpoint>\nSTOP", "## Goal\nA"),
        ("<checkpoint>[template]</checkpoint>\n<checkpoint>## Goal\nB</checkpoint>", "## Goal\nB"),
        ("<CHECKPOINT>\n## Goal\nA\n</CHECKPOINT>", "## Goal\nA"),
        ("<checkpoint>\n## Goal\nA (cut off", "## Goal\nA (cut off"),
        ("## Goal\nNo tags at all", "## Goal\nNo tags at all"),
        ("```\n## Goal\nFenced, no tags\n```", "## Goal\nFenced, no tags"),
        ("", ""),
        ("   \n ", ""),
    ],
    ids=[
        "plain",
        "fenced",
        "fenced-lang",
        "fence-inside",
        "surrounded",
        "last-block-wins",
        "upper-case",
        "unclosed",
        "no-tags",
        "fenced-no-tags",
        "empty",
        "blank",
    ],
)
def test_seg014_checkpoint_extraction(text: str, checkpoint: str) -> None:
    assert extract_checkpoint(text) == checkpoint


@requirement("REQ-SEG-014")
def test_seg014_checkpoint_sections() -> None:
    text = "intro\n## Goal\nShip\n\n## Completed Work\n- a\n- b\n## Do Not Redo ##\nx"
    assert checkpoint_sections(text) == {
        "Goal": "Ship",
        "Completed Work": "- a\n- b",
        "Do Not Redo": "x",
    }
    assert checkpoint_sections("no headings") == {}


@requirement("REQ-SEG-014")
@pytest.mark.parametrize(
    "event",
    [
        CheckpointResponse(text="   "),
        CheckpointFailed(error="SECRET-ERROR-42"),
    ],
    ids=["empty-answer", "final-failure"],
)
def test_seg014_no_checkpoint_gives_the_minimal_prompt(event: Any) -> None:
    playbook = asking(B.CHECKPOINT_RESTART).given(reply(THRESHOLD, call(1))) >> event
    playbook << [
        StartSession(session=2, reason="checkpoint_restart"),
        user(CONTINUE_PREVIOUS_WORK, session=2),
        RequestLlm(),
    ]
    assert continuation_prompt("") == CONTINUE_PREVIOUS_WORK
    assert "continue the previous work" in CONTINUE_PREVIOUS_WORK
    assert "SECRET-ERROR-42" not in effects_text(playbook.all_effects())


@requirement("REQ-SEG-014", "REQ-SEG-021")
def test_seg014_cancel_while_checkpointing_restarts_without_asking() -> None:
    playbook = asking(B.CHECKPOINT_RESTART).given(reply(THRESHOLD, call(1))) >> UserCancel()
    playbook << [
        CancelRequest(),
        StartSession(session=2, reason="checkpoint_restart"),
        user(CONTINUE_PREVIOUS_WORK, session=2),
    ]
    playbook.in_phase("idle")


@requirement("REQ-SEG-015")
def test_seg015_checkpoint_restarts_are_bounded() -> None:
    playbook = asking(B.CHECKPOINT_RESTART, max_continuations=2)
    for session in (2, 3):
        playbook.given(reply(THRESHOLD, call(session)))
        playbook >> CheckpointResponse(text=f"<checkpoint>round {session}</checkpoint>")
        playbook << [
            "append_message",
            StartSession(session=session, reason="checkpoint_restart"),
            "append_message",
            RequestLlm(),
        ]
    playbook >> reply(THRESHOLD)
    playbook << [warning(THRESHOLD), assistant(THRESHOLD, session=3), NotifyFailed]
    assert playbook.phase.error_kind is ErrorKind.CONTINUATION_LIMIT
    assert playbook.state.continuations == 2


@requirement("REQ-SEG-015")
def test_seg015_compactions_are_bounded() -> None:
    playbook = asking(B.COMPACT_IN_PLACE, max_continuations=1)
    playbook.given(reply(THRESHOLD, call(1)))
    playbook >> CompactionResponse(summary="older work", retained_tokens=50_000)
    playbook << [
        StartGeneration(generation=2, summary="older work"),
        "append_message",
        RequestLlm(),
    ]
    # The warning was given in generation 1: a new generation is the same session, so none.
    playbook >> reply(THRESHOLD) << ["append_message", NotifyFailed]
    assert playbook.phase.error_kind is ErrorKind.CONTINUATION_LIMIT
    zero = asking(B.COMPACT_IN_PLACE, max_continuations=0) >> reply(THRESHOLD)
    zero << [warning(THRESHOLD), "append_message", NotifyFailed]


@requirement("REQ-SEG-015", "REQ-BED-023")
def test_seg015_a_heavy_compaction_still_warns_at_the_next_response() -> None:
    playbook = asking(B.COMPACT_IN_PLACE).given(reply(150_000))
    playbook.given(UserMessage(text="more", token_count=35_000)).in_phase("compacting")
    playbook >> CompactionResponse(summary="older work", retained_tokens=165_000)
    playbook << ["start_generation", "append_message", RequestLlm()]
    assert not playbook.state.warned  # an estimate is not a response's occupancy
    playbook >> reply(170_000) << [warning(170_000), "append_message"]


@requirement("REQ-SEG-016")
def test_seg016_a_checkpoint_that_overflows_the_new_session_fails() -> None:
    answer = "<checkpoint>\n## Goal\n" + "x" * 600 + "\n</checkpoint>"
    seed_tokens = estimate_tokens(continuation_prompt(extract_checkpoint(answer)))

    def restart_in(window: int) -> Playbook:
        playbook = asking(
            B.CHECKPOINT_RESTART,
            context_window=window,
            warning_threshold=1.0,
            continuation_threshold=1.0,
        )
        return playbook.given(reply(window)).in_phase("awaiting_checkpoint")

    fails = restart_in(seed_tokens) >> CheckpointResponse(text=answer)
    fails << [AppendMessage(message=Message(kind="checkpoint", text=answer)), NotifyFailed]
    assert fails.phase.error_kind is ErrorKind.CHECKPOINT_OVERFLOW
    assert fails.state.session == 1
    fits = restart_in(seed_tokens + 1) >> CheckpointResponse(text=answer)
    fits << [
        "append_message",
        StartSession(session=2, reason="checkpoint_restart"),
        "append_message",
    ]


@requirement("REQ-SEG-017")
def test_seg017_compaction_archives_first_then_summarises_into_a_new_generation() -> None:
    playbook = asking(B.COMPACT_IN_PLACE) >> reply(THRESHOLD, call(1))
    playbook << [
        warning(THRESHOLD),
        assistant(THRESHOLD, call(1)),
        not_run(call(1)),
        ArchiveTranscript(generation=1),
        RequestCompaction(rejected_tool_calls=(call(1),)),
    ]
    assert playbook.phase == Compacting(rejected_tool_calls=(call(1),), resume_after=True)
    playbook >> CompactionResponse(summary=" Older work: parser done. ", retained_tokens=40_000)
    playbook << [
        StartGeneration(generation=2, summary="Older work: parser done."),
        AppendMessage(
            message=Message(kind="summary", text="Older work: parser done.", generation=2)
        ),
        RequestLlm(),
    ]
    state = playbook.state
    assert (state.generation, state.continuations, state.session) == (2, 1, 1)
    assert (state.context_tokens, state.pending_tokens) == (None, 40_000)


@requirement("REQ-SEG-017")
def test_seg017_compaction_after_a_finished_turn_waits_for_the_user() -> None:
    playbook = asking(B.COMPACT_IN_PLACE).given(reply(THRESHOLD))
    playbook >> CompactionResponse(summary="", retained_tokens=10_000)
    playbook << [RequestCompaction(alternate=True)]  # an empty answer is asked for again
    playbook >> CompactionResponse(summary="", retained_tokens=10_000)
    playbook << [
        StartGeneration(generation=2, summary=COMPACTION_FALLBACK_SUMMARY),
        AppendMessage(
            message=Message(kind="summary", text=COMPACTION_FALLBACK_SUMMARY, generation=2)
        ),
    ]
    playbook.in_phase("idle")


@requirement("REQ-SEG-017", "REQ-SEG-030")
def test_seg017_compaction_that_cannot_be_done_rolls_back() -> None:
    playbook = asking(B.COMPACT_IN_PLACE).given(reply(THRESHOLD))
    before = playbook.state
    playbook >> CompactionFailed(error="bad request")
    message = "Compaction failed; the conversation goes on uncompacted: bad request"
    playbook << [NotifyCompactionFailed(message=message)]
    playbook.in_phase("idle")
    after = playbook.state
    assert (after.generation, after.continuations) == (before.generation, before.continuations)
    # Usable: the next message is taken (and, the context still full, compaction tried again).
    playbook >> UserMessage(text="still there?")
    playbook << ["append_message", "archive_transcript", "request_compaction"]


@requirement("REQ-SEG-018", "REQ-SEG-025")
def test_seg018_compaction_leaving_the_context_over_the_threshold_fails() -> None:
    fails = asking(B.COMPACT_IN_PLACE).given(reply(THRESHOLD))
    fails >> CompactionResponse(summary="s", retained_tokens=180_000)
    message = (
        "After compaction the context still holds 180,000 tokens (threshold 180,000); "
        "compacting again would loop."
    )
    fails << [NotifyFailed(error_kind=ErrorKind.COMPACTION_INEFFECTIVE, message=message)]
    assert fails.phase == Failed(error_kind=ErrorKind.COMPACTION_INEFFECTIVE, message=message)
    assert fails.state.generation == 1
    fits = asking(B.COMPACT_IN_PLACE).given(reply(THRESHOLD))
    fits >> CompactionResponse(summary="s", retained_tokens=179_999)
    fits << [StartGeneration(generation=2, summary="s"), "append_message"]


# =========================================================================== control


SNAPSHOT_TEXT = "<checkpoint>\n## Goal\nG\n\n## Remaining Tasks\nR\n</checkpoint>"


def paused() -> Playbook:
    """A conversation paused after one exchange (the pause asked while the request ran)."""
    playbook = asking().given(PauseRequested(reason="nightly"), reply(50_000))
    return playbook.given(CheckpointResponse(text=SNAPSHOT_TEXT)).in_phase("paused")


@requirement("REQ-SEG-019")
def test_seg019_pause_waits_for_the_turn_boundary_and_stores_a_snapshot() -> None:
    playbook = asking() >> PauseRequested(reason="nightly") << []
    playbook.in_phase("llm_requesting")
    assert playbook.state.pause_requested
    (
        playbook
        >> reply(50_000, text="done")
        << [
            assistant(50_000, text="done"),
            RequestCheckpoint(purpose="pause"),
        ]
    )
    assert playbook.phase == AwaitingCheckpoint(purpose="pause")
    playbook >> CheckpointResponse(text=SNAPSHOT_TEXT)
    snapshot = SessionSnapshot(
        conversation_id="conversation",
        version=1,
        session=1,
        reason="nightly",
        checkpoint="## Goal\nG\n\n## Remaining Tasks\nR",
        sections={"Goal": "G", "Remaining Tasks": "R"},
        context_tokens=50_000,
        context_window=WINDOW,
        message_count=3,
        continuations=0,
    )
    playbook << [
        AppendMessage(message=Message(kind="checkpoint", text=SNAPSHOT_TEXT)),
        SaveSnapshot(snapshot=snapshot),
    ]
    assert playbook.phase == Paused(snapshot=snapshot)
    assert not playbook.state.pause_requested


@requirement("REQ-SEG-019")
def test_seg019_pause_lets_running_tools_finish() -> None:
    playbook = asking().given(reply(50_000, call(1), call(2)))
    playbook >> PauseRequested() << []
    playbook >> ToolResult(tool_call_id="toolu_1", output="a") << [tool_result("toolu_1", "a")]
    playbook >> ToolResult(tool_call_id="toolu_2", output="b")
    playbook << [tool_result("toolu_2", "b"), RequestCheckpoint(purpose="pause")]
    assert playbook.phase == AwaitingCheckpoint(purpose="pause", resume_after=True)
    assert unpaired_tool_uses(playbook.messages) == []


@requirement("REQ-SEG-019")
def test_seg019_pause_from_idle_is_immediate_and_snapshots_are_versioned() -> None:
    playbook = idle_at(10) >> PauseRequested() << [RequestCheckpoint(purpose="pause")]
    (
        playbook
        >> CheckpointResponse(text="<checkpoint>one</checkpoint>")
        << ["append_message", SaveSnapshot]
    )
    assert playbook.phase.snapshot.version == 1
    playbook.given(ResumeRequested(), reply(20)).in_phase("idle")
    playbook >> PauseRequested() << [RequestCheckpoint(purpose="pause")]
    (
        playbook
        >> CheckpointResponse(text="<checkpoint>two</checkpoint>")
        << ["append_message", SaveSnapshot]
    )
    snapshot = playbook.phase.snapshot
    assert (snapshot.version, snapshot.session, snapshot.checkpoint) == (2, 2, "two")


@requirement("REQ-SEG-019")
def test_seg019_paused_conversation_rejects_user_messages() -> None:
    playbook = paused()
    before = playbook.state
    playbook >> UserMessage(text="hi") << [RejectUserMessage]
    assert playbook.state is before
    assert transition(before, PauseRequested()) == (before, ())


@requirement("REQ-SEG-020")
def test_seg020_resume_starts_a_new_session_with_the_compiled_context() -> None:
    playbook = paused()
    snapshot = playbook.phase.snapshot
    context = compile_resume_context(snapshot)
    (
        playbook
        >> ResumeRequested()
        << [
            StartSession(session=2, reason="resume", system_context=context),
            user(RESUME_PROMPT, session=2),
            RequestLlm(),
        ]
    )
    state = playbook.state
    assert (state.session, state.context_tokens) == (2, None)
    assert state.pending_tokens == estimate_tokens(context) + estimate_tokens(RESUME_PROMPT)
    assert context.startswith("## Session Resume Context")
    assert "conversation (session 2; snapshot v1)" in context
    assert "paused because: nightly" in context
    assert context.index("### Goal\nG") < context.index("### Remaining Tasks\nR")


@requirement("REQ-SEG-020")
def test_seg020_resume_with_a_prompt_of_its_own() -> None:
    playbook = paused() >> ResumeRequested(prompt="Finish the docs.")
    playbook << ["start_session", user("Finish the docs.", session=2), RequestLlm()]
    blank = paused() >> ResumeRequested(prompt="  ")
    blank << ["start_session", user(RESUME_PROMPT, session=2), RequestLlm()]


@requirement("REQ-SEG-020")
def test_seg020_resume_context_orders_sections_and_adds_git_state() -> None:
    snapshot = SessionSnapshot(
        conversation_id="c1",
        version=3,
        session=4,
        checkpoint="...",
        sections={"Key Decisions": "K", "Notes": "N", "Goal": "G", "Do Not Redo": ""},
        context_window=WINDOW,
        git=GitState(branch="main", commit="abc123", files_modified=("a.py", "b.py")),
    )
    context = compile_resume_context(snapshot)
    headings = [line for line in context.splitlines() if line.startswith("### ")]
    assert headings == [
        "### Goal",
        "### Do Not Redo",
        "### Key Decisions",
        "### Notes",
        "### Git State",
    ]
    assert "(session 5; snapshot v3)" in context
    assert "### Do Not Redo\n(none)" in context
    assert "- Branch: main at abc123" in context
    assert "- Files modified: 2" in context
    assert "- Uncommitted changes: no" in context
    bare = compile_resume_context(snapshot.model_copy(update={"sections": {}, "checkpoint": ""}))
    assert "### Checkpoint\n(no checkpoint was written)" in bare


@requirement("REQ-SEG-020", "REQ-SEG-004")
def test_seg020_resume_goes_through_preflight() -> None:
    def paused_in(window: int) -> Playbook:
        state = conversation(
            context_window=window, warning_threshold=1.0, continuation_threshold=1.0
        )
        playbook = Playbook(state).given(
            PauseRequested(), CheckpointResponse(text="<checkpoint>c</checkpoint>")
        )
        return playbook.in_phase("paused")

    context = compile_resume_context(paused_in(WINDOW).phase.snapshot)
    needed = estimate_tokens(context) + estimate_tokens(RESUME_PROMPT)
    over = paused_in(needed) >> ResumeRequested()
    over << ["start_session", "append_message", RequestContinuation()]
    assert over.phase.trigger == "preflight"
    fits = paused_in(needed + 1) >> ResumeRequested()
    fits << ["start_session", "append_message", RequestLlm()]


def _busy_states() -> list[tuple[str, ConversationState]]:
    return [
        ("llm_requesting", asking().state),
        ("tool_executing", asking().given(reply(10, call(1))).state),
        ("awaiting_continuation", summarising().state),
        ("awaiting_checkpoint", asking(B.CHECKPOINT_RESTART).given(reply(THRESHOLD)).state),
        ("compacting", asking(B.COMPACT_IN_PLACE).given(reply(THRESHOLD)).state),
    ]


@requirement("REQ-SEG-021")
@pytest.mark.parametrize(("kind", "state"), _busy_states(), ids=lambda value: str(value)[:22])
def test_seg021_busy_phases_reject_user_messages(kind: str, state: ConversationState) -> None:
    assert state.phase.kind == kind
    playbook = Playbook(state) >> UserMessage(text="are you there?") << [RejectUserMessage]
    assert playbook.state is state
    assert "busy" in playbook.effects[0].reason  # type: ignore[union-attr]  # checked above


@requirement("REQ-SEG-021")
def test_seg021_cancel_stops_a_request() -> None:
    playbook = asking() >> UserCancel() << [CancelRequest()]
    playbook.in_phase("idle")


@requirement("REQ-SEG-021")
def test_seg021_cancel_answers_every_tool_still_running() -> None:
    playbook = asking().given(reply(100_000, call(1), call(2), call(3)))
    playbook >> ToolResult(tool_call_id="toolu_2", output="done") << ["append_message"]
    (
        playbook
        >> UserCancel()
        << [
            CancelRequest(),
            not_run(call(1), TOOL_NOT_RUN_CANCELLED),
            not_run(call(3), TOOL_NOT_RUN_CANCELLED),
        ]
    )
    playbook.in_phase("idle")
    assert unpaired_tool_uses(playbook.messages) == []
    idle = playbook.state
    assert transition(idle, ToolResult(tool_call_id="toolu_1", output="late")) == (idle, ())


@requirement("REQ-SEG-021", "REQ-SEG-022")
def test_seg021_unknown_or_duplicate_tool_results_are_ignored() -> None:
    playbook = asking().given(reply(100_000, call(1), call(2)))
    playbook.given(ToolResult(tool_call_id="toolu_1", output="a"))
    state = playbook.state
    for stale in ("toolu_1", "toolu_9"):
        assert transition(state, ToolResult(tool_call_id=stale, output="x")) == (state, ())


@requirement("REQ-SEG-021", "REQ-SEG-019")
def test_seg021_cancel_abandons_a_pause_checkpoint() -> None:
    playbook = asking().given(PauseRequested(reason="deploy"), reply(100_000))
    playbook.in_phase("awaiting_checkpoint")
    playbook >> UserCancel() << [CancelRequest()]
    playbook.in_phase("idle")
    assert (playbook.state.pause_requested, playbook.state.snapshots) == (False, 0)


@requirement("REQ-SEG-021", "REQ-SEG-014")
def test_seg021_cancel_of_a_restart_checkpoint_drops_a_pending_pause() -> None:
    playbook = asking(B.CHECKPOINT_RESTART).given(PauseRequested(), reply(THRESHOLD))
    playbook.in_phase("awaiting_checkpoint")
    playbook >> UserCancel()
    playbook << [
        CancelRequest(),
        StartSession(session=2, reason="checkpoint_restart"),
        user(continuation_prompt(""), session=2),
    ]
    playbook.in_phase("idle")
    assert not playbook.state.pause_requested


@requirement("REQ-SEG-021", "REQ-SEG-014")
def test_seg021_rejected_tool_results_are_counted() -> None:
    playbook = asking(B.CHECKPOINT_RESTART).given(reply(THRESHOLD, call(1), call(2)))
    assert playbook.state.message_count == len(playbook.messages) == 4


@requirement("REQ-SEG-021")
def test_seg021_cancel_while_compacting_returns_to_idle() -> None:
    playbook = asking(B.COMPACT_IN_PLACE).given(reply(THRESHOLD)) >> UserCancel()
    playbook << [CancelRequest()]
    playbook.in_phase("idle")


@requirement("REQ-SEG-021")
@pytest.mark.parametrize("behavior", list(B))
def test_seg021_every_tool_use_gets_a_result(behavior: ContextExhaustionBehavior) -> None:
    """A long run across the paths that record tool calls: no ``tool_use`` left unpaired."""
    playbook = asking(behavior, max_continuations=5)
    playbook.given(reply(50_000, call(1), call(2)), ToolResult(tool_call_id="toolu_1", output="a"))
    playbook.given(UserCancel(), UserMessage(text="again"))
    playbook.given(reply(60_000, call(3), stop="max_tokens"), UserMessage(text="go"))
    playbook.given(reply(70_000, call(4)), PauseRequested())
    playbook.given(ToolResult(tool_call_id="toolu_4", output="d"))
    if playbook.state.phase.kind == "awaiting_checkpoint":
        playbook.given(CheckpointResponse(text="<checkpoint>p</checkpoint>"), ResumeRequested())
    playbook.given(reply(THRESHOLD, call(5), call(6)))
    assert playbook.state.phase.kind != "tool_executing"
    assert unpaired_tool_uses(playbook.messages) == []


# =========================================================================== totality

SNAPSHOT = SessionSnapshot(
    conversation_id="conversation", version=1, session=1, checkpoint="G", context_window=WINDOW
)
PHASES: list[Any] = [
    Idle(),
    LlmRequesting(),
    LlmRequesting(attempt=2, retry_pending=True),
    ToolExecuting(tool_calls=(call(1), call(2)), pending=("toolu_1", "toolu_2")),
    AwaitingContinuation(rejected_tool_calls=(call(1),)),
    AwaitingContinuation(attempt=2, retry_pending=True),
    AwaitingCheckpoint(),
    AwaitingCheckpoint(purpose="pause", resume_after=True, retry_pending=True),
    Compacting(resume_after=True),
    Compacting(attempt=3, trim_level=1, retry_pending=True),
    ContextExhausted(summary="S"),
    Paused(snapshot=SNAPSHOT),
    Failed(error_kind=ErrorKind.LLM_ERROR, message="m"),
    Failed(error_kind=ErrorKind.CONTEXT_EXHAUSTED, message="m"),
]
EVENTS: list[Any] = [
    UserMessage(text="hi"),
    UserMessage(text="huge", token_count=THRESHOLD),
    UserMessage(text="overflowing", token_count=90_000),
    reply(10),
    reply(THRESHOLD, call(1)),
    reply(None, call(1)),
    reply(WINDOW + 1),
    reply(10, call(1), stop="max_tokens"),
    reply(10, stop="model_context_window_exceeded"),
    reply(THRESHOLD, stop="pause_turn"),
    ProviderCompacted(summary="s"),
    ProviderCompacted(summary="s", post_tokens=10),
    LlmError(message="e"),
    LlmError(message="e", retryable=True),
    LlmError(message="e", context_overflow=True),
    ToolResult(tool_call_id="toolu_1", output="x"),
    ToolResult(tool_call_id="toolu_9", output="x"),
    ContinuationResponse(summary="S"),
    ContinuationResponse(summary="", stop_reason="refusal"),
    ContinuationFailed(error="e"),
    ContinuationFailed(error="e", retryable=True),
    ContinuationFailed(error="e", context_overflow=True),
    CheckpointResponse(text="<checkpoint>c</checkpoint>"),
    CheckpointResponse(text="x" * 600_000),
    CheckpointFailed(error="e", retryable=True),
    CompactionResponse(summary="s", retained_tokens=10),
    CompactionResponse(summary="s", retained_tokens=THRESHOLD),
    CompactionFailed(error="e"),
    CompactionFailed(error="e", context_overflow=True),
    RetryDue(attempt=2),
    RetryDue(attempt=3),
    UserCancel(),
    ManualContinuation(),
    PauseRequested(reason="r"),
    ResumeRequested(),
    ResumeRequested(prompt="go"),
    SummaryRedoRequested(focus="f"),
    ContinuationRedone(summary="S again"),
    CompactionUndoRequested(messages=(Message(kind="user", text="u", copy_of=1),), tokens=10),
    CompactionUndoRequested(messages=(), tokens=10),
]
EFFECT_ADAPTER: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(Effect)


def test_totality_samples_cover_every_phase_and_event_type() -> None:
    assert {type(phase) for phase in PHASES} == set(PHASE_TYPES)
    assert {type(event) for event in EVENTS} == set(EVENT_TYPES)
    phase_kinds = {phase.kind for phase in PHASES}
    event_kinds = {event.kind for event in EVENTS}
    assert {pair[0] for pair in HANDLED_PAIRS} <= phase_kinds
    assert {pair[1] for pair in HANDLED_PAIRS} <= event_kinds


@requirement("REQ-SEG-022")
@pytest.mark.parametrize("behavior", list(B))
@pytest.mark.parametrize("phase", PHASES, ids=lambda phase: phase.kind)
def test_seg022_every_phase_answers_every_event(
    behavior: ContextExhaustionBehavior, phase: Any
) -> None:
    base = idle_at(100_000, behavior, parent_id="parent").state.with_phase(phase)
    dumped = base.model_dump()
    problems: list[str] = []
    for event in EVENTS:
        new, effects = transition(base, event)
        if base.model_dump() != dumped:
            problems.append(f"{event!r} mutated the input state")
        if transition(base, event) != (new, effects):
            problems.append(f"{event!r} is not deterministic")
        if (phase.kind, event.kind) not in HANDLED_PAIRS:
            if new is not base or effects != ():
                problems.append(f"unhandled {event!r} changed something: {effects!r}")
            continue
        if ConversationState.model_validate(new.model_dump()) != new:
            problems.append(f"{event!r} built an invalid state: {new!r}")
        problems.extend(
            f"{event!r} built an invalid effect: {effect!r}"
            for effect in effects
            if EFFECT_ADAPTER.validate_python(effect.model_dump()) != effect
        )
    assert not problems, "\n".join(problems)


@requirement("REQ-SEG-022")
def test_seg022_handled_pairs_are_the_only_ones_that_change_anything() -> None:
    assert ("context_exhausted", "user_message") in HANDLED_PAIRS
    assert ("idle", "llm_response") not in HANDLED_PAIRS
    assert ("context_exhausted", "manual_continuation") not in HANDLED_PAIRS
    state = idle_at(10).state
    assert transition(state, reply(10)) == (state, ())
    assert transition(state, UserCancel()) == (state, ())


# =========================================================================== failures


@requirement("REQ-SEG-023")
@pytest.mark.parametrize(
    "failure",
    [LlmError(message="bad request"), LlmError(message="503", retryable=True)],
    ids=["llm_error", "retries_exhausted"],
)
def test_seg023_recoverable_failures_accept_a_new_message(failure: LlmError) -> None:
    playbook = asking(max_attempts=1).given(failure)
    assert playbook.phase.error_kind in {ErrorKind.LLM_ERROR, ErrorKind.RETRIES_EXHAUSTED}
    playbook >> UserMessage(text="try again") << [user("try again"), RequestLlm()]
    playbook.in_phase("llm_requesting")


@requirement("REQ-SEG-023")
def test_seg023_a_recovered_conversation_still_rejects_oversize_messages() -> None:
    playbook = asking().given(LlmError(message="bad request"))
    failed = playbook.state
    playbook >> UserMessage(text="huge", token_count=THRESHOLD) << [RejectUserMessage]
    assert playbook.state is failed


@requirement("REQ-SEG-023")
@pytest.mark.parametrize(
    "kind",
    [
        ErrorKind.CONTEXT_EXHAUSTED,
        ErrorKind.CONTINUATION_LIMIT,
        ErrorKind.CHECKPOINT_OVERFLOW,
        ErrorKind.COMPACTION_INEFFECTIVE,
    ],
)
def test_seg023_other_failures_reject_user_messages(kind: ErrorKind) -> None:
    state = conversation().with_phase(Failed(error_kind=kind, message="why"))
    playbook = Playbook(state) >> UserMessage(text="hello") << [RejectUserMessage]
    assert playbook.state is state
    reason = playbook.effects[0].reason  # type: ignore[union-attr]  # checked above
    assert f"({kind.value}: why)" in reason
    assert "new conversation" in reason


@requirement("REQ-SEG-024")
@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Usage(input_tokens=-1), "input_tokens"),
        (lambda: Usage(input_tokens=True), "input_tokens"),
        (lambda: Usage.model_validate({"tokens": 1}), "tokens"),
        (lambda: LlmResponse(usage={"output_tokens": "many"}), "output_tokens"),  # type: ignore[arg-type]
        (lambda: ToolCall(id="", name="bash"), "id"),
        (lambda: UserMessage(text="x", token_count=-1), "token_count"),
        (lambda: new_conversation(model=MODEL, warning_threshold=0.95), "warning_threshold"),
    ],
)
def test_seg024_bad_input_raises_validation_error(build: Any, field: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=field):
        build()


@requirement("REQ-SEG-025")
def test_seg025_thresholds_are_exact_integers() -> None:
    assert threshold_tokens(0.9, 200_000) == 180_000
    assert threshold_tokens(0.8, 200_000) == 160_000
    # 0.7 * 100 == 70.00000000000001 in floats: a float comparison would let 70 through.
    state = conversation(context_window=100, warning_threshold=0.07, continuation_threshold=0.7)
    assert state.config.continuation_tokens == 70
    below = Playbook(state).given(UserMessage(text="x", token_count=1)) >> reply(69)
    below << [warning(69, 100), assistant(69)]
    at = Playbook(state).given(UserMessage(text="x", token_count=1)) >> reply(70)
    at << [warning(70, 100), assistant(70), RequestContinuation()]


# =========================================================================== suspected bugs


@requirement("REQ-SEG-004")
def test_seg004_cancelled_tool_results_count_in_preflight() -> None:
    playbook = asking().given(reply(179_970, call(1)), UserCancel())
    appended = estimate_tokens(TOOL_NOT_RUN_CANCELLED)  # 19
    assert playbook.state.projected_tokens == 179_970 + appended
    playbook >> UserMessage(text="next", token_count=30 - appended)
    playbook << [user("next"), RequestContinuation()]  # 179,970 + 19 + 11 = 180,000


@requirement("REQ-SEG-016", "REQ-SEG-004")
def test_seg016_the_system_prompt_counts_in_the_new_session() -> None:
    answer = "<checkpoint>\n## Goal\nship\n</checkpoint>"
    seed_tokens = estimate_tokens(continuation_prompt(extract_checkpoint(answer)))
    playbook = Playbook(conversation(B.CHECKPOINT_RESTART, system_tokens=THRESHOLD - seed_tokens))
    playbook.given(UserMessage(text="hi", token_count=1), reply(THRESHOLD))
    playbook >> CheckpointResponse(text=answer) << ["append_message", NotifyFailed]
    assert playbook.phase.error_kind is ErrorKind.CHECKPOINT_OVERFLOW


# =========================================================================== the helper


def test_playbook_reports_a_diff_on_mismatch() -> None:
    playbook = asking() >> reply(10)
    with pytest.raises(AssertionError) as caught:
        playbook << ["append_message", "request_llm"]
    report = str(caught.value)
    assert "effects differ (- expected, + actual)" in report
    assert "- request_llm" in report
    assert "now in phase 'idle'" in report
    with pytest.raises(AssertionError, match="expected phase 'failed', got 'idle'"):
        playbook.in_phase("failed")


def test_playbook_compares_kinds_classes_and_values() -> None:
    (asking() >> reply(10)) << [AppendMessage]
    (asking() >> reply(10)) << [assistant(10)]
    with pytest.raises(AssertionError, match="usage=Usage"):
        (asking() >> reply(10)) << [assistant(11)]
    classes: list[Any] = [AppendMessage, RequestLlm]
    with pytest.raises(AssertionError, match="<RequestLlm>"):
        (asking() >> reply(10)) << classes


def test_playbook_refuses_unchecked_effects() -> None:
    playbook = Playbook(conversation()) >> UserMessage(text="hi")
    with pytest.raises(AssertionError, match="never checked"):
        playbook >> reply(10)
    (Playbook(conversation()).given(UserMessage(text="hi")) >> reply(10)) << ["append_message"]


def test_unpaired_tool_uses_finds_a_missing_result() -> None:
    used = Message(kind="assistant", tool_calls=(call(1), call(2)))
    answered = Message(kind="tool_result", tool_call_id="toolu_1")
    assert unpaired_tool_uses([used, answered]) == ["toolu_2"]
    assert unpaired_tool_uses([used, answered, Message(kind="assistant")]) == ["toolu_2"]


# =========================================================================== bounded turns


def rounds(playbook: Playbook, count: int) -> Playbook:
    """Run ``count`` tool rounds in the turn in flight."""
    for number in range(1, count + 1):
        playbook.given(reply(1_000 + number, call(number)))
        playbook.given(ToolResult(tool_call_id=f"toolu_{number}", output="done"))
    return playbook


@requirement("REQ-SEG-026")
def test_seg026_past_its_tool_rounds_a_turn_gets_one_grace_request() -> None:
    playbook = rounds(asking(max_tool_rounds=3), 3)
    playbook >> reply(2_000, call(4))
    playbook << [
        assistant(2_000, call(4)),
        not_run(call(4), TOOL_NOT_RUN_LIMIT),
        NotifyToolRoundLimit(rounds=3),
        RequestLlm(final=True),
    ]
    assert playbook.phase == LlmRequesting(final=True)
    # It asks for tools anyway: none runs, the turn ends.
    playbook >> reply(2_100, call(5))
    playbook << [assistant(2_100, call(5)), not_run(call(5), TOOL_NOT_RUN_LIMIT)]
    playbook.in_phase("idle")
    assert unpaired_tool_uses(playbook.messages) == []
    # The next message starts a new turn with all its rounds.
    playbook >> UserMessage(text="go on") << ["append_message", "request_llm"]
    playbook >> reply(2_200, call(6)) << ["append_message", "execute_tools"]


@requirement("REQ-SEG-026")
def test_seg026_the_grace_answer_ends_the_turn_and_its_retries_stay_graceful() -> None:
    playbook = rounds(asking(max_tool_rounds=1), 1)
    playbook.given(reply(2_000, call(2)))
    assert playbook.phase == LlmRequesting(final=True)
    playbook >> LlmError(message="overloaded", retryable=True) << ["schedule_retry"]
    playbook >> RetryDue(attempt=2) << [RequestLlm(attempt=2, final=True)]
    playbook >> reply(2_100, text="Here is what I found.") << ["append_message"]
    playbook.in_phase("idle")


@requirement("REQ-SEG-026", "REQ-SEG-013")
def test_seg026_a_sub_agent_past_its_tool_rounds_fails_with_its_own_kind() -> None:
    sub_agent = conversation(B.INTENTIONALLY_UNHANDLED, parent_id="parent", max_tool_rounds=2)
    playbook = rounds(Playbook(sub_agent).given(UserMessage(text="dig")), 2)
    playbook >> reply(2_000, call(3))
    message = "The turn used its 2 tool rounds and still asked for bash."
    playbook << [
        assistant(2_000, call(3)),
        not_run(call(3), TOOL_NOT_RUN_LIMIT),
        NotifyFailed(error_kind=ErrorKind.TOOL_ROUNDS_EXHAUSTED, message=message),
        NotifyParent(
            parent_id="parent", error_kind=ErrorKind.TOOL_ROUNDS_EXHAUSTED, message=message
        ),
    ]
    assert playbook.phase == Failed(error_kind=ErrorKind.TOOL_ROUNDS_EXHAUSTED, message=message)
    # Not recoverable: a sub-agent that looped is done; its parent decides what next.
    playbook >> UserMessage(text="again?") << ["reject_user_message"]


@requirement("REQ-SEG-026", "REQ-SEG-019")
def test_seg026_a_pending_pause_is_taken_before_the_grace_request() -> None:
    playbook = rounds(asking(B.CHECKPOINT_RESTART, max_tool_rounds=1), 1)
    playbook.given(PauseRequested(reason="lunch"))
    playbook >> reply(2_000, call(2))
    playbook << [
        assistant(2_000, call(2)),
        not_run(call(2), TOOL_NOT_RUN_LIMIT),
        NotifyToolRoundLimit(rounds=1),
        RequestCheckpoint(purpose="pause"),
    ]


@requirement("REQ-SEG-026")
def test_seg026_a_fresh_session_starts_a_new_count() -> None:
    playbook = rounds(asking(B.CHECKPOINT_RESTART, max_tool_rounds=2), 2)
    playbook.given(reply(THRESHOLD)).given(CheckpointResponse(text="<checkpoint>go</checkpoint>"))
    assert playbook.state.tool_rounds == 0
    assert playbook.state.session == 2


# =========================================================================== pausing for later


@requirement("REQ-SEG-027")
def test_seg027_at_the_threshold_a_checkpoint_pause_conversation_pauses() -> None:
    playbook = asking(B.CHECKPOINT_PAUSE) >> reply(THRESHOLD, call(1))
    playbook << [
        warning(THRESHOLD),
        assistant(THRESHOLD, call(1)),
        not_run(call(1)),
        RequestCheckpoint(purpose="pause", rejected_tool_calls=(call(1),)),
    ]
    playbook >> CheckpointResponse(text=SNAPSHOT_TEXT) << ["append_message", SaveSnapshot]
    assert isinstance(playbook.phase, Paused)
    snapshot = playbook.phase.snapshot
    assert (snapshot.trigger, snapshot.version, snapshot.session) == ("exhaustion", 1, 1)
    playbook >> UserMessage(text="hello?") << ["reject_user_message"]
    playbook >> ResumeRequested() << ["start_session", "append_message", "request_llm"]
    state = playbook.state
    assert (state.session, state.continuations, state.context_tokens) == (2, 1, None)
    assert state.resume_context is not None
    assert "context window was nearly full" in state.resume_context


@requirement("REQ-SEG-027", "REQ-SEG-012")
def test_seg027_a_cancel_abandons_the_checkpoint_but_still_pauses() -> None:
    playbook = asking(B.CHECKPOINT_PAUSE).given(reply(THRESHOLD))
    playbook >> UserCancel() << [CancelRequest(), SaveSnapshot]
    assert isinstance(playbook.phase, Paused)
    assert playbook.phase.snapshot.checkpoint == ""
    assert playbook.phase.snapshot.trigger == "exhaustion"
    failed = asking(B.CHECKPOINT_PAUSE, max_attempts=1).given(reply(THRESHOLD))
    failed >> CheckpointFailed(error="down") << [SaveSnapshot]
    failed.in_phase("paused")


@requirement("REQ-SEG-027", "REQ-SEG-015")
def test_seg027_pausing_at_the_limit_is_bounded_by_continuations() -> None:
    playbook = asking(B.CHECKPOINT_PAUSE, max_continuations=1).given(reply(THRESHOLD))
    playbook.given(CheckpointResponse(text=SNAPSHOT_TEXT), ResumeRequested())
    assert playbook.state.continuations == 1
    playbook >> reply(THRESHOLD)
    playbook << ["notify_context_warning", "append_message", NotifyFailed]
    assert isinstance(playbook.phase, Failed)
    assert playbook.phase.error_kind is ErrorKind.CONTINUATION_LIMIT


@requirement("REQ-SEG-028")
def test_seg028_a_snapshot_keeps_the_decisions_its_checkpoint_states() -> None:
    playbook = asking(B.CHECKPOINT_PAUSE).given(reply(1_000, call(1)))
    playbook.given(ToolResult(tool_call_id="toolu_1", output="ok"))
    decided = "<checkpoint>\n## Goal\nG\n\n## Key Decisions\n- Use SQLite\n</checkpoint>"
    playbook.given(reply(THRESHOLD, text="Decision: ship friday"), CheckpointResponse(text=decided))
    assert isinstance(playbook.phase, Paused)
    snapshot = playbook.phase.snapshot
    assert snapshot.decisions == ("Use SQLite",)  # the transcript's are the runtime's to add
    assert snapshot.schema_version == 2
    # What the session did and cost is the runtime's to add, from the store.
    assert (snapshot.llm_calls, snapshot.tool_calls, snapshot.usage, snapshot.errors) == (
        0,
        0,
        None,
        (),
    )
    errored = snapshot.model_copy(update={"errors": ("overloaded",)})
    assert "### Errors Met\n- overloaded" in compile_resume_context(errored)


@requirement("REQ-SEG-028")
def test_seg028_a_version_1_snapshot_still_loads() -> None:
    old = (
        '{"schema_version": 1, "conversation_id": "c", "version": 1, "session": 1, '
        '"trigger": "pause", "reason": "r", "checkpoint": "cp", "sections": {}, '
        '"context_tokens": 5, "context_window": 200000, "message_count": 2, '
        '"continuations": 0, "git": null}'
    )
    snapshot = SessionSnapshot.model_validate_json(old)
    assert (snapshot.schema_version, snapshot.llm_calls, snapshot.decisions) == (1, 0, ())
    assert snapshot.context is None
    assert "cp" in compile_resume_context(snapshot)


@requirement("REQ-SEG-028")
def test_seg028_resume_uses_the_stored_snapshot_and_states_a_moved_head() -> None:
    playbook = idle_at(1_000, B.CHECKPOINT_RESTART).given(PauseRequested(reason="eod"))
    playbook.given(CheckpointResponse(text=SNAPSHOT_TEXT))
    assert isinstance(playbook.phase, Paused)
    stored = playbook.phase.snapshot.model_copy(
        update={"created_at": 1_700_000_000.0, "context": {"git": {"head": "abc123"}}}
    )
    other = stored.model_copy(update={"version": 9})  # not this pause's: ignored
    ignored, _ = transition(playbook.state, ResumeRequested(snapshot=other))
    assert ignored.resume_context is not None
    assert "abc123" not in ignored.resume_context
    event = ResumeRequested(snapshot=stored, current_context={"git": {"head": "def456"}})
    playbook >> event << ["start_session", "append_message", "request_llm"]
    context = playbook.state.resume_context
    assert context is not None
    assert '"head": "abc123"' in context
    assert "HEAD moved since the pause, from abc123 to def456" in context


def test_decisions_are_extracted_from_the_checkpoint_and_the_transcript() -> None:
    checkpoint = "## Goal\nG\n\n## Key Decisions\n- Use SQLite\n1. Keep the API\n- (none)\n"
    texts = [
        "Decision: ship on Friday.",
        "ok, so I'll use pytest instead of unittest",
        "We decided to drop 3.10.",
        "nothing decided here",
        "**Decision:** use SQLite",
    ]
    assert extract_decisions(checkpoint, texts) == (
        "Use SQLite",
        "Keep the API",
        "ship on Friday.",
        "I'll use pytest instead of unittest",
        "We decided to drop 3.10.",
    )
    assert extract_decisions("", ["Decision: x"] * 50) == ("x",)


# =========================================================================== the record


@requirement("REQ-SEG-029")
def test_seg029_the_exhausted_phase_keeps_what_triggered_and_what_the_summary_cost() -> None:
    playbook = summarising()
    answered = ContinuationResponse(summary="We did X.", usage=usage(150_000))
    playbook >> answered
    recorded = AppendMessage(
        message=Message(kind="continuation", text="We did X.", usage=usage(150_000))
    )
    playbook << [recorded, NotifyContextExhausted(summary="We did X.")]
    assert playbook.phase == ContextExhausted(
        summary="We did X.", trigger_usage=usage(THRESHOLD), final_usage=usage(150_000)
    )


@requirement("REQ-SEG-029")
def test_seg029_checkpoints_and_compactions_keep_their_usage() -> None:
    checkpoint = asking(B.CHECKPOINT_RESTART).given(reply(THRESHOLD))
    checkpoint >> CheckpointResponse(text="<checkpoint>x</checkpoint>", usage=usage(9_000))
    checkpoint << [
        AppendMessage(
            message=Message(
                kind="checkpoint", text="<checkpoint>x</checkpoint>", usage=usage(9_000)
            )
        ),
        "start_session",
        "append_message",
    ]
    compaction = asking(B.COMPACT_IN_PLACE).given(reply(THRESHOLD))
    compaction >> CompactionResponse(summary="Old.", retained_tokens=5_000, usage=usage(7_000))
    compaction << ["start_generation", "append_message"]
    assert compaction.messages[-1].usage == usage(7_000)
    assert compaction.messages[-1].kind == "summary"


@requirement("REQ-SEG-030")
def test_seg030_a_pending_pause_is_taken_when_compaction_rolls_back() -> None:
    playbook = asking(B.COMPACT_IN_PLACE).given(reply(THRESHOLD), PauseRequested(reason="eod"))
    playbook >> CompactionFailed(error="bad request")
    playbook << [NotifyCompactionFailed, RequestCheckpoint(purpose="pause")]


@requirement("REQ-SEG-030", "REQ-BED-023")
def test_seg030_no_second_compaction_while_one_runs() -> None:
    playbook = idle_at(100_000, B.COMPACT_IN_PLACE)
    playbook >> ManualContinuation() << ["archive_transcript", "request_compaction"]
    compacting = playbook.state
    assert transition(compacting, ManualContinuation()) == (compacting, ())


@requirement("REQ-SEG-031")
def test_seg031_a_refused_compaction_is_asked_again_then_used() -> None:
    playbook = asking(B.COMPACT_IN_PLACE).given(reply(THRESHOLD))
    refused = CompactionResponse(summary="I can't.", retained_tokens=5_000, stop_reason="refusal")
    playbook >> refused << [RequestCompaction(alternate=True)]
    assert isinstance(playbook.phase, Compacting)
    assert playbook.phase.alternate
    playbook >> CompactionFailed(error="overloaded", retryable=True) << [ScheduleRetry]
    playbook >> RetryDue(attempt=2) << [RequestCompaction(attempt=2, alternate=True)]
    playbook >> CompactionResponse(summary="Old work.", retained_tokens=5_000)
    playbook << [StartGeneration(generation=2, summary="Old work."), "append_message"]


@requirement("REQ-SEG-031")
def test_seg031_the_second_ask_of_a_continuation_keeps_its_retries_and_trims() -> None:
    playbook = (
        summarising() >> ContinuationResponse(summary="") << [RequestContinuation(alternate=True)]
    )
    playbook >> ContinuationFailed(error="too long", context_overflow=True)
    playbook << [RequestContinuation(attempt=2, trim_level=1, alternate=True)]
    playbook >> ContinuationResponse(summary="Now it works.")
    playbook << [continuation("Now it works."), NotifyContextExhausted(summary="Now it works.")]


@requirement("REQ-SEG-032")
def test_seg032_the_provider_session_is_kept_across_generations_and_dropped_by_a_new_session() -> (
    None
):
    session_ref = "sdk-session-1"
    playbook = asking(B.CHECKPOINT_RESTART)
    playbook.given(LlmResponse(text="ok", usage=usage(1_000), session_ref=session_ref))
    assert playbook.state.provider_session == session_ref
    playbook.given(UserMessage(text="go on"), LlmResponse(text="ok", usage=usage(2_000)))
    assert playbook.state.provider_session == session_ref  # a response naming none keeps it
    playbook.given(UserMessage(text="more"), ProviderCompacted(summary="Earlier: setup."))
    assert (playbook.state.generation, playbook.state.provider_session) == (2, session_ref)
    playbook.given(LlmResponse(text="x", usage=usage(THRESHOLD), session_ref=session_ref))
    playbook.given(CheckpointResponse(text="<checkpoint>Goal: ship</checkpoint>"))
    assert playbook.state.session == 2
    assert playbook.state.provider_session is None


@requirement("REQ-SEG-033")
def test_seg033_a_provider_compaction_starts_a_generation_and_the_response_measures_it() -> None:
    playbook = asking(B.COMPACT_IN_PLACE).given(reply(150_000, text="big"))
    playbook.given(UserMessage(text="continue"))
    summary = "The user is building a parser; the lexer is done."
    playbook >> ProviderCompacted(summary=summary, pre_tokens=165_000, post_tokens=12_000)
    playbook << [
        StartGeneration(generation=2, summary=summary),
        AppendMessage(message=Message(kind="summary", text=summary, generation=2)),
    ]
    state = playbook.state
    assert isinstance(state.phase, LlmRequesting)
    assert (state.generation, state.context_tokens, state.pending_tokens) == (2, None, 12_000)
    assert state.continuations == 0  # the provider's compaction is not one of segue's
    playbook >> reply(14_000) << [assistant(14_000, generation=2)]
    assert (playbook.state.context_tokens, playbook.phase.kind) == (14_000, "idle")


@requirement("REQ-SEG-033")
def test_seg033_a_provider_compaction_without_figures_is_estimated_and_stale_ones_are_ignored() -> (
    None
):
    playbook = asking(B.THRESHOLD_BASED_CONTINUATION, system_tokens=500)
    playbook >> ProviderCompacted(summary="short") << ["start_generation", "append_message"]
    assert playbook.state.pending_tokens == 500 + estimate_tokens("short")
    playbook.given(reply(1_000))
    idle = playbook.state
    playbook >> ProviderCompacted(summary="late") << []
    assert playbook.state == idle


@requirement("REQ-SEG-034")
@pytest.mark.parametrize(
    ("stop", "resumes"), [("pause_turn", True), ("end_turn", False)], ids=["paused", "ended"]
)
def test_seg034_a_turn_stopped_at_the_threshold_resumes_after_the_restart(
    stop: str, resumes: bool
) -> None:
    playbook = asking(B.CHECKPOINT_RESTART) >> reply(THRESHOLD, stop=stop)
    playbook << ["notify_context_warning", "append_message", RequestCheckpoint(purpose="restart")]
    assert playbook.phase == AwaitingCheckpoint(purpose="restart", resume_after=resumes)
    playbook >> CheckpointResponse(text="<checkpoint>Goal: ship</checkpoint>")
    expected: list[Any] = ["append_message", "start_session", "append_message"]
    playbook << ([*expected, RequestLlm()] if resumes else expected)


@requirement("REQ-SEG-004", "REQ-SEG-033")
def test_seg004_a_retry_meets_pre_flight_when_a_provider_compaction_filled_the_window() -> None:
    """Found by the stateful test: the provider compacted its context to more than the
    threshold while a request ran, the request then failed; its retry must not leave with a
    projection over the threshold."""
    playbook = asking(B.CHECKPOINT_RESTART)
    playbook.given(ProviderCompacted(summary="What the provider kept.", post_tokens=THRESHOLD))
    playbook >> LlmError(message="overloaded", retryable=True) << ["schedule_retry"]
    playbook >> RetryDue(attempt=2) << [RequestCheckpoint()]
    assert playbook.phase.resume_after  # the agent was mid-task: it goes on after the restart
    # Below the threshold, the retry is the request it always was.
    fine = asking(B.CHECKPOINT_RESTART)
    fine.given(ProviderCompacted(summary="What the provider kept.", post_tokens=THRESHOLD - 1))
    fine.given(LlmError(message="overloaded", retryable=True))
    fine >> RetryDue(attempt=2) << [RequestLlm(attempt=2)]


# =========================================================================== the provider compacts


def providing(**settings: Any) -> Playbook:
    """A compact_in_place conversation whose provider compacts (REQ-SEG-048), first request in
    flight."""
    return asking(B.COMPACT_IN_PLACE, compaction="provider", **settings)


SUMMARY_BLOCK = CompactionBlock(
    provider="anthropic", content="The parser is half done.", signature="sig-1"
)


@requirement("REQ-SEG-048")
def test_seg048_the_provider_compacts_only_a_compact_in_place_conversation() -> None:
    for behavior in B:
        if behavior is B.COMPACT_IN_PLACE:
            assert conversation(behavior, compaction="provider").config.compaction == "provider"
            continue
        with pytest.raises(pydantic.ValidationError, match="compact_in_place"):
            conversation(behavior, compaction="provider")
    with pytest.raises(pydantic.ValidationError, match="compact_in_place"):
        new_conversation(model=MODEL, compaction="provider")  # the default behaviour


@requirement("REQ-SEG-048")
def test_seg048_while_the_provider_compacts_the_limit_is_the_window() -> None:
    """At the threshold, the next request goes to the provider, which compacts it; segue
    steps in at the window only (and, past its bound, at the threshold again)."""
    playbook = providing()
    crossing = reply(THRESHOLD + 1_000, call(1))
    playbook >> crossing << [warning(THRESHOLD + 1_000), "append_message", "execute_tools"]
    # The tool runs: the provider compacts the next request.
    (
        playbook
        >> ToolResult(tool_call_id="toolu_1", output="done")
        << ["append_message", RequestLlm()]
    )
    (
        playbook
        >> reply(WINDOW)
        << ["append_message", ArchiveTranscript(generation=1), "request_compaction"]
    )
    playbook.in_phase("compacting")  # at the window, segue compacts itself
    bounded = providing(max_continuations=0)  # no compaction left: the threshold again
    bounded >> reply(THRESHOLD) << [warning(THRESHOLD), "append_message", "notify_failed"]


@requirement("REQ-SEG-048")
def test_seg048_a_response_after_the_providers_compaction_starts_a_generation_in_one_step() -> None:
    playbook = providing(system_tokens=100)
    playbook.given(reply(THRESHOLD - 5_000), UserMessage(text="and now?"))
    compaction = ProviderCompacted(
        summary="The parser is half done.",
        block=SUMMARY_BLOCK,
        usage=Usage(input_tokens=THRESHOLD, output_tokens=900),
        post_tokens=1_000,
    )
    playbook >> LlmResponse(text="Next: tests.", usage=usage(1_500), compactions=(compaction,))
    summary = Message(
        kind="summary",
        text="The parser is half done.",
        usage=compaction.usage,
        generation=2,
        content=(SUMMARY_BLOCK,),
    )
    playbook << [
        ArchiveTranscript(generation=1),
        StartGeneration(generation=2, summary="The parser is half done."),
        AppendMessage(message=summary),
        assistant(1_500, text="Next: tests.", generation=2),
    ]
    state = playbook.state
    assert (state.generation, state.continuations, state.context_tokens) == (2, 1, 1_500)
    assert isinstance(state.phase, Idle)


@requirement("REQ-SEG-048")
def test_seg048_a_turn_paused_after_the_compaction_goes_on_at_once() -> None:
    playbook = providing()
    playbook.given(reply(THRESHOLD - 5_000), UserMessage(text="pin me", pinned=True))
    compaction = ProviderCompacted(
        summary="Earlier.", block=SUMMARY_BLOCK, post_tokens=2_000, kept_messages=1
    )
    paused = LlmResponse(text="", stop_reason="compaction", compactions=(compaction,))
    # Nothing else is recorded (the provider said nothing else), and the turn asks again.
    playbook >> paused << ["archive_transcript", "start_generation", "append_message", RequestLlm()]
    assert playbook.state.generation == 2
    assert playbook.state.message_count == 4  # two user messages, a reply, the summary
    # The same stop reason from a provider segue did not ask ends the turn as any other.
    segue_compacts = asking(B.COMPACT_IN_PLACE)
    segue_compacts >> LlmResponse(text="", stop_reason="compaction") << ["append_message"]
    segue_compacts.in_phase("idle")


@requirement("REQ-SEG-049")
def test_seg049_a_compaction_without_a_summary_falls_back_and_the_turn_goes_on() -> None:
    playbook = providing()
    playbook.given(reply(THRESHOLD - 5_000), UserMessage(text="and now?"))
    failed = ProviderCompacted(
        summary="", block=CompactionBlock(provider="anthropic", content=None)
    )
    playbook >> LlmResponse(text="Here.", usage=usage(THRESHOLD), compactions=(failed,))
    playbook << [
        NotifyCompactionFallback(reason="the provider's compaction produced no summary"),
        "append_message",
        "archive_transcript",
        "request_compaction",
    ]  # nothing of the failure is recorded; segue's own compaction takes the threshold
    assert playbook.state.compaction_fallback
    assert playbook.state.generation == 1
    messages = [e.message for e in playbook.effects if isinstance(e, AppendMessage)]
    assert [m.kind for m in messages] == ["assistant"]


@requirement("REQ-SEG-049")
def test_seg049_a_refusal_to_compact_falls_back_once_and_asks_again() -> None:
    playbook = providing()
    refused = LlmError(message="compaction is not supported", compaction_refused=True)
    (
        playbook
        >> refused
        << [NotifyCompactionFallback(reason="compaction is not supported"), RequestLlm()]
    )
    assert playbook.state.compaction_fallback
    playbook.given(reply(1_000))
    playbook.given(UserMessage(text="again"))
    playbook >> refused << ["notify_failed"]  # fallen back: an ordinary failure now
    on_demand = providing()
    on_demand.given(reply(1_000))
    on_demand >> ManualContinuation() << ["archive_transcript", "request_compaction"]
    on_demand >> CompactionFailed(error="no", compaction_refused=True)
    on_demand << [NotifyCompactionFallback(reason="no"), RequestCompaction()]
    assert on_demand.state.compaction_fallback


@requirement("REQ-SEG-050")
def test_seg050_context_edits_are_refused_unless_as_the_provider_documents_them() -> None:
    clear = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 30_000},
        "keep": {"type": "tool_uses", "value": 3},
        "clear_at_least": {"type": "input_tokens", "value": 5_000},
        "exclude_tools": ["web_search"],
        "clear_tool_inputs": True,
    }
    thinking = {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}}
    state = conversation(context_edits=[clear, thinking])
    assert state.config.context_edits == (clear, thinking)
    wrong = [
        ([{"type": "clear_tool_uses_20250919", "keep": 3}], "keep"),
        (
            [{"type": "clear_tool_uses_20250919", "trigger": {"type": "seconds", "value": 1}}],
            "trigger",
        ),
        (
            [{"type": "clear_tool_uses_20250919", "keeps": {"type": "tool_uses", "value": 1}}],
            "keeps",
        ),
        ([{"type": "clear_everything"}], "unknown strategy"),
        ([{"type": "compact_20260112"}], 'compaction="provider"'),
        ([thinking, thinking], "twice"),
    ]
    for edits, said in wrong:
        with pytest.raises(pydantic.ValidationError, match=re.escape(said)):
            conversation(context_edits=edits)


# =========================================================================== the pause triggers


def _pause_taken(state: ConversationState) -> tuple[ConversationState, SessionSnapshot]:
    """``state`` waits for its pause's checkpoint: the answer pauses it (REQ-SEG-019); the
    paused state and its snapshot."""
    assert isinstance(state.phase, AwaitingCheckpoint), state.phase
    assert state.phase.purpose == "pause"
    paused, effects = transition(state, CheckpointResponse(text="<checkpoint>x</checkpoint>"))
    assert isinstance(paused.phase, Paused)
    assert [effect.kind for effect in effects][-1] == "save_snapshot"
    return paused, paused.phase.snapshot


@requirement("REQ-SEG-052")
def test_seg052_the_reply_that_ends_the_nth_turn_pauses_never_one_that_asks_for_tools() -> None:
    playbook = Playbook(conversation(pause_after_turns=2))
    playbook.given(UserMessage(text="one"), reply(1_000)).in_phase("idle")
    assert playbook.state.turns_since_resume == 1
    playbook.given(UserMessage(text="two"))
    (playbook >> reply(2_000, call(1)) << [assistant(2_000, call(1)), "execute_tools"])
    playbook.given(ToolResult(tool_call_id="toolu_1", output="done")).in_phase("llm_requesting")
    (
        playbook
        >> reply(3_000, text="all done")
        << [assistant(3_000, text="all done"), RequestCheckpoint(purpose="pause")]
    )
    assert playbook.state.pause_reason == "after 2 turns"
    snapshot = _pause_taken(playbook.state)[1]
    assert (snapshot.trigger, snapshot.reason) == ("pause", "after 2 turns")
    # A pause asked for keeps its reason; a reply that crosses the limit carries the pause
    # through the limit's path (here a compaction), and the pause is taken after it.
    asked = Playbook(conversation(pause_after_turns=1)).given(UserMessage(text="go"))
    asked.given(PauseRequested(reason="lunch"), reply(1_000))
    assert asked.state.pause_reason == "lunch"
    crossing = Playbook(conversation(B.COMPACT_IN_PLACE, pause_after_turns=1))
    crossing.given(UserMessage(text="go"))
    crossing >> reply(THRESHOLD)
    crossing << [
        "notify_context_warning",
        "append_message",
        "archive_transcript",
        "request_compaction",
    ]
    crossing >> CompactionResponse(summary="s", retained_tokens=5_000)
    crossing << ["start_generation", "append_message", RequestCheckpoint(purpose="pause")]
    assert crossing.state.pause_reason == "after 1 turn"


@requirement("REQ-SEG-053")
def test_seg053_a_turn_that_ends_s_seconds_after_the_start_pauses_never_mid_turn() -> None:
    playbook = Playbook(conversation(pause_after_seconds=1_800.0, started_at=1_000.0))
    playbook.given(UserMessage(text="one"))
    playbook.given(LlmResponse(text="early", usage=usage(1_000), at=2_799.0)).in_phase("idle")
    playbook.given(UserMessage(text="two"))
    # Past the bound mid-turn: the tools still run and the turn goes on.
    late = LlmResponse(text="", tool_calls=(call(1),), usage=usage(2_000), at=2_800.0)
    playbook.given(late).in_phase("tool_executing")
    playbook.given(ToolResult(tool_call_id="toolu_1", output="ok")).in_phase("llm_requesting")
    playbook >> LlmResponse(text="done", usage=usage(3_000), at=2_900.0)
    playbook << [assistant(3_000, text="done"), RequestCheckpoint(purpose="pause")]
    assert playbook.state.pause_reason == "after 30 minutes"
    # Without a time the trigger cannot fire; a conversation made without one starts its clock
    # at its first answer.
    untimed = Playbook(conversation(pause_after_seconds=60.0)).given(UserMessage(text="a"))
    untimed.given(LlmResponse(text="b", usage=usage(1_000), at=500.0)).in_phase("idle")
    assert untimed.state.active_since == 500.0
    untimed.given(UserMessage(text="c"), reply(1_100)).in_phase("idle")
    untimed.given(UserMessage(text="d"), LlmResponse(text="e", at=560.0))
    assert untimed.state.pause_reason == "after 1 minute"


@requirement("REQ-SEG-054")
def test_seg054_a_pause_by_a_trigger_resumes_as_any_and_counts_again_from_the_resume() -> None:
    playbook = Playbook(conversation(pause_after_turns=1, pause_after_seconds=60.0, started_at=0.0))
    playbook.given(UserMessage(text="go"), LlmResponse(text="done", at=10.0))
    paused, snapshot = _pause_taken(playbook.state)
    assert snapshot.reason == "after 1 turn"
    refused = transition(paused, UserMessage(text="more"))[1]
    assert [(type(effect), getattr(effect, "cause", None)) for effect in refused] == [
        (RejectUserMessage, "paused")
    ]
    resumed, _ = transition(paused, ResumeRequested(at=1_000.0))
    assert (resumed.turns_since_resume, resumed.active_since) == (0, 1_000.0)
    assert resumed.phase.kind == "llm_requesting"  # the resume's own turn
    again, _ = transition(resumed, LlmResponse(text="resumed", at=1_030.0))
    assert again.pause_reason == "after 1 turn"  # its count began at the resume; 30 s is not 60
    # A cancelled pause is no resume: the next turn's end pauses again.
    cancelled, _ = transition(paused, UserCancel())
    assert cancelled.phase.kind == "idle"
    cancelled, _ = transition(cancelled, UserMessage(text="again"))
    cancelled, _ = transition(cancelled, LlmResponse(text="ok", at=20.0))
    assert cancelled.pause_reason == "after 1 turn"
    assert isinstance(cancelled.phase, AwaitingCheckpoint)
    with pytest.raises(pydantic.ValidationError, match="pause_after_turns"):
        conversation(pause_after_turns=0)
    with pytest.raises(pydantic.ValidationError, match="pause_after_seconds"):
        conversation(pause_after_seconds=-1.0)


# =========================================================================== control at the limit


@requirement("REQ-SEG-041")
@pytest.mark.parametrize("behavior", [B.THRESHOLD_BASED_CONTINUATION, B.CHECKPOINT_RESTART])
def test_seg041_a_manual_triggers_focus_goes_with_every_ask(
    behavior: ContextExhaustionBehavior,
) -> None:
    focus = "the parser's error recovery"
    continuing = behavior is B.THRESHOLD_BASED_CONTINUATION
    ask: Any = RequestContinuation if continuing else RequestCheckpoint
    failed: Any = ContinuationFailed if continuing else CheckpointFailed
    playbook = idle_at(100_000, behavior) >> ManualContinuation(focus=focus) << [ask(focus=focus)]
    assert playbook.phase.focus == focus
    # A trim after an overflow, and a retry after a retryable error, ask with the same focus.
    playbook >> failed(error="too long", context_overflow=True)
    playbook << [ask(attempt=2, trim_level=1, focus=focus)]
    playbook >> failed(error="busy", retryable=True) << ["schedule_retry"]
    playbook >> RetryDue(attempt=3) << [ask(attempt=3, trim_level=1, focus=focus)]


@requirement("REQ-SEG-041")
def test_seg041_compaction_asks_with_the_focus_after_its_archive() -> None:
    focus = "the schema decisions"
    playbook = idle_at(100_000, B.COMPACT_IN_PLACE) >> ManualContinuation(focus=focus)
    playbook << [ArchiveTranscript(generation=1), RequestCompaction(focus=focus)]
    playbook >> CompactionResponse(summary="", retained_tokens=1_000)
    playbook << [RequestCompaction(alternate=True, focus=focus)]
    playbook >> CompactionFailed(error="overloaded", retryable=True) << ["schedule_retry"]
    playbook >> RetryDue(attempt=2)
    playbook << [RequestCompaction(attempt=2, alternate=True, focus=focus)]


@requirement("REQ-SEG-041")
def test_seg041_the_second_ask_after_an_empty_summary_keeps_the_focus() -> None:
    playbook = idle_at(100_000) >> ManualContinuation(focus="open questions")
    playbook << [RequestContinuation(focus="open questions")]
    playbook >> ContinuationResponse(summary="  ")
    playbook << [RequestContinuation(alternate=True, focus="open questions")]
    # A trigger without a focus asks as before.
    plain = idle_at(100_000) >> ManualContinuation() << [RequestContinuation()]
    assert plain.phase.focus is None


@requirement("REQ-SEG-042")
def test_seg042_a_pinned_message_is_recorded_as_such_and_counted() -> None:
    text = "Always answer in French."
    playbook = Playbook(conversation()) >> UserMessage(text=text, pinned=True)
    playbook << [AppendMessage(message=Message(kind="user", text=text, pinned=True)), RequestLlm()]
    assert playbook.state.pinned_tokens == estimate_tokens(text)
    playbook.given(reply(1_000)) >> UserMessage(text="hello") << [user("hello"), RequestLlm()]
    assert playbook.state.pinned_tokens == estimate_tokens(text)  # unpinned adds nothing


@requirement("REQ-SEG-042", "REQ-SEG-005")
def test_seg042_pinned_text_past_a_quarter_of_the_window_is_refused() -> None:
    budget = WINDOW // 4
    first = UserMessage(text="pinned", pinned=True, token_count=budget - 100)
    playbook = Playbook(conversation()).given(first, reply(60_000))
    assert playbook.state.pinned_tokens == budget - 100
    before = playbook.state
    playbook >> UserMessage(text="also", pinned=True, token_count=101) << [RejectUserMessage]
    rejection = playbook.effects[0]
    assert isinstance(rejection, RejectUserMessage)
    assert rejection.cause == "too_large"
    assert f"{budget:,}" in rejection.reason
    assert playbook.state is before  # nothing recorded
    # Exactly at the budget is taken; unpinned, the same message is taken too.
    (
        playbook
        >> UserMessage(text="also", pinned=True, token_count=100)
        << ["append_message", "request_llm"]
    )
    assert playbook.state.pinned_tokens == budget


@requirement("REQ-SEG-042", "REQ-SEG-016")
def test_seg042_a_restarts_seed_counts_the_pinned_messages() -> None:
    pinned = UserMessage(text="rules", pinned=True, token_count=40_000)
    fits = Playbook(conversation(B.CHECKPOINT_RESTART)).given(pinned, reply(THRESHOLD))
    fits >> CheckpointResponse(text="<checkpoint>go</checkpoint>")
    fits << ["append_message", "start_session", "append_message"]
    seed = fits.state.pending_tokens
    assert seed == 40_000 + estimate_tokens(continuation_prompt("go"))
    # With the system prompt, the same seed reaches the threshold: it fails, it never loops.
    heavy = conversation(B.CHECKPOINT_RESTART, system_tokens=THRESHOLD - seed)
    crowded = Playbook(heavy).given(pinned, reply(THRESHOLD))
    crowded >> CheckpointResponse(text="<checkpoint>go</checkpoint>")
    crowded << ["append_message", "notify_failed"]
    assert crowded.phase.error_kind is ErrorKind.CHECKPOINT_OVERFLOW


@requirement("REQ-SEG-043")
def test_seg043_a_tool_result_past_the_cap_is_recorded_cut_with_a_note() -> None:
    state = conversation(max_tool_output_tokens=1_000)
    playbook = Playbook(state).given(UserMessage(text="list"), reply(2_000, call(1)))
    output = "".join(f"row {n}\n" for n in range(100_000))
    (
        playbook
        >> ToolResult(tool_call_id="toolu_1", output=output)
        << ["append_message", "request_llm"]
    )
    (recorded,) = [m for m in playbook.messages if m.kind == "tool_result"]
    assert estimate_tokens(recorded.text) <= 1_000
    assert recorded.text.startswith("row 0\nrow 1\n")
    assert recorded.text.endswith("row 99999\n")
    assert "of this output were cut here" in recorded.text
    assert playbook.state.pending_tokens <= 1_000  # what is sent is what is counted


@requirement("REQ-SEG-043")
def test_seg043_a_result_within_the_cap_is_recorded_as_it_is() -> None:
    state = conversation(max_tool_output_tokens=1_000)
    playbook = Playbook(state).given(UserMessage(text="list"), reply(2_000, call(1)))
    output = "x" * 2_900  # an estimate of 975 tokens
    playbook >> ToolResult(tool_call_id="toolu_1", output=output)
    playbook << [tool_result("toolu_1", output), RequestLlm()]
    # The default cap: 25,000 tokens in a large window, an eighth of a small one.
    assert conversation().config.tool_output_cap == 25_000
    assert conversation(context_window=32_000).config.tool_output_cap == 4_000


@requirement("REQ-SEG-044")
def test_seg044_past_its_time_bound_a_run_stops_at_the_limit() -> None:
    playbook = asking(B.CHECKPOINT_RESTART, max_run_seconds=3_600).given(reply(THRESHOLD))
    text = "<checkpoint>## Goal\nShip it.</checkpoint>"
    playbook >> CheckpointResponse(text=text, elapsed_seconds=3_600)
    playbook << ["append_message", NotifyFailed]
    assert playbook.phase.error_kind is ErrorKind.RUN_TIME_LIMIT
    assert "3,600 s" in playbook.phase.message
    assert playbook.messages[-1].kind == "checkpoint"
    # Within the bound (or without one, or unmeasured), it restarts.
    for bound, elapsed in ((3_600, 3_599.0), (None, 10**6), (3_600, None)):
        settings = {} if bound is None else {"max_run_seconds": bound}
        running = asking(B.CHECKPOINT_RESTART, **settings).given(reply(THRESHOLD))
        running >> CheckpointResponse(text=text, elapsed_seconds=elapsed)
        running << ["append_message", "start_session", "append_message"]


@requirement("REQ-SEG-044")
def test_seg044_a_checkpoint_given_up_on_past_the_bound_stops_too() -> None:
    playbook = asking(B.CHECKPOINT_RESTART, max_run_seconds=60, max_attempts=1)
    playbook.given(reply(THRESHOLD))
    playbook >> CheckpointFailed(error="refused", elapsed_seconds=61) << [NotifyFailed]
    assert playbook.phase.error_kind is ErrorKind.RUN_TIME_LIMIT


@requirement("REQ-SEG-046")
def test_seg046_a_cancel_ends_a_pause_and_keeps_the_session() -> None:
    playbook = paused()
    snapshot = playbook.phase.snapshot
    session = playbook.state.session
    playbook >> UserCancel() << []
    playbook.in_phase("idle")
    assert (playbook.state.session, playbook.state.snapshots) == (session, snapshot.version)
    playbook >> UserMessage(text="back") << ["append_message", "request_llm"]


@requirement("REQ-SEG-047")
@pytest.mark.parametrize("purpose", ["continuation", "checkpoint", "compaction"])
def test_seg047_the_limits_request_reuses_the_turns_cached_prefix(purpose: Any) -> None:
    """The request at the limit, as ``AnthropicModel`` sends it, against the fake server's
    prompt cache: it reads the tools and system prompt the turn cached, writes nothing, and
    can call no tool; without the turn's tools (or trimmed) it declares none."""
    from segue.executor.model_port import LlmRequest, ToolSpec
    from segue.executor.models.anthropic_payload import build_payload
    from segue.testing.prompt_cache import PromptCache

    tools = (ToolSpec(name="lookup", description="Look it up. " * 400, input_schema={}),)
    call = ToolCall(id="toolu_1", name="lookup", input={"q": "x"})
    history = (
        Message(kind="user", text="Find x."),
        Message(kind="assistant", text="Looking.", tool_calls=(call,)),
        Message(kind="tool_result", text="x is 42. " * 200, tool_call_id="toolu_1"),
        Message(
            kind="assistant", text="x is 42.", tool_calls=(call.model_copy(update={"id": "r"}),)
        ),
    )

    def body(**fields: Any) -> dict[str, Any]:
        request = LlmRequest(
            conversation_id="c",
            model="claude-sonnet-4-6",
            system="Be brief. " * 200,
            messages=history,
            **fields,
        )
        payload = build_payload(request, max_tokens=1_000)
        return {"model": request.model, **payload.arguments(), **payload.options}

    cache = PromptCache()
    turn = body(purpose="turn", tools=tools)
    cache.account(turn)
    limit = body(purpose=purpose, tools=tools, instruction="Summarise.")
    accounted = cache.account(limit)
    assert limit["tool_choice"] == {"type": "none"}  # no tool can be called
    assert (limit["tools"], limit["system"]) == (turn["tools"], turn["system"])
    assert limit["messages"][:-1] == turn["messages"][:-1]
    assert accounted.cache_read_input_tokens > 0  # the tools and system, read back
    assert accounted.cache_creation_input_tokens == 0  # nothing written that nobody reads
    for tool_less in (
        body(purpose=purpose, instruction="Summarise."),
        body(purpose=purpose, tools=tools, instruction="Summarise.", trim_level=1),
    ):
        assert "tools" not in tool_less
        assert "tool_use" not in str(tool_less["messages"])
        assert tool_less["messages"][-1]["content"][-1]["text"] == "Summarise."


@requirement("REQ-SEG-055")
@pytest.mark.parametrize("purpose", ["continuation", "checkpoint", "compaction"])
def test_seg055_reuse_prefix_repeats_the_turn_and_reads_it_from_the_cache(purpose: Any) -> None:
    """The core asks for the shape the conversation chose (the first ask; tool-less once an
    overflow trimmed it); ``AnthropicModel`` sends the turn's request exactly with the
    instruction and a breakpoint last, and the fake's prompt cache reads all of the turn's
    prefix back."""
    from segue.executor.model_port import LlmRequest, ToolSpec
    from segue.executor.models.anthropic_payload import build_payload
    from segue.testing.prompt_cache import PromptCache

    behavior = {
        "continuation": B.THRESHOLD_BASED_CONTINUATION,
        "checkpoint": B.CHECKPOINT_RESTART,
        "compaction": B.COMPACT_IN_PLACE,
    }[purpose]
    playbook = asking(behavior, summary_request="reuse_prefix").given(reply(THRESHOLD))
    asked = playbook.effects[-1]
    assert getattr(asked, "shape", None) == "reuse_prefix"
    failed = {
        "continuation": ContinuationFailed,
        "checkpoint": CheckpointFailed,
        "compaction": CompactionFailed,
    }[purpose]
    playbook.given(failed(error="too long", context_overflow=True))
    assert getattr(playbook.effects[-1], "shape", None) == "tool_less"  # trimmed: as text
    tool_less = asking(behavior).given(reply(THRESHOLD)).effects[-1]
    assert getattr(tool_less, "shape", None) == "tool_less"  # the default

    tools = (ToolSpec(name="lookup", description="Look it up. " * 400, input_schema={}),)
    history = (
        Message(kind="user", text="Find x. " * 300),
        Message(kind="assistant", text="x is 42. " * 300),
        Message(kind="user", text="And y? " * 300),
    )

    def body(**fields: Any) -> dict[str, Any]:
        request = LlmRequest(
            conversation_id="c",
            model="claude-sonnet-4-6",
            system="Be brief. " * 200,
            messages=history,
            tools=tools,
            **fields,
        )
        payload = build_payload(request, max_tokens=1_000)
        return {"model": request.model, **payload.arguments(), **payload.options}

    cache = PromptCache()
    turn = body(purpose="turn")
    cache.account(turn)
    limit = body(purpose=purpose, instruction="Summarise.", reuse_prefix=True)
    accounted = cache.account(limit)
    assert "tool_choice" not in limit  # the turn's (none set): its tools stay callable
    assert (limit["tools"], limit["system"]) == (turn["tools"], turn["system"])
    assert limit["messages"][:-1] == turn["messages"][:-1]
    kept = [
        {k: v for k, v in block.items() if k != "cache_control"}
        for block in turn["messages"][-1]["content"]
    ]
    assert limit["messages"][-1]["content"][:-1] == kept  # the turn's last message, then
    assert limit["messages"][-1]["content"][-1] == {
        "type": "text",
        "text": "Summarise.",
        "cache_control": {"type": "ephemeral"},
    }
    prompt = accounted.input_tokens + accounted.cache_read_input_tokens
    written = accounted.cache_creation_input_tokens
    assert accounted.cache_read_input_tokens / (prompt + written) > 0.95


@requirement("REQ-SEG-056")
def test_seg056_a_tool_call_in_a_summary_is_refused_and_asked_again() -> None:
    """Never run, named with the rejected calls, asked again with the prefix, then tool-less,
    whose answer is read for its text; the tool-less default reads the answer at once."""
    calls = (call(7),)
    playbook = asking(summary_request="reuse_prefix").given(reply(THRESHOLD, call(1)))
    playbook.in_phase("awaiting_continuation")
    (
        playbook
        >> ContinuationResponse(summary="Checking.", tool_calls=calls)
        << [
            RequestContinuation(
                rejected_tool_calls=(call(1), call(7)), shape="reuse_prefix", attempt=1
            )
        ]
    )
    assert playbook.phase.tool_answers == 1
    again = (call(8),)
    (
        playbook
        >> ContinuationResponse(summary="Checking.", tool_calls=again)
        << [
            RequestContinuation(
                rejected_tool_calls=(call(1), call(7), call(8)), shape="tool_less", attempt=1
            )
        ]
    )
    (
        playbook
        >> ContinuationResponse(summary="The summary.", tool_calls=(call(9),))
        << [
            continuation("The summary."),
            NotifyContextExhausted(summary="The summary."),
        ]
    )
    playbook.in_phase("context_exhausted")
    kinds = {effect.kind for _, effects in playbook.log for effect in effects}
    assert "execute_tools" not in kinds
    default = asking().given(reply(THRESHOLD)).in_phase("awaiting_continuation")
    (
        default
        >> ContinuationResponse(summary="Read.", tool_calls=calls)
        << [
            continuation("Read."),
            NotifyContextExhausted(summary="Read."),
        ]
    )


@requirement("REQ-SEG-057")
def test_seg057_the_conformance_kit_checks_an_adapter_that_claims_it() -> None:
    """segue's adapters that claim the shape pass the kit's check on their fakes."""
    import asyncio

    from segue.testing.conformance import run_check
    from segue.testing.conformance.checks import summaries_can_repeat_the_turn
    from segue.testing.harnesses import AnthropicHarness, OpenAIHarness

    for harness in (AnthropicHarness(), OpenAIHarness("responses")):
        with harness as started:
            assert asyncio.run(run_check(started, summaries_can_repeat_the_turn)) == "passed"


# =========================================================================== traceability


def _tagged_tests() -> dict[str, tuple[str, ...]]:
    """Tagged tests here, and in ``test_chains``, ``test_control``, ``test_imports``,
    ``test_deleted_streams`` and ``test_redo_summary`` (the requirements the runtime carries
    out)."""
    tests = {
        **vars(test_chains),
        **vars(test_control),
        **vars(test_imports),
        **vars(test_deleted_streams),
        **vars(test_redo_summary),
        **globals(),
    }
    return {
        name: requirements_of(test)
        for name, test in tests.items()
        if name.startswith("test_") and requirements_of(test)
    }


def test_every_requirement_in_the_spec_has_a_test() -> None:
    spec = SPEC.read_text(encoding="utf-8")
    declared = re.findall(r"^### (REQ-[A-Z]+-\d{3}):", spec, flags=re.MULTILINE)
    assert len(declared) == len(set(declared)) == 70, declared
    mentioned = set(re.findall(r"REQ-[A-Z]+-\d{3}", spec))
    assert mentioned == set(declared), "the spec mentions ids it does not declare"
    tagged = _tagged_tests()
    covered = {rid for ids in tagged.values() for rid in ids}
    assert sorted(set(declared) - covered) == [], "requirements without a test"
    assert sorted(covered - set(declared)) == [], "tests cite ids the spec does not declare"
    for name, ids in tagged.items():
        short = {rid.split("-", 1)[1].replace("-", "").lower() for rid in ids}
        assert any(f"_{tag}_" in name for tag in short), f"{name} is not named after {ids}"
