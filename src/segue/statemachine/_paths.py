"""The paths every handler of ``transition()`` ends on: record a message, fail, take the
behaviour's exhaustion path, or stop at a turn boundary (pre-flight, a pending pause, the next
request or Idle). Shared by ``_turns`` and ``_summaries``; the laws are in ``machine``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from segue.statemachine._values import replaced
from segue.statemachine.content import ContentBlock
from segue.statemachine.effects import (
    AppendMessage,
    ArchiveTranscript,
    CancelRequest,
    Effect,
    NotifyFailed,
    NotifyParent,
    RequestCheckpoint,
    RequestCompaction,
    RequestContinuation,
    RequestLlm,
)
from segue.statemachine.models import (
    ContextExhaustionBehavior,
    ErrorKind,
    Message,
    MessageKind,
    ToolCall,
    Usage,
)
from segue.statemachine.phases import (
    IDLE,
    AwaitingCheckpoint,
    AwaitingContinuation,
    Compacting,
    ExhaustionTrigger,
    Failed,
    LlmRequesting,
)
from segue.statemachine.rules import limit_of
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
TOOL_NOT_RUN_LIMIT: Final = "Not run: this turn reached its limit of tool rounds."
NOTHING: Final[Effects] = ()
# Values without data are shared, never rebuilt: they are immutable, and an ordinary event asks
# for one of them each time.
REQUEST_LLM: Final = RequestLlm()
LLM_REQUESTING: Final = LlmRequesting()
FINAL_REQUEST: Final = RequestLlm(final=True)
FINAL_REQUESTING: Final = LlmRequesting(final=True)
CANCEL: Final = CancelRequest()
Requesting = LlmRequesting | AwaitingContinuation | AwaitingCheckpoint | Compacting
Summarising = AwaitingContinuation | AwaitingCheckpoint | Compacting
Request = RequestLlm | RequestContinuation | RequestCheckpoint | RequestCompaction
WINDOW_EXCEEDED: Final = "model_context_window_exceeded"
PAUSED_TURN: Final = "pause_turn"
"""The provider (or an adapter stopping a running agent) paused a turn mid-task (REQ-SEG-034)."""
TRUNCATED: Final = "max_tokens"
REFUSAL: Final = "refusal"
COMPACTION_PAUSE: Final = "compaction"
"""The provider stopped after compacting the context, as segue asked it to (REQ-SEG-048): the
turn goes on at once, in the generation the compaction started."""
OPAQUE_SUMMARY: Final = (
    "Earlier messages of this conversation were compacted by the provider, whose summary is "
    "opaque; the archive holds them."
)
"""What a provider compaction that carries no readable summary (OpenAI's item) is recorded as."""


# --------------------------------------------------------------------------- small builders


def record(
    state: ConversationState,
    kind: MessageKind,
    text: str,
    *,
    tool_calls: tuple[ToolCall, ...] = (),
    tool_call_id: str | None = None,
    is_error: bool = False,
    usage: Usage | None = None,
    kept_messages: int = 0,
    content: tuple[ContentBlock, ...] = (),
    pinned: bool = False,
    copy_of: int | None = None,
    summarises: int | None = None,
    carried: int = 0,
) -> AppendMessage:
    """Record a message of ``kind`` in the transcript, in the state's session and generation.

    Its fields are spelled out (``Message``'s defaults) rather than passed on as ``**extra``:
    packing and unpacking keywords cost as much as building the message, on nearly every
    event."""
    message = Message._make(
        kind=kind,
        text=text,
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
        is_error=is_error,
        usage=usage,
        session=state.session,
        generation=state.generation,
        kept_messages=kept_messages,
        content=content,
        pinned=pinned,
        copy_of=copy_of,
        summarises=summarises,
        carried=carried,
    )
    return AppendMessage._make(message=message)


def not_run(state: ConversationState, calls: tuple[ToolCall, ...], why: str) -> list[Effect]:
    """Error results for tool calls that will never run, so no ``tool_use`` is left unpaired."""
    return [
        record(state, "tool_result", why, tool_call_id=call.id, is_error=True) for call in calls
    ]


def request_for(phase: Requesting) -> Request:
    """The request ``phase`` waits for, as the phase now stands (its attempt, how much history
    to trim, which instruction, the user's focus): written once for the first ask of an
    exhaustion path, a retry and a trimmed or alternate ask, which must all say the same."""
    if isinstance(phase, AwaitingContinuation):
        return RequestContinuation._make(
            rejected_tool_calls=phase.rejected_tool_calls,
            attempt=phase.attempt,
            trim_level=phase.trim_level,
            alternate=phase.alternate,
            focus=phase.focus,
            shape=phase.shape,
        )
    if isinstance(phase, AwaitingCheckpoint):
        return RequestCheckpoint._make(
            purpose=phase.purpose,
            rejected_tool_calls=phase.rejected_tool_calls,
            attempt=phase.attempt,
            trim_level=phase.trim_level,
            focus=phase.focus,
            shape=phase.shape,
        )
    if isinstance(phase, Compacting):
        return RequestCompaction._make(
            rejected_tool_calls=phase.rejected_tool_calls,
            attempt=phase.attempt,
            trim_level=phase.trim_level,
            alternate=phase.alternate,
            focus=phase.focus,
            shape=phase.shape,
            redo=phase.redo,
            summary_prompt=phase.summary_prompt,
            summary_model=phase.summary_model,
        )
    return RequestLlm._make(attempt=phase.attempt, final=phase.final)


FRESH_SESSION: Final[dict[str, Any]] = {"tool_rounds": 0, "provider_session": None}
"""What a new session starts from besides its figures: its own turn, and no provider session
(REQ-SEG-032)."""


def retry_delay(
    state: ConversationState, next_attempt: int, retry_after: float | None = None
) -> float:
    """Exponential backoff, capped; never shorter than what the provider asked for."""
    config = state.config
    backoff = float(min(config.retry_max_delay, config.retry_base_delay * 2 ** (next_attempt - 2)))
    return backoff if retry_after is None else max(backoff, retry_after)


def fail(state: ConversationState, kind: ErrorKind, message: str, effects: list[Effect]) -> Result:
    effects.append(NotifyFailed._make(error_kind=kind, message=message))
    config = state.config
    if (
        config.parent_id is not None
        and config.behavior is ContextExhaustionBehavior.INTENTIONALLY_UNHANDLED
    ):
        effects.append(
            NotifyParent._make(parent_id=config.parent_id, error_kind=kind, message=message)
        )
    failed = Failed._make(error_kind=kind, message=message)
    return replaced(state, {"phase": failed, "pause_requested": False}), tuple(effects)


def exhausted_message(state: ConversationState) -> str:
    return (
        f"Context window exhausted: {state.projected_tokens:,} of "
        f"{state.config.context_window:,} tokens (threshold "
        f"{state.config.continuation_tokens:,})."
    )


# --------------------------------------------------------------------------- the exhaustion path


def exhaust(
    state: ConversationState,
    trigger: ExhaustionTrigger,
    rejected: tuple[ToolCall, ...],
    resume_after: bool,
    effects: list[Effect],
    *,
    usage: Usage | None = None,
    focus: str | None = None,
) -> Result:
    """Take the conversation's behaviour at the limit (``docs/design.md`` section 2);
    ``usage`` is the triggering response's, kept for the record; ``focus`` is a manual
    trigger's, sent with every request of this path (REQ-SEG-041)."""
    behavior = state.config.behavior
    shape = state.config.summary_request
    phase: Summarising
    if behavior is ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION:
        phase = AwaitingContinuation._make(
            rejected_tool_calls=rejected,
            trigger=trigger,
            trigger_usage=usage,
            focus=focus,
            shape=shape,
        )
    elif behavior is ContextExhaustionBehavior.INTENTIONALLY_UNHANDLED:
        return fail(state, ErrorKind.CONTEXT_EXHAUSTED, exhausted_message(state), effects)
    elif state.continuations >= state.config.max_continuations:
        message = (
            f"{state.continuations} continuations already; the bound is "
            f"{state.config.max_continuations}. {exhausted_message(state)}"
        )
        return fail(state, ErrorKind.CONTINUATION_LIMIT, message, effects)
    elif behavior is ContextExhaustionBehavior.CHECKPOINT_RESTART:
        phase = AwaitingCheckpoint._make(
            rejected_tool_calls=rejected,
            trigger=trigger,
            resume_after=resume_after,
            focus=focus,
            shape=shape,
        )
    elif behavior is ContextExhaustionBehavior.CHECKPOINT_PAUSE:
        phase = AwaitingCheckpoint._make(
            purpose="pause",
            exhausted=True,
            rejected_tool_calls=rejected,
            trigger=trigger,
            resume_after=resume_after,
            focus=focus,
            shape=shape,
        )
    else:
        # COMPACT_IN_PLACE archives first: a failed archive never blocks the compaction.
        effects.append(ArchiveTranscript._make(generation=state.generation))
        phase = Compacting._make(
            rejected_tool_calls=rejected,
            trigger=trigger,
            resume_after=resume_after,
            focus=focus,
            shape=shape,
        )
    effects.append(request_for(phase))
    return replaced(state, {"phase": phase}), tuple(effects)


def turn_boundary(
    state: ConversationState,
    effects: list[Effect],
    ask_llm: bool,
    changes: dict[str, Any] | None = None,
    final: bool = False,
) -> Result:
    """Where a turn may stop: pre-flight, then a pending pause, then the next request or Idle.

    ``changes`` are what the event itself did to the state (tokens appended, a message counted);
    they are applied together with the new phase, so an ordinary event builds one state.
    ``final``: the request to send is a turn's grace request (its tool rounds are used up).
    """
    if changes is None:
        changes = {}
    if ask_llm:
        context = changes.get("context_tokens", state.context_tokens) or 0
        pending = changes.get("pending_tokens", state.pending_tokens)
        config = state.config
        limit = config.continuation_tokens
        if config.compaction != "segue":  # the provider may compact the request (REQ-SEG-048)
            limit = limit_of(
                config,
                changes.get("compaction_fallback", state.compaction_fallback),
                changes.get("continuations", state.continuations),
            )
        if context + pending >= limit:
            return exhaust(replaced(state, changes), "preflight", (), True, effects)
    if changes.get("pause_requested", state.pause_requested):
        pausing = AwaitingCheckpoint._make(
            purpose="pause", resume_after=ask_llm, shape=state.config.summary_request
        )
        effects.append(request_for(pausing))
        changes["phase"] = pausing
    elif ask_llm:
        effects.append(FINAL_REQUEST if final else REQUEST_LLM)
        changes["phase"] = FINAL_REQUESTING if final else LLM_REQUESTING
    else:
        changes["phase"] = IDLE
    return replaced(state, changes), tuple(effects)
