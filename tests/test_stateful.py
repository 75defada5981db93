"""The shipped state machine (``segue.testing.ConversationMachine``) against the real core.

The first test is the one users copy: ``transition()`` keeps every invariant over random runs.
The rest prove that each invariant can fail: a deliberately broken transition function, checked
by a machine with only that invariant switched on, must be caught. Without them a machine whose
invariants were vacuous (checking the wrong step, or nothing) would pass just the same.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import INVARIANT_MARKER, run_state_machine_as_test

from broken_cores import (
    double_request,
    forgetting_cancelled_tools,
    raising_on_stale_results,
    reopening_exhausted,
    tools_despite_threshold,
    unbounded_retries,
)
from segue import (
    ContextExhaustionBehavior,
    ConversationState,
    LlmRequesting,
    LlmResponse,
    PauseRequested,
    ToolCall,
    Usage,
    UserCancel,
    UserMessage,
    new_conversation,
    transition,
)
from segue.effects import AppendMessage, Effect, RequestCheckpoint
from segue.testing import ConversationMachine, InvariantError, TransitionFunction, conversations

TestConversationMachine = ConversationMachine.TestCase
TestConversationMachine.settings = settings(
    max_examples=150,
    stateful_step_count=40,
)

Result = tuple[ConversationState, tuple[Effect, ...]]
THRESHOLD = ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION

INVARIANTS = sorted(
    name
    for name, member in inspect.getmembers(ConversationMachine)
    if hasattr(member, INVARIANT_MARKER)
)


def test_the_machine_checks_the_promised_invariants() -> None:
    assert INVARIANTS == [
        "attempts_bounded",
        "exhausted_is_absorbing",
        "late_answers_ignored",
        "no_tools_past_threshold",
        "occupancy_never_summed",
        "one_request_in_flight",
        "phase_matches_world",
        "preflight_before_requests",
        "tool_calls_paired",
        "turns_bounded",
        "values_valid",
    ]


def test_the_fake_server_imports_without_hypothesis() -> None:
    """segue.testing loads its hypothesis-backed names lazily, so the standard-library-only fake
    server still imports (and runs as ``python -m``) where hypothesis is not installed. A fresh
    interpreter, since this one has hypothesis loaded."""
    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "import segue.testing.anthropic_server\n"
        "import segue.testing\n"
        "try:\n    segue.testing.ConversationMachine\n"
        "except ImportError:\n    print('lazy')\n"
    )
    done = subprocess.run(  # noqa: S603  # our own interpreter on our own code
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "lazy"


# --------------------------------------------------------------------------- broken cores


def summing_usage(state: ConversationState, event: Any) -> Result:
    """Adds each response's usage to the last figure: the classic 'reads 3x too full' bug."""
    after, effects = transition(state, event)
    if (
        isinstance(event, LlmResponse)
        and state.context_tokens is not None
        and after.context_tokens is not None
        and after.context_tokens != state.context_tokens
    ):
        after = after.model_copy(
            update={"context_tokens": state.context_tokens + after.context_tokens}
        )
    return after, effects


def unbounded_tool_rounds(state: ConversationState, event: Any) -> Result:
    """Forgets the tool rounds a turn has run: every response's tools run."""
    if isinstance(event, LlmResponse):
        fresh = state.model_copy(update={"tool_rounds": 0})
        if isinstance(fresh.phase, LlmRequesting):
            fresh = fresh.with_phase(fresh.phase.model_copy(update={"final": False}))
        return transition(fresh, event)
    return transition(state, event)


def one_tool_round(state: ConversationState) -> ConversationState:
    """The conversation with ``max_tool_rounds=1``: its second tool round is over the limit."""
    return state.model_copy(
        update={"config": state.config.model_copy(update={"max_tool_rounds": 1})}
    )


