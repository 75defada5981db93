"""The promises ``ConversationMachine`` checks after every step (``segue.testing.stateful``).

Why a module of their own: the invariants are what segue promises a chat backend, read on their
own by anyone who wonders what the machine checks; how the machine drives a conversation and
plays the world around it is the other half, in ``stateful``. They are a mixin of the machine
over the books it keeps (hypothesis collects ``@invariant()`` methods from base classes too), so
a backend's subclass switches one off as before: by overriding it with a plain method.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Final, get_args

from hypothesis.stateful import invariant
from pydantic import ValidationError

from segue.effects import (
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
    PHASE_TYPES,
    CheckpointResponse,
    ContinuationResponse,
    ConversationState,
    Event,
    LlmResponse,
    PhaseKind,
)
from segue.statemachine.accounting import reported_occupancy
from segue.statemachine.phases import (
    AwaitingCheckpoint,
    AwaitingContinuation,
    Compacting,
    LlmRequesting,
    ToolExecuting,
)
from segue.testing._explore_world import ANSWERS, WAITS_FOR

__all__ = ["InvariantError", "Invariants", "Step"]

_PHASE_KINDS: Final = frozenset(get_args(PhaseKind))
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


class Invariants:
    """segue's invariants, checked against the books of the world the machine plays (kept by
    ``ConversationMachine``: the invariants only read them)."""

    in_flight: list[RequestKind]
    """Requests sent and neither answered nor cancelled, oldest first."""
    timers: list[tuple[RequestKind, int]]
    """Retry timers set and not yet fired: (request, attempt)."""
    running_tools: list[str]
    """Tool call ids being executed and without a result yet."""
    tool_uses: Counter[str]
    """Tool call ids of the recorded ``tool_use`` blocks."""
    tool_results: Counter[str]
    """Tool call ids of the recorded ``tool_result`` messages."""
    rounds: int
    """Tool rounds run since the turn began (a user-role message starts one)."""
    grace_requests: int
    """Grace requests (``RequestLlm(final=True)``, first attempts) since the turn began."""
    last: Step | None
    """The step just taken (None before the first step of a conversation)."""

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
        rejection), but for its continuation summary made again (REQ-SEG-063): recorded and
        taken as its summary, the conversation still read-only."""
        last = self.last
        if last is None or last.before.phase.kind != "context_exhausted":
            return
        if last.event.kind == "continuation_redone":
            kept = {"phase": last.before.phase, "message_count": last.before.message_count}
            kinds = [effect.kind for effect in last.effects]
            if last.after.phase.kind != "context_exhausted" or (
                last.after.model_copy(update=kept) != last.before
            ):
                raise last.fail("exhausted_is_absorbing", "more than the summary changed")
            if kinds != ["append_message", "notify_context_exhausted"]:
                raise last.fail("exhausted_is_absorbing", f"a summary made again made {kinds}")
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
