"""Per-event cost of ``transition()`` over two workloads, beside ``transitions`` and
``python-statemachine`` driven through the same table in the same run.

Run ``python bench/bench_transition.py`` (about 40 seconds) or ``--quick`` (about ten seconds,
used by the smoke test). The report says PASS or FAIL against the targets of
``docs/design.md`` section 4, for each workload:

- at least 2x faster than ``transitions`` and 20x faster than ``python-statemachine``;
- no growth of per-event cost from turn 10 to turn 10,000 (late / early <= 1.5x), and a state
  that is the same size after 10,000 turns as after 10.

The workloads:

1. A plain turn: user message -> response with one tool call -> tool result -> final response.
2. A tool-heavy turn: user message -> response with three tool calls -> three results ->
   response with two tool calls -> two results -> final response (9 events). Every response
   carries usage past the 80% warning (the first one of a run crosses it and warns), so every
   response is a usage update and the warning guard is evaluated on each.

Every library evaluates the same guards (does the response call tools? are other calls still
running? does the usage cross the warning?) and builds the same number of effect-like values,
which the driver consumes; each run is checked against that count outside the timed region, so a
driver that skipped work would be caught.

How it is measured: ``time.perf_counter_ns`` around a run of 25 turns, best of many runs, the
libraries interleaved run by run so that a slow patch of the machine hits all of them alike,
and the garbage collector off in the timed region, as ``timeit`` does. Runs are short on
purpose: on a busy 2-core machine a run of 100 ms or more is almost always preempted, so the
best of a few long runs still carries other processes' time; the best of many short runs comes
close to the undisturbed cost.

The exit status is 0 whatever the timings say: the numbers are a report, not a test (timed
assertions are flaky and forbidden in the test suite).
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from importlib.metadata import version
from typing import Any, TypeVar

from statemachine import State, StateMachine
from transitions import Machine

from segue import (
    ConversationState,
    LlmResponse,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
    new_conversation,
    transition,
)
from segue.effects import AppendMessage, ExecuteTools, RequestLlm
from segue.statemachine.models import Message
from segue.statemachine.phases import IDLE, LlmRequesting, ToolExecuting

MODEL = "claude-sonnet-4-6"
"""A 1M-token window: the plain turn's usage (about 31k tokens) stays far under the 80% warning
and the 90% threshold; the tool-heavy turn's (805k-818k) sits between them. Every turn of every
run takes the same path (the warning is given once, in the first turn of a fresh conversation)."""
WARNING_TOKENS = 800_000
"""The 80% warning of ``MODEL``'s window, which the reference drivers check as segue does."""
EFFECTS_PER_TURN = 7
"""AppendMessage + RequestLlm, AppendMessage + ExecuteTools, AppendMessage + RequestLlm,
AppendMessage: what ``transition()`` returns over one plain turn, and what the other drivers
build."""
TOOL_HEAVY_EFFECTS_PER_TURN = 14
"""2 (user) + 2 (three calls) + 1 + 1 + 2 (their results, the last one asks again) + 2 (two
calls) + 1 + 2 (their results) + 1 (final): one tool-heavy turn's effects."""
TURNS_PER_RUN = 25
EARLY_TURN = 10
LATE_TURN = 10_000
WINDOW_TURNS = 100
GROWTH_LIMIT = 1.5
TRANSITIONS_TARGET = 2.0
STATEMACHINE_TARGET = 20.0

REQUEST_LLM = RequestLlm()
LLM_REQUESTING = LlmRequesting()

Turn = tuple[UserMessage, LlmResponse, ToolResult, LlmResponse]
Events = tuple[UserMessage | LlmResponse | ToolResult, ...]
"""The events of one turn, in order."""
T = TypeVar("T")
Run = Callable[[int], int]
"""Drives ``turns`` turns and returns how many effects it consumed."""