def machine_checking_only(
    invariant: str,
    broken: TransitionFunction,
    behaviors: tuple[ContextExhaustionBehavior, ...] | None = None,
    narrow: Callable[[ConversationState], ConversationState] | None = None,
) -> type[ConversationMachine]:
    """A ConversationMachine over ``broken`` with every other invariant switched off, so the
    test shows that this one catches the bug (an undecorated override is not an invariant).
    ``behaviors`` and ``narrow`` narrow the conversations it starts from, as a user's subclass
    may."""

    def off(_self: ConversationMachine) -> None:
        return None

    def initial_states(_cls: type[ConversationMachine]) -> st.SearchStrategy[ConversationState]:
        start = conversations(behaviors=behaviors)
        return start if narrow is None else start.map(narrow)

    namespace: dict[str, Any] = {name: off for name in INVARIANTS if name != invariant}
    namespace["transition_function"] = staticmethod(broken)
    namespace["initial_states"] = classmethod(initial_states)
    return type(f"Broken_{invariant}", (ConversationMachine,), namespace)


@pytest.mark.parametrize(
    ("broken", "invariant", "behaviors", "narrow"),
    [
        (summing_usage, "occupancy_never_summed", None, None),
        (tools_despite_threshold, "no_tools_past_threshold", None, None),
        (reopening_exhausted, "exhausted_is_absorbing", (THRESHOLD,), None),
        (forgetting_cancelled_tools, "tool_calls_paired", None, None),
        (double_request, "one_request_in_flight", None, None),
        (unbounded_retries, "attempts_bounded", None, None),
        (unbounded_tool_rounds, "turns_bounded", None, one_tool_round),
        (raising_on_stale_results, "transition never raises", None, None),
    ],
)
def test_a_broken_transition_is_caught(
    broken: TransitionFunction,
    invariant: str,
    behaviors: tuple[ContextExhaustionBehavior, ...] | None,
    narrow: Callable[[ConversationState], ConversationState] | None,
) -> None:
    machine = machine_checking_only(invariant, broken, behaviors, narrow)
    # The second tool round of one turn is the rarest path the stateful machine draws (it took
    # 400 examples on an idle machine and missed in full-suite runs): search it further.
    quick = settings(
        max_examples=2_000 if invariant == "turns_bounded" else 400,
        stateful_step_count=40,
        database=None,
        phases=[Phase.generate],  # finding the bug is the point; shrinking it costs seconds
        report_multiple_bugs=False,
        # The same examples on every run: a search that found each bug once finds it again
        # (a random one missed the rarest bug, a second tool round, about one run in ten).
        derandomize=True,
    )
    with pytest.raises(InvariantError, match=f"^{invariant}"):
        # Older hypothesis releases leave this untyped, newer ones type it: hold for both.
        run_state_machine_as_test(machine, settings=quick)  # type: ignore[no-untyped-call,unused-ignore]


def test_the_real_transition_passes_each_isolated_invariant() -> None:
    """The isolating helper itself does not break anything: a correct core passes with any one
    invariant on (so the failures above come from the broken cores)."""
    machine = machine_checking_only("occupancy_never_summed", transition)
    run_state_machine_as_test(  # type: ignore[no-untyped-call,unused-ignore]  # see above
        machine,
        settings=settings(
            max_examples=20,
            stateful_step_count=20,
        ),
    )


# --------------------------------------------------------------------------- found by the machine


def run(state: ConversationState, events: list[Any]) -> tuple[ConversationState, list[Effect]]:
    effects: list[Effect] = []
    for event in events:
        state, step = transition(state, event)
        effects += step
    return state, effects


def test_message_count_counts_the_results_of_rejected_tools() -> None:
    call = ToolCall(id="toolu_01", name="bash")
    state, effects = run(
        new_conversation(model="claude-sonnet-4-5"),
        [
            UserMessage(text="hi"),
            LlmResponse(tool_calls=(call,), stop_reason="model_context_window_exceeded"),
        ],
    )
    recorded = [effect for effect in effects if isinstance(effect, AppendMessage)]
    assert len(recorded) == 3  # user, assistant with the tool_use, the error tool_result
    assert state.message_count == len(recorded)


def test_a_cancel_leaves_no_request_in_flight() -> None:
    state, effects = run(
        new_conversation(model="claude-sonnet-4-5", behavior="checkpoint_restart"),
        [
            UserMessage(text="hi"),
            PauseRequested(),
            LlmResponse(usage=Usage(input_tokens=190_000)),  # over 90%: checkpoint requested
        ],
    )
    assert state.phase.kind == "awaiting_checkpoint"
    state, effects = run(state, [UserCancel()])
    assert not any(isinstance(effect, RequestCheckpoint) for effect in effects)
    assert state.phase.kind == "idle"
