"""``transition(state, event) -> (state, effects)``: the whole behaviour of a conversation.

Rules of this module (read these before changing anything):

1. Pure. No I/O, no clock, no randomness, no logging. Same input, same output; inputs are never
   mutated. Time appears only as data (a retry delay in an effect; a ``RetryDue`` event).
2. Every change of a conversation goes through ``transition()``. The executor performs the
   returned effects and reports their outcomes as new events; it never edits a state.
3. Total. Every phase x event pair has an answer. An event that does not fit (a late response
   after a cancel, a timer for an old attempt, a manual trigger while busy) changes nothing; a
   user message that cannot be taken is answered with ``RejectUserMessage``. Nothing raises.
4. Occupancy is never summed: a response's usage replaces the figure, it does not add to it.

Theory of operation. ``_HANDLERS`` maps (phase kind, event kind) to a handler; pairs not listed
change nothing. ``specs/transitions.toml`` is the same table as data: the tests hold the two
together row by row, and a reference model built from the data runs beside this code.

The core builds its own values with ``_make``/``_evolve`` (no re-validation): everything it
combines was validated when it entered as an event, or built here from such values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, cast

from segue.statemachine._values import builder
from segue.statemachine.accounting import (
    estimate_tokens,
    estimate_tool_calls,
    reported_occupancy,
)
from segue.statemachine.checkpoint import (
    SessionSnapshot,
    checkpoint_sections,
    compile_resume_context,
    continuation_prompt,
    extract_checkpoint,
)
from segue.statemachine.effects import (
    AppendMessage,
    ArchiveTranscript,
    CancelRequest,
    Effect,
    ExecuteTools,
    NotifyContextExhausted,
    NotifyContextWarning,
    NotifyFailed,
    NotifyParent,
    NotifyTruncated,
    RejectUserMessage,
    ReportAccountingAnomaly,
    RequestCheckpoint,
    RequestCompaction,
    RequestContinuation,
    RequestKind,
    RequestLlm,
    SaveSnapshot,
    ScheduleRetry,
    StartGeneration,
    StartSession,
)
from segue.statemachine.events import (
    CheckpointFailed,
    CheckpointResponse,
    CompactionFailed,
    CompactionResponse,
    ContinuationFailed,
    ContinuationResponse,
    LlmError,
    LlmResponse,
    PauseRequested,
    ResumeRequested,
    RetryDue,
    ToolResult,
    UserMessage,
)
from segue.statemachine.models import (
    ContextExhaustionBehavior,
    ErrorKind,
    Message,
    MessageKind,
    ToolCall,
)
from segue.statemachine.phases import (
    IDLE,
    AwaitingCheckpoint,
    AwaitingContinuation,
    Compacting,
    ContextExhausted,
    ExhaustionTrigger,
    Failed,
    LlmRequesting,
    Paused,
    ToolExecuting,
)
from segue.statemachine.state import ConversationState

Effects = tuple[Effect, ...]
Result = tuple[ConversationState, Effects]
Handler = Callable[[ConversationState, Any], Result]

FALLBACK_SUMMARY: Final = (
    "Context limit reached. The continuation summary could not be generated. "
    "Please start a new conversation."
)
CANCELLED_SUMMARY: Final = (
    "Context limit reached. The continuation summary was cancelled. "
    "Please start a new conversation."
)
COMPACTION_FALLBACK_SUMMARY: Final = (
    "Earlier messages of this conversation were archived; their summary could not be generated."
)
RESUME_PROMPT: Final = "Resume the paused work from the resume context in your system prompt."
TOOL_NOT_RUN_CONTEXT: Final = "Not run: the context window is nearly full."
TOOL_NOT_RUN_CANCELLED: Final = "Not run: cancelled by the user."
_NOTHING: Final[Effects] = ()
# Values without data are shared, never rebuilt: they are immutable, and building one costs
# as much as the rest of an ordinary event.
_REQUEST_LLM: Final = RequestLlm._make()
_LLM_REQUESTING: Final = LlmRequesting._make()
_CANCEL: Final = CancelRequest._make()
_Requesting = LlmRequesting | AwaitingContinuation | AwaitingCheckpoint | Compacting
_Summarising = AwaitingContinuation | AwaitingCheckpoint | Compacting
_RECOVERABLE_ERRORS: Final = frozenset({ErrorKind.LLM_ERROR, ErrorKind.RETRIES_EXHAUSTED})
_WINDOW_EXCEEDED: Final = "model_context_window_exceeded"
_TRUNCATED: Final = "max_tokens"
_REFUSAL: Final = "refusal"


def transition(state: ConversationState, event: Any) -> Result:
    """The next state of ``state`` after ``event``, and the effects the world must perform.

    ``event`` is any of ``segue.statemachine.events``; anything that does not fit the current
    phase returns ``(state, ())``.
    """
    handler = _HANDLERS.get((state.phase.kind, event.kind))
    if handler is None:
        return state, _NOTHING
    return handler(state, event)


# --------------------------------------------------------------------------- small builders


_build_append = builder(AppendMessage)
_build_message = builder(Message)
_build_execute = builder(ExecuteTools)
_build_executing = builder(ToolExecuting)


def _record(state: ConversationState, kind: MessageKind, text: str, **extra: Any) -> AppendMessage:
    """Record a message of ``kind`` in the transcript, in the state's session and generation."""
    message = _build_message(
        kind=kind, text=text, session=state.session, generation=state.generation, **extra
    )
    return _build_append(message=message)


