"""Handlers of an ordinary turn: Idle, LlmRequesting, ToolExecuting, and the phases that
only answer a user message (exhausted, failed, paused). The laws are in ``machine``.
"""

from __future__ import annotations

from typing import Any, cast

from segue.effects import (
    Effect,
    ExecuteTools,
    NotifyContextWarning,
    NotifyToolRoundLimit,
    NotifyTruncated,
    RejectUserMessage,
    ReportAccountingAnomaly,
    ScheduleRetry,
    StartGeneration,
)
from segue.statemachine._paths import (
    CANCEL,
    NOTHING,
    PAUSED_TURN,
    TOOL_NOT_RUN_CANCELLED,
    TOOL_NOT_RUN_CONTEXT,
    TOOL_NOT_RUN_LIMIT,
    TRUNCATED,
    WINDOW_EXCEEDED,
    Requesting,
    Result,
    exhaust,
    fail,
    not_run,
    record,
    request_for,
    retry_delay,
    turn_boundary,
)
from segue.statemachine.accounting import (
    cap_text,
    estimate_content,
    estimate_tokens,
    estimate_tool_calls,
    reported_occupancy,
)
from segue.statemachine.events import (
    LlmError,
    LlmResponse,
    ManualContinuation,
    PauseRequested,
    ProviderCompacted,
    RetryDue,
    ToolResult,
    UserMessage,
)
from segue.statemachine.models import (
    ContextExhaustionBehavior,
    ErrorKind,
)
from segue.statemachine.phases import (
    IDLE,
    ExhaustionTrigger,
    Failed,
    LlmRequesting,
    ToolExecuting,
)
from segue.statemachine.rules import RECOVERABLE_ERRORS
from segue.statemachine.state import ConversationState

# --------------------------------------------------------------------------- Idle


def on_user_message(state: ConversationState, event: UserMessage) -> Result:
    tokens, text, content = event.token_count, event.text, event.content
    if tokens is None:
        tokens = estimate_content(text, content) if content else estimate_tokens(text)
    config = state.config
    if tokens >= config.continuation_tokens:
        reason = (
            f"The message is too large for this conversation: about {tokens:,} tokens, while "
            f"{config.continuation_tokens:,} is the most a whole prompt may hold here. "
            "Shorten it, or split it over several messages."
        )
        return state, (RejectUserMessage(reason=reason, cause="too_large"),)
    changes: dict[str, Any] = {
        "pending_tokens": state.pending_tokens + tokens,
        "message_count": state.message_count + 1,
        "tool_rounds": 0,
    }
    kept: dict[str, Any] = {"content": content} if content else {}
    if event.pinned:
        pinned = state.pinned_tokens + tokens
        if pinned > config.pinned_budget:
            reason = (
                f"The message cannot be pinned: about {tokens:,} tokens, and pinned messages "
                f"may hold {config.pinned_budget:,} together in this conversation (a quarter of "
                f"its window; {state.pinned_tokens:,} are pinned already). Send it unpinned, "
                "or pin something shorter."
            )
            return state, (RejectUserMessage(reason=reason, cause="too_large"),)
        changes["pinned_tokens"] = pinned
        kept["pinned"] = True
    effects: list[Effect] = [record(state, "user", text, **kept)]
    return turn_boundary(state, effects, True, changes)


def on_manual_continuation(state: ConversationState, event: ManualContinuation) -> Result:
    return exhaust(state, "manual", (), False, [], focus=event.focus)


def on_cancel_pause(state: ConversationState, _event: object) -> Result:
    """REQ-SEG-046: a cancel ends a pause; the conversation waits for the user in the session
    it paused in (its snapshot stays stored)."""
    return state.model_copy(update={"phase": IDLE}), NOTHING


def on_pause_when_idle(state: ConversationState, event: PauseRequested) -> Result:
    changes = {"pause_requested": True, "pause_reason": event.reason}
    return turn_boundary(state, [], False, changes)


