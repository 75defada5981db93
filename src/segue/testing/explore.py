"""Bounded exhaustive exploration of a transition function: every reachable abstract state.

Why it exists: random walks (``strategies``, ``stateful``) meet a rare corner only now and then,
so a broken rule there fails one run in many. Here a conversation of one configuration is driven
breadth-first through EVERY sequence of events from a finite alphabet, up to a depth, and every
invariant is checked on every edge. Two properties follow from breadth-first order: a broken rule
is found on every run (nothing is sampled), and the path reported to it is a shortest one.

The space is kept finite by abstraction: states that differ only in what no rule compares (ids,
texts, message counts, session and generation numbers, snapshot versions) are one abstract state;
everything a guard reads (token figures, counters, flags, the phase and its data, the world's
books) is kept exactly. For a paused conversation the key holds the size estimate of the resume
context, which is what a resume adds to the prompt.

The world is played as the executor plays it: each request effect puts one request in flight,
each ``ScheduleRetry`` sets a timer, ``ExecuteTools`` starts tools, ``CancelRequest`` stops both;
the world answers what is in flight (from the alphabet), fires the timers it holds, finishes the
tools it runs, and also delivers stray events in every phase (late answers, stale timers and
tool results, messages while busy, cancels, manual triggers, pauses and resumes). A crash and
recovery reloads the state from the store's codec; by the outbox's rule the pending effect is
performed again and its outcome arrives once, so the world's books are unchanged.

``explore(start, depth=...)`` returns an ``Exploration``: how many abstract states and edges it
saw, whether the space closed before the depth, and the first ``Violation`` (with its shortest
path) when a check failed. ``INVARIANTS`` are the promises of ``specs/requirements.md``; extra
checks (a reference model, coverage counters) can be passed in ``checks``. A backend that wraps
or reimplements ``transition`` checks it keeps them so::

    from segue import new_conversation
    from segue.testing.explore import explore

    start = new_conversation(
        model="claude-sonnet-4-5", behavior="checkpoint_restart", context_window=1_000,
        max_attempts=2, max_continuations=1, max_tool_rounds=1,
    )
    result = explore(start, depth=6, transition_function=my_backend.transition)
    assert result.violation is None, str(result.violation)  # the shortest path, as events

Keep the window and the bounds small: the space grows about twofold with each level of depth.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from segue.executor.stores.codec import dump_state, load_state
from segue.statemachine import (
    RECOVERABLE_ERRORS,
    ConversationState,
    ToolCall,
    compile_resume_context,
    estimate_tokens,
    limit_tokens,
    transition,
)
from segue.statemachine.phases import (
    AwaitingCheckpoint,
    AwaitingContinuation,
    Compacting,
    ContextExhausted,
    Failed,
    LlmRequesting,
    Paused,
    ToolExecuting,
)
from segue.testing._explore_alphabet import CRASH, Alphabet, Move
from segue.testing._explore_checks import INVARIANTS
from segue.testing._explore_world import Check, Edge, World

if TYPE_CHECKING:
    from segue.testing.strategies import TransitionFunction

__all__ = [
    "CRASH",
    "INVARIANTS",
    "Alphabet",
    "Check",
    "Edge",
    "Exploration",
    "Move",
    "Violation",
    "World",
    "abstract_key",
    "explore",
]


# --------------------------------------------------------------------------- abstraction


def _ids(calls: tuple[ToolCall, ...]) -> tuple[str, ...]:
    return tuple(call.id for call in calls)


def _phase_key(phase: Any) -> tuple[object, ...]:
    """The phase with what no rule reads left out: why the exhaustion path started, which tool
    calls it rejected, the usage kept for the record, texts, summaries and error messages."""
    if isinstance(phase, LlmRequesting):
        return (phase.kind, phase.attempt, phase.retry_pending, phase.final)
    if isinstance(phase, ToolExecuting):
        return (phase.kind, _ids(phase.tool_calls), phase.pending)
    if isinstance(phase, AwaitingContinuation):
        return (phase.kind, phase.attempt, phase.trim_level, phase.retry_pending, phase.alternate)
    if isinstance(phase, AwaitingCheckpoint):
        return (
            phase.kind,
            phase.purpose,
            phase.exhausted,
            phase.resume_after,
            phase.attempt,
            phase.trim_level,
            phase.retry_pending,
        )
    if isinstance(phase, Compacting):
        return (
            phase.kind,
            phase.resume_after,
            phase.attempt,
            phase.trim_level,
            phase.retry_pending,
            phase.alternate,
        )
    if isinstance(phase, Paused):
        snapshot = phase.snapshot
        resume = estimate_tokens(compile_resume_context(snapshot))
        return (phase.kind, snapshot.trigger, resume)
    if isinstance(phase, Failed):
        return (phase.kind, phase.error_kind)
    return (phase.kind,)


def _fresh_before_read(phase: Any) -> bool:
    """Whether every way out of ``phase`` either ends the conversation or starts a new session
    with new figures (occupancy, what was appended, the warning, the turn's tool rounds): then
    those figures are never read again, and states that differ only in them are one."""
    if isinstance(phase, AwaitingContinuation | ContextExhausted | Paused):
        return True  # read-only next, or a resume into a new session
    if isinstance(phase, AwaitingCheckpoint):
        return phase.purpose == "restart" or phase.exhausted  # a new session, or paused
    if isinstance(phase, Failed):
        return phase.error_kind not in RECOVERABLE_ERRORS  # absorbing
    return False


def abstract_key(state: ConversationState, world: World) -> tuple[object, ...]:
    """What identifies a state for the exploration: every figure, counter and flag a rule may
    still read, the phase (``_phase_key``) and the world's books. Left out: the session and
    generation numbers, the message and snapshot counts, the texts of the resume context and
    the provider's session (which only feed records); what is appended past the threshold
    (every figure there is read the same way: over, since only a new measure, session or
    generation, which replaces it, makes it smaller); and the figures a phase never reads again
    (``_fresh_before_read``)."""
    phase = state.phase
    if _fresh_before_read(phase):
        figures: tuple[object, ...] = ()
    else:
        context, pending = state.context_tokens, state.pending_tokens
        # Past the limit every figure is read the same way (the threshold, or the window while
        # the provider compacts: REQ-SEG-048); below it, the threshold is read too.
        room = max(state.config.continuation_tokens, limit_tokens(state)) - (context or 0)
        figures = (context, min(pending, room), state.warned, state.tool_rounds)
    return (
        _phase_key(phase),
        figures,
        state.continuations,
        state.compaction_fallback,  # whether the provider still compacts (REQ-SEG-049)
        state.pinned_tokens,  # read by the pinned budget and by every fresh start
        state.pause_requested,
        state.pause_reason if state.pause_requested else None,  # it goes into the snapshot
        state.provider_session is not None,
        world,
    )


# --------------------------------------------------------------------------- the search


@dataclass(frozen=True)
class Violation:
    """A broken rule, with the shortest sequence of moves from the start that breaks it."""

    check: str
    message: str
    moves: tuple[Move, ...]
    """The moves from the start, the last one breaking the rule; no shorter sequence does."""

    @property
    def path(self) -> tuple[str, ...]:
        """The moves as labels: the event sequence to read in a failure report."""
        return tuple(move.label for move in self.moves)

    def __str__(self) -> str:
        steps = "\n".join(f"  {index}. {label}" for index, label in enumerate(self.path, 1))
        return f"{self.check}: {self.message}\nshortest path ({len(self.moves)} moves):\n{steps}"


@dataclass
class Exploration:
    """What a bounded exploration saw."""

    label: str
    states: int = 0
    """Abstract states reached (the start included)."""
    edges: int = 0
    """Moves taken (each checked)."""
    depth: int = 0
    """Every sequence of at most this many moves was taken (less when a violation stopped it)."""
    closed: bool = False
    """True when no new state was left before the depth bound: the whole reachable space."""
    violation: Violation | None = None
    levels: list[int] = field(default_factory=list)
    """New states found at each depth (the start is depth 0)."""
    phases: Counter[str] = field(default_factory=Counter)
    """Abstract states reached per phase kind."""

    def summary(self) -> str:
        """One line: what was explored, and how it ended."""
        reach = f"closed at depth {self.depth}" if self.closed else f"depth {self.depth}"
        verdict = f"VIOLATION of {self.violation.check}" if self.violation else "every rule holds"
        return f"{self.label}: {self.states:,} states, {self.edges:,} edges, {reach}: {verdict}"


def _step(
    transition_function: TransitionFunction,
    state: ConversationState,
    world: World,
    move: Move,
    depth: int,
) -> Edge:
    event = move.event
    if event is None:  # a crash: the state is read back from what was committed
        after = load_state(dump_state(state))
        return Edge(state, move, after, (), world, world, None, (), depth)
    after, effects = transition_function(state, event)
    effects = tuple(effects)
    world_after, orphans = world.after(move, effects)
    answered = world.answered_by(event)
    return Edge(state, move, after, effects, world, world_after, answered, orphans, depth)


Key = tuple[object, ...]


def explore(
    start: ConversationState,
    *,
    depth: int,
    alphabet: Alphabet | None = None,
    checks: Mapping[str, Check] = INVARIANTS,
    transition_function: TransitionFunction = transition,
    label: str | None = None,
) -> Exploration:
    """Every abstract state reachable from ``start`` in at most ``depth`` moves, breadth first,
    with every ``check`` on every edge (and totality: no exception). Stops at the first
    violation, whose path is a shortest one: every shorter path was checked before it."""
    moves = alphabet if alphabet is not None else Alphabet.for_config(start.config)
    result = Exploration(label=label or start.config.behavior.value)
    first = abstract_key(start, World())
    parents: dict[Key, tuple[Key, Move] | None] = {first: None}
    frontier = [(start, World(), first)]
    result.states, result.levels = 1, [1]
    result.phases[start.phase.kind] += 1

    def broken(key: Key, move: Move, check: str, message: str, level: int) -> Exploration:
        path = [move]
        link = parents[key]
        while link is not None:
            key, into = link
            path.append(into)
            link = parents[key]
        result.violation = Violation(check, message, tuple(reversed(path)))
        result.depth = level
        return result

    for level in range(1, depth + 1):
        found: list[tuple[ConversationState, World, Key]] = []
        for state, world, key in frontier:
            for move in moves.moves(world):
                result.edges += 1
                try:
                    edge = _step(transition_function, state, world, move, level)
                except Exception as error:  # noqa: BLE001  # totality: any exception is the finding
                    message = f"transition raised {type(error).__name__}: {error}"
                    return broken(key, move, "totality", message, level)
                for name, check in checks.items():
                    finding = check(edge)
                    if finding is not None:
                        return broken(key, move, name, finding, level)
                if edge.after is state and edge.world_after is world:
                    continue  # nothing changed: the same abstract state
                after_key = abstract_key(edge.after, edge.world_after)
                if after_key not in parents:
                    parents[after_key] = (key, move)
                    found.append((edge.after, edge.world_after, after_key))
                    result.phases[edge.after.phase.kind] += 1
        result.depth = level
        result.states += len(found)
        result.levels.append(len(found))
        frontier = found
        if not frontier:
            result.closed = True
            break
    return result