def _not_run(state: ConversationState, calls: tuple[ToolCall, ...], why: str) -> list[Effect]:
    """Error results for tool calls that will never run, so no ``tool_use`` is left unpaired."""
    return [
        _record(state, "tool_result", why, tool_call_id=call.id, is_error=True) for call in calls
    ]


def _retry_delay(state: ConversationState, next_attempt: int) -> float:
    config = state.config
    return float(min(config.retry_max_delay, config.retry_base_delay * 2 ** (next_attempt - 2)))


def _fail(state: ConversationState, kind: ErrorKind, message: str, effects: list[Effect]) -> Result:
    effects.append(NotifyFailed._make(error_kind=kind, message=message))
    config = state.config
    if (
        config.parent_id is not None
        and config.behavior is ContextExhaustionBehavior.INTENTIONALLY_UNHANDLED
    ):
        effects.append(
            NotifyParent._make(parent_id=state.config.parent_id, error_kind=kind, message=message)
        )
    failed = Failed._make(error_kind=kind, message=message)
    return state._evolve(phase=failed, pause_requested=False), tuple(effects)


def _exhausted_message(state: ConversationState) -> str:
    return (
        f"Context window exhausted: {state.projected_tokens:,} of "
        f"{state.config.context_window:,} tokens (threshold "
        f"{state.config.continuation_tokens:,})."
    )


# --------------------------------------------------------------------------- the exhaustion path


def _exhaust(
    state: ConversationState,
    trigger: ExhaustionTrigger,
    rejected: tuple[ToolCall, ...],
    resume_after: bool,
    effects: list[Effect],
) -> Result:
    """Take the conversation's behaviour at the limit (DESIGN section 2)."""
    behavior = state.config.behavior
    if behavior is ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION:
        effects.append(RequestContinuation._make(rejected_tool_calls=rejected))
        waiting = AwaitingContinuation._make(rejected_tool_calls=rejected, trigger=trigger)
        return state._evolve(phase=waiting), tuple(effects)
    if behavior is ContextExhaustionBehavior.INTENTIONALLY_UNHANDLED:
        return _fail(state, ErrorKind.CONTEXT_EXHAUSTED, _exhausted_message(state), effects)
    if state.continuations >= state.config.max_continuations:
        message = (
            f"{state.continuations} continuations already; the bound is "
            f"{state.config.max_continuations}. {_exhausted_message(state)}"
        )
        return _fail(state, ErrorKind.CONTINUATION_LIMIT, message, effects)
    if behavior is ContextExhaustionBehavior.CHECKPOINT_RESTART:
        effects.append(RequestCheckpoint._make(rejected_tool_calls=rejected))
        checkpointing = AwaitingCheckpoint._make(
            rejected_tool_calls=rejected, trigger=trigger, resume_after=resume_after
        )
        return state._evolve(phase=checkpointing), tuple(effects)
    effects.append(ArchiveTranscript._make(generation=state.generation))
    effects.append(RequestCompaction._make(rejected_tool_calls=rejected))
    phase = Compacting._make(
        rejected_tool_calls=rejected, trigger=trigger, resume_after=resume_after
    )
    return state._evolve(phase=phase), tuple(effects)


