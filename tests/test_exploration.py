"""The core, proved on a bounded space: every reachable abstract state of ``transition()``.

Why: the random walks of ``test_table.py`` and ``test_stateful.py`` meet a rare corner only now
and then (a ``pause_turn`` response crossing the threshold under CHECKPOINT_RESTART was read
differently by the reference model and the code, and found about once in many runs). Here
``segue.testing.explore`` drives one conversation per behaviour breadth-first through EVERY
sequence of a finite alphabet of events up to ``DEPTH`` moves (a 1,000-token window), checks
the invariants of ``specs/requirements.md`` on every edge, and runs the reference model of
``reference_model.py`` beside the core on every edge too. Nothing is sampled, so a broken rule
fails every run, with a shortest path to it.

The last tests plant broken rules and check the exploration reports each, with its shortest
path: without them an exploration that checked nothing would pass just the same.
"""

from __future__ import annotations

import time
from functools import cache
from typing import Any, Final

import pytest

from broken_cores import (
    double_request,
    forgetting_cancelled_tools,
    raising_on_stale_results,
    reopening_exhausted,
    tools_despite_threshold,
    unbounded_retries,
)
from reference_model import Reference, books, observed
from segue import (
    HANDLED_PAIRS,
    ContextExhaustionBehavior,
    ConversationState,
    LlmResponse,
    continuation_prompt,
    estimate_tokens,
    new_conversation,
    transition,
)
from segue.effects import Effect
from segue.statemachine.spec import load_table
from segue.testing.explore import INVARIANTS, Alphabet, Check, Edge, Exploration, explore

B = ContextExhaustionBehavior
ROWS: Final = load_table().rows
WINDOW: Final = 1_000
THRESHOLD: Final = 900
DEPTH: Final = 7
"""Every row of the table that a behaviour can take is first taken within 6 moves; one more
level checks what follows each of them."""
Result = tuple[ConversationState, tuple[Effect, ...]]


def start(behavior: ContextExhaustionBehavior, **options: Any) -> ConversationState:
    """A conversation small enough to explore: a 1,000-token window (warning 800, threshold
    900), two attempts per request, one continuation, one tool round per turn; a sub-agent
    (with a parent to notify) for INTENTIONALLY_UNHANDLED."""
    return new_conversation(
        model="claude-sonnet-4-5",
        behavior=behavior,
        context_window=WINDOW,
        parent_id="parent-1" if behavior is B.INTENTIONALLY_UNHANDLED else None,
        max_attempts=2,
        max_continuations=1,
        max_tool_rounds=1,
        **options,
    )


NO_ROOM_FOR_A_SEED: Final = THRESHOLD - estimate_tokens(continuation_prompt(""))
REUSING: Final = {B.THRESHOLD_BASED_CONTINUATION, B.COMPACT_IN_PLACE}
"""Behaviours explored with ``summary_request="reuse_prefix"`` (REQ-SEG-055), with the restart
below: a summary answer that called a tool is refused there (REQ-SEG-056); the others send the
tool-less request, whose answers are read for their text whatever they hold."""
STARTS: Final = {
    **{
        behavior.value: start(
            behavior, summary_request="reuse_prefix" if behavior in REUSING else "tool_less"
        )
        for behavior in B
        if behavior is not B.CHECKPOINT_RESTART
    },
    # A run with a time bound (REQ-SEG-044): the restart after it is a failure.
    B.CHECKPOINT_RESTART.value: start(
        B.CHECKPOINT_RESTART, max_run_seconds=3_600, summary_request="reuse_prefix"
    ),
    "checkpoint_restart, no room for a seed": start(
        B.CHECKPOINT_RESTART, system_tokens=NO_ROOM_FOR_A_SEED
    ),
    # The provider compacts (REQ-SEG-048): the limit is the window until it fails
    # (REQ-SEG-049) or the bound is reached.
    "compact_in_place, the provider compacts": start(B.COMPACT_IN_PLACE, compaction="provider"),
}
"""One conversation per behaviour (the restarting one with a time bound), and a restart whose
system prompt leaves no room even for the minimal seed (the rows where a restart without a
checkpoint cannot fit a fresh session)."""

PINNING: Final = {B.THRESHOLD_BASED_CONTINUATION.value, B.CHECKPOINT_RESTART.value}
"""The explorations with pinned messages: the budget's rows (idle, and a recoverable failure)
and what a fresh start counts (a restart's seed, a resume) are all reached in these two; in the
others a pinned message would only double the space."""

