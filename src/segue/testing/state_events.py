"""Events that make sense for a given state: the answer its phase waits for, mostly, with a
little noise (``events_for``). The single events are built in ``event_strategies``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Final

from hypothesis import strategies as st

from segue.statemachine import (
    AwaitingCheckpoint,
    AwaitingContinuation,
    Compacting,
    ConversationState,
    Event,
    LlmRequesting,
    RetryDue,
    ToolExecuting,
)
from segue.testing.event_strategies import EVENT_KINDS, TOOL_CALL_IDS, Scale, built, weighted


def events_for(state: ConversationState, *, noise: int = 2) -> st.SearchStrategy[Event]:
    """Events that make sense for ``state`` (the answer its phase waits for, mostly), plus any
    event at all with weight ``noise`` out of roughly 12: what a real runtime delivers, late
    answers and stray timers included."""
    phase = state.phase
    waiting: tuple[str, ...] = ()
    retry_attempt = 0
    if isinstance(phase, LlmRequesting | AwaitingContinuation | AwaitingCheckpoint | Compacting):
        retry_attempt = phase.attempt + 1 if phase.retry_pending else 0
    elif isinstance(phase, ToolExecuting):
        waiting = phase.pending
    return _events_for(Scale.of(state.config), phase.kind, retry_attempt, waiting, noise)


_ANSWERS: Final = {
    "llm_requesting": ("llm_response", "llm_error"),
    "awaiting_continuation": ("continuation_response", "continuation_failed"),
    "awaiting_checkpoint": ("checkpoint_response", "checkpoint_failed"),
    "compacting": ("compaction_response", "compaction_failed"),
}


@lru_cache(maxsize=1024)
def _events_for(
    scale: Scale, phase: str, retry_attempt: int, waiting: tuple[str, ...], noise: int
) -> st.SearchStrategy[Event]:
    """``events_for`` on a hashable summary of the state, so its strategies are built once."""

    def kind(name: str, ids: tuple[str, ...] = TOOL_CALL_IDS) -> st.SearchStrategy[Event]:
        return built(scale, (name,), ids)

    choices: list[tuple[int, st.SearchStrategy[Any]]] = []
    if phase in _ANSWERS:
        if retry_attempt:
            choices.append((8, st.just(RetryDue(attempt=retry_attempt))))
        else:
            response, failure = _ANSWERS[phase]
            choices += [(8, kind(response)), (2, kind(failure))]
            if phase == "llm_requesting":  # a provider that compacts its own context
                choices.append((1, kind("provider_compacted")))
        choices += [(1, kind("user_cancel")), (1, kind("pause_requested"))]
    elif phase == "tool_executing":
        choices += [(9, kind("tool_result", waiting)), (1, kind("user_cancel"))]
        choices.append((1, kind("pause_requested")))
    elif phase == "idle":
        choices += [(9, kind("user_message")), (1, kind("manual_continuation"))]
        choices.append((1, kind("pause_requested")))
        choices += [(1, kind("summary_redo_requested")), (1, kind("compaction_undo_requested"))]
    elif phase == "paused":
        choices += [(8, kind("resume_requested")), (2, kind("user_message"))]
    elif phase == "context_exhausted":  # a user message, or the summary made again
        choices += [(8, kind("user_message")), (1, kind("continuation_redone"))]
    else:  # failed: only a user message can mean anything
        choices.append((8, kind("user_message")))
    if noise > 0:
        choices.append((noise, built(scale, EVENT_KINDS, TOOL_CALL_IDS)))
    return weighted(choices)