def _turn_boundary(
    state: ConversationState,
    effects: list[Effect],
    ask_llm: bool,
    changes: dict[str, Any] | None = None,
) -> Result:
    """Where a turn may stop: pre-flight, then a pending pause, then the next request or Idle.

    ``changes`` are what the event itself did to the state (tokens appended, a message counted);
    they are applied together with the new phase, so an ordinary event builds one state.
    """
    if changes is None:
        changes = {}
    if ask_llm:
        context = changes.get("context_tokens", state.context_tokens) or 0
        pending = changes.get("pending_tokens", state.pending_tokens)
        if context + pending >= state.config.continuation_tokens:
            return _exhaust(state._replace(changes), "preflight", (), True, effects)
    if changes.get("pause_requested", state.pause_requested):
        effects.append(RequestCheckpoint._make(purpose="pause"))
        changes["phase"] = AwaitingCheckpoint._make(purpose="pause", resume_after=ask_llm)
    elif ask_llm:
        effects.append(_REQUEST_LLM)
        changes["phase"] = _LLM_REQUESTING
    else:
        changes["phase"] = IDLE
    return state._replace(changes), tuple(effects)


# --------------------------------------------------------------------------- Idle


def _on_user_message(state: ConversationState, event: UserMessage) -> Result:
    tokens = event.token_count if event.token_count is not None else estimate_tokens(event.text)
    if tokens >= state.config.continuation_tokens:
        reason = (
            f"The message is too large for this conversation: about {tokens:,} tokens, while "
            f"{state.config.continuation_tokens:,} is the most a whole prompt may hold here. "
            "Shorten it or attach it as a file."
        )
        return state, (RejectUserMessage._make(reason=reason),)
    effects: list[Effect] = [_record(state, "user", event.text)]
    changes = {
        "pending_tokens": state.pending_tokens + tokens,
        "message_count": state.message_count + 1,
    }
    return _turn_boundary(state, effects, True, changes)


def _on_manual_continuation(state: ConversationState, _event: object) -> Result:
    return _exhaust(state, "manual", (), False, [])


def _on_pause_when_idle(state: ConversationState, event: PauseRequested) -> Result:
    changes = {"pause_requested": True, "pause_reason": event.reason}
    return _turn_boundary(state, [], False, changes)


def _on_pause_when_busy(state: ConversationState, event: PauseRequested) -> Result:
    if state.pause_requested:
        return state, _NOTHING
    return state._evolve(pause_requested=True, pause_reason=event.reason), _NOTHING


def _reject_busy(state: ConversationState, _event: object) -> Result:
    reason = (
        f"The conversation is busy ({state.phase.kind.replace('_', ' ')}); "
        "send the message when it is idle, or cancel first."
    )
    return state, (RejectUserMessage._make(reason=reason),)


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
        grown = state.pending_tokens + estimate_tokens(event.text)
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
    return changes, reported >= config.continuation_tokens


def _on_llm_response(state: ConversationState, event: LlmResponse) -> Result:
    if cast(LlmRequesting, state.phase).retry_pending:
        return state, _NOTHING
    effects: list[Effect] = []
    changes, over = _measure(state, event, effects)
    calls = event.tool_calls
    stop_reason = event.stop_reason
    if stop_reason == _WINDOW_EXCEEDED or over:
        effects.append(_record(state, "assistant", event.text, tool_calls=calls, usage=event.usage))
        if calls:
            # Their error results are recorded messages, so they are counted; their tokens are
            # not, since every exhaustion path leaves this context (new session, generation or
            # an end) and the figure reported to the user stays the measured one.
            effects += _not_run(state, calls, TOOL_NOT_RUN_CONTEXT)
            changes["message_count"] += len(calls)
        trigger: ExhaustionTrigger = "overflow" if stop_reason == _WINDOW_EXCEEDED else "threshold"
        resume_after = bool(calls) or stop_reason == _WINDOW_EXCEEDED
        return _exhaust(state._replace(changes), trigger, calls, resume_after, effects)
    if stop_reason == _TRUNCATED:
        effects.append(_record(state, "assistant", event.text, usage=event.usage))
        effects.append(NotifyTruncated._make(dropped_tool_calls=calls))
        return _turn_boundary(state, effects, False, changes)
    effects.append(_record(state, "assistant", event.text, tool_calls=calls, usage=event.usage))
    if not calls:
        return _turn_boundary(state, effects, False, changes)
    # One call is the common case; several may repeat an id, which is waited for once.
    pending = (calls[0].id,) if len(calls) == 1 else tuple(dict.fromkeys(c.id for c in calls))
    effects.append(_build_execute(tool_calls=calls))
    changes["phase"] = _build_executing(tool_calls=calls, pending=pending)
    return state._replace(changes), tuple(effects)


