"""Handlers of an ordinary turn: Idle, LlmRequesting, ToolExecuting, and the phases that
only answer a user message (exhausted, failed, paused). The laws are in ``machine``.
"""

from __future__ import annotations

from typing import Any, cast

from segue.statemachine._paths import (
    CANCEL,
    COMPACTION_PAUSE,
    NOTHING,
    OPAQUE_SUMMARY,
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
from segue.statemachine._values import replaced
from segue.statemachine.accounting import (
    cap_text,
    estimate_content,
    estimate_tokens,
    estimate_tool_calls,
    reported_occupancy,
)
from segue.statemachine.effects import (
    ArchiveTranscript,
    Effect,
    ExecuteTools,
    NotifyCompactionFallback,
    NotifyContextWarning,
    NotifyToolRoundLimit,
    NotifyTruncated,
    RejectUserMessage,
    ReportAccountingAnomaly,
    ScheduleRetry,
    StartGeneration,
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
from segue.statemachine.pacing import pause_due
from segue.statemachine.phases import (
    IDLE,
    ExhaustionTrigger,
    Failed,
    LlmRequesting,
    ToolExecuting,
)
from segue.statemachine.rules import RECOVERABLE_ERRORS, limit_tokens
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
        return state, (RejectUserMessage._make(reason=reason, cause="too_large"),)
    changes: dict[str, Any] = {
        "pending_tokens": state.pending_tokens + tokens,
        "message_count": state.message_count + 1,
        "tool_rounds": 0,
    }
    if event.pinned:
        pinned = state.pinned_tokens + tokens
        if pinned > config.pinned_budget:
            reason = (
                f"The message cannot be pinned: about {tokens:,} tokens, and pinned messages "
                f"may hold {config.pinned_budget:,} together in this conversation (a quarter of "
                f"its window; {state.pinned_tokens:,} are pinned already). Send it unpinned, "
                "or pin something shorter."
            )
            return state, (RejectUserMessage._make(reason=reason, cause="too_large"),)
        changes["pinned_tokens"] = pinned
    effects: list[Effect] = [record(state, "user", text, content=content, pinned=event.pinned)]
    return turn_boundary(state, effects, True, changes)


def on_manual_continuation(state: ConversationState, event: ManualContinuation) -> Result:
    return exhaust(state, "manual", (), False, [], focus=event.focus)


def on_cancel_pause(state: ConversationState, _event: object) -> Result:
    """REQ-SEG-046: a cancel ends a pause; the conversation waits for the user in the session
    it paused in (its snapshot stays stored)."""
    return replaced(state, {"phase": IDLE}), NOTHING


def on_pause_when_idle(state: ConversationState, event: PauseRequested) -> Result:
    changes = {"pause_requested": True, "pause_reason": event.reason}
    return turn_boundary(state, [], False, changes)


def on_pause_when_busy(state: ConversationState, event: PauseRequested) -> Result:
    if state.pause_requested:
        return state, NOTHING
    changes = {"pause_requested": True, "pause_reason": event.reason}
    return replaced(state, changes), NOTHING


def reject_busy(state: ConversationState, _event: object) -> Result:
    reason = (
        f"The conversation is busy ({state.phase.kind.replace('_', ' ')}); "
        "send the message when it is idle, or cancel first."
    )
    return state, (RejectUserMessage._make(reason=reason, cause="busy"),)


# --------------------------------------------------------------------------- LlmRequesting


def _measure(
    state: ConversationState, event: LlmResponse, effects: list[Effect]
) -> tuple[dict[str, Any], bool]:
    """What a response's usage changes in the state, and whether it crossed the threshold."""
    config = state.config
    reported = reported_occupancy(event.usage)
    if reported is not None and reported > config.context_window:
        effects.append(
            ReportAccountingAnomaly._make(
                reported_tokens=reported, context_window=config.context_window
            )
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
            NotifyContextWarning._make(
                context_tokens=reported, context_window=config.context_window
            )
        )
        changes["warned"] = True
    limit = config.continuation_tokens if config.compaction == "segue" else limit_tokens(state)
    return changes, reported >= limit


def on_llm_response(state: ConversationState, event: LlmResponse) -> Result:
    phase: LlmRequesting = state.phase  # type: ignore[assignment]  # the table routes it here
    if phase.retry_pending:
        return state, NOTHING
    effects: list[Effect] = []
    for compaction in event.compactions:  # made in the same call, before the answer
        state = _compacted(state, compaction, effects)
    changes, over = _measure(state, event, effects)
    if event.session_ref is not None:
        changes["provider_session"] = event.session_ref  # REQ-SEG-032
    calls, stop_reason, usage = event.tool_calls, event.stop_reason, event.usage
    content = event.content
    if stop_reason == COMPACTION_PAUSE and not calls and state.config.compaction == "provider":
        # REQ-SEG-048: the provider paused after its compaction; the turn goes on at once, in
        # the generation it started (what it said besides, if anything, is kept).
        if event.text or content:
            effects.append(record(state, "assistant", event.text, usage=usage, content=content))
        else:
            changes["message_count"] = state.message_count
        return turn_boundary(state, effects, True, changes, final=phase.final)
    if stop_reason == WINDOW_EXCEEDED or over:
        return _at_the_limit(state, event, effects, changes)
    if stop_reason == TRUNCATED:
        # The dropped calls leave its blocks too: a tool_use without a result is refused.
        if content:
            content = tuple(b for b in content if b.type != "tool_use")
        effects.append(record(state, "assistant", event.text, usage=usage, content=content))
        effects.append(NotifyTruncated._make(dropped_tool_calls=calls))
        _turn_answered(state, event, changes)
        return turn_boundary(state, effects, False, changes)
    said = record(state, "assistant", event.text, tool_calls=calls, usage=usage, content=content)
    effects.append(said)
    if not calls:
        _turn_answered(state, event, changes)
        return turn_boundary(state, effects, False, changes)
    if phase.final or state.tool_rounds >= state.config.max_tool_rounds:
        return _round_limit(state, event, effects, changes, grace=not phase.final)
    changes["tool_rounds"] = state.tool_rounds + 1
    # One call is the common case; several may repeat an id, which is waited for once.
    pending = (calls[0].id,) if len(calls) == 1 else tuple(dict.fromkeys([c.id for c in calls]))
    effects.append(ExecuteTools._make(tool_calls=calls))
    changes["phase"] = ToolExecuting._make(tool_calls=calls, pending=pending)
    return replaced(state, changes), tuple(effects)


def _at_the_limit(
    state: ConversationState, event: LlmResponse, effects: list[Effect], changes: dict[str, Any]
) -> Result:
    """The response reached the limit (its occupancy, or the provider's window): it is
    recorded, the tools it asks for are answered as not run, and the behaviour's path at the
    limit starts."""
    calls, stop_reason, usage = event.tool_calls, event.stop_reason, event.usage
    said = record(
        state, "assistant", event.text, tool_calls=calls, usage=usage, content=event.content
    )
    effects.append(said)
    if calls:
        # Their error results are recorded messages, so they are counted; their tokens are
        # not, since every exhaustion path leaves this context (new session, generation or
        # an end) and the figure reported to the user stays the measured one.
        effects += not_run(state, calls, TOOL_NOT_RUN_CONTEXT)
        changes["message_count"] += len(calls)
    trigger: ExhaustionTrigger = "overflow" if stop_reason == WINDOW_EXCEEDED else "threshold"
    resume_after = bool(calls) or stop_reason in (WINDOW_EXCEEDED, PAUSED_TURN)
    if not resume_after:  # the reply ended the turn; a pause due waits for the limit's path
        _turn_answered(state, event, changes)
    measured = replaced(state, changes)
    return exhaust(measured, trigger, calls, resume_after, effects, usage=usage)


def _turn_answered(state: ConversationState, event: LlmResponse, changes: dict[str, Any]) -> None:
    """The reply ``event`` ends a turn: it is counted, and when a pause trigger is due
    (REQ-SEG-052, -053) a pause is pending from here, as if one had been asked for, so the
    turn's boundary takes it (after a path at the limit the reply started, if any). A pause
    already asked for keeps its own reason."""
    turns = state.turns_since_resume + 1
    changes["turns_since_resume"] = turns
    at = event.at
    if state.active_since is None and at is not None:
        changes["active_since"] = at  # a conversation made without a time: its first answer
    if state.pause_requested:
        return
    reason = pause_due(state, turns, at)
    if reason is not None:
        changes["pause_requested"] = True
        changes["pause_reason"] = reason


def on_provider_compacted(state: ConversationState, event: ProviderCompacted) -> Result:
    """REQ-SEG-033: the provider's context now starts from its summary, so segue's record does
    too (a compaction reported apart from its response)."""
    effects: list[Effect] = []
    compacted = _compacted(state, event, effects)
    return compacted, tuple(effects)


def _compacted(
    state: ConversationState, event: ProviderCompacted, effects: list[Effect]
) -> ConversationState:
    """The state after the provider's compaction ``event``, its effects added to ``effects``.

    REQ-SEG-033: a new generation starting from the provider's summary, whose occupancy the
    response that follows will measure. REQ-SEG-048: a compaction whose ``block`` stands in for
    the history segue holds is also one of the conversation's continuations, and what it
    replaces is archived first. REQ-SEG-049: a block that failed is no compaction: nothing is
    recorded, and the conversation falls back to segue's own compaction (said once)."""
    block = event.block
    if block is not None and block.failed:
        if state.compaction_fallback:
            return state
        reason = "the provider's compaction produced no summary"
        effects.append(NotifyCompactionFallback._make(reason=reason))
        return replaced(state, {"compaction_fallback": True})
    generation = state.generation + 1
    summary = event.summary if block is None else event.summary.strip() or OPAQUE_SUMMARY
    pending = event.post_tokens
    if pending is None:
        pending = state.config.system_tokens + estimate_tokens(summary)
    changes: dict[str, Any] = {
        "generation": generation,
        "context_tokens": None,
        "pending_tokens": pending,
        "message_count": state.message_count + 1,
    }
    if block is not None:
        effects.append(ArchiveTranscript._make(generation=state.generation))
        # Never past the bound: from it on the provider is not asked to compact (a block that
        # comes all the same is what the provider now holds, and is recorded as such).
        changes["continuations"] = min(state.continuations + 1, state.config.max_continuations)
    fresh = replaced(state, changes)
    effects.append(StartGeneration._make(generation=generation, summary=summary))
    effects.append(
        record(
            fresh,
            "summary",
            summary,
            usage=event.usage,
            kept_messages=event.kept_messages,
            content=(block,) if block is not None else (),
        )
    )
    return fresh


def _round_limit(
    state: ConversationState,
    event: LlmResponse,
    effects: list[Effect],
    changes: dict[str, Any],
    *,
    grace: bool,
) -> Result:
    """The turn used its tool rounds: the calls are answered as not run (no tool_use is left
    unpaired), then a sub-agent fails, and anyone else gets one grace request without tools
    (``grace``), or, when that request asked for tools anyway, the turn ends."""
    calls = event.tool_calls
    effects += not_run(state, calls, TOOL_NOT_RUN_LIMIT)
    changes["message_count"] += len(calls)
    changes["pending_tokens"] += len(calls) * estimate_tokens(TOOL_NOT_RUN_LIMIT)
    if not grace:  # the grace request's answer ends the turn, whatever it asks for
        _turn_answered(state, event, changes)
        return turn_boundary(state, effects, False, changes)
    config = state.config
    if config.behavior is ContextExhaustionBehavior.INTENTIONALLY_UNHANDLED:
        message = (
            f"The turn used its {config.max_tool_rounds} tool rounds and still asked for "
            f"{', '.join(call.name for call in calls)}."
        )
        failing = replaced(state, changes)
        return fail(failing, ErrorKind.TOOL_ROUNDS_EXHAUSTED, message, effects)
    effects.append(NotifyToolRoundLimit._make(rounds=config.max_tool_rounds))
    return turn_boundary(state, effects, True, changes, final=True)


def on_llm_error(state: ConversationState, event: LlmError) -> Result:
    phase = cast(LlmRequesting, state.phase)
    if phase.retry_pending:
        return state, NOTHING
    if (
        event.compaction_refused
        and state.config.compaction == "provider"
        and not state.compaction_fallback
    ):
        # REQ-SEG-049: segue compacts this conversation itself from now on; the turn goes on.
        effects: list[Effect] = [NotifyCompactionFallback._make(reason=event.message)]
        changes: dict[str, Any] = {"compaction_fallback": True}
        return turn_boundary(state, effects, True, changes, final=phase.final)
    if event.context_overflow:
        return exhaust(state, "overflow", (), True, [])
    attempt = phase.attempt
    if event.retryable and attempt < state.config.max_attempts:
        delay = retry_delay(state, attempt + 1, event.retry_after)
        retry = ScheduleRetry._make(request="llm", attempt=attempt + 1, delay_seconds=delay)
        waiting = replaced(phase, {"retry_pending": True})
        return replaced(state, {"phase": waiting}), (retry,)
    if event.retryable:
        message = f"The LLM request failed {attempt} times; last error: {event.message}"
        return fail(state, ErrorKind.RETRIES_EXHAUSTED, message, [])
    return fail(state, ErrorKind.LLM_ERROR, f"The LLM request failed: {event.message}", [])


def on_retry_due(state: ConversationState, event: RetryDue) -> Result:
    """A retry timer fired: only the one for the next attempt of the current request counts."""
    phase = cast(Requesting, state.phase)
    if not phase.retry_pending or event.attempt != phase.attempt + 1:
        return state, NOTHING
    if isinstance(phase, LlmRequesting) and state.projected_tokens >= limit_tokens(state):
        # REQ-SEG-004: a retry is a request too. The projection moved while the failed
        # attempt ran only if the provider compacted its context to more than the threshold.
        return exhaust(state, "preflight", (), True, [])
    asking = replaced(phase, {"attempt": event.attempt, "retry_pending": False})
    return replaced(state, {"phase": asking}), (request_for(asking),)


def on_cancel_request(state: ConversationState, _event: object) -> Result:
    changes = {"phase": IDLE, "pause_requested": False, "pause_reason": ""}
    return replaced(state, changes), (CANCEL,)


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
    effects: list[Effect] = [
        record(
            state,
            "tool_result",
            output,
            tool_call_id=event.tool_call_id,
            is_error=event.is_error,
            content=content,
        )
    ]
    waiting = phase.pending
    pending = (
        ()
        if len(waiting) == 1  # the common case: it was the one awaited
        # A list made first: ``tuple()`` over a generator costs three times as much here.
        else tuple([call_id for call_id in waiting if call_id != event.tool_call_id])
    )
    changes: dict[str, Any] = {
        "pending_tokens": state.pending_tokens + tokens,
        "message_count": state.message_count + 1,
    }
    if pending:
        changes["phase"] = ToolExecuting._make(tool_calls=phase.tool_calls, pending=pending)
        return replaced(state, changes), tuple(effects)
    return turn_boundary(state, effects, True, changes)


def _capped(output: str, content: tuple[Any, ...], cap: int) -> tuple[str, tuple[Any, ...]]:
    """A tool result within ``cap``: its text capped, and each text block of its content (a
    result with images keeps them; pre-flight still counts them)."""
    if not content:
        return cap_text(output, cap), content
    blocks = tuple(
        replaced(block, {"text": cap_text(block.text, cap)}) if block.type == "text" else block
        for block in content
    )
    return cap_text(output, cap), blocks


def on_cancel_tools(state: ConversationState, _event: object) -> Result:
    phase = cast(ToolExecuting, state.phase)
    waiting = tuple(call for call in phase.tool_calls if call.id in phase.pending)
    effects = [CANCEL, *not_run(state, waiting, TOOL_NOT_RUN_CANCELLED)]
    not_run_tokens = len(waiting) * estimate_tokens(TOOL_NOT_RUN_CANCELLED)
    cancelled = replaced(
        state,
        {
            "phase": IDLE,
            "pause_requested": False,
            "pause_reason": "",
            "pending_tokens": state.pending_tokens + not_run_tokens,
            "message_count": state.message_count + len(waiting),
        },
    )
    return cancelled, tuple(effects)


# --------------------------------------------------------------------------- terminal phases


def reject_exhausted(state: ConversationState, _event: object) -> Result:
    reason = (
        "This conversation has reached its context limit and is read-only. "
        "Start a new conversation from it to continue (its summary can seed the new one)."
    )
    return state, (RejectUserMessage._make(reason=reason, cause="exhausted"),)


def on_user_message_failed(state: ConversationState, event: UserMessage) -> Result:
    failed = cast(Failed, state.phase)
    if failed.error_kind in RECOVERABLE_ERRORS:
        return on_user_message(state, event)
    reason = (
        f"This conversation has failed ({failed.error_kind.value}: "
        f"{failed.message}). Start a new conversation to continue."
    )
    return state, (RejectUserMessage._make(reason=reason, cause="failed"),)


def reject_paused(state: ConversationState, _event: object) -> Result:
    reason = "This conversation is paused. Resume it first; the message was not recorded."
    return state, (RejectUserMessage._make(reason=reason, cause="paused"),)