def on_pause_when_busy(state: ConversationState, event: PauseRequested) -> Result:
    if state.pause_requested:
        return state, NOTHING
    changes = {"pause_requested": True, "pause_reason": event.reason}
    return state.model_copy(update=changes), NOTHING


def reject_busy(state: ConversationState, _event: object) -> Result:
    reason = (
        f"The conversation is busy ({state.phase.kind.replace('_', ' ')}); "
        "send the message when it is idle, or cancel first."
    )
    return state, (RejectUserMessage(reason=reason, cause="busy"),)


# --------------------------------------------------------------------------- LlmRequesting


def _measure(
    state: ConversationState, event: LlmResponse, effects: list[Effect]
) -> tuple[dict[str, Any], bool]:
    """What a response's usage changes in the state, and whether it crossed the threshold."""
    config = state.config
    reported = reported_occupancy(event.usage)
    if reported is not None and reported > config.context_window:
        effects.append(
            ReportAccountingAnomaly(reported_tokens=reported, context_window=config.context_window)
        )
        reported = None
    if reported is None:
        content = event.content
        grown = state.pending_tokens + (
            estimate_content(event.text, content) if content else estimate_tokens(event.text)
        )
        if event.tool_calls:
            grown += estimate_tool_calls(event.tool_calls)
        return {"pending_tokens": grown, "message_count": state.message_count + 1}, False
    changes: dict[str, Any] = {
        "context_tokens": reported,
        "pending_tokens": 0,
        "message_count": state.message_count + 1,
    }
    if not state.warned and reported >= config.warning_tokens:
        effects.append(
            NotifyContextWarning(context_tokens=reported, context_window=config.context_window)
        )
        changes["warned"] = True
    return changes, reported >= config.continuation_tokens


def on_llm_response(state: ConversationState, event: LlmResponse) -> Result:
    phase: LlmRequesting = state.phase  # type: ignore[assignment]  # the table routes it here
    if phase.retry_pending:
        return state, NOTHING
    effects: list[Effect] = []
    changes, over = _measure(state, event, effects)
    if event.session_ref is not None:
        changes["provider_session"] = event.session_ref  # REQ-SEG-032
    calls, stop_reason, usage = event.tool_calls, event.stop_reason, event.usage
    kept = {"content": event.content} if event.content else {}
    if stop_reason == WINDOW_EXCEEDED or over:
        said = record(state, "assistant", event.text, tool_calls=calls, usage=usage, **kept)
        effects.append(said)
        if calls:
            # Their error results are recorded messages, so they are counted; their tokens are
            # not, since every exhaustion path leaves this context (new session, generation or
            # an end) and the figure reported to the user stays the measured one.
            effects += not_run(state, calls, TOOL_NOT_RUN_CONTEXT)
            changes["message_count"] += len(calls)
        trigger: ExhaustionTrigger = "overflow" if stop_reason == WINDOW_EXCEEDED else "threshold"
        resume_after = bool(calls) or stop_reason in (WINDOW_EXCEEDED, PAUSED_TURN)
        measured = state.model_copy(update=changes)
        return exhaust(measured, trigger, calls, resume_after, effects, usage=usage)
    if stop_reason == TRUNCATED:
        # The dropped calls leave its blocks too: a tool_use without a result is refused.
        if kept:
            kept = {"content": tuple(b for b in event.content if b.type != "tool_use")}
        effects.append(record(state, "assistant", event.text, usage=usage, **kept))
        effects.append(NotifyTruncated(dropped_tool_calls=calls))
        return turn_boundary(state, effects, False, changes)
    effects.append(record(state, "assistant", event.text, tool_calls=calls, usage=usage, **kept))
    if not calls:
        return turn_boundary(state, effects, False, changes)
    if phase.final or state.tool_rounds >= state.config.max_tool_rounds:
        return _round_limit(state, calls, effects, changes, grace=not phase.final)
    changes["tool_rounds"] = state.tool_rounds + 1
    # One call is the common case; several may repeat an id, which is waited for once.
    pending = (calls[0].id,) if len(calls) == 1 else tuple(dict.fromkeys(c.id for c in calls))
    effects.append(ExecuteTools(tool_calls=calls))
    changes["phase"] = ToolExecuting(tool_calls=calls, pending=pending)
    return state.model_copy(update=changes), tuple(effects)