def _on_llm_error(state: ConversationState, event: LlmError) -> Result:
    phase = cast(LlmRequesting, state.phase)
    if phase.retry_pending:
        return state, _NOTHING
    if event.context_overflow:
        return _exhaust(state, "overflow", (), True, [])
    attempt = phase.attempt
    if event.retryable and attempt < state.config.max_attempts:
        delay = _retry_delay(state, attempt + 1)
        retry = ScheduleRetry._make(request="llm", attempt=attempt + 1, delay_seconds=delay)
        return state._evolve(phase=phase._evolve(retry_pending=True)), (retry,)
    if event.retryable:
        message = f"The LLM request failed {attempt} times; last error: {event.message}"
        return _fail(state, ErrorKind.RETRIES_EXHAUSTED, message, [])
    return _fail(state, ErrorKind.LLM_ERROR, f"The LLM request failed: {event.message}", [])


def _on_retry_due(state: ConversationState, event: RetryDue) -> Result:
    """A retry timer fired: only the one for the next attempt of the current request counts."""
    phase = cast(_Requesting, state.phase)
    if not phase.retry_pending or event.attempt != phase.attempt + 1:
        return state, _NOTHING
    next_phase = phase._evolve(attempt=event.attempt, retry_pending=False)
    request: Effect
    if isinstance(phase, LlmRequesting):
        request = RequestLlm._make(attempt=event.attempt)
    elif isinstance(phase, AwaitingContinuation):
        request = RequestContinuation._make(
            rejected_tool_calls=phase.rejected_tool_calls,
            attempt=event.attempt,
            trim_level=phase.trim_level,
        )
    elif isinstance(phase, AwaitingCheckpoint):
        request = RequestCheckpoint._make(
            purpose=phase.purpose,
            rejected_tool_calls=phase.rejected_tool_calls,
            attempt=event.attempt,
            trim_level=phase.trim_level,
        )
    else:
        request = RequestCompaction._make(
            rejected_tool_calls=phase.rejected_tool_calls,
            attempt=event.attempt,
            trim_level=phase.trim_level,
        )
    return state._evolve(phase=next_phase), (request,)


def _on_cancel_request(state: ConversationState, _event: object) -> Result:
    cancelled = state._evolve(phase=IDLE, pause_requested=False, pause_reason="")
    return cancelled, (_CANCEL,)


# --------------------------------------------------------------------------- ToolExecuting


def _on_tool_result(state: ConversationState, event: ToolResult) -> Result:
    phase = cast(ToolExecuting, state.phase)
    if event.tool_call_id not in phase.pending:
        return state, _NOTHING  # unknown or duplicate: a stale report
    tokens = event.token_count if event.token_count is not None else estimate_tokens(event.output)
    effects: list[Effect] = [
        _record(
            state,
            "tool_result",
            event.output,
            tool_call_id=event.tool_call_id,
            is_error=event.is_error,
        )
    ]
    pending = tuple(call_id for call_id in phase.pending if call_id != event.tool_call_id)
    grown = state.pending_tokens + tokens
    count = state.message_count + 1
    if pending:
        waiting = phase._evolve(pending=pending)
        return state._evolve(phase=waiting, pending_tokens=grown, message_count=count), tuple(
            effects
        )
    return _turn_boundary(state, effects, True, {"pending_tokens": grown, "message_count": count})


def _on_cancel_tools(state: ConversationState, _event: object) -> Result:
    phase = cast(ToolExecuting, state.phase)
    waiting = tuple(call for call in phase.tool_calls if call.id in phase.pending)
    effects = [_CANCEL, *_not_run(state, waiting, TOOL_NOT_RUN_CANCELLED)]
    not_run_tokens = len(waiting) * estimate_tokens(TOOL_NOT_RUN_CANCELLED)
    cancelled = state._evolve(
        phase=IDLE,
        pause_requested=False,
        pause_reason="",
        pending_tokens=state.pending_tokens + not_run_tokens,
        message_count=state.message_count + len(waiting),
    )
    return cancelled, tuple(effects)


