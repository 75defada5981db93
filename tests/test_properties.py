"""Properties of ``transition()`` over reachable states, drawn with ``segue.testing.strategies``.

The exhaustive phase x event tests pin every pair on hand-made states; these go where hand-made
states do not: whatever a real sequence of events leaves behind (a pending pause, a retry timer,
a half-answered tool batch, a third session). The last group checks the strategies themselves,
since a strategy that never reaches a phase would make every property above quietly weaker.
"""

from __future__ import annotations

from typing import Any, get_args

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from segue import (
    HANDLED_PAIRS,
    CheckpointResponse,
    ContextExhaustionBehavior,
    ConversationState,
    LlmResponse,
    PauseRequested,
    PhaseKind,
    Usage,
    UserMessage,
    new_conversation,
    transition,
)
from segue.effects import (
    AppendMessage,
    ArchiveTranscript,
    CancelRequest,
    ExecuteTools,
    NotifyCompactionFailed,
    NotifyContextExhausted,
    NotifyContextWarning,
    NotifyFailed,
    NotifyParent,
    NotifyToolRoundLimit,
    NotifyTruncated,
    RejectUserMessage,
    ReportAccountingAnomaly,
    RequestCheckpoint,
    RequestCompaction,
    RequestContinuation,
    RequestLlm,
    SaveSnapshot,
    ScheduleRetry,
    StartGeneration,
    StartSession,
)
from segue.executor.stores.codec import (
    dump_effect,
    dump_event,
    dump_state,
    load_effect,
    load_event,
    load_state,
)
from segue.testing import (
    EVENT_KINDS,
    configs,
    conversations,
    event_sequences,
    events,
    events_for,
    states,
    tool_calls,
    usages,
)

EFFECT_TYPES = (
    AppendMessage,
    ArchiveTranscript,
    CancelRequest,
    ExecuteTools,
    NotifyCompactionFailed,
    NotifyContextExhausted,
    NotifyContextWarning,
    NotifyFailed,
    NotifyParent,
    NotifyToolRoundLimit,
    NotifyTruncated,
    RejectUserMessage,
    ReportAccountingAnomaly,
    RequestCheckpoint,
    RequestCompaction,
    RequestContinuation,
    RequestLlm,
    SaveSnapshot,
    ScheduleRetry,
    StartGeneration,
    StartSession,
)

properties = settings(
    max_examples=100,
)


def any_event(data: st.DataObject, state: ConversationState) -> Any:
    """What a phase waits for, or anything at all (scaled to this window or to the default)."""
    return data.draw(st.one_of(events_for(state), events(state.config), events()), label="event")


# --------------------------------------------------------------------------- purity


@properties
@given(st.data())
def test_transition_is_deterministic_and_leaves_its_inputs_alone(data: st.DataObject) -> None:
    state = data.draw(states(), label="state")
    event = any_event(data, state)
    state_before, event_before = state.model_dump(), event.model_dump()

    first = transition(state, event)
    second = transition(state, event)
    from_a_copy = transition(load_state(dump_state(state)), load_event(dump_event(event)))

    assert first == second == from_a_copy
    assert state.model_dump() == state_before
    assert event.model_dump() == event_before


# --------------------------------------------------------------------------- totality


@properties
@given(st.data())
def test_transition_answers_every_event_in_every_reachable_state(data: st.DataObject) -> None:
    state = data.draw(states(), label="state")
    event = any_event(data, state)

    after, effects = transition(state, event)  # raising is the failure

    assert isinstance(after, ConversationState)
    assert isinstance(effects, tuple)
    assert all(isinstance(effect, EFFECT_TYPES) for effect in effects)
    assert after.config == state.config
    if (state.phase.kind, event.kind) not in HANDLED_PAIRS:
        assert after is state
        assert effects == ()


@properties
@given(event_sequences(max_size=40))
def test_replaying_a_sequence_never_raises_and_keeps_the_config(sequence: Any) -> None:
    steps = sequence.replay()
    assert len(steps) == len(sequence.events)
    assert all(state.config == sequence.start.config for state, _ in steps)


