"""The pause triggers: a conversation that pauses by itself after so many turns or so long.

An orchestrated agent that works for hours is paused now and then so that a person can look at
what it did (amelia's "auto-pause after N tasks" and "workflow exceeds configured duration").
``pause_after_turns`` and ``pause_after_seconds`` ask for it; this module says, from the state
and the time a turn's reply arrived, whether that reply's turn ends with a pause, and why in
words. It is pure: the time comes as data (``LlmResponse.at``, ``ConversationState.active_since``),
never from a clock.

The pause itself is the one a person asks for (``PauseRequested``): due at the reply that ends
the turn, it is taken at that boundary (a checkpoint, then ``Paused`` with a snapshot whose
reason is these words), and resumed, cancelled and shown as any other (REQ-SEG-052 to 054).
"""

from __future__ import annotations

from segue.statemachine.state import ConversationState

_UNITS = ((3600, "hour"), (60, "minute"), (1, "second"))


def turns_words(turns: int) -> str:
    """``"5 turns"``, ``"1 turn"``."""
    return f"{turns} turn" if turns == 1 else f"{turns} turns"


def duration_words(seconds: float) -> str:
    """A duration as a person says it: ``"30 minutes"``, ``"1 hour 30 minutes"``,
    ``"90.5 seconds"`` (a duration with a fraction of a second is said in seconds)."""
    if seconds != int(seconds) or seconds < 60:
        amount = f"{seconds:g}"
        return f"{amount} second" if amount == "1" else f"{amount} seconds"
    left = int(seconds)
    parts = []
    for size, unit in _UNITS:
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count} {unit}" if count == 1 else f"{count} {unit}s")
    return " ".join(parts)


def pause_due(state: ConversationState, turns: int, at: float | None) -> str | None:
    """Why the turn whose reply arrived at ``at`` (the ``turns``-th since the conversation was
    created or last resumed) ends with a pause: ``"after 5 turns"``, ``"after 30 minutes"``
    (both, joined, when both are due); None when no trigger is due (or none is set)."""
    config = state.config
    due = []
    count = config.pause_after_turns
    if count is not None and turns >= count:
        due.append(turns_words(count))
    bound = config.pause_after_seconds
    since = state.active_since if state.active_since is not None else at
    if bound is not None and since is not None and at is not None and at - since >= bound:
        due.append(duration_words(bound))
    return f"after {' and '.join(due)}" if due else None