# --------------------------------------------------------------------------- summary requests


def _retry_or_give_up(
    state: ConversationState,
    event: ContinuationFailed | CheckpointFailed | CompactionFailed,
    request: RequestKind,
    give_up: Callable[[ConversationState, str], Result],
) -> Result:
    """Shared by the three tool-less requests: trim on overflow, back off on retryable errors."""
    phase = cast(_Summarising, state.phase)
    if phase.retry_pending:
        return state, _NOTHING
    attempt = phase.attempt
    if attempt >= state.config.max_attempts or not (event.context_overflow or event.retryable):
        return give_up(state, event.error)
    if event.context_overflow:
        trimmed = phase._evolve(attempt=attempt + 1, trim_level=phase.trim_level + 1)
        effect: Effect
        if isinstance(phase, AwaitingContinuation):
            effect = RequestContinuation._make(
                rejected_tool_calls=phase.rejected_tool_calls,
                attempt=attempt + 1,
                trim_level=trimmed.trim_level,
            )
        elif isinstance(phase, AwaitingCheckpoint):
            effect = RequestCheckpoint._make(
                purpose=phase.purpose,
                rejected_tool_calls=phase.rejected_tool_calls,
                attempt=attempt + 1,
                trim_level=trimmed.trim_level,
            )
        else:
            effect = RequestCompaction._make(
                rejected_tool_calls=phase.rejected_tool_calls,
                attempt=attempt + 1,
                trim_level=trimmed.trim_level,
            )
        return state._evolve(phase=trimmed), (effect,)
    delay = _retry_delay(state, attempt + 1)
    retry = ScheduleRetry._make(request=request, attempt=attempt + 1, delay_seconds=delay)
    return state._evolve(phase=phase._evolve(retry_pending=True)), (retry,)


def _exhausted_with(state: ConversationState, summary: str, effects: list[Effect]) -> Result:
    effects.append(_record(state, "continuation", summary))
    effects.append(NotifyContextExhausted._make(summary=summary))
    exhausted = state._evolve(
        phase=ContextExhausted._make(summary=summary),
        pause_requested=False,
        message_count=state.message_count + 1,
    )
    return exhausted, tuple(effects)


def _measured_only(
    state: ConversationState, usage: Any, effects: list[Effect]
) -> ConversationState:
    """A summary answer's usage: occupancy when usable, an anomaly report above the window."""
    reported = reported_occupancy(usage)
    if reported is None:
        return state
    window = state.config.context_window
    if reported > window:
        effects.append(
            ReportAccountingAnomaly._make(reported_tokens=reported, context_window=window)
        )
        return state
    return state._evolve(context_tokens=reported, pending_tokens=0)


def _on_continuation_response(state: ConversationState, event: ContinuationResponse) -> Result:
    if cast(AwaitingContinuation, state.phase).retry_pending:
        return state, _NOTHING
    summary = event.summary.strip()
    if not summary or event.stop_reason == _REFUSAL:
        summary = FALLBACK_SUMMARY
    effects: list[Effect] = []
    return _exhausted_with(_measured_only(state, event.usage, effects), summary, effects)


def _on_continuation_failed(state: ConversationState, event: ContinuationFailed) -> Result:
    return _retry_or_give_up(
        state, event, "continuation", lambda s, _error: _exhausted_with(s, FALLBACK_SUMMARY, [])
    )


def _on_cancel_continuation(state: ConversationState, _event: object) -> Result:
    return _exhausted_with(state, CANCELLED_SUMMARY, [_CANCEL])


# --------------------------------------------------------------------------- checkpoints