def build_turn() -> Turn:
    """The four events of one turn, validated once, as a runtime would receive them."""
    call = ToolCall(id="toolu_01A", name="get_weather", input={"city": "Paris", "unit": "celsius"})
    return (
        UserMessage(text="Will I need an umbrella in Paris this afternoon?"),
        LlmResponse(
            text="Let me check the forecast.",
            tool_calls=(call,),
            usage=Usage(input_tokens=1_200, cache_read_input_tokens=30_000, output_tokens=64),
            stop_reason="tool_use",
        ),
        ToolResult(
            tool_call_id="toolu_01A",
            output='{"temperature_c": 14, "rain_probability": 0.7, "wind_kph": 18}',
        ),
        LlmResponse(
            text="Yes: there is a 70% chance of rain this afternoon, so take an umbrella.",
            usage=Usage(input_tokens=1_350, cache_read_input_tokens=30_000, output_tokens=40),
        ),
    )


def build_tool_heavy_turn() -> Events:
    """The nine events of one tool-heavy turn: three calls, then two, then the answer; each
    response with usage between the warning and the threshold."""

    def call(number: int, name: str, **arguments: Any) -> ToolCall:
        return ToolCall(id=f"toolu_0{number}", name=name, input=arguments)

    first = (
        call(1, "read_file", path="src/app.py"),
        call(2, "grep", pattern="def handler", path="src"),
        call(3, "run_tests", target="tests/test_app.py"),
    )
    second = (call(4, "edit_file", path="src/app.py", line=42), call(5, "run_tests"))

    def usage(prompt: int) -> Usage:
        return Usage(input_tokens=1_500, cache_read_input_tokens=prompt - 1_500, output_tokens=120)

    def result(tool: ToolCall, output: str) -> ToolResult:
        return ToolResult(tool_call_id=tool.id, output=output)

    return (
        UserMessage(text="The handler crashes on an empty body; find out why and fix it."),
        LlmResponse(
            text="Let me look at the handler and its tests.",
            tool_calls=first,
            usage=usage(805_000),
            stop_reason="tool_use",
        ),
        result(first[0], "def handler(body):\n    return json.loads(body)['id']\n"),
        result(first[1], "src/app.py:41:def handler(body):"),
        result(first[2], "FAILED tests/test_app.py::test_empty_body - JSONDecodeError"),
        LlmResponse(
            text="An empty body is not JSON; the handler must check it first.",
            tool_calls=second,
            usage=usage(811_000),
            stop_reason="tool_use",
        ),
        result(second[0], "edited src/app.py:42"),
        result(second[1], "12 passed in 0.41s"),
        LlmResponse(
            text="Fixed: an empty body now gets a 400 instead of a crash; the tests pass.",
            usage=usage(818_000),
        ),
    )


def occupancy(usage: Usage | None) -> int:
    """What a usage report says the context holds (the reference drivers' warning guard)."""
    if usage is None:
        return 0
    return (
        usage.input_tokens
        + usage.cache_creation_input_tokens
        + usage.cache_read_input_tokens
        + usage.output_tokens
    )


# --------------------------------------------------------------------------- segue


def segue_turns(state: ConversationState, turn: Turn, turns: int) -> tuple[ConversationState, int]:
    """``turns`` plain turns from ``state``, carrying the state; returns it and the effects
    consumed."""
    user, tool_call, tool_result, final = turn
    consumed = 0
    for _ in range(turns):
        state, effects = transition(state, user)
        consumed += len(effects)
        state, effects = transition(state, tool_call)
        consumed += len(effects)
        state, effects = transition(state, tool_result)
        consumed += len(effects)
        state, effects = transition(state, final)
        consumed += len(effects)
    return state, consumed


def segue_steps(
    state: ConversationState, events: Events, turns: int
) -> tuple[ConversationState, int]:
    """``turns`` turns of ``events`` from ``state``, one loop step an event (as the reference
    drivers of the tool-heavy workload take them)."""
    consumed = 0
    for _ in range(turns):
        for event in events:
            state, effects = transition(state, event)
            consumed += len(effects)
    return state, consumed


