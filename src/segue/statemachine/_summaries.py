"""Handlers of the tool-less requests that end a context: the continuation summary, the
checkpoint (restart or pause, and resume) and compaction. The laws are in ``machine``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from segue.statemachine._paths import (
    CANCEL,
    CANCELLED_SUMMARY,
    COMPACTION_FALLBACK_SUMMARY,
    FALLBACK_SUMMARY,
    FRESH_SESSION,
    NOTHING,
    REFUSAL,
    RESUME_PROMPT,
    Result,
    Summarising,
    fail,
    record,
    request_for,
    retry_delay,
    turn_boundary,
)
from segue.statemachine._values import replaced
from segue.statemachine.accounting import (
    estimate_tokens,
    reported_occupancy,
)
from segue.statemachine.checkpoint import (
    SessionSnapshot,
    checkpoint_sections,
    compile_resume_context,
    continuation_prompt,
    extract_checkpoint,
    extract_decisions,
)
from segue.statemachine.effects import (
    AppendMessage,
    ArchiveTranscript,
    Effect,
    NotifyCompactionFailed,
    NotifyCompactionFallback,
    NotifyContextExhausted,
    ReportAccountingAnomaly,
    RequestKind,
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
    CompactionUndoRequested,
    ContinuationFailed,
    ContinuationRedone,
    ContinuationResponse,
    ResumeRequested,
    SummaryRedoRequested,
)
from segue.statemachine.models import (
    REUSE_PREFIX_ASKS,
    ContextExhaustionBehavior,
    ErrorKind,
    Message,
    ToolCall,
    Usage,
)
from segue.statemachine.phases import (
    IDLE,
    AwaitingCheckpoint,
    AwaitingContinuation,
    Compacting,
    ContextExhausted,
    Paused,
)
from segue.statemachine.state import ConversationState

# --------------------------------------------------------------------------- summary requests


def _retry_or_give_up(
    state: ConversationState,
    event: ContinuationFailed | CheckpointFailed | CompactionFailed,
    request: RequestKind,
    give_up: Callable[[ConversationState, str], Result],
) -> Result:
    """Shared by the three tool-less requests: trim on overflow, back off on retryable errors."""
    phase = cast(Summarising, state.phase)
    if phase.retry_pending:
        return state, NOTHING
    attempt = phase.attempt
    if attempt >= state.config.max_attempts or not (event.context_overflow or event.retryable):
        return give_up(state, event.error)
    if event.context_overflow:
        # A trimmed history is no longer the turn's prefix: it goes as text (REQ-SEG-047).
        trim = {
            "attempt": attempt + 1,
            "trim_level": phase.trim_level + 1,
            "shape": "tool_less",
        }
        trimmed = replaced(phase, trim)
        return replaced(state, {"phase": trimmed}), (request_for(trimmed),)
    delay = retry_delay(state, attempt + 1, event.retry_after)
    retry = ScheduleRetry._make(request=request, attempt=attempt + 1, delay_seconds=delay)
    waiting = replaced(phase, {"retry_pending": True})
    return replaced(state, {"phase": waiting}), (retry,)


def called_a_tool(state: ConversationState, tool_calls: tuple[ToolCall, ...]) -> bool:
    """Whether a summary answer is one that called a tool from a request that left the turn's
    tools callable (REQ-SEG-056): it is refused, whatever text came with it. An answer to a
    tool-less request holds no call the model could make; one that does anyway is read for
    its text, as before."""
    phase = cast(Summarising, state.phase)
    return bool(tool_calls) and phase.shape == "reuse_prefix"


def ask_again_without_calls(
    state: ConversationState, tool_calls: tuple[ToolCall, ...], effects: list[Effect]
) -> Result:
    """A summary answer called a tool (REQ-SEG-056): the call is never run. It is named to the
    model with the calls already rejected, as the tool-less path names them, and the summary is
    asked for again: with the turn's prefix while ``REUSE_PREFIX_ASKS`` allows, then without a
    callable tool, which cannot be answered with a call. The answer's usage is in its event, so
    the bill counts every attempt (REQ-SEG-038)."""
    phase = cast(Summarising, state.phase)
    answers = phase.tool_answers + 1
    again = replaced(
        phase,
        {
            "rejected_tool_calls": phase.rejected_tool_calls + tool_calls,
            "tool_answers": answers,
            "shape": "reuse_prefix" if answers < REUSE_PREFIX_ASKS else "tool_less",
            "attempt": 1,
        },
    )
    effects.append(request_for(again))
    return replaced(state, {"phase": again}), tuple(effects)


def _exhausted_with(
    state: ConversationState, summary: str, effects: list[Effect], usage: Usage | None = None
) -> Result:
    """Read-only with ``summary``; ``usage`` is the summary request's answer's, when it had one
    (it is recorded with the summary: every request's cost is kept with its purpose)."""
    waiting = cast(AwaitingContinuation, state.phase)
    effects.append(record(state, "continuation", summary, usage=usage))
    effects.append(NotifyContextExhausted._make(summary=summary))
    ended = ContextExhausted._make(
        summary=summary, trigger_usage=waiting.trigger_usage, final_usage=usage
    )
    exhausted = replaced(
        state,
        {
            "phase": ended,
            "pause_requested": False,
            "message_count": state.message_count + 1,
        },
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
    return replaced(state, {"context_tokens": reported, "pending_tokens": 0})


def on_continuation_response(state: ConversationState, event: ContinuationResponse) -> Result:
    phase = cast(AwaitingContinuation, state.phase)
    if phase.retry_pending:
        return state, NOTHING
    effects: list[Effect] = []
    measured = _measured_only(state, event.usage, effects)  # the latest answer, used or not
    if called_a_tool(state, event.tool_calls):
        return ask_again_without_calls(measured, event.tool_calls, effects)
    summary = event.summary.strip()
    if not summary or event.stop_reason == REFUSAL:
        if not phase.alternate:  # asked once more, with another instruction, first
            again = replaced(phase, {"alternate": True, "attempt": 1})
            effects.append(request_for(again))
            return replaced(measured, {"phase": again}), tuple(effects)
        summary = FALLBACK_SUMMARY
    return _exhausted_with(measured, summary, effects, event.usage)


def on_continuation_failed(state: ConversationState, event: ContinuationFailed) -> Result:
    return _retry_or_give_up(
        state, event, "continuation", lambda s, _error: _exhausted_with(s, FALLBACK_SUMMARY, [])
    )


def on_cancel_continuation(state: ConversationState, _event: object) -> Result:
    return _exhausted_with(state, CANCELLED_SUMMARY, [CANCEL])


# --------------------------------------------------------------------------- checkpoints


def _checkpoint_taken(
    state: ConversationState,
    text: str,
    effects: list[Effect],
    *,
    resume: bool | None = None,
    usage: Usage | None = None,
    elapsed: float | None = None,
) -> Result:
    """Use an agent's checkpoint answer (``""`` when none could be had); ``elapsed`` is how
    long the run has gone on, when the runtime measured it."""
    phase = cast(AwaitingCheckpoint, state.phase)
    checkpoint = extract_checkpoint(text)
    if text.strip():
        effects.append(record(state, "checkpoint", text, usage=usage))
        state = replaced(state, {"message_count": state.message_count + 1})
    resume_after = phase.resume_after if resume is None else resume
    if phase.purpose == "pause":
        return _pause_with(state, checkpoint, effects)
    bound = state.config.max_run_seconds
    if bound is not None and elapsed is not None and elapsed >= bound:  # REQ-SEG-044
        message = (
            f"The run has gone on for {elapsed:,.0f} s, and its bound is {bound:,.0f} s "
            "(max_run_seconds): it stops at this limit instead of restarting. Its checkpoint "
            "is recorded; a new conversation can start from it."
        )
        return fail(state, ErrorKind.RUN_TIME_LIMIT, message, effects)
    seed = continuation_prompt(checkpoint)
    seed_tokens = state.config.system_tokens + state.pinned_tokens + estimate_tokens(seed)
    if seed_tokens >= state.config.continuation_tokens:
        message = (
            f"The checkpoint (about {seed_tokens:,} tokens with the system prompt and the "
            "pinned messages) does not fit "
            "a fresh session "
            f"(threshold {state.config.continuation_tokens:,}); restarting again would loop."
        )
        return fail(state, ErrorKind.CHECKPOINT_OVERFLOW, message, effects)
    session = state.session + 1
    effects.append(StartSession._make(session=session, reason="checkpoint_restart"))
    fresh = replaced(
        state,
        {
            "session": session,
            "continuations": state.continuations + 1,
            "context_tokens": None,
            "pending_tokens": seed_tokens,
            "warned": False,
            "message_count": state.message_count + 1,
            "resume_context": None,
            **FRESH_SESSION,
        },
    )
    effects.append(record(fresh, "user", seed))
    return turn_boundary(fresh, effects, ask_llm=resume_after)


def _pause_with(state: ConversationState, checkpoint: str, effects: list[Effect]) -> Result:
    """Stop in ``Paused`` with a snapshot: the checkpoint and the decisions it states. The
    runtime adds, from the store, what the session did and cost, the errors it met, the
    decisions the transcript states, when it was saved and the application's context."""
    version = state.snapshots + 1
    exhausted = cast(AwaitingCheckpoint, state.phase).exhausted
    snapshot = SessionSnapshot._make(
        conversation_id=state.config.id,
        version=version,
        session=state.session,
        trigger="exhaustion" if exhausted else "pause",
        reason=state.pause_reason,
        checkpoint=checkpoint,
        sections=checkpoint_sections(checkpoint),
        context_tokens=state.context_tokens,
        context_window=state.config.context_window,
        message_count=state.message_count,
        continuations=state.continuations,
        decisions=extract_decisions(checkpoint),
    )
    effects.append(SaveSnapshot._make(snapshot=snapshot))
    paused = replaced(
        state,
        {
            "phase": Paused._make(snapshot=snapshot),
            "snapshots": version,
            "pause_requested": False,
            "pause_reason": "",
        },
    )
    return paused, tuple(effects)


def on_checkpoint_response(state: ConversationState, event: CheckpointResponse) -> Result:
    if cast(AwaitingCheckpoint, state.phase).retry_pending:
        return state, NOTHING
    if called_a_tool(state, event.tool_calls):
        return ask_again_without_calls(state, event.tool_calls, [])
    return _checkpoint_taken(
        state, event.text, [], usage=event.usage, elapsed=event.elapsed_seconds
    )


def on_checkpoint_failed(state: ConversationState, event: CheckpointFailed) -> Result:
    elapsed = event.elapsed_seconds
    return _retry_or_give_up(
        state, event, "checkpoint", lambda s, _error: _checkpoint_taken(s, "", [], elapsed=elapsed)
    )


def on_cancel_checkpoint(state: ConversationState, _event: object) -> Result:
    """The user's cancel abandons a pending pause, as it does in every busy phase
    (REQ-SEG-021). A restart still happens (the old session is over the threshold), seeded
    with the minimal prompt and waiting for the user; a pause checkpoint just stops."""
    calm = replaced(state, {"pause_requested": False, "pause_reason": ""})
    phase = cast(AwaitingCheckpoint, state.phase)
    if phase.purpose == "pause" and not phase.exhausted:
        return replaced(calm, {"phase": IDLE}), (CANCEL,)
    # A restart or a pause at the limit still happens: the old session is over the threshold.
    return _checkpoint_taken(calm, "", [CANCEL], resume=False)


def resumed_snapshot(state: ConversationState, event: ResumeRequested) -> SessionSnapshot:
    """The snapshot a resume compiles its context from: the one the runtime stored (with when
    it was saved and the application's context) when it is this pause's, else the phase's."""
    own = cast(Paused, state.phase).snapshot
    given = event.snapshot
    if (
        given is not None
        and given.conversation_id == own.conversation_id
        and given.version == own.version
    ):
        return given
    return own


def on_resume(state: ConversationState, event: ResumeRequested) -> Result:
    snapshot = resumed_snapshot(state, event)
    context = compile_resume_context(snapshot, current_context=event.current_context)
    prompt = event.prompt if event.prompt and event.prompt.strip() else RESUME_PROMPT
    session = state.session + 1
    effects: list[Effect] = [
        StartSession._make(session=session, reason="resume", system_context=context)
    ]
    fresh = replaced(
        state,
        {
            "session": session,
            "continuations": state.continuations + (snapshot.trigger == "exhaustion"),
            "context_tokens": None,
            "pending_tokens": state.config.system_tokens
            + state.pinned_tokens
            + estimate_tokens(context)
            + estimate_tokens(prompt),
            "warned": False,
            "message_count": state.message_count + 1,
            "resume_context": context,
            # REQ-SEG-054: the pause triggers count again from the resume.
            "turns_since_resume": 0,
            "active_since": event.at,
            **FRESH_SESSION,
        },
    )
    effects.append(record(fresh, "user", prompt))
    return turn_boundary(fresh, effects, ask_llm=True)


# --------------------------------------------------------------------------- compaction


def on_compaction_response(state: ConversationState, event: CompactionResponse) -> Result:
    phase = cast(Compacting, state.phase)
    if phase.retry_pending:
        return state, NOTHING
    if called_a_tool(state, event.tool_calls):
        return ask_again_without_calls(state, event.tool_calls, [])
    unusable = not event.summary.strip() or event.stop_reason == REFUSAL
    if unusable and not phase.alternate:  # asked once more, with another instruction, first
        again = replaced(phase, {"alternate": True, "attempt": 1})
        return replaced(state, {"phase": again}), (request_for(again),)
    config = state.config
    if event.retained_tokens >= config.continuation_tokens:
        message = (
            f"After compaction the context still holds {event.retained_tokens:,} tokens "
            f"(threshold {config.continuation_tokens:,}); compacting again would loop."
        )
        return fail(state, ErrorKind.COMPACTION_INEFFECTIVE, message, [])
    summary = COMPACTION_FALLBACK_SUMMARY if unusable else event.summary.strip()
    if phase.redo:
        return _summary_redone(state, event, summary)
    generation = state.generation + 1
    fresh = replaced(
        state,
        {
            "generation": generation,
            "continuations": state.continuations + 1,
            "context_tokens": None,
            "pending_tokens": event.retained_tokens,
            # Once per session (REQ-BED-023): a new generation is the same session, so the flag
            # stays as it was. The retained figure is an estimate, never a response's occupancy:
            # a response that reaches the warning threshold in the new generation still warns.
            "message_count": state.message_count + 1,
        },
    )
    block = event.block  # the provider's, when it compacted on demand (REQ-SEG-048)
    effects: list[Effect] = [
        StartGeneration._make(generation=generation, summary=summary),
        record(
            fresh,
            "summary",
            summary,
            kept_messages=event.kept_messages,
            usage=event.usage,
            content=(block,) if block is not None and not block.failed else (),
        ),
    ]
    return turn_boundary(fresh, effects, ask_llm=phase.resume_after)


def _compaction_gave_up(state: ConversationState, error: str) -> Result:
    """Roll back: the conversation stays in its generation and is usable again (a failed
    compaction used to end it in ``Failed``, a dead end). It is still near its limit, so the next
    request meets pre-flight and may compact again; ``max_continuations`` is untouched, since
    no continuation happened."""
    message = f"Compaction failed; the conversation goes on uncompacted: {error}"
    effects: list[Effect] = [NotifyCompactionFailed._make(message=message)]
    return turn_boundary(state, effects, ask_llm=False)


def on_compaction_failed(state: ConversationState, event: CompactionFailed) -> Result:
    phase = cast(Compacting, state.phase)
    if (
        event.compaction_refused
        and not phase.retry_pending
        and state.config.compaction == "provider"
        and not state.compaction_fallback
    ):
        # REQ-SEG-049: asked on demand, the provider could not compact: segue compacts this
        # conversation itself from now on, starting with this compaction (asked at once).
        notice = NotifyCompactionFallback._make(reason=event.error)
        fallen = replaced(state, {"compaction_fallback": True})
        return fallen, (notice, request_for(phase))
    return _retry_or_give_up(state, event, "compaction", _compaction_gave_up)


# --------------------------------------------------------------------------- redo and undo


def _copied(state: ConversationState, messages: tuple[Message, ...]) -> list[Effect]:
    """``messages`` recorded again in the state's session and generation: the copies a redone
    summary carries or an undone compaction restores. The runtime made them (the core holds no
    transcript): each names its original (``copy_of``) and carries no usage, which its original
    already counts."""
    where = {"session": state.session, "generation": state.generation}
    return [AppendMessage._make(message=replaced(message, where)) for message in messages]


def on_summary_redo(state: ConversationState, event: SummaryRedoRequested) -> Result:
    """REQ-SEG-063: the latest compaction's summary is asked for again, from the generation it
    replaced (the runtime builds that request). The current generation is archived first, as
    every compaction's is. Its request is sent as the conversation's summary requests are (the
    runtime sends it without tools: it repeats no turn's prefix)."""
    if state.config.behavior is not ContextExhaustionBehavior.COMPACT_IN_PLACE:
        return state, NOTHING
    effects: list[Effect] = [ArchiveTranscript._make(generation=state.generation)]
    phase = Compacting._make(
        trigger="manual",
        focus=event.focus,
        redo=True,
        summary_prompt=event.summary_prompt,
        summary_model=event.summary_model,
        shape=state.config.summary_request,
    )
    effects.append(request_for(phase))
    return replaced(state, {"phase": phase}), tuple(effects)


def _summary_redone(state: ConversationState, event: CompactionResponse, summary: str) -> Result:
    """The summary made again starts a new generation: the summary (with its own usage), then
    the copies the runtime read (the first summary's verbatim tail, and what came after it).
    Nothing is deleted: the first summary stays in the transcript as a version. It replaces a
    continuation rather than adding one, so ``continuations`` is unchanged: making a summary
    again never brings a conversation nearer its ``max_continuations``."""
    generation = state.generation + 1
    copies = event.copies
    fresh = replaced(
        state,
        {
            "generation": generation,
            "context_tokens": None,
            "pending_tokens": event.retained_tokens,
            "message_count": state.message_count + 1 + len(copies),
        },
    )
    redone = Message._make(
        kind="summary",
        text=summary,
        usage=event.usage,
        session=fresh.session,
        generation=generation,
        summarises=event.summarises,
        carried=min(event.carried, len(copies)),
    )
    effects: list[Effect] = [
        StartGeneration._make(generation=generation, summary=summary),
        AppendMessage._make(message=redone),
        *_copied(fresh, copies),
    ]
    return turn_boundary(fresh, effects, ask_llm=False)


def on_compaction_undo(state: ConversationState, event: CompactionUndoRequested) -> Result:
    """REQ-SEG-064: the view before the latest compaction, and what came after it, restored as
    a new generation of copies, when it fits below the continuation threshold now (a larger
    window since, say). The runtime refuses the rest with the figures; here they change
    nothing."""
    tokens = event.tokens
    if state.config.behavior is not ContextExhaustionBehavior.COMPACT_IN_PLACE:
        return state, NOTHING
    if not event.messages or tokens >= state.config.continuation_tokens:
        return state, NOTHING
    generation = state.generation + 1
    fresh = replaced(
        state,
        {
            "generation": generation,
            "context_tokens": None,
            "pending_tokens": tokens,
            "message_count": state.message_count + len(event.messages),
        },
    )
    # The generation taken back is archived first, as every compacted one is: together the
    # archives still hold the whole transcript up to the current generation.
    archive = ArchiveTranscript._make(generation=state.generation)
    start = StartGeneration._make(generation=generation, summary=event.messages[0].text)
    return fresh, (archive, start, *_copied(fresh, event.messages))


def on_continuation_redone(state: ConversationState, event: ContinuationRedone) -> Result:
    """REQ-SEG-063: the continuation summary made again is recorded and becomes the one a
    child is seeded with; the conversation stays read-only, its figures unchanged."""
    ended = cast(ContextExhausted, state.phase)
    summary = event.summary.strip()
    effects: list[Effect] = [
        record(state, "continuation", summary, usage=event.usage),
        NotifyContextExhausted._make(summary=summary),
    ]
    phase = replaced(ended, {"summary": summary, "final_usage": event.usage})
    redone = replaced(state, {"phase": phase, "message_count": state.message_count + 1})
    return redone, tuple(effects)