def _checkpoint_taken(
    state: ConversationState, text: str, effects: list[Effect], resume: bool | None = None
) -> Result:
    """Use an agent's checkpoint answer (``""`` when none could be had)."""
    phase = cast(AwaitingCheckpoint, state.phase)
    checkpoint = extract_checkpoint(text)
    if text.strip():
        effects.append(_record(state, "checkpoint", text))
        state = state._evolve(message_count=state.message_count + 1)
    resume_after = phase.resume_after if resume is None else resume
    if phase.purpose == "pause":
        return _pause_with(state, checkpoint, effects)
    seed = continuation_prompt(checkpoint)
    seed_tokens = state.config.system_tokens + estimate_tokens(seed)
    if seed_tokens >= state.config.continuation_tokens:
        message = (
            f"The checkpoint (about {seed_tokens:,} tokens with the system prompt) does not fit "
            "a fresh session "
            f"(threshold {state.config.continuation_tokens:,}); restarting again would loop."
        )
        return _fail(state, ErrorKind.CHECKPOINT_OVERFLOW, message, effects)
    session = state.session + 1
    effects.append(StartSession._make(session=session, reason="checkpoint_restart"))
    fresh = state._evolve(
        session=session,
        continuations=state.continuations + 1,
        context_tokens=None,
        pending_tokens=seed_tokens,
        warned=False,
        message_count=state.message_count + 1,
    )
    effects.append(_record(fresh, "user", seed))
    return _turn_boundary(fresh, effects, ask_llm=resume_after)


def _pause_with(state: ConversationState, checkpoint: str, effects: list[Effect]) -> Result:
    version = state.snapshots + 1
    snapshot = SessionSnapshot._make(
        conversation_id=state.config.id,
        version=version,
        session=state.session,
        reason=state.pause_reason,
        checkpoint=checkpoint,
        sections=checkpoint_sections(checkpoint),
        context_tokens=state.context_tokens,
        context_window=state.config.context_window,
        message_count=state.message_count,
        continuations=state.continuations,
    )
    effects.append(SaveSnapshot._make(snapshot=snapshot))
    paused = state._evolve(
        phase=Paused._make(snapshot=snapshot),
        snapshots=version,
        pause_requested=False,
        pause_reason="",
    )
    return paused, tuple(effects)


def _on_checkpoint_response(state: ConversationState, event: CheckpointResponse) -> Result:
    if cast(AwaitingCheckpoint, state.phase).retry_pending:
        return state, _NOTHING
    return _checkpoint_taken(state, event.text, [])


def _on_checkpoint_failed(state: ConversationState, event: CheckpointFailed) -> Result:
    return _retry_or_give_up(
        state, event, "checkpoint", lambda s, _error: _checkpoint_taken(s, "", [])
    )


def _on_cancel_checkpoint(state: ConversationState, _event: object) -> Result:
    """The user's cancel abandons a pending pause, as it does in every busy phase
    (REQ-SEG-021). A restart still happens (the old session is over the threshold), seeded
    with the minimal prompt and waiting for the user; a pause checkpoint just stops."""
    calm = state._evolve(pause_requested=False, pause_reason="")
    if cast(AwaitingCheckpoint, state.phase).purpose == "pause":
        return calm._evolve(phase=IDLE), (_CANCEL,)
    return _checkpoint_taken(calm, "", [_CANCEL], resume=False)


def _on_resume(state: ConversationState, event: ResumeRequested) -> Result:
    snapshot = cast(Paused, state.phase).snapshot
    context = compile_resume_context(snapshot)
    prompt = event.prompt if event.prompt and event.prompt.strip() else RESUME_PROMPT
    session = state.session + 1
    effects: list[Effect] = [
        StartSession._make(session=session, reason="resume", system_context=context)
    ]
    fresh = state._evolve(
        session=session,
        context_tokens=None,
        pending_tokens=state.config.system_tokens
        + estimate_tokens(context)
        + estimate_tokens(prompt),
        warned=False,
        message_count=state.message_count + 1,
    )
    effects.append(_record(fresh, "user", prompt))
    return _turn_boundary(fresh, effects, ask_llm=True)


# --------------------------------------------------------------------------- compaction


def _on_compaction_response(state: ConversationState, event: CompactionResponse) -> Result:
    phase = cast(Compacting, state.phase)
    if phase.retry_pending:
        return state, _NOTHING
    config = state.config
    if event.retained_tokens >= config.continuation_tokens:
        message = (
            f"After compaction the context still holds {event.retained_tokens:,} tokens "
            f"(threshold {config.continuation_tokens:,}); compacting again would loop."
        )
        return _fail(state, ErrorKind.COMPACTION_INEFFECTIVE, message, [])
    summary = event.summary.strip() or COMPACTION_FALLBACK_SUMMARY
    generation = state.generation + 1
    fresh = state._evolve(
        generation=generation,
        continuations=state.continuations + 1,
        context_tokens=None,
        pending_tokens=event.retained_tokens,
        # Once per session (REQ-BED-023): a new generation is the same session, so the flag
        # stays as it was. The retained figure is an estimate, never a response's occupancy: a
        # response that reaches the warning threshold in the new generation still warns.
        warned=state.warned,
        message_count=state.message_count + 1,
    )
    effects: list[Effect] = [
        StartGeneration._make(generation=generation, summary=summary),
        _record(fresh, "summary", summary, kept_messages=event.kept_messages),
    ]
    return _turn_boundary(fresh, effects, ask_llm=phase.resume_after)