Drive = Callable[[ConversationState, int], tuple[ConversationState, int]]
"""Runs ``turns`` turns of one workload through ``transition()`` from a state."""


def prepare_segue(drive: Drive, events_per_turn: int) -> Run:
    """A run from a fresh conversation; its last state is checked to be idle."""
    start = new_conversation(model=MODEL, conversation_id="bench")

    def run(turns: int) -> int:
        state, consumed = drive(start, turns)
        assert state.phase.kind == "idle", state.phase
        assert state.message_count == events_per_turn * turns, state.message_count
        return consumed

    return run


def prepare_floor(turn: Turn) -> Run:
    """The values one plain turn returns (4 states, 4 transcript messages with their
    AppendMessage, ExecuteTools, ToolExecuting; RequestLlm and LlmRequesting are shared), built
    without validation as the core builds them, with no decision made: what building the values
    alone costs. Built through the public ``model_copy`` of validated prototypes (the core's
    own builders stay the core's), which costs what they do within a few percent."""
    user, tool_call, result, final = turn
    start = new_conversation(model=MODEL, conversation_id="bench")
    calls = tool_call.tool_calls
    pending = (calls[0].id,)
    message = Message(kind="user")
    append = AppendMessage(message=message)
    execute = ExecuteTools(tool_calls=calls)
    executing = ToolExecuting(tool_calls=calls, pending=pending)
    said = {"kind": "user", "text": user.text, "session": 1, "generation": 1}
    called = {
        "kind": "assistant",
        "text": tool_call.text,
        "tool_calls": calls,
        "usage": tool_call.usage,
        "session": 1,
        "generation": 1,
    }
    answered = {
        "kind": "tool_result",
        "text": result.output,
        "tool_call_id": result.tool_call_id,
        "session": 1,
        "generation": 1,
    }
    ended = {
        "kind": "assistant",
        "text": final.text,
        "usage": final.usage,
        "session": 1,
        "generation": 1,
    }

    def record(fields: dict[str, Any]) -> AppendMessage:
        return append.model_copy(update={"message": message.model_copy(update=fields)})

    def run(turns: int) -> int:
        state, consumed = start, 0
        for count in range(0, 4 * turns, 4):
            effects: tuple[object, ...] = (record(said), REQUEST_LLM)
            state = state.model_copy(update={"message_count": count + 1, "phase": LLM_REQUESTING})
            consumed += len(effects)
            effects = (record(called), execute.model_copy(update={"tool_calls": calls}))
            phase = executing.model_copy(update={"tool_calls": calls, "pending": pending})
            state = state.model_copy(update={"message_count": count + 2, "phase": phase})
            consumed += len(effects)
            effects = (record(answered), REQUEST_LLM)
            state = state.model_copy(update={"message_count": count + 3, "phase": LLM_REQUESTING})
            consumed += len(effects)
            effects = (record(ended),)
            state = state.model_copy(update={"message_count": count + 4, "phase": IDLE})
            consumed += len(effects)
        return consumed

    return run


# ----------------------------------------------------------------------- transitions (plain)


class TransitionsModel:
    """The model ``transitions.Machine`` drives: the guard, and callbacks that build effects."""

    state: str

    def __init__(self) -> None:
        self.effects: tuple[tuple[str, Any], ...] = ()
        self.message_count = 0

    def has_tools(self, event: LlmResponse) -> bool:
        return bool(event.tool_calls)

    def on_user_message(self, event: UserMessage) -> None:
        self.message_count += 1
        self.effects = (("append_message", event.text), ("request_llm", 1))

    def on_tool_call(self, event: LlmResponse) -> None:
        self.message_count += 1
        self.effects = (("append_message", event.text), ("execute_tools", event.tool_calls))

    def on_tool_result(self, event: ToolResult) -> None:
        self.message_count += 1
        self.effects = (("append_message", event.output), ("request_llm", 1))

    def on_final(self, event: LlmResponse) -> None:
        self.message_count += 1
        self.effects = (("append_message", event.text),)


