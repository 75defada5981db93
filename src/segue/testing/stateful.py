"""A hypothesis state machine that drives ``transition()`` and checks segue's invariants.

Why ship it: the invariants below are the promises segue makes to a chat backend (no tool runs
past the threshold, one request in flight, bounded retries, a read-only conversation stays
read-only, occupancy is measured and never summed, every ``tool_use`` gets its ``tool_result``).
A backend that wraps or reimplements ``transition`` can check it keeps them by subclassing
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
from dataclasses import dataclass
from typing import ClassVar, Final, get_args

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from pydantic import ValidationError

from segue.effects import (
    AppendMessage,
    CancelRequest,
    Effect,
    ExecuteTools,
    NotifyContextWarning,
    RequestCheckpoint,
    RequestCompaction,
    RequestContinuation,
    RequestKind,
    RequestLlm,
    ScheduleRetry,
)
from segue.executor.stores.codec import dump_effect, dump_state, load_effect, load_state
from segue.statemachine import (
    BUSY_PHASES,
    ENDED_PHASES,
    PHASE_TYPES,
    WAITING_PHASES,
    CheckpointResponse,
    ContinuationResponse,
    ConversationState,
    Event,
    LlmResponse,
    PhaseKind,
    RetryDue,
    ToolResult,
    new_conversation,
    transition,
)
from segue.statemachine.accounting import reported_occupancy
from segue.statemachine.phases import (
    AwaitingCheckpoint,
    AwaitingContinuation,
    Compacting,
    LlmRequesting,
    ToolExecuting,
)
from segue.testing._explore_world import ANSWERS, REQUEST_EFFECTS, WAITS_FOR
from segue.testing.strategies import TransitionFunction, conversations, events

__all__ = ["ConversationMachine", "InvariantError", "Step"]

_PHASE_KINDS: Final = frozenset(get_args(PhaseKind))
_AT_REST: Final = WAITING_PHASES - {"paused"}
_MEASURED_BY: Final = (LlmResponse, ContinuationResponse, CheckpointResponse)
"""Events whose usage may become the conversation's occupancy."""
_ATTEMPTED: Final = (
    RequestLlm,
    RequestContinuation,
    RequestCheckpoint,
    RequestCompaction,
    ScheduleRetry,
)
"""Effects that carry an attempt number."""


class InvariantError(AssertionError):
    """A promise of segue's core was broken; the message names it and shows the step."""


@dataclass(frozen=True)
class Step:
    """One call of the transition function, with what the world made of the event."""

    before: ConversationState
    event: Event
    after: ConversationState
    effects: tuple[Effect, ...]
    answered: RequestKind | None
    """The in-flight request this event answered, ``None`` for anything else (a stale answer)."""

    def fail(self, invariant_name: str, detail: str) -> InvariantError:
        """The error to raise, with enough of the step to see what happened."""
        kinds = [effect.kind for effect in self.effects]
        return InvariantError(
            f"{invariant_name}: {detail}\n  phase {self.before.phase.kind} -> "
            f"{self.after.phase.kind}\n  event {self.event!r}\n  effects {kinds}"
        )