def on_provider_compacted(state: ConversationState, event: ProviderCompacted) -> Result:
    """REQ-SEG-033: the provider's context now starts from its summary, so segue's record does
    too: a new generation, whose occupancy the response that follows will measure."""
    generation = state.generation + 1
    pending = event.post_tokens
    if pending is None:
        pending = state.config.system_tokens + estimate_tokens(event.summary)
    fresh = state.model_copy(
        update={
            "generation": generation,
            "context_tokens": None,
            "pending_tokens": pending,
            "message_count": state.message_count + 1,
        }
    )
    effects: tuple[Effect, ...] = (
        StartGeneration(generation=generation, summary=event.summary),
        record(fresh, "summary", event.summary),
    )
    return fresh, effects


def _round_limit(
    state: ConversationState,
    calls: tuple[Any, ...],
    effects: list[Effect],
    changes: dict[str, Any],
    *,
    grace: bool,
) -> Result:
    """The turn used its tool rounds: the calls are answered as not run (no tool_use is left
    unpaired), then a sub-agent fails, and anyone else gets one grace request without tools
    (``grace``), or, when that request asked for tools anyway, the turn ends."""
    effects += not_run(state, calls, TOOL_NOT_RUN_LIMIT)
    changes["message_count"] += len(calls)
    changes["pending_tokens"] += len(calls) * estimate_tokens(TOOL_NOT_RUN_LIMIT)
    if not grace:
        return turn_boundary(state, effects, False, changes)
    config = state.config
    if config.behavior is ContextExhaustionBehavior.INTENTIONALLY_UNHANDLED:
        message = (
            f"The turn used its {config.max_tool_rounds} tool rounds and still asked for "
            f"{', '.join(call.name for call in calls)}."
        )
        failing = state.model_copy(update=changes)
        return fail(failing, ErrorKind.TOOL_ROUNDS_EXHAUSTED, message, effects)
    effects.append(NotifyToolRoundLimit(rounds=config.max_tool_rounds))
    return turn_boundary(state, effects, True, changes, final=True)


def on_llm_error(state: ConversationState, event: LlmError) -> Result:
    phase = cast(LlmRequesting, state.phase)
    if phase.retry_pending:
        return state, NOTHING
    if event.context_overflow:
        return exhaust(state, "overflow", (), True, [])
    attempt = phase.attempt
    if event.retryable and attempt < state.config.max_attempts:
        delay = retry_delay(state, attempt + 1, event.retry_after)
        retry = ScheduleRetry(request="llm", attempt=attempt + 1, delay_seconds=delay)
        waiting = phase.model_copy(update={"retry_pending": True})
        return state.model_copy(update={"phase": waiting}), (retry,)
    if event.retryable:
        message = f"The LLM request failed {attempt} times; last error: {event.message}"
        return fail(state, ErrorKind.RETRIES_EXHAUSTED, message, [])
    return fail(state, ErrorKind.LLM_ERROR, f"The LLM request failed: {event.message}", [])


def on_retry_due(state: ConversationState, event: RetryDue) -> Result:
    """A retry timer fired: only the one for the next attempt of the current request counts."""
    phase = cast(Requesting, state.phase)
    if not phase.retry_pending or event.attempt != phase.attempt + 1:
        return state, NOTHING
    if (
        isinstance(phase, LlmRequesting)
        and state.projected_tokens >= state.config.continuation_tokens
    ):
        # REQ-SEG-004: a retry is a request too. The projection moved while the failed
        # attempt ran only if the provider compacted its context to more than the threshold.
        return exhaust(state, "preflight", (), True, [])
    asking = phase.model_copy(update={"attempt": event.attempt, "retry_pending": False})
    return state.model_copy(update={"phase": asking}), (request_for(asking),)


def on_cancel_request(state: ConversationState, _event: object) -> Result:
    changes = {"phase": IDLE, "pause_requested": False, "pause_reason": ""}
    return state.model_copy(update=changes), (CANCEL,)