def prepare_transitions(turn: Turn) -> Run:
    """The same four-step cycle as a ``transitions.Machine`` with ``conditions``/``unless``."""
    model = TransitionsModel()
    Machine(
        model=model,
        states=["idle", "llm_requesting", "tool_executing"],
        initial="idle",
        auto_transitions=False,
        transitions=[
            {
                "trigger": "user_message",
                "source": "idle",
                "dest": "llm_requesting",
                "after": "on_user_message",
            },
            {
                "trigger": "llm_response",
                "source": "llm_requesting",
                "dest": "tool_executing",
                "conditions": "has_tools",
                "after": "on_tool_call",
            },
            {
                "trigger": "llm_response",
                "source": "llm_requesting",
                "dest": "idle",
                "unless": "has_tools",
                "after": "on_final",
            },
            {
                "trigger": "tool_result",
                "source": "tool_executing",
                "dest": "llm_requesting",
                "after": "on_tool_result",
            },
        ],
    )
    # Triggers are attached to the model at run time; bound once, as a caller would.
    user_message: Callable[[UserMessage], bool] = getattr(model, "user_message")  # noqa: B009
    llm_response: Callable[[LlmResponse], bool] = getattr(model, "llm_response")  # noqa: B009
    tool_result: Callable[[ToolResult], bool] = getattr(model, "tool_result")  # noqa: B009
    user, tool_call, result, final = turn

    def run(turns: int) -> int:
        consumed = 0
        for _ in range(turns):
            user_message(user)
            consumed += len(model.effects)
            llm_response(tool_call)
            consumed += len(model.effects)
            tool_result(result)
            consumed += len(model.effects)
            llm_response(final)
            consumed += len(model.effects)
        assert model.state == "idle", model.state
        return consumed

    return run


# ---------------------------------------------------------------- python-statemachine (plain)


class TurnMachine(StateMachine):
    """The same four-step cycle in ``python-statemachine`` 3.x; the ``on`` action's return value
    is what ``send`` returns, so the effects come back to the caller as with ``transition()``."""

    idle = State(initial=True)
    llm_requesting = State()
    tool_executing = State()

    user_message = idle.to(llm_requesting, on="on_user_message")
    llm_response = llm_requesting.to(tool_executing, cond="has_tools", on="on_tool_call") | (
        llm_requesting.to(idle, unless="has_tools", on="on_final")
    )
    tool_result = tool_executing.to(llm_requesting, on="on_tool_result")

    def __init__(self) -> None:
        self.message_count = 0
        super().__init__()

    def has_tools(self, payload: LlmResponse) -> bool:
        return bool(payload.tool_calls)

    def on_user_message(self, payload: UserMessage) -> tuple[tuple[str, Any], ...]:
        self.message_count += 1
        return (("append_message", payload.text), ("request_llm", 1))

    def on_tool_call(self, payload: LlmResponse) -> tuple[tuple[str, Any], ...]:
        self.message_count += 1
        return (("append_message", payload.text), ("execute_tools", payload.tool_calls))

    def on_tool_result(self, payload: ToolResult) -> tuple[tuple[str, Any], ...]:
        self.message_count += 1
        return (("append_message", payload.output), ("request_llm", 1))

    def on_final(self, payload: LlmResponse) -> tuple[tuple[str, Any], ...]:
        self.message_count += 1
        return (("append_message", payload.text),)


def prepare_statemachine(turn: Turn) -> Run:
    """Events sent with ``send``, the documented entry point; the payload as a keyword."""
    machine = TurnMachine()
    send = machine.send
    user, tool_call, result, final = turn

    def run(turns: int) -> int:
        consumed = 0
        for _ in range(turns):
            consumed += len(send("user_message", payload=user))
            consumed += len(send("llm_response", payload=tool_call))
            consumed += len(send("tool_result", payload=result))
            consumed += len(send("llm_response", payload=final))
        assert machine.current_state_value == "idle", machine.current_state_value
        return consumed

    return run