_SEEN = {"idle", "llm_requesting", "tool_executing", "awaiting_checkpoint", "paused", "failed"}
PHASES: Final = {
    B.THRESHOLD_BASED_CONTINUATION.value: {*_SEEN, "awaiting_continuation", "context_exhausted"},
    B.INTENTIONALLY_UNHANDLED.value: _SEEN,
    B.CHECKPOINT_RESTART.value: _SEEN,
    B.COMPACT_IN_PLACE.value: {*_SEEN, "compacting"},
    B.CHECKPOINT_PAUSE.value: _SEEN,
    "checkpoint_restart, no room for a seed": {"idle", "awaiting_checkpoint", "paused", "failed"},
    "compact_in_place, the provider compacts": {*_SEEN, "compacting"},
}
"""The phases each exploration must reach (a pause requested by an orchestrator reaches
``awaiting_checkpoint`` and ``paused`` in every behaviour); fewer would mean a weaker alphabet."""


class ReferenceCheck:
    """The reference model beside the core on every edge.

    On each edge the model is loaded from the state before and stepped with the event. It must
    (1) take a row exactly when the core has a handler for the pair, (2) agree with the core's
    new state on every figure it keeps (``observed``), and (3) keep the books a model loaded
    from the core's new state keeps (``books``). (3) makes the check of each edge a check of
    every path: by induction, a model that followed any explored path holds at its end what a
    model loaded there holds, so the model and the core agree along every path.
    """

    def __init__(self, first: ConversationState) -> None:
        self.model = Reference(first, ROWS)
        self.rows: set[str] = set()

    def __call__(self, edge: Edge) -> str | None:
        event = edge.move.event
        if event is None:  # a crash changes nothing the model keeps
            return None
        pair = (edge.before.phase.kind, event.kind)
        handled = pair in HANDLED_PAIRS
        if pair not in self.model.by_pair:
            return f"the core handles {pair}, the table has no row" if handled else None
        model = self.model.load(edge.before)
        fired = model.step(event)
        row = model.taken
        taken = f"row {row.id} ({row.guard})" if row is not None else "no row"
        if fired != handled:
            return f"{pair}: the table takes {taken}, the core's handlers disagree"
        if model.observed() != observed(edge.after):
            return (
                f"after {taken}: the model has {model.observed()}, the core {observed(edge.after)}"
            )
        if model.books() != books(edge.after):
            return f"after {taken}: the model keeps {model.books()}, the core {books(edge.after)}"
        if row is not None:
            self.rows.add(row.id)
        return None


@cache
def explored(label: str) -> tuple[Exploration, frozenset[str], float]:
    """The exploration of ``STARTS[label]`` with the invariants and the reference model, the
    table rows it took, and how long it ran (once per test session)."""
    first = STARTS[label]
    reference = ReferenceCheck(first)
    alphabet = Alphabet.for_config(first.config, pinned=label in PINNING)
    began = time.perf_counter()
    result = explore(
        first,
        depth=DEPTH,
        checks={**INVARIANTS, "reference model": reference},
        label=label,
        alphabet=alphabet,
    )
    return result, frozenset(reference.rows), time.perf_counter() - began