# --------------------------------------------------------------------------- serialisation


@properties
@given(states())
def test_reachable_states_survive_the_codec(state: ConversationState) -> None:
    text = dump_state(state)
    loaded = load_state(text)
    assert loaded == state
    assert dump_state(loaded) == text


def test_a_state_dumps_to_the_same_text_after_a_reload() -> None:
    state = new_conversation(
        model="claude-sonnet-4-5", warning_threshold=0.5, continuation_threshold=0.5
    )
    for event in (
        UserMessage(text="Hello"),
        PauseRequested(),
        LlmResponse(text="Hello"),
        CheckpointResponse(text=""),
    ):
        state, _ = transition(state, event)
    assert state.phase.kind == "paused"
    text = dump_state(state)
    assert dump_state(load_state(text)) == text


@properties
@given(st.data())
def test_a_reloaded_state_behaves_as_the_original(data: st.DataObject) -> None:
    """A runtime restarted from its store must make the same decisions it would have made."""
    state = data.draw(states(), label="state")
    event = any_event(data, state)
    reloaded_after, reloaded_effects = transition(load_state(dump_state(state)), event)
    after, effects = transition(state, event)
    assert reloaded_after == after
    assert reloaded_effects == effects
    assert [load_effect(dump_effect(effect)) for effect in effects] == list(effects)


@properties
@given(events())
def test_events_survive_the_codec(event: Any) -> None:
    assert load_event(dump_event(event)) == event


# --------------------------------------------------------------------------- the strategies


@properties
@given(usages(max_tokens=1_000, landmarks=(0, 900, 1_000, 5_000)))
def test_usages_stay_within_their_bound(usage: Usage) -> None:
    assert 0 <= usage.context_tokens <= 1_000


def test_usages_include_the_all_zero_report() -> None:
    found = find(
        usages(),
        lambda usage: not usage.is_known,
        settings=settings(database=None, max_examples=100),
    )
    assert found == Usage()


@properties
@given(tool_calls(ids=("a", "b"), max_size=5))
def test_tool_call_ids_are_unique_within_a_response(calls: Any) -> None:
    ids = [call.id for call in calls]
    assert len(ids) == len(set(ids)) <= 2
    assert set(ids) <= {"a", "b"}


@properties
@given(configs())
def test_configs_keep_the_warning_at_or_below_the_continuation(config: Any) -> None:
    assert 0 < config.warning_tokens <= config.continuation_tokens <= config.context_window


@pytest.mark.parametrize("behavior", list(ContextExhaustionBehavior))
def test_conversations_cover_every_behaviour(behavior: ContextExhaustionBehavior) -> None:
    found = find(
        conversations(),
        lambda state: state.behavior is behavior,
        # A search: the count is its own, not the profile's (the dev profile draws fewer).
        settings=settings(database=None, max_examples=100),
    )
    assert found.phase.kind == "idle"


@properties
@given(st.data())
def test_events_respect_the_kinds_asked_for(data: st.DataObject) -> None:
    kinds = data.draw(st.sets(st.sampled_from(EVENT_KINDS), min_size=1), label="kinds")
    event = data.draw(events(kinds=kinds, tool_ids=("only",)), label="event")
    assert event.kind in kinds
    if event.kind == "tool_result":
        assert event.tool_call_id == "only"


def test_events_refuse_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="llm_reply"):
        events(kinds=("llm_reply",))


def test_states_reach_every_phase() -> None:
    """One derandomized pass (so it cannot flake): every phase shows up as a drawn state."""
    every_phase = set(get_args(PhaseKind))
    seen: set[str] = set()

    def all_seen(state: ConversationState) -> bool:
        seen.add(state.phase.kind)
        return seen >= every_phase

    find(
        states(),
        all_seen,
        settings=settings(
            database=None,
            max_examples=2_000,
            phases=[Phase.generate],
            derandomize=True,
        ),
    )
    assert seen == every_phase