# --------------------------------------------------------------------------- ToolExecuting


def on_tool_result(state: ConversationState, event: ToolResult) -> Result:
    phase: ToolExecuting = state.phase  # type: ignore[assignment]  # the table routes it here
    if event.tool_call_id not in phase.pending:
        return state, NOTHING  # unknown or duplicate: a stale report
    output, content = event.output, event.content
    tokens = event.token_count
    if tokens is None:
        tokens = estimate_content(output, content) if content else estimate_tokens(output)
    config = state.config
    cap = config.max_tool_output_tokens  # set on validation; the property for a bare copy
    if cap is None:
        cap = config.tool_output_cap
    if tokens > cap:  # REQ-SEG-043: the head and the tail, and a note of what was cut
        output, content = _capped(output, content, cap)
        tokens = cap  # what was kept is estimated at most this: counted as all of it
    kept = {"content": content} if content else {}
    effects: list[Effect] = [
        record(
            state,
            "tool_result",
            output,
            tool_call_id=event.tool_call_id,
            is_error=event.is_error,
            **kept,
        )
    ]
    waiting = phase.pending
    pending = (
        ()
        if len(waiting) == 1  # the common case: it was the one awaited
        else tuple(call_id for call_id in waiting if call_id != event.tool_call_id)
    )
    changes: dict[str, Any] = {
        "pending_tokens": state.pending_tokens + tokens,
        "message_count": state.message_count + 1,
    }
    if pending:
        # Built anew rather than copied: validating a value this small costs less than
        # ``model_copy`` (about 0.9 us against 1.3 us), and a tool round passes here per call.
        changes["phase"] = ToolExecuting(tool_calls=phase.tool_calls, pending=pending)
        return state.model_copy(update=changes), tuple(effects)
    return turn_boundary(state, effects, True, changes)


def _capped(output: str, content: tuple[Any, ...], cap: int) -> tuple[str, tuple[Any, ...]]:
    """A tool result within ``cap``: its text capped, and each text block of its content (a
    result with images keeps them; pre-flight still counts them)."""
    if not content:
        return cap_text(output, cap), content
    blocks = tuple(
        block.model_copy(update={"text": cap_text(block.text, cap)})
        if block.type == "text"
        else block
        for block in content
    )
    return cap_text(output, cap), blocks


def on_cancel_tools(state: ConversationState, _event: object) -> Result:
    phase = cast(ToolExecuting, state.phase)
    waiting = tuple(call for call in phase.tool_calls if call.id in phase.pending)
    effects = [CANCEL, *not_run(state, waiting, TOOL_NOT_RUN_CANCELLED)]
    not_run_tokens = len(waiting) * estimate_tokens(TOOL_NOT_RUN_CANCELLED)
    cancelled = state.model_copy(
        update={
            "phase": IDLE,
            "pause_requested": False,
            "pause_reason": "",
            "pending_tokens": state.pending_tokens + not_run_tokens,
            "message_count": state.message_count + len(waiting),
        }
    )
    return cancelled, tuple(effects)


# --------------------------------------------------------------------------- terminal phases


def reject_exhausted(state: ConversationState, _event: object) -> Result:
    reason = (
        "This conversation has reached its context limit and is read-only. "
        "Start a new conversation from it to continue (its summary can seed the new one)."
    )
    return state, (RejectUserMessage(reason=reason, cause="exhausted"),)


def on_user_message_failed(state: ConversationState, event: UserMessage) -> Result:
    failed = cast(Failed, state.phase)
    if failed.error_kind in RECOVERABLE_ERRORS:
        return on_user_message(state, event)
    reason = (
        f"This conversation has failed ({failed.error_kind.value}: "
        f"{failed.message}). Start a new conversation to continue."
    )
    return state, (RejectUserMessage(reason=reason, cause="failed"),)


def reject_paused(state: ConversationState, _event: object) -> Result:
    reason = "This conversation is paused. Resume it first; the message was not recorded."
    return state, (RejectUserMessage(reason=reason, cause="paused"),)
