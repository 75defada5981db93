"""Hypothesis strategies for segue's values: usage, tool calls, events, conversations, states.

Why these exist: a backend that stores, replays or wraps segue conversations wants to be tested
on the awkward cases (all-zero usage, a response exactly at the threshold, a tool result for a
call that was cancelled, a retry timer for an old attempt) without hand-writing them. These
strategies aim at the edges of each conversation's own thresholds, so a 1,000-token window and a
1,000,000-token window are both pushed across their warning and continuation points.

Every event is built through its public constructor, so what they generate is exactly what a
runtime may legally pass to ``transition()``. States come from ``new_conversation`` driven by
``transition()`` itself, so every generated state is reachable.

Single values (usage, tool calls, events) are built in ``event_strategies``; this module adds
conversations and their histories, and is where all of them are imported from.

Requires ``hypothesis`` (a dev dependency of segue: ``pip install segue[dev]``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Final

from hypothesis import strategies as st

from segue.effects import Effect
from segue.statemachine import (
    ContextExhaustionBehavior,
    ConversationConfig,
    ConversationState,
    Event,
    new_conversation,
    transition,
)
from segue.testing.event_strategies import (
    EVENT_KINDS,
    TOOL_CALL_IDS,
    events,
    tool_calls,
    usages,
    weighted,
)
from segue.testing.state_events import events_for

__all__ = [
    "EVENT_KINDS",
    "TOOL_CALL_IDS",
    "EventSequence",
    "TransitionFunction",
    "configs",
    "conversations",
    "event_sequences",
    "events",
    "events_for",
    "states",
    "tool_calls",
    "usages",
]

TransitionFunction = Callable[
    [ConversationState, Any], tuple[ConversationState, tuple[Effect, ...]]
]
"""Anything shaped like ``segue.transition``: a state and an event in, a state and effects out."""

_MODELS: Final = ("claude-sonnet-4-5", "claude-opus-4-6", "claude-haiku-4-5", "not-a-known-model")
_WINDOWS: Final = (200, 1_000, 8_192, 200_000, 1_000_000)
"""Windows worth hitting on purpose: one where a checkpoint seed (about 85 tokens) may not fit
a fresh session, small ones where token estimates decide, and the real 200k and 1M windows."""
_RATIOS: Final = (0.5, 0.8, 0.85, 0.9, 0.95, 1.0)

# --------------------------------------------------------------------------- conversations


@st.composite
def _conversation(
    draw: st.DrawFn,
    behaviors: tuple[ContextExhaustionBehavior, ...],
    context_windows: st.SearchStrategy[int],
) -> ConversationState:
    window = draw(st.one_of(st.none(), context_windows))
    ratio = st.one_of(st.sampled_from(_RATIOS), st.floats(0.3, 1.0))
    warning, continuation = sorted((draw(ratio), draw(ratio)))
    effective = window if window is not None else 200_000
    return new_conversation(
        model=draw(st.sampled_from(_MODELS)),
        behavior=draw(st.sampled_from(behaviors)),
        warning_threshold=warning,
        continuation_threshold=continuation,
        conversation_id=draw(st.sampled_from(("conv-1", "a" * 200))),
        parent_id=draw(st.sampled_from((None, "parent-1"))),
        context_window=window,
        system_tokens=draw(st.one_of(st.just(0), st.integers(0, effective // 4))),
        max_attempts=draw(st.integers(1, 5)),
        max_continuations=draw(weighted([(4, st.integers(1, 5)), (1, st.just(0))])),
        max_tool_rounds=draw(weighted([(3, st.integers(1, 3)), (1, st.just(50))])),
        summary_request=draw(st.sampled_from(("tool_less", "reuse_prefix"))),
        pause_after_turns=draw(weighted([(3, st.none()), (1, st.integers(1, 3))])),
        pause_after_seconds=draw(weighted([(3, st.none()), (1, st.sampled_from((60.0, 1_800.0)))])),
        started_at=draw(st.sampled_from((None, 0.0))),
    )


def conversations(
    *,
    behaviors: Collection[ContextExhaustionBehavior | str] | None = None,
    context_windows: st.SearchStrategy[int] | None = None,
) -> st.SearchStrategy[ConversationState]:
    """New, idle conversations from ``new_conversation``: every behaviour (or ``behaviors``),
    windows from tiny to 1M (or ``context_windows``; sometimes the model table's), thresholds with
    warning <= continuation, a few attempt, continuation and tool-round bounds, sometimes a pause
    trigger, with and without a parent."""
    chosen = tuple(
        ContextExhaustionBehavior(behavior)
        for behavior in (behaviors if behaviors is not None else ContextExhaustionBehavior)
    )
    if not chosen:
        msg = "behaviors must not be empty"
        raise ValueError(msg)
    windows = context_windows or st.one_of(st.sampled_from(_WINDOWS), st.integers(100, 2_000_000))
    return _conversation(chosen, windows)


def configs(
    *,
    behaviors: Collection[ContextExhaustionBehavior | str] | None = None,
    context_windows: st.SearchStrategy[int] | None = None,
) -> st.SearchStrategy[ConversationConfig]:
    """The configurations of ``conversations()`` (same arguments)."""
    return conversations(behaviors=behaviors, context_windows=context_windows).map(
        lambda state: state.config
    )


@dataclass(frozen=True)
class EventSequence:
    """A conversation's starting state and the events delivered to it, in order."""

    start: ConversationState
    events: tuple[Event, ...]

    def replay(
        self, transition_function: TransitionFunction = transition
    ) -> list[tuple[ConversationState, tuple[Effect, ...]]]:
        """The state and effects after each event."""
        state = self.start
        steps = []
        for event in self.events:
            state, effects = transition_function(state, event)
            steps.append((state, effects))
        return steps

    def final_state(
        self, transition_function: TransitionFunction = transition
    ) -> ConversationState:
        """The state after the last event."""
        steps = self.replay(transition_function)
        return steps[-1][0] if steps else self.start


@st.composite
def _sequence(
    draw: st.DrawFn,
    start: st.SearchStrategy[ConversationState],
    *,
    sizes: tuple[int, int],
    noise: int,
    transition_function: TransitionFunction,
) -> EventSequence:
    first = draw(start)
    state = first
    drawn: list[Event] = []
    min_size, max_size = sizes
    moved = False
    while len(drawn) < max_size:
        if len(drawn) >= min_size and draw(st.integers(0, 3 if moved else 15)) == 0:
            break  # more likely right after a phase change: short-lived phases end sequences too
        event = draw(events_for(state, noise=noise))
        drawn.append(event)
        before = state.phase.kind
        state, _ = transition_function(state, event)
        moved = state.phase.kind != before
    return EventSequence(start=first, events=tuple(drawn))


def event_sequences(
    start: st.SearchStrategy[ConversationState] | None = None,
    *,
    min_size: int = 0,
    max_size: int = 30,
    noise: int = 2,
    transition_function: TransitionFunction = transition,
) -> st.SearchStrategy[EventSequence]:
    """Sequences of events that follow a conversation as it goes (each drawn by ``events_for``
    on the state the previous ones reached), starting from ``start`` (``conversations()``)."""
    return _sequence(
        start if start is not None else conversations(),
        sizes=(min_size, max_size),
        noise=noise,
        transition_function=transition_function,
    )


def states(
    start: st.SearchStrategy[ConversationState] | None = None,
    *,
    max_events: int = 30,
    transition_function: TransitionFunction = transition,
) -> st.SearchStrategy[ConversationState]:
    """Reachable states: ``new_conversation`` driven by ``transition()`` through a sequence
    from ``event_sequences``, so every phase shows up with the data it really carries."""
    return event_sequences(start, max_size=max_events, transition_function=transition_function).map(
        lambda sequence: sequence.final_state(transition_function)
    )