# ------------------------------------------------------------------- the tool-heavy references


Effects = tuple[tuple[str, Any], ...]


class ToolHeavyTurn:
    """What both reference libraries do on a tool-heavy turn: the guards and the effects.

    It keeps what segue's state keeps for these decisions: the ids still running and whether
    the conversation was warned; each response checks its usage against the warning.
    """

    def __init__(self) -> None:
        self.effects: Effects = ()
        self.message_count = 0
        self.pending: tuple[str, ...] = ()
        self.warned = False

    def has_tools(self, event: LlmResponse) -> bool:
        return bool(event.tool_calls)

    def more_pending(self, event: ToolResult) -> bool:
        return len(self.pending) > 1 and event.tool_call_id in self.pending

    def _warning(self, event: LlmResponse) -> Effects:
        tokens = occupancy(event.usage)
        if self.warned or tokens < WARNING_TOKENS:
            return ()
        self.warned = True
        return (("notify_context_warning", tokens),)

    def on_user_message(self, event: UserMessage) -> Effects:
        self.message_count += 1
        self.effects = (("append_message", event.text), ("request_llm", 1))
        return self.effects

    def on_tool_calls(self, event: LlmResponse) -> Effects:
        self.message_count += 1
        self.pending = tuple(call.id for call in event.tool_calls)
        self.effects = (
            *self._warning(event),
            ("append_message", event.text),
            ("execute_tools", event.tool_calls),
        )
        return self.effects

    def on_final(self, event: LlmResponse) -> Effects:
        self.message_count += 1
        self.effects = (*self._warning(event), ("append_message", event.text))
        return self.effects

    def on_tool_result(self, event: ToolResult) -> Effects:
        self.message_count += 1
        self.pending = tuple(call_id for call_id in self.pending if call_id != event.tool_call_id)
        self.effects = (("append_message", event.output),)
        return self.effects

    def on_last_result(self, event: ToolResult) -> Effects:
        self.message_count += 1
        self.pending = ()
        self.effects = (("append_message", event.output), ("request_llm", 1))
        return self.effects


def prepare_tool_heavy_transitions(events: Events) -> Run:
    """The tool-heavy table as a ``transitions.Machine``: a result while other calls run is an
    internal transition (``dest=None``), the last one goes back to the model."""
    model = ToolHeavyTurn()
    Machine(
        model=model,
        states=["idle", "llm_requesting", "tool_executing"],
        initial="idle",
        auto_transitions=False,
        transitions=[
            {
                "trigger": "user_message",
                "source": "idle",
                "dest": "llm_requesting",
                "after": "on_user_message",
            },
            {
                "trigger": "llm_response",
                "source": "llm_requesting",
                "dest": "tool_executing",
                "conditions": "has_tools",
                "after": "on_tool_calls",
            },
            {
                "trigger": "llm_response",
                "source": "llm_requesting",
                "dest": "idle",
                "unless": "has_tools",
                "after": "on_final",
            },
            {
                "trigger": "tool_result",
                "source": "tool_executing",
                "dest": None,
                "conditions": "more_pending",
                "after": "on_tool_result",
            },
            {
                "trigger": "tool_result",
                "source": "tool_executing",
                "dest": "llm_requesting",
                "unless": "more_pending",
                "after": "on_last_result",
            },
        ],
    )
    # Triggers are attached to the model at run time; bound once, as a caller would.
    steps = [(getattr(model, event.kind), event) for event in events]

    def run(turns: int) -> int:
        consumed = 0
        model.warned = False  # each run is a fresh conversation, as segue's
        for _ in range(turns):
            for trigger, event in steps:
                trigger(event)
                consumed += len(model.effects)
        assert model.state == "idle", model.state  # type: ignore[attr-defined]
        return consumed

    return run