def _compaction_gave_up(state: ConversationState, error: str) -> Result:
    message = f"Compaction failed, so the context cannot be reduced: {error}"
    return _fail(state, ErrorKind.CONTEXT_EXHAUSTED, message, [])


def _on_compaction_failed(state: ConversationState, event: CompactionFailed) -> Result:
    return _retry_or_give_up(state, event, "compaction", _compaction_gave_up)


# --------------------------------------------------------------------------- terminal phases


def _reject_exhausted(state: ConversationState, _event: object) -> Result:
    reason = (
        "This conversation has reached its context limit and is read-only. "
        "Start a new conversation from it to continue (its summary can seed the new one)."
    )
    return state, (RejectUserMessage._make(reason=reason),)


def _on_user_message_failed(state: ConversationState, event: UserMessage) -> Result:
    failed = cast(Failed, state.phase)
    if failed.error_kind in _RECOVERABLE_ERRORS:
        return _on_user_message(state, event)
    reason = (
        f"This conversation has failed ({failed.error_kind.value}: "
        f"{failed.message}). Start a new conversation to continue."
    )
    return state, (RejectUserMessage._make(reason=reason),)


def _reject_paused(state: ConversationState, _event: object) -> Result:
    reason = "This conversation is paused. Resume it first; the message was not recorded."
    return state, (RejectUserMessage._make(reason=reason),)


# --------------------------------------------------------------------------- the table

_BUSY = (
    "llm_requesting",
    "tool_executing",
    "awaiting_continuation",
    "awaiting_checkpoint",
    "compacting",
)
_REQUESTS = ("llm_requesting", "awaiting_continuation", "awaiting_checkpoint", "compacting")

_HANDLERS: Final[dict[tuple[str, str], Handler]] = {
    ("idle", "user_message"): _on_user_message,
    ("idle", "manual_continuation"): _on_manual_continuation,
    ("idle", "pause_requested"): _on_pause_when_idle,
    ("llm_requesting", "llm_response"): _on_llm_response,
    ("llm_requesting", "llm_error"): _on_llm_error,
    ("llm_requesting", "user_cancel"): _on_cancel_request,
    ("tool_executing", "tool_result"): _on_tool_result,
    ("tool_executing", "user_cancel"): _on_cancel_tools,
    ("awaiting_continuation", "continuation_response"): _on_continuation_response,
    ("awaiting_continuation", "continuation_failed"): _on_continuation_failed,
    ("awaiting_continuation", "user_cancel"): _on_cancel_continuation,
    ("awaiting_checkpoint", "checkpoint_response"): _on_checkpoint_response,
    ("awaiting_checkpoint", "checkpoint_failed"): _on_checkpoint_failed,
    ("awaiting_checkpoint", "user_cancel"): _on_cancel_checkpoint,
    ("compacting", "compaction_response"): _on_compaction_response,
    ("compacting", "compaction_failed"): _on_compaction_failed,
    ("compacting", "user_cancel"): _on_cancel_request,
    ("context_exhausted", "user_message"): _reject_exhausted,
    ("failed", "user_message"): _on_user_message_failed,
    ("paused", "user_message"): _reject_paused,
    ("paused", "resume_requested"): _on_resume,
}
for _phase in _BUSY:
    _HANDLERS[(_phase, "user_message")] = _reject_busy
    _HANDLERS[(_phase, "pause_requested")] = _on_pause_when_busy
for _phase in _REQUESTS:
    _HANDLERS[(_phase, "retry_due")] = _on_retry_due

HANDLED_PAIRS: Final = frozenset(_HANDLERS)
"""The (phase kind, event kind) pairs that can change something; all others change nothing."""
