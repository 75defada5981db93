"""The world around a conversation in ``segue.testing.explore``: the executor's books.

Why a model of the world: an invariant such as "at most one request in flight" or "every tool
call gets exactly one result" is about what was performed, not about the state, so the
exploration keeps the books the executor would keep and updates them from the effects, as the
executor performs them (a ``CancelRequest`` drops the pending requests, timers and tools, which
leave the outbox with it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from segue.effects import (
    AppendMessage,
    CancelRequest,
    Effect,
    ExecuteTools,
    RequestCheckpoint,
    RequestCompaction,
    RequestContinuation,
    RequestKind,
    RequestLlm,
    ScheduleRetry,
)
from segue.statemachine import ConversationState, Event, ToolResult
from segue.statemachine.phases import (
    AwaitingCheckpoint,
    AwaitingContinuation,
    Compacting,
    LlmRequesting,
)
from segue.testing._explore_alphabet import Move

REQUEST_EFFECTS: Final[dict[type[Any], RequestKind]] = {
    RequestLlm: "llm",
    RequestContinuation: "continuation",
    RequestCheckpoint: "checkpoint",
    RequestCompaction: "compaction",
}
"""Which request each request effect sends (the books of ``stateful`` keep them too)."""
ANSWERS: Final[dict[str, RequestKind]] = {
    "llm_response": "llm",
    "llm_error": "llm",
    "continuation_response": "continuation",
    "continuation_failed": "continuation",
    "checkpoint_response": "checkpoint",
    "checkpoint_failed": "checkpoint",
    "compaction_response": "compaction",
    "compaction_failed": "compaction",
}
"""Which request each answer event answers (``provider_compacted`` precedes an answer)."""
WAITS_FOR: Final[dict[type[Any], RequestKind]] = {
    LlmRequesting: "llm",
    AwaitingContinuation: "continuation",
    AwaitingCheckpoint: "checkpoint",
    Compacting: "compaction",
}
"""Which request each requesting phase waits for."""


@dataclass(frozen=True, slots=True)
class World:
    """The executor's books beside the state: requests sent and neither answered nor cancelled
    (kind, attempt), retry timers set and not fired, tools running, and the transcript's
    ``tool_use`` ids still without a ``tool_result`` (sorted, repeated when open twice)."""

    in_flight: tuple[tuple[RequestKind, int], ...] = ()
    timers: frozenset[tuple[RequestKind, int]] = frozenset()
    running: tuple[str, ...] = ()
    unpaired: tuple[str, ...] = ()

    def answered_by(self, event: Event) -> RequestKind | None:
        """The in-flight request ``event`` answers, ``None`` when it answers none (stray)."""
        request = ANSWERS.get(event.kind)
        if request is not None and self.in_flight and self.in_flight[0][0] == request:
            return request
        return None

    def _untouched_by(self, event: Event) -> bool:
        if isinstance(event, ToolResult):
            return event.tool_call_id not in self.running
        return self.answered_by(event) is None

    def after(self, move: Move, effects: tuple[Effect, ...]) -> tuple[World, tuple[str, ...]]:
        """The books once ``move``'s event arrived and ``effects`` were performed, and the tool
        results recorded for no open ``tool_use`` (each is a broken pairing)."""
        event = move.event
        if not effects and move.fires is None and (event is None or self._untouched_by(event)):
            return self, ()  # most stray events: nothing to settle, nothing performed
        books = _Books(
            list(self.in_flight), set(self.timers), list(self.running), Counter(self.unpaired)
        )
        if move.fires is not None:
            books.timers.discard(move.fires)
        elif event is not None:
            if self.answered_by(event) is not None:
                books.in_flight.pop(0)
            elif isinstance(event, ToolResult) and event.tool_call_id in books.running:
                books.running.remove(event.tool_call_id)
        for effect in effects:
            books.perform(effect)
        world = World(
            in_flight=tuple(books.in_flight),
            timers=frozenset(books.timers),
            running=tuple(books.running),
            unpaired=tuple(sorted(books.unpaired.elements())),
        )
        return world, tuple(books.orphans)


@dataclass(slots=True)
class _Books:
    """The world's books while one step's effects are performed."""

    in_flight: list[tuple[RequestKind, int]]
    timers: set[tuple[RequestKind, int]]
    running: list[str]
    unpaired: Counter[str]
    orphans: list[str] = field(default_factory=list)

    def perform(self, effect: Effect) -> None:
        """What performing ``effect`` does to the books, as the executor performs it."""
        request = REQUEST_EFFECTS.get(type(effect))
        if request is not None:
            self.in_flight.append((request, getattr(effect, "attempt", 1)))
        elif isinstance(effect, ScheduleRetry):
            self.timers.add((effect.request, effect.attempt))
        elif isinstance(effect, CancelRequest):  # the executor drops all three
            self.in_flight.clear()
            self.running.clear()
            self.timers.clear()
        elif isinstance(effect, ExecuteTools):
            self.running = list(dict.fromkeys(call.id for call in effect.tool_calls))
        elif isinstance(effect, AppendMessage):
            message = effect.message
            self.unpaired.update(call.id for call in message.tool_calls)
            call_id = message.tool_call_id
            if message.kind == "tool_result" and call_id is not None:
                if self.unpaired[call_id] > 0:
                    self.unpaired[call_id] -= 1
                else:
                    self.orphans.append(call_id)


@dataclass(frozen=True, slots=True)
class Edge:
    """One step of the exploration: ``move`` taken in ``before``, with the world around it."""

    before: ConversationState
    move: Move
    after: ConversationState
    effects: tuple[Effect, ...]
    world_before: World
    world_after: World
    answered: RequestKind | None
    """The in-flight request the event answered (``None``: a stray event, or a crash)."""
    orphans: tuple[str, ...]
    """Tool results recorded for no open ``tool_use`` (a second result, or one for nothing)."""
    depth: int = 0
    """How many moves from the start this edge's move is (1 for the first)."""


Check = Callable[[Edge], str | None]
"""A rule checked on every edge: ``None`` when it holds, else what broke."""