class _Summary:
    """Prints what each exploration covered at the end of the run, whatever the capture."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.lines:
            terminalreporter.write_sep("-", "bounded exploration of transition()")
            for line in self.lines:
                terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def summary(request: pytest.FixtureRequest) -> list[str]:
    plugin = _Summary()
    request.config.pluginmanager.register(plugin)
    return plugin.lines


@pytest.mark.parametrize("label", list(STARTS))
def test_every_reachable_state_keeps_every_rule(label: str, summary: list[str]) -> None:
    result, rows, seconds = explored(label)
    line = f"{result.summary()}; {len(rows)} table rows taken ({seconds:.1f} s)"
    print(line)  # noqa: T201  # the figures the issue asks for, with -s
    summary.append(line)
    if result.violation is not None:
        pytest.fail(f"{line}\n{result.violation}", pytrace=False)
    assert result.depth == DEPTH or result.closed, line
    assert set(result.phases) == PHASES[label], f"{line}: phases {dict(result.phases)}"


def test_the_explorations_take_every_row_of_the_table() -> None:
    taken: set[str] = set()
    for label in STARTS:
        taken |= explored(label)[1]
    rows = {row.id for row in ROWS if not row.is_noop}
    assert sorted(rows - taken) == [], "rows no exploration takes: the alphabet lost a case"


# --------------------------------------------------------------------------- planted bugs


def planted(broken: Any, behavior: ContextExhaustionBehavior, depth: int = DEPTH) -> Exploration:
    """The exploration of a broken transition function, with the reference model as well."""
    first = start(behavior)
    checks: dict[str, Check] = {**INVARIANTS, "reference model": ReferenceCheck(first)}
    return explore(first, depth=depth, checks=checks, transition_function=broken)


def test_a_read_only_conversation_that_requests_fails_with_the_shortest_path() -> None:
    result = planted(reopening_exhausted, B.THRESHOLD_BASED_CONTINUATION)
    violation = result.violation
    assert violation is not None
    assert violation.check == "read_only"
    assert "request_llm" in violation.message
    # The shortest way to a read-only conversation is a manual trigger and one answer (or a
    # cancel) to the summary request; then the message.
    assert len(violation.moves) == 3, str(violation)
    assert violation.path[0] == "manual_continuation"
    assert violation.path[-1].startswith("user_message")
    assert "shortest path (3 moves):\n  1. manual_continuation\n  2. " in str(violation)
    state = start(B.THRESHOLD_BASED_CONTINUATION)
    for move in violation.moves[:-1]:
        assert move.event is not None
        state, _ = transition(state, move.event)
    assert state.phase.kind == "context_exhausted"
    shallower = planted(reopening_exhausted, B.THRESHOLD_BASED_CONTINUATION, depth=2)
    assert shallower.violation is None, "BFS reported a path longer than the shortest"


def forgetting_pause_turn(state: ConversationState, event: Any) -> Result:
    """The drift of issue 17 the other way round: a ``pause_turn`` response crossing the
    threshold restarts without asking the model at once (REQ-SEG-034)."""
    after, effects = transition(state, event)
    phase: Any = after.phase
    if (
        isinstance(event, LlmResponse)
        and event.stop_reason == "pause_turn"
        and phase.kind
        in (
            "awaiting_checkpoint",
            "compacting",
        )
    ):
        after = after.with_phase(phase.model_copy(update={"resume_after": bool(event.tool_calls)}))
    return after, effects


@pytest.mark.parametrize("behavior", [B.CHECKPOINT_RESTART, B.COMPACT_IN_PLACE])
def test_the_reference_model_finds_a_pause_turn_drift_on_every_run(
    behavior: ContextExhaustionBehavior,
) -> None:
    result = planted(forgetting_pause_turn, behavior)
    violation = result.violation
    assert violation is not None
    assert violation.check == "reference model"
    assert violation.path == (
        "user_message(150 tokens)",
        "llm_response(at threshold, 0 tool calls, pause_turn)",
    ), str(violation)


def summing_usage(state: ConversationState, event: Any) -> Result:
    """Adds each response's usage to the last figure: the 'reads 3x too full' bug."""
    after, effects = transition(state, event)
    if (
        isinstance(event, LlmResponse)
        and state.context_tokens is not None
        and after.context_tokens is not None
        and after.session == state.session
    ):
        after = after.model_copy(
            update={"context_tokens": state.context_tokens + after.context_tokens}
        )
    return after, effects


def test_summed_usage_is_found() -> None:
    result = planted(summing_usage, B.CHECKPOINT_RESTART)
    assert result.violation is not None
    assert result.violation.check == "never_summed", str(result.violation)


def test_an_exception_is_a_totality_violation_at_the_first_move() -> None:
    result = planted(raising_on_stale_results, B.COMPACT_IN_PLACE)
    violation = result.violation
    assert violation is not None
    assert violation.check == "totality"
    assert "KeyError" in violation.message
    assert len(violation.moves) == 1
    assert violation.path[0].startswith("tool_result")


def acting_on_late_answers(state: ConversationState, event: Any) -> Result:
    """Records a late answer that arrives when nothing waits for it."""
    after, effects = transition(state, event)
    if event.kind == "llm_response" and state.phase.kind == "idle":
        return after.model_copy(update={"message_count": after.message_count + 1}), effects
    return after, effects


@pytest.mark.parametrize(
    ("broken", "rule"),
    [
        (forgetting_cancelled_tools, "tool_pairing"),
        (double_request, "one_request"),
        (unbounded_retries, "bounded"),
        (tools_despite_threshold, "threshold"),
        (acting_on_late_answers, "inert_pairs"),
    ],
    ids=lambda value: getattr(value, "__name__", value),
)
def test_each_invariant_finds_its_broken_rule(broken: Any, rule: str) -> None:
    """With only that invariant checked, so the finding is its own (the reference model, or
    another invariant, might otherwise find the same bug first)."""
    first = start(B.CHECKPOINT_RESTART)
    result = explore(
        first, depth=DEPTH, checks={rule: INVARIANTS[rule]}, transition_function=broken
    )
    assert result.violation is not None, result.summary()
    assert result.violation.check == rule, str(result.violation)