class ToolHeavyMachine(StateMachine):
    """The tool-heavy table in ``python-statemachine`` 3.x; the ``on`` actions return the
    effects, which ``send`` returns."""

    idle = State(initial=True)
    llm_requesting = State()
    tool_executing = State()

    user_message = idle.to(llm_requesting, on="on_user_message")
    llm_response = llm_requesting.to(tool_executing, cond="has_tools", on="on_tool_calls") | (
        llm_requesting.to(idle, unless="has_tools", on="on_final")
    )
    tool_result = tool_executing.to(
        tool_executing, internal=True, cond="more_pending", on="on_tool_result"
    ) | tool_executing.to(llm_requesting, unless="more_pending", on="on_last_result")

    def __init__(self) -> None:
        self.turn = ToolHeavyTurn()
        super().__init__()

    def has_tools(self, payload: LlmResponse) -> bool:
        return self.turn.has_tools(payload)

    def more_pending(self, payload: ToolResult) -> bool:
        return self.turn.more_pending(payload)

    def on_user_message(self, payload: UserMessage) -> Effects:
        return self.turn.on_user_message(payload)

    def on_tool_calls(self, payload: LlmResponse) -> Effects:
        return self.turn.on_tool_calls(payload)

    def on_final(self, payload: LlmResponse) -> Effects:
        return self.turn.on_final(payload)

    def on_tool_result(self, payload: ToolResult) -> Effects:
        return self.turn.on_tool_result(payload)

    def on_last_result(self, payload: ToolResult) -> Effects:
        return self.turn.on_last_result(payload)


def prepare_tool_heavy_statemachine(events: Events) -> Run:
    """Events sent with ``send``, the documented entry point; the payload as a keyword."""
    machine = ToolHeavyMachine()
    send = machine.send
    steps = [(event.kind, event) for event in events]

    def run(turns: int) -> int:
        consumed = 0
        machine.turn.warned = False  # each run is a fresh conversation, as segue's
        for _ in range(turns):
            for name, event in steps:
                consumed += len(send(name, payload=event))
        assert machine.current_state_value == "idle", machine.current_state_value
        return consumed

    return run


# --------------------------------------------------------------------------- measuring


def timed(run: Callable[[], T]) -> tuple[int, T]:
    """Nanoseconds ``run`` took with the collector off, and what it returned.

    No ``gc.collect()`` per run: a full collection of this process costs more than a run, and
    everything a run allocates is freed by reference counting when it ends.
    """
    gc.disable()
    try:
        start = time.perf_counter_ns()
        result = run()
        elapsed = time.perf_counter_ns() - start
    finally:
        gc.enable()
    return elapsed, result


@dataclass
class Best:
    """The fastest of several runs of one driver."""

    name: str
    run: Run
    ns: int = sys.maxsize


@dataclass(frozen=True)
class Workload:
    """One mix of events, with segue's driver and the reference libraries' for it."""

    title: str
    """The report's heading."""
    label: str
    """How the growth lines name its turns."""
    events_per_turn: int
    effects_per_run: Callable[[int], int]
    """The effects a run of so many turns from a fresh conversation returns."""
    drive: Drive
    drivers: Callable[[], list[Best]]
    """segue's, ``transitions``' and ``python-statemachine``'s, then any floor."""

    def us_per_event(self, best: Best, turns: int) -> float:
        return best.ns / (self.events_per_turn * turns) / 1_000


def plain_workload() -> Workload:
    turn = build_turn()

    def drive(state: ConversationState, turns: int) -> tuple[ConversationState, int]:
        return segue_turns(state, turn, turns)

    return Workload(
        title="One turn = 4 events (user -> 1 tool call -> its result -> answer)",
        label="turns",
        events_per_turn=4,
        effects_per_run=lambda turns: EFFECTS_PER_TURN * turns,
        drive=drive,
        drivers=lambda: [
            Best("segue transition()", prepare_segue(drive, 4)),
            Best(f"transitions {version('transitions')}", prepare_transitions(turn)),
            Best(
                f"python-statemachine {version('python-statemachine')}",
                prepare_statemachine(turn),
            ),
            Best("values only (segue's floor)", prepare_floor(turn)),
        ],
    )


