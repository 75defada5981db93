"""``transition(state, event) -> (state, effects)``: the whole behaviour of a conversation.

Rules of this module (read these before changing anything):

1. Pure. No I/O, no clock, no randomness, no logging. Same input, same output; inputs are never
   mutated. Time appears only as data (a retry delay in an effect; a ``RetryDue`` event; the
   runtime's times on an answer or a resume, which the pause triggers compare).
2. Every change of a conversation goes through ``transition()``. The executor performs the
   returned effects and reports their outcomes as new events; it never edits a state.
3. Total. Every phase x event pair has an answer. An event that does not fit (a late response
   after a cancel, a timer for an old attempt, a manual trigger while busy) changes nothing; a
   user message that cannot be taken is answered with ``RejectUserMessage``. Nothing raises.
4. Occupancy is never summed: a response's usage replaces the figure, it does not add to it.

Theory of operation. ``_HANDLERS`` maps (phase kind, event kind) to a handler; pairs not listed
change nothing (``transition`` reads it by phase, then by event). Which phases are busy and
which wait for a request is read from ``rules``, where it is written once for this table and for
everyone who asks. The handlers live in ``_turns`` (an ordinary turn) and ``_summaries`` (the
requests that end a context); both end on the shared paths of ``_paths``.
``specs/transitions.toml`` is the same table as data: the tests hold the two together row by
row, and a reference model built from the data runs beside this code.

The core builds its values without validating them again (everything it combines was validated
when it entered): new ones with ``Cls._make(...)``, changed ones with ``replaced(value, changes)``,
plain Python over the values' dataclass fields (``segue.statemachine._values`` says why). Nothing
outside this package calls them; handlers read fields as attributes.
"""

from __future__ import annotations

from typing import Any, Final, get_args

from segue.statemachine._paths import (
    CANCELLED_SUMMARY,
    COMPACTION_FALLBACK_SUMMARY,
    FALLBACK_SUMMARY,
    NOTHING,
    OPAQUE_SUMMARY,
    RESUME_PROMPT,
    TOOL_NOT_RUN_CANCELLED,
    TOOL_NOT_RUN_CONTEXT,
    TOOL_NOT_RUN_LIMIT,
    Effects,
    Handler,
    Result,
)
from segue.statemachine._redo import on_compaction_undo, on_continuation_redone, on_summary_redo
from segue.statemachine._summaries import (
    on_cancel_checkpoint,
    on_cancel_continuation,
    on_checkpoint_failed,
    on_checkpoint_response,
    on_compaction_failed,
    on_compaction_response,
    on_continuation_failed,
    on_continuation_response,
    on_resume,
)
from segue.statemachine._turns import (
    on_cancel_pause,
    on_cancel_request,
    on_cancel_tools,
    on_llm_error,
    on_llm_response,
    on_manual_continuation,
    on_pause_when_busy,
    on_pause_when_idle,
    on_provider_compacted,
    on_retry_due,
    on_tool_result,
    on_user_message,
    on_user_message_failed,
    reject_busy,
    reject_exhausted,
    reject_paused,
)
from segue.statemachine.phases import PhaseKind
from segue.statemachine.rules import BUSY_PHASES, REQUEST_PHASES
from segue.statemachine.state import ConversationState


def transition(state: ConversationState, event: Any) -> Result:
    """The next state of ``state`` after ``event``, and the effects the world must perform.

    ``event`` is any of ``segue.statemachine.events``; anything that does not fit the current
    phase returns ``(state, ())``.
    """
    handler = _BY_PHASE[state.phase.kind].get(event.kind)
    if handler is None:
        return state, NOTHING
    return handler(state, event)


# --------------------------------------------------------------------------- the table

_HANDLERS: Final[dict[tuple[str, str], Handler]] = {
    ("idle", "user_message"): on_user_message,
    ("idle", "manual_continuation"): on_manual_continuation,
    ("idle", "pause_requested"): on_pause_when_idle,
    ("idle", "summary_redo_requested"): on_summary_redo,
    ("idle", "compaction_undo_requested"): on_compaction_undo,
    ("llm_requesting", "llm_response"): on_llm_response,
    ("llm_requesting", "llm_error"): on_llm_error,
    ("llm_requesting", "provider_compacted"): on_provider_compacted,
    ("llm_requesting", "user_cancel"): on_cancel_request,
    ("tool_executing", "tool_result"): on_tool_result,
    ("tool_executing", "user_cancel"): on_cancel_tools,
    ("awaiting_continuation", "continuation_response"): on_continuation_response,
    ("awaiting_continuation", "continuation_failed"): on_continuation_failed,
    ("awaiting_continuation", "user_cancel"): on_cancel_continuation,
    ("awaiting_checkpoint", "checkpoint_response"): on_checkpoint_response,
    ("awaiting_checkpoint", "checkpoint_failed"): on_checkpoint_failed,
    ("awaiting_checkpoint", "user_cancel"): on_cancel_checkpoint,
    ("compacting", "compaction_response"): on_compaction_response,
    ("compacting", "compaction_failed"): on_compaction_failed,
    ("compacting", "user_cancel"): on_cancel_request,
    ("context_exhausted", "user_message"): reject_exhausted,
    ("context_exhausted", "continuation_redone"): on_continuation_redone,
    ("failed", "user_message"): on_user_message_failed,
    ("paused", "user_message"): reject_paused,
    ("paused", "resume_requested"): on_resume,
    ("paused", "user_cancel"): on_cancel_pause,
}
for _phase in BUSY_PHASES:
    _HANDLERS[(_phase, "user_message")] = reject_busy
    _HANDLERS[(_phase, "pause_requested")] = on_pause_when_busy
for _phase in REQUEST_PHASES:
    _HANDLERS[(_phase, "retry_due")] = on_retry_due

_BY_PHASE: Final[dict[str, dict[str, Handler]]] = {kind: {} for kind in get_args(PhaseKind)}
"""The same table by phase, then event: two lookups of a string cost less than building and
hashing the pair on every event."""
for (_kind, _event), _handler in _HANDLERS.items():
    _BY_PHASE[_kind][_event] = _handler

HANDLED_PAIRS: Final = frozenset(_HANDLERS)
"""The (phase kind, event kind) pairs that can change something; all others change nothing."""

__all__ = [
    "CANCELLED_SUMMARY",
    "COMPACTION_FALLBACK_SUMMARY",
    "FALLBACK_SUMMARY",
    "HANDLED_PAIRS",
    "OPAQUE_SUMMARY",
    "RESUME_PROMPT",
    "TOOL_NOT_RUN_CANCELLED",
    "TOOL_NOT_RUN_CONTEXT",
    "TOOL_NOT_RUN_LIMIT",
    "Effects",
    "Handler",
    "Result",
    "transition",
]
