"""A hypothesis state machine that drives ``transition()`` and checks segue's invariants.

Why ship it: its invariants (``Invariants``, in ``_stateful_invariants``, which the machine
inherits) are the promises segue makes to a chat backend (no tool runs past the threshold, one
request in flight, bounded retries, a read-only conversation stays read-only, occupancy is
measured and never summed, every ``tool_use`` gets its ``tool_result``). A backend that wraps or
reimplements ``transition`` can check it keeps them by subclassing
``ConversationMachine`` and pointing ``transition_function`` at its own callable::

    from hypothesis import settings
    from segue.testing import ConversationMachine, conversations

    class MyBackendMachine(ConversationMachine):
        transition_function = staticmethod(my_backend.transition)

        @classmethod
        def initial_states(cls):  # optional: the conversations each run starts from
            return conversations(behaviors=["checkpoint_restart"])

    TestMyBackend = MyBackendMachine.TestCase  # collected by pytest or unittest
    TestMyBackend.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)

An invariant a backend does not promise is switched off by overriding it with a plain method
(without ``@invariant()``).

The machine plays the world honestly: it answers the request the conversation is waiting for,
runs the tools it was asked to run and fires the retry timers it was asked to set, and it also
delivers stray events (late answers, stale timers, messages while busy) through ``stray_event``.
It keeps its own books of what is in flight, so it checks the conversation against the world
rather than against itself. Every step is recorded with ``note()``; a violated invariant raises
``InvariantError`` (an ``AssertionError``) naming the invariant.

Requires ``hypothesis`` (a dev dependency of segue: ``pip install segue[dev]``).
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar, Final

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
)

from segue.effects import (
    AppendMessage,
    CancelRequest,
    Effect,
    ExecuteTools,
    RequestKind,
    RequestLlm,
    ScheduleRetry,
)
from segue.statemachine import (
    BUSY_PHASES,
    ENDED_PHASES,
    WAITING_PHASES,
    ConversationState,
    Event,
    RetryDue,
    ToolResult,
    new_conversation,
    transition,
)
from segue.testing._explore_world import ANSWERS, REQUEST_EFFECTS
from segue.testing._stateful_invariants import InvariantError, Invariants, Step
from segue.testing.strategies import TransitionFunction, conversations, events

__all__ = ["ConversationMachine", "InvariantError", "Step"]

_AT_REST: Final = WAITING_PHASES - {"paused"}


class ConversationMachine(Invariants, RuleBasedStateMachine):
    """Drives a transition function with one rule per event kind and checks the invariants.

    Subclass and set ``transition_function`` to test another implementation; override
    ``initial_states`` to choose the conversations it starts from.
    """

    transition_function: ClassVar[TransitionFunction] = staticmethod(transition)
    """The callable under test; ``segue.transition`` by default."""

    def __init__(self) -> None:
        super().__init__()
        self.state = new_conversation(model="claude-sonnet-4-5")
        # The world's books, empty (``Invariants`` says what each holds: it reads them)
        self.in_flight = []
        self.timers = []
        self.running_tools = []
        self.tool_uses = Counter()
        self.tool_results = Counter()
        self.rounds = 0
        self.grace_requests = 0
        self.last = None

    @classmethod
    def initial_states(cls) -> st.SearchStrategy[ConversationState]:
        """Where each run starts: a new conversation of any behaviour."""
        return conversations()

    # ----------------------------------------------------------------------- driving

    def step(self, event: Event) -> Step:
        """Deliver ``event`` to the conversation and update the world's books."""
        before = self.state
        answered = self._answer(event)
        try:
            after, effects = type(self).transition_function(before, event)
        except Exception as error:
            msg = f"transition never raises: {type(error).__name__}: {error}\n  event {event!r}"
            raise InvariantError(msg) from error
        effects = tuple(effects)
        note(
            f"{before.phase.kind} <- {event!r}\n"
            f"    -> {after.phase.kind}: {[effect.kind for effect in effects]}"
        )
        for effect in effects:
            self._perform(effect)
        self.state = after
        self.last = Step(before, event, after, effects, answered)
        return self.last

    def _answer(self, event: Event) -> RequestKind | None:
        """Settle the world's books for an incoming event; which request it answered, if any."""
        if isinstance(event, ToolResult) and event.tool_call_id in self.running_tools:
            self.running_tools.remove(event.tool_call_id)
        request = ANSWERS.get(event.kind)
        if request is not None and request in self.in_flight:
            self.in_flight.remove(request)
            return request
        return None

    def _perform(self, effect: Effect) -> None:
        """What a runtime does with each effect, as far as the books are concerned."""
        request = REQUEST_EFFECTS.get(type(effect))
        if request is not None:
            self.in_flight.append(request)
            if isinstance(effect, RequestLlm) and effect.final and effect.attempt == 1:
                self.grace_requests += 1
        elif isinstance(effect, CancelRequest):
            self.in_flight.clear()
            self.running_tools.clear()
        elif isinstance(effect, ScheduleRetry):
            self.timers.append((effect.request, effect.attempt))
        elif isinstance(effect, ExecuteTools):
            self.running_tools = list(dict.fromkeys(call.id for call in effect.tool_calls))
            self.rounds += 1
        elif isinstance(effect, AppendMessage):
            message = effect.message
            if message.kind == "user":
                self.rounds = self.grace_requests = 0
            elif message.kind == "assistant":
                self.tool_uses.update(call.id for call in message.tool_calls)
            elif message.kind == "tool_result" and message.tool_call_id is not None:
                self.tool_results[message.tool_call_id] += 1

    def _waiting_for(self, request: RequestKind) -> bool:
        return bool(self.in_flight) and self.in_flight[0] == request

    # ----------------------------------------------------------------------- rules

    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        """Start from a new conversation."""
        self.state = data.draw(self.initial_states(), label="conversation")
        note(f"start: {self.state.config!r}")

    @precondition(lambda self: self.state.phase.kind in ENDED_PHASES)
    @rule(data=st.data())
    def start_over(self, data: st.DataObject) -> None:
        """The user leaves a finished conversation for a new one (which gets fresh books), so a
        run does not spend its remaining steps knocking on a closed door."""
        self.in_flight.clear()
        self.timers.clear()
        self.running_tools.clear()
        self.tool_uses.clear()
        self.tool_results.clear()
        self.last = None
        self.start(data)

    def _deliver(self, data: st.DataObject, kind: str, tool_ids: tuple[str, ...] = ()) -> None:
        extra = {"tool_ids": tool_ids} if tool_ids else {}
        event = data.draw(events(self.state.config, kinds=(kind,), **extra), label=kind)
        self.step(event)

    @precondition(lambda self: self.state.phase.kind in _AT_REST)
    @rule(data=st.data())
    def user_message(self, data: st.DataObject) -> None:
        """The user writes (busy and paused phases get theirs through ``stray_event``)."""
        self._deliver(data, "user_message")

    @precondition(lambda self: self._waiting_for("llm"))
    @rule(data=st.data())
    def llm_response(self, data: st.DataObject) -> None:
        """The LLM request in flight completes."""
        self._deliver(data, "llm_response")

    @precondition(lambda self: self._waiting_for("llm"))
    @rule(data=st.data())
    def provider_compacted(self, data: st.DataObject) -> None:
        """The provider compacts its own context while the request is in flight."""
        self._deliver(data, "provider_compacted")

    @precondition(lambda self: self._waiting_for("llm"))
    @rule(data=st.data())
    def llm_error(self, data: st.DataObject) -> None:
        """The LLM request in flight fails."""
        self._deliver(data, "llm_error")

    @precondition(lambda self: bool(self.running_tools))
    @rule(data=st.data())
    def tool_result(self, data: st.DataObject) -> None:
        """A running tool finishes."""
        self._deliver(data, "tool_result", tuple(self.running_tools))

    @precondition(lambda self: self._waiting_for("continuation"))
    @rule(data=st.data())
    def continuation_response(self, data: st.DataObject) -> None:
        """The continuation summary arrives."""
        self._deliver(data, "continuation_response")

    @precondition(lambda self: self._waiting_for("continuation"))
    @rule(data=st.data())
    def continuation_failed(self, data: st.DataObject) -> None:
        """The continuation summary request fails."""
        self._deliver(data, "continuation_failed")

    @precondition(lambda self: self._waiting_for("checkpoint"))
    @rule(data=st.data())
    def checkpoint_response(self, data: st.DataObject) -> None:
        """The agent's checkpoint arrives."""
        self._deliver(data, "checkpoint_response")

    @precondition(lambda self: self._waiting_for("checkpoint"))
    @rule(data=st.data())
    def checkpoint_failed(self, data: st.DataObject) -> None:
        """The checkpoint request fails."""
        self._deliver(data, "checkpoint_failed")

    @precondition(lambda self: self._waiting_for("compaction"))
    @rule(data=st.data())
    def compaction_response(self, data: st.DataObject) -> None:
        """The compaction summary arrives."""
        self._deliver(data, "compaction_response")

    @precondition(lambda self: self._waiting_for("compaction"))
    @rule(data=st.data())
    def compaction_failed(self, data: st.DataObject) -> None:
        """The compaction summary request fails."""
        self._deliver(data, "compaction_failed")

    @precondition(lambda self: bool(self.timers))
    @rule(data=st.data())
    def retry_due(self, data: st.DataObject) -> None:
        """A retry timer the conversation set fires (possibly after a cancel made it stale)."""
        timer = data.draw(st.sampled_from(self.timers), label="timer")
        self.timers.remove(timer)
        self.step(RetryDue(attempt=timer[1]))

    @precondition(lambda self: self.state.phase.kind in BUSY_PHASES)
    @rule(data=st.data())
    def user_cancel(self, data: st.DataObject) -> None:
        """The user stops what is in flight."""
        self._deliver(data, "user_cancel")

    @precondition(lambda self: self.state.phase.kind == "idle" and self.state.warned)
    @rule(data=st.data())
    def manual_continuation(self, data: st.DataObject) -> None:
        """The user takes the warning's offer to continue in a new conversation now (at other
        times it arrives through ``stray_event``)."""
        self._deliver(data, "manual_continuation")

    @precondition(lambda self: self.state.phase.kind in BUSY_PHASES)
    @rule(data=st.data())
    def pause_requested(self, data: st.DataObject) -> None:
        """An orchestrator asks for a pause while the turn (or its path at the limit) runs, in
        the phases the core's rules name for it (at other times: ``stray_event``)."""
        self._deliver(data, "pause_requested")

    @precondition(lambda self: self.state.phase.kind == "paused")
    @rule(data=st.data())
    def resume_requested(self, data: st.DataObject) -> None:
        """An orchestrator resumes the paused conversation."""
        self._deliver(data, "resume_requested")

    @rule(data=st.data())
    def stray_event(self, data: st.DataObject) -> None:
        """Any event at all, whatever the phase: late answers, stale timers, impatient users."""
        event = data.draw(events(self.state.config), label="stray")
        self.step(event)
