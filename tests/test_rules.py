"""``segue.statemachine.rules`` says what ``transition()`` does: held together here.

Why: the server, the CLI and the runtime ask the rules (may this conversation take a message?
does it go on only in a new one?) instead of calling ``transition()`` to find out. A rule that
drifted from the table would answer 409 to a message the core takes, or let through one it
refuses. So each rule is checked against ``transition()`` itself, on generated reachable states
and on a state in every phase (with every way to fail).
"""

from __future__ import annotations

from typing import Final

import pytest
from hypothesis import given

from segue import (
    HANDLED_PAIRS,
    AwaitingCheckpoint,
    AwaitingContinuation,
    Compacting,
    ContextExhausted,
    ConversationState,
    ErrorKind,
    Failed,
    LlmRequesting,
    Paused,
    PauseRequested,
    Phase,
    RetryDue,
    SessionSnapshot,
    ToolCall,
    ToolExecuting,
    UserMessage,
    new_conversation,
    transition,
)
from segue.effects import RejectUserMessage
from segue.statemachine.phases import IDLE, PHASE_TYPES
from segue.statemachine.rules import (
    BUSY_PHASES,
    ENDED_PHASES,
    REQUEST_PHASES,
    WAITING_PHASES,
    accepts_message,
    continues_in_new,
)
from segue.testing import states

HELLO: Final = UserMessage(text="hello")
"""A message small enough for any conversation: only where the conversation is can refuse it."""
ALL_PHASES: Final = frozenset(str(cls.model_fields["kind"].default) for cls in PHASE_TYPES)


def refusal(state: ConversationState) -> RejectUserMessage | None:
    """How ``transition()`` refuses ``HELLO`` in ``state``, if it does."""
    _, effects = transition(state, HELLO)
    refused = [effect for effect in effects if isinstance(effect, RejectUserMessage)]
    assert len(refused) <= 1, effects
    return refused[0] if refused else None


def _in_every_phase() -> list[ConversationState]:
    """A conversation in each phase, failed in each way: the user-message handlers read only the
    phase (and, failed, its error kind)."""
    call = ToolCall(id="toolu_1", name="bash")
    snapshot = SessionSnapshot(
        conversation_id="c", version=1, session=1, checkpoint="", context_window=1_000
    )
    start = new_conversation(model="claude-sonnet-4-5", conversation_id="c")
    phases: list[Phase] = [
        IDLE,
        LlmRequesting(),
        LlmRequesting(retry_pending=True),
        ToolExecuting(tool_calls=(call,), pending=(call.id,)),
        AwaitingContinuation(),
        AwaitingCheckpoint(),
        AwaitingCheckpoint(purpose="pause"),
        Compacting(),
        ContextExhausted(summary="s"),
        Paused(snapshot=snapshot),
        *(Failed(error_kind=kind, message="why") for kind in ErrorKind),
    ]
    return [start.with_phase(phase) for phase in phases]


EVERY_PHASE: Final = _in_every_phase()


def test_every_phase_is_covered() -> None:
    assert {state.phase.kind for state in EVERY_PHASE} == ALL_PHASES


def _check_message_rules(state: ConversationState) -> None:
    refused = refusal(state)
    kind = state.phase.kind
    assert accepts_message(state) is (refused is None), (kind, refused)
    assert (kind in BUSY_PHASES) is (refused is not None and refused.cause == "busy"), kind
    assert continues_in_new(state) is (kind in ENDED_PHASES), kind
    if refused is None:  # taken: the message is recorded and the model asked
        after, effects = transition(state, HELLO)
        assert after.message_count == state.message_count + 1
        assert [effect.kind for effect in effects][:1] == ["append_message"]


@pytest.mark.parametrize("state", EVERY_PHASE, ids=lambda state: state.phase.kind)
def test_message_rules_agree_with_transition_in_every_phase(state: ConversationState) -> None:
    _check_message_rules(state)


@given(states())
def test_message_rules_agree_with_transition_on_reachable_states(state: ConversationState) -> None:
    _check_message_rules(state)


@pytest.mark.parametrize("state", EVERY_PHASE, ids=lambda state: state.phase.kind)
def test_a_pause_waits_for_the_turn_exactly_in_the_busy_phases(state: ConversationState) -> None:
    """Busy: the pause is noted and the phase goes on. Idle: it is taken at once. Elsewhere a
    pause changes nothing."""
    after, effects = transition(state, PauseRequested(reason="lunch"))
    kind = state.phase.kind
    if kind in BUSY_PHASES:
        assert (after.phase, effects, after.pause_requested) == (state.phase, (), True)
    elif kind == "idle":
        assert after.phase.kind == "awaiting_checkpoint"
    else:
        assert (after, effects) == (state, ())


@pytest.mark.parametrize("state", EVERY_PHASE, ids=lambda state: state.phase.kind)
def test_retry_timers_count_exactly_in_the_request_phases(state: ConversationState) -> None:
    """A timer for the next attempt of a request waiting for it sends that request again in a
    request phase, and changes nothing anywhere else."""
    phase = state.phase
    waiting = state
    if "retry_pending" in type(phase).model_fields:
        waiting = state.with_phase(phase.model_copy(update={"retry_pending": True}))
    after, effects = transition(waiting, RetryDue(attempt=2))
    if phase.kind in REQUEST_PHASES:
        asking = after.phase.model_dump()
        assert (asking["attempt"], asking["retry_pending"]) == (2, False)
        assert [effect.model_dump()["attempt"] for effect in effects] == [2]
    else:
        assert (after, effects) == (waiting, ())


def test_the_phase_sets_are_the_tables() -> None:
    """Every phase is busy or waiting, never both; the request phases are the busy ones that
    retry; and the table answers a user message and a pause in every busy phase."""
    assert BUSY_PHASES | WAITING_PHASES == ALL_PHASES
    assert not BUSY_PHASES & WAITING_PHASES
    assert {phase for phase, event in HANDLED_PAIRS if event == "retry_due"} == REQUEST_PHASES
    assert REQUEST_PHASES < BUSY_PHASES
    assert ENDED_PHASES < WAITING_PHASES
    for phase in BUSY_PHASES:
        assert {(phase, "user_message"), (phase, "pause_requested")} <= HANDLED_PAIRS