def tool_heavy_workload() -> Workload:
    events = build_tool_heavy_turn()

    def drive(state: ConversationState, turns: int) -> tuple[ConversationState, int]:
        return segue_steps(state, events, turns)

    return Workload(
        title=(
            "Tool-heavy turn = 9 events (user -> 3 tool calls -> 3 results -> 2 calls -> "
            "2 results -> answer), usage on every response, the warning crossed once a run"
        ),
        label="tool-heavy turns",
        events_per_turn=len(events),
        effects_per_run=lambda turns: TOOL_HEAVY_EFFECTS_PER_TURN * turns + 1,
        drive=drive,
        drivers=lambda: [
            Best("segue transition()", prepare_segue(drive, len(events))),
            Best(f"transitions {version('transitions')}", prepare_tool_heavy_transitions(events)),
            Best(
                f"python-statemachine {version('python-statemachine')}",
                prepare_tool_heavy_statemachine(events),
            ),
        ],
    )


def compare(workload: Workload, turns: int, repeats: int) -> list[Best]:
    """Best-of-``repeats`` time of ``turns`` turns for each library, runs interleaved."""
    drivers = workload.drivers()
    for driver in drivers:  # warm-up: imports, caches, first-call paths
        driver.run(10)
    gc.collect()
    expected = workload.effects_per_run(turns)
    for _ in range(repeats):
        for driver in drivers:
            ns, consumed = timed(partial(driver.run, turns))
            assert consumed == expected, (driver.name, consumed, expected)
            driver.ns = min(driver.ns, ns)
    return drivers