class ConversationMachine(RuleBasedStateMachine):
    """Drives a transition function with one rule per event kind and checks the invariants.

    Subclass and set ``transition_function`` to test another implementation; override
    ``initial_states`` to choose the conversations it starts from.
    """

    transition_function: ClassVar[TransitionFunction] = staticmethod(transition)
    """The callable under test; ``segue.transition`` by default."""

    def __init__(self) -> None:
        super().__init__()
        self.state = new_conversation(model="claude-sonnet-4-5")
        self.in_flight: list[RequestKind] = []
        """Requests sent and neither answered nor cancelled, oldest first."""
        self.timers: list[tuple[RequestKind, int]] = []
        """Retry timers set and not yet fired: (request, attempt)."""
        self.running_tools: list[str] = []
        """Tool call ids being executed and without a result yet."""
        self.tool_uses: Counter[str] = Counter()
        self.tool_results: Counter[str] = Counter()
        self.rounds = 0
        """Tool rounds run since the turn began (a user-role message starts one)."""
        self.grace_requests = 0
        """Grace requests (``RequestLlm(final=True)``, first attempts) since the turn began."""
        self.last: Step | None = None

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

    @precondition(lambda self: self.state.phase.kind in {"llm_requesting", "tool_executing"})
    @rule(data=st.data())
    def pause_requested(self, data: st.DataObject) -> None:
        """An orchestrator asks for a pause mid-turn (at other times: ``stray_event``)."""
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

    # ----------------------------------------------------------------------- invariants

    @invariant()
    def no_tools_past_threshold(self) -> None:
        """Tools requested by a response at or over the continuation threshold are never run."""
        last = self.last
        if last is None or not any(isinstance(e, ExecuteTools) for e in last.effects):
            return
        threshold = last.before.config.continuation_tokens
        event = last.event
        if isinstance(event, LlmResponse):
            reported = reported_occupancy(event.usage)
            window = last.before.config.context_window
            if reported is not None and threshold <= reported <= window:
                raise last.fail("no_tools_past_threshold", f"response reported {reported}")
        occupancy = last.after.context_tokens
        if occupancy is not None and occupancy >= threshold:
            raise last.fail("no_tools_past_threshold", f"occupancy {occupancy} >= {threshold}")

    @invariant()
    def one_request_in_flight(self) -> None:
        """At most one request (LLM, summary, checkpoint, compaction) is outstanding."""
        if len(self.in_flight) > 1 and self.last is not None:
            raise self.last.fail("one_request_in_flight", f"outstanding: {self.in_flight}")

    @invariant()
    def phase_matches_world(self) -> None:
        """A waiting phase has exactly its request (or its retry timer) outstanding, a tool phase
        exactly its tools, and a phase at rest nothing: otherwise the conversation would hang."""
        last = self.last
        if last is None:
            return
        phase = last.after.phase
        request = WAITS_FOR.get(type(phase))
        if isinstance(
            phase, LlmRequesting | AwaitingContinuation | AwaitingCheckpoint | Compacting
        ):
            if phase.retry_pending:
                ok = not self.in_flight and (request, phase.attempt + 1) in self.timers
            else:
                ok = self.in_flight == [request]
        elif isinstance(phase, ToolExecuting):
            ok = not self.in_flight and sorted(phase.pending) == sorted(self.running_tools)
        else:
            ok = not self.in_flight and not self.running_tools
        if not ok:
            detail = f"in flight {self.in_flight}, timers {self.timers}, tools {self.running_tools}"
            raise last.fail("phase_matches_world", detail)

    @invariant()
    def late_answers_ignored(self) -> None:
        """An answer to no outstanding request (cancelled, or already answered) changes nothing."""
        last = self.last
        if last is None or last.event.kind not in ANSWERS or last.answered is not None:
            return
        if last.effects or last.after != last.before:
            raise last.fail("late_answers_ignored", "a stale answer was acted on")

    @invariant()
    def attempts_bounded(self) -> None:
        """No request is ever made, scheduled or waited for beyond ``config.max_attempts``."""
        last = self.last
        if last is None:
            return
        bound = last.after.config.max_attempts
        phase = last.after.phase
        attempts = [effect.attempt for effect in last.effects if isinstance(effect, _ATTEMPTED)]
        if isinstance(
            phase, LlmRequesting | AwaitingContinuation | AwaitingCheckpoint | Compacting
        ):
            attempts.append(phase.attempt)
        if any(attempt > bound for attempt in attempts):
            raise last.fail("attempts_bounded", f"attempts {attempts} over {bound}")

    @invariant()
    def exhausted_is_absorbing(self) -> None:
        """Once ``context_exhausted``, nothing changes and only user messages get an answer (a
        rejection)."""
        last = self.last
        if last is None or last.before.phase.kind != "context_exhausted":
            return
        if last.after != last.before:
            raise last.fail("exhausted_is_absorbing", "the state changed")
        if any(effect.kind != "reject_user_message" for effect in last.effects):
            raise last.fail("exhausted_is_absorbing", "an effect other than a rejection")

    @invariant()
    def occupancy_never_summed(self) -> None:
        """``context_tokens`` is the latest known usage (known: > 0 and within the window), or
        what it was, or ``None`` in a fresh session or generation: never a sum."""
        last = self.last
        if last is None:
            return
        before, after, event = last.before, last.after, last.event
        allowed: list[int | None] = [before.context_tokens]
        reported = reported_occupancy(event.usage) if isinstance(event, _MEASURED_BY) else None
        window = after.config.context_window
        if reported is not None and reported > window:
            reported = None  # an accounting anomaly: reported, never used
        if reported is not None:
            allowed.append(reported)
        if (after.session, after.generation) != (before.session, before.generation):
            allowed.append(None)
        if after.context_tokens not in allowed:
            detail = f"context_tokens {after.context_tokens}, allowed {allowed}"
            raise last.fail("occupancy_never_summed", detail)
        accepted = last.answered is not None and isinstance(
            event, LlmResponse | ContinuationResponse
        )
        if accepted and reported is not None and after.context_tokens != reported:
            detail = f"an accepted response reported {reported}, kept {after.context_tokens}"
            raise last.fail("occupancy_never_summed", detail)

    @invariant()
    def turns_bounded(self) -> None:
        """A turn runs at most ``max_tool_rounds`` tool rounds, then at most one grace request:
        one user message never starts an unbounded loop."""
        last = self.last
        if last is None:
            return
        bound = last.after.config.max_tool_rounds
        if self.rounds > bound or self.grace_requests > 1:
            detail = f"{self.rounds} tool rounds (bound {bound}), {self.grace_requests} grace"
            raise last.fail("turns_bounded", detail)

    @invariant()
    def tool_calls_paired(self) -> None:
        """Outside ``tool_executing`` every recorded ``tool_use`` has exactly one result."""
        last = self.last
        if last is None or last.after.phase.kind == "tool_executing":
            return
        if self.tool_uses != self.tool_results:
            unpaired = (self.tool_uses - self.tool_results) + (self.tool_results - self.tool_uses)
            raise last.fail("tool_calls_paired", f"unpaired ids {dict(unpaired)}")

    @invariant()
    def preflight_before_requests(self) -> None:
        """No LLM request leaves with a projected prompt at or over the threshold, and the
        warning is given at most once per session or generation."""
        last = self.last
        if last is None:
            return
        after = last.after
        if any(isinstance(effect, RequestLlm) for effect in last.effects):
            threshold = after.config.continuation_tokens
            if after.projected_tokens >= threshold:
                detail = f"projected {after.projected_tokens} >= {threshold}"
                raise last.fail("preflight_before_requests", detail)
        warnings = sum(isinstance(effect, NotifyContextWarning) for effect in last.effects)
        if warnings and (warnings > 1 or last.before.warned or not after.warned):
            raise last.fail("preflight_before_requests", "warned twice")

    @invariant()
    def values_valid(self) -> None:
        """The phase is a known kind, and the state and every effect survive the store's codec
        (what the core builds without validation must still be valid)."""
        last = self.last
        if last is None:
            return
        after = last.after
        if not isinstance(after.phase, PHASE_TYPES) or after.phase.kind not in _PHASE_KINDS:
            raise last.fail("values_valid", f"unknown phase {after.phase!r}")
        try:
            if load_state(dump_state(after)) != after:
                raise last.fail("values_valid", "the state changed through the codec")
            for effect in last.effects:
                if load_effect(dump_effect(effect)) != effect:
                    raise last.fail("values_valid", f"{effect.kind} changed through the codec")
        except ValidationError as error:
            raise last.fail("values_valid", str(error)) from error
