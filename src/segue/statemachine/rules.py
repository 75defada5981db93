"""What the core says about a conversation, for everyone outside it to ask rather than restate.

The server decides whether to answer 409, the CLI whether to refuse, the runtime whether to
count a message's tokens or let a conversation continue in a new one: each asks these. They are
read off the same table ``transition()`` follows (a test holds them together), so a rule
changed here changes every reader.
"""

from __future__ import annotations

from typing import Final

from segue.statemachine.models import ErrorKind
from segue.statemachine.phases import Failed, Idle, PhaseKind
from segue.statemachine.state import ConversationConfig, ConversationState

BUSY_PHASES: Final[frozenset[PhaseKind]] = frozenset(
    {
        "llm_requesting",
        "tool_executing",
        "awaiting_continuation",
        "awaiting_checkpoint",
        "compacting",
    }
)
"""Phases in which a turn, or the work at the limit, is running: a message is refused as busy,
a pause waits for the turn's next boundary."""
REQUEST_PHASES: Final[frozenset[PhaseKind]] = frozenset(
    {"llm_requesting", "awaiting_continuation", "awaiting_checkpoint", "compacting"}
)
"""Busy phases that wait for a model's answer (and may wait for a retry's timer)."""
WAITING_PHASES: Final[frozenset[PhaseKind]] = frozenset(
    {"idle", "context_exhausted", "failed", "paused"}
)
"""Phases in which a conversation waits for input: a turn that reaches one is over."""
ENDED_PHASES: Final[frozenset[PhaseKind]] = frozenset({"context_exhausted", "failed"})
"""Phases no message moves on from in place: what follows is a new conversation (a failure a
message recovers from aside, see ``RECOVERABLE_ERRORS``)."""
RECOVERABLE_ERRORS: Final[frozenset[ErrorKind]] = frozenset(
    {ErrorKind.LLM_ERROR, ErrorKind.RETRIES_EXHAUSTED}
)
"""Failures a user message recovers from (REQ-SEG-023): the conversation takes the message and
asks the model again."""
CONTEXT_FAILURES: Final[frozenset[ErrorKind]] = frozenset(
    {
        ErrorKind.CONTEXT_EXHAUSTED,
        ErrorKind.CHECKPOINT_OVERFLOW,
        ErrorKind.COMPACTION_INEFFECTIVE,
        ErrorKind.RUN_TIME_LIMIT,
    }
)
"""Failures of a conversation whose context (or its run's time) ran out: what it wrote last at
the limit (a summary, a checkpoint) seeds the conversation that continues it."""


def accepts_message(state: ConversationState) -> bool:
    """Whether ``transition()`` takes a user message in this state (rather than refusing it as
    busy, read-only, paused or failed)."""
    phase = state.phase
    return isinstance(phase, Idle) or (
        isinstance(phase, Failed) and phase.error_kind in RECOVERABLE_ERRORS
    )


def continues_in_new(state: ConversationState) -> bool:
    """Whether the conversation can go on only in a new one (``Runtime.start_new_from``): it is
    read-only at its limit, or it failed."""
    return state.phase.kind in ENDED_PHASES


def provider_compacts(state: ConversationState) -> bool:
    """Whether the provider is asked to compact the conversation's next request itself
    (REQ-SEG-048): it was created with ``compaction="provider"``, the provider has not failed
    it (REQ-SEG-049), and it has compactions left under ``max_continuations``."""
    return _provider_compacts(state.config, state.compaction_fallback, state.continuations)


def _provider_compacts(config: ConversationConfig, fallback: bool, continuations: int) -> bool:
    return (
        config.compaction == "provider"
        and not fallback
        and continuations < config.max_continuations
    )


def limit_of(config: ConversationConfig, fallback: bool, continuations: int) -> int:
    """The occupancy at which segue takes the behaviour's path at the limit: the continuation
    threshold; or, while the provider compacts the conversation (``provider_compacts``), the
    window: the provider compacts at the threshold within the next call, and segue steps in
    only where it cannot (a prompt that would not fit at all, REQ-SEG-048)."""
    if _provider_compacts(config, fallback, continuations):
        return config.context_window
    return config.continuation_tokens


def limit_tokens(state: ConversationState) -> int:
    """``limit_of`` the conversation as it stands."""
    return limit_of(state.config, state.compaction_fallback, state.continuations)