def deep_size(root: object) -> int:
    """Bytes held by ``root`` and everything it reaches (each object counted once, but each
    number where it is held: two counters that both read 10 share CPython's cached small int,
    and at 10,000 no longer do, which is no growth of the state)."""
    seen: set[int] = set()
    stack: list[object] = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if isinstance(obj, type) or (id(obj) in seen and not isinstance(obj, int | float)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        children: Iterable[object] = ()
        if isinstance(obj, dict):
            children = [*obj.keys(), *obj.values()]
        elif isinstance(obj, tuple | list | set | frozenset):
            children = obj
        elif hasattr(obj, "__dict__"):
            children = [vars(obj)]
        stack.extend(children)
    return total


def pass_fail(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report_comparison(number: int, workload: Workload, turns: int, repeats: int) -> None:
    drivers = compare(workload, turns, repeats)
    print(f"\n{number}. {workload.title}")
    print(f"   runs of {turns:,} turns, best of {repeats} runs")
    print(f"   {'library':<30} {'us/event':>9} {'us/turn':>9}")
    for driver in drivers:
        per_event = workload.us_per_event(driver, turns)
        per_turn = workload.events_per_turn * per_event
        print(f"   {driver.name:<30} {per_event:>9.2f} {per_turn:>9.2f}")
    segue, other, chart, *floor = drivers
    print()
    for label, driver, target in (
        ("transitions / segue", other, TRANSITIONS_TARGET),
        ("python-statemachine / segue", chart, STATEMACHINE_TARGET),
    ):
        ratio = driver.ns / segue.ns
        print(f"   {label:<30} {ratio:>8.1f}x  target >= {target:g}x  {pass_fail(ratio >= target)}")
    for values in floor:
        print(
            f"   {'transitions / values only':<30} {other.ns / values.ns:>8.1f}x  the most any "
            "transition() returning these values could reach\n"
            f"   {'values only / segue':<30} {values.ns / segue.ns:>8.0%}  of segue's time is "
            "building the values it returns"
        )


def report_growth(workload: Workload, repeats: int) -> ConversationState:
    """Per-event cost early and late in one conversation; returns the state at the early turn."""
    early = new_conversation(model=MODEL, conversation_id="bench")
    early, _ = workload.drive(early, EARLY_TURN)
    late, _ = workload.drive(early, LATE_TURN - EARLY_TURN)
    assert late.message_count == workload.events_per_turn * LATE_TURN, late.message_count
    assert late.phase.kind == "idle", late.phase

    # States are immutable, so the same window of a conversation can be replayed from the state
    # it starts at as often as best-of-N needs: exactly the work turns 10-110 (or 10,000-10,100)
    # of that conversation did.
    best = {EARLY_TURN: sys.maxsize, LATE_TURN: sys.maxsize}
    gc.collect()
    for _ in range(repeats):
        for first, state in ((EARLY_TURN, early), (LATE_TURN, late)):
            ns, _ = timed(partial(workload.drive, state, WINDOW_TURNS))
            best[first] = min(best[first], ns)
    events = workload.events_per_turn * WINDOW_TURNS
    per_event = {first: ns / events / 1_000 for first, ns in best.items()}
    ratio = per_event[LATE_TURN] / per_event[EARLY_TURN]
    for first in (EARLY_TURN, LATE_TURN):
        window = f"{workload.label} {first:,}-{first + WINDOW_TURNS:,}"
        print(f"   segue {window:<30} {per_event[first]:>9.2f} us/event")
    print(
        f"   late / early {'':<30} {ratio:>8.2f}x  target <= {GROWTH_LIMIT}x  "
        f"{pass_fail(ratio <= GROWTH_LIMIT)}"
    )
    return early


def report_size(workload: Workload, early: ConversationState) -> None:
    """The size of a state after 10 and after 10,000 turns, and what running on keeps."""
    late, _ = workload.drive(early, LATE_TURN - EARLY_TURN)
    size_early, size_late = deep_size(early), deep_size(late)
    print("\n4. State size (deep sys.getsizeof), and memory kept by running on")
    print(f"   state after turn {EARLY_TURN:<10,} {size_early:>9,} bytes")
    print(f"   state after turn {LATE_TURN:<10,} {size_late:>9,} bytes")
    verdict = pass_fail(size_late <= size_early)
    print(f"   growth {'':<20} {size_late - size_early:>9,} bytes  {verdict}")
    tracemalloc.start()
    gc.collect()
    before, _ = tracemalloc.get_traced_memory()
    kept, _ = workload.drive(early, 1_000)
    gc.collect()
    after, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert kept.phase.kind == "idle", kept.phase
    print(
        f"   tracemalloc over 1,000 more turns: {after - before:,} bytes kept (the new state), "
        f"{peak - before:,} bytes peak"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a ~10 s run with fewer repetitions")
    args = parser.parse_args(argv)
    repeats, window_repeats = (100, 60) if args.quick else (1_000, 400)

    print("segue benchmark: transition() over two workloads, beside two FSM libraries")
    print(
        f"Python {platform.python_version()} ({platform.python_implementation()}), "
        f"{platform.machine()}, {platform.system()}; pydantic {version('pydantic')}; "
        f"{'quick' if args.quick else 'full'} mode; gc off in timed regions"
    )
    plain, tool_heavy = plain_workload(), tool_heavy_workload()
    report_comparison(1, plain, TURNS_PER_RUN, repeats)
    report_comparison(2, tool_heavy, TURNS_PER_RUN, repeats)
    print(
        f"\n3. Growth: one conversation run to turn {LATE_TURN:,}, "
        f"best of {window_repeats} per window ({window_repeats // 4} tool-heavy)"
    )
    early = report_growth(plain, window_repeats)
    report_growth(tool_heavy, window_repeats // 4)
    print(
        "   (why none is expected: an event reads the current phase and a few counters, never the\n"
        "   history; messages leave the core as AppendMessage effects, so no event does O(n) work)"
    )
    report_size(plain, early)
    return 0


if __name__ == "__main__":
    sys.exit(main())
