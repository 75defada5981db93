"""The pause triggers (``pause_after_turns``, ``pause_after_seconds``; REQ-SEG-052 to 054).

Properties of the core first: over any number of turns, each with any number of tool rounds,
at any times, the pause is pending exactly at the reply that ends the Nth turn (or the first
turn that ends S seconds after the start or the resume), never at a reply that asks for tools
or at a tool result. Then the real runtime (``MemoryStore`` and ``SqliteStore`` with the
``ScriptedModel``, a clock the test moves), the REST API and the CLI: the options reach the
conversation, the pause is taken there with its reason, its snapshot holds what any pause's
does (the git state among it), and it resumes as any pause does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import pydantic
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_run import invoke, plain_output
from repos import dirty_repository, needs_git
from segue import (
    AwaitingCheckpoint,
    ConversationOptions,
    ConversationState,
    LlmResponse,
    MemoryStore,
    Runtime,
    ScriptedModel,
    SqliteStore,
    Store,
    Tool,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
    git_context,
    new_conversation,
    transition,
)
from segue.executor.model_port import LlmReply
from segue.server import create_app
from segue.statemachine.events import CheckpointResponse, ResumeRequested
from segue.statemachine.pacing import duration_words

MODEL = "claude-sonnet-4-5"


# --------------------------------------------------------------------------- the core


def _pausing(state: ConversationState) -> bool:
    """Whether the state waits for its pause's checkpoint."""
    phase = state.phase
    return isinstance(phase, AwaitingCheckpoint) and phase.purpose == "pause"


def _run_turn(
    state: ConversationState, rounds: int, times: list[float]
) -> tuple[ConversationState, bool]:
    """One turn of ``rounds`` tool rounds, each reply at the next of ``times``; whether a pause
    became pending before its last reply (it must not)."""
    state, _ = transition(state, UserMessage(text="go on"))
    early = _pausing(state)
    for number in range(rounds):
        call = ToolCall(id=f"toolu_{number}", name="work", input={})
        asked = LlmResponse(tool_calls=(call,), usage=Usage(input_tokens=1_000), at=times.pop(0))
        state, _ = transition(state, asked)
        early = early or _pausing(state) or state.pause_requested
        state, _ = transition(state, ToolResult(tool_call_id=call.id, output="done"))
        early = early or _pausing(state) or state.pause_requested
    answer = LlmResponse(text="done", usage=Usage(input_tokens=1_000), at=times.pop(0))
    state, _ = transition(state, answer)
    return state, early


@settings(max_examples=150, deadline=None)
@given(count=st.integers(1, 4), rounds=st.lists(st.integers(0, 3), min_size=1, max_size=8))
def test_the_pause_comes_exactly_after_the_nth_turn(count: int, rounds: list[int]) -> None:
    state = new_conversation(
        model=MODEL, context_window=1_000_000, max_tool_rounds=5, pause_after_turns=count
    )
    times = [0.0] * (sum(rounds) + len(rounds))
    for number, tool_rounds in enumerate(rounds, start=1):
        state, early = _run_turn(state, tool_rounds, times)
        assert not early, "a pause became pending mid-turn"
        if number < count:
            assert state.phase.kind == "idle"
            assert state.turns_since_resume == number
            continue
        assert _pausing(state), (number, state.phase)
        assert state.pause_reason == (f"after {count} turn" + ("s" if count > 1 else ""))
        break
    else:
        assert len(rounds) < count


@settings(max_examples=150, deadline=None)
@given(
    bound=st.floats(1, 500),
    rounds=st.lists(st.integers(0, 3), min_size=1, max_size=8),
    steps=st.lists(st.floats(0, 120), min_size=40, max_size=40),
)
def test_the_pause_comes_at_the_first_turn_end_past_s_seconds(
    bound: float, rounds: list[int], steps: list[float]
) -> None:
    state = new_conversation(
        model=MODEL,
        context_window=1_000_000,
        max_tool_rounds=5,
        pause_after_seconds=bound,
        started_at=1_000.0,
    )
    times, now = [], 1_000.0
    for step in steps:
        now += step
        times.append(now)
    for tool_rounds in rounds:
        ends_at = times[tool_rounds]  # the turn's last reply
        state, early = _run_turn(state, tool_rounds, times)
        assert not early, "a pause became pending mid-turn"
        if ends_at - 1_000.0 < bound:
            assert state.phase.kind == "idle"
            continue
        assert _pausing(state)
        assert state.pause_reason == f"after {duration_words(bound)}"
        break


@settings(max_examples=60, deadline=None)
@given(count=st.integers(1, 3), cycles=st.integers(1, 3))
def test_each_resume_counts_the_turns_again(count: int, cycles: int) -> None:
    state = new_conversation(model=MODEL, context_window=1_000_000, pause_after_turns=count)
    for _ in range(count):
        state, _ = transition(state, UserMessage(text="go"))
        state, _ = transition(state, LlmResponse(text="ok"))
    for _ in range(cycles):
        assert _pausing(state)
        state, _ = transition(state, CheckpointResponse(text="<checkpoint>x</checkpoint>"))
        assert state.phase.kind == "paused"
        state, _ = transition(state, ResumeRequested())
        assert state.turns_since_resume == 0
        # The resume's own turn is the first of the new count.
        for turn in range(count):
            if turn:
                state, _ = transition(state, UserMessage(text="go"))
            assert not _pausing(state)
            state, _ = transition(state, LlmResponse(text="ok"))
    assert _pausing(state)


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (1.0, "1 second"),
        (45.0, "45 seconds"),
        (90.5, "90.5 seconds"),
        (60.0, "1 minute"),
        (1_800.0, "30 minutes"),
        (5_400.0, "1 hour 30 minutes"),
        (7_200.0, "2 hours"),
        (3_661.0, "1 hour 1 minute 1 second"),
    ],
)
def test_a_duration_is_said_as_a_person_says_it(seconds: float, words: str) -> None:
    assert duration_words(seconds) == words


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"pause_after_turns": 0}, "pause_after_turns"),
        ({"pause_after_turns": -3}, "pause_after_turns"),
        ({"pause_after_turns": 2.5}, "pause_after_turns"),
        ({"pause_after_turns": True}, "pause_after_turns"),
        ({"pause_after_seconds": 0}, "pause_after_seconds"),
        ({"pause_after_seconds": -1.5}, "pause_after_seconds"),
        ({"pause_after_seconds": float("inf")}, "pause_after_seconds"),
        ({"pause_after_seconds": "soon"}, "pause_after_seconds"),
    ],
)
def test_a_trigger_that_is_not_positive_is_refused_with_its_name(
    fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(pydantic.ValidationError, match=named):
        ConversationOptions(model=MODEL, **fields)


# --------------------------------------------------------------------------- the runtime


class Clock:
    """The runtime's clock, moved by the test (and by a tool that takes a while)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


StoreFactory = Callable[[Path], Store]
STORES: dict[str, StoreFactory] = {
    "memory": lambda _tmp: MemoryStore(),
    "sqlite": lambda tmp: SqliteStore(tmp / "triggers.db"),
}


def _runtime(
    store: Store, clock: Clock, script: list[LlmReply] | None = None, **settings: Any
) -> Runtime:
    """A runtime on ``store`` and ``clock`` whose model answers ``script`` first, with a tool
    that takes ten minutes of the clock."""

    async def slow_work(_input: dict[str, Any]) -> str:
        clock.now += 600  # ten minutes of work, inside the turn
        return "worked"

    work = Tool(name="work", description="Work for ten minutes.", function=slow_work)
    model = ScriptedModel(script or ())
    return Runtime(store=store, llm=model, tools=[work], clock=clock, **settings)


def run(coroutine: Awaitable[Any]) -> Any:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", sorted(STORES))
def test_the_runtime_pauses_after_n_turns_and_counts_again_after_a_resume(
    kind: str, tmp_path: Path
) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with _runtime(STORES[kind](tmp_path), clock) as rt:
            state = await rt.create_conversation(model=MODEL, pause_after_turns=2)
            cid = state.id
            assert (await rt.send(cid, "One.")).phase.kind == "idle"
            paused = await rt.send(cid, "Two.")
            assert paused.phase.kind == "paused"
            snapshot = (await rt.store.snapshots(cid))[-1]
            assert (snapshot.trigger, snapshot.reason) == ("pause", "after 2 turns")
            assert snapshot.created_at == clock.now
            kinds = [m.kind for m in await rt.messages(cid)]
            assert kinds[-3:] == ["user", "assistant", "checkpoint"]  # the turn's reply first
            resumed = await rt.resume(cid)  # the resume's own turn is the first of two
            assert resumed.phase.kind == "idle"
            assert resumed.turns_since_resume == 1
            assert (await rt.send(cid, "Three.")).phase.kind == "paused"
            assert len(await rt.store.snapshots(cid)) == 2

    run(scenario())


@pytest.mark.parametrize("kind", sorted(STORES))
def test_the_runtime_pauses_after_s_seconds_at_the_end_of_the_turn(
    kind: str, tmp_path: Path
) -> None:
    async def scenario() -> None:
        clock = Clock()
        calls = [ToolCall(id="toolu_1", name="work", input={})]
        script = [
            LlmReply(text="Quick answer."),
            LlmReply(text="", tool_calls=tuple(calls), stop_reason="tool_use"),
            LlmReply(text="The work is done."),
        ]
        async with _runtime(STORES[kind](tmp_path), clock, script) as rt:
            cid = (await rt.create_conversation(model=MODEL, pause_after_seconds=900.0)).id
            clock.now += 300
            assert (await rt.send(cid, "Something quick.")).phase.kind == "idle"
            # The bound passes while the turn's tool runs: the turn ends first, then the pause.
            paused = await rt.send(cid, "Now the long work.")
            assert paused.phase.kind == "paused"
            transcript = await rt.messages(cid)
            assert [m.kind for m in transcript[-4:]] == [
                "assistant",
                "tool_result",
                "assistant",
                "checkpoint",
            ]
            assert transcript[-2].text == "The work is done."
            snapshot = (await rt.store.snapshots(cid))[-1]
            assert snapshot.reason == "after 15 minutes"
            resumed = await rt.resume(cid)
            assert resumed.active_since == clock.now
            clock.now += 899
            assert (await rt.send(cid, "Still fresh.")).phase.kind == "idle"
            clock.now += 1
            assert (await rt.send(cid, "Now.")).phase.kind == "paused"

    run(scenario())


@needs_git
def test_a_pause_by_a_trigger_records_the_git_state_as_any_pause(tmp_path: Path) -> None:
    repo = tmp_path / "project"
    branch, head = dirty_repository(repo)

    async def scenario() -> None:
        rt = _runtime(MemoryStore(), Clock(), snapshot_context=git_context(repo))
        async with rt:
            cid = (await rt.create_conversation(model=MODEL, pause_after_turns=1)).id
            assert (await rt.send(cid, "Start the migration.")).phase.kind == "paused"
            snapshot = (await rt.store.snapshots(cid))[-1]
            assert snapshot.context == {
                "git": {"branch": branch, "head": head, "dirty": ["notes.txt"]}
            }
            assert snapshot.llm_calls >= 1

    run(scenario())


def test_a_store_keeps_the_count_and_the_clock(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with _runtime(SqliteStore(tmp_path / "kept.db"), clock) as rt:
            cid = (await rt.create_conversation(model=MODEL, pause_after_turns=3)).id
            await rt.send(cid, "One.")
        async with _runtime(SqliteStore(tmp_path / "kept.db"), clock) as rt:
            state = await rt.state(cid)
            assert (state.turns_since_resume, state.active_since) == (1, 1_000_000.0)
            assert state.config.pause_after_turns == 3
            assert (await rt.options(cid)).pause_after_turns == 3  # a child inherits it
            await rt.send(cid, "Two.")
            assert (await rt.send(cid, "Three.")).phase.kind == "paused"

    run(scenario())


# --------------------------------------------------------------------------- REST and CLI


def test_rest_creates_with_the_triggers_and_shows_the_pause_as_any() -> None:
    runtime = Runtime(store=MemoryStore(), llm=ScriptedModel())
    with TestClient(create_app(runtime)) as http:
        created = http.post(
            "/api/conversations", json={"pause_after_turns": 1, "pause_after_seconds": 3600}
        )
        assert created.status_code == 201, created.text
        body = created.json()
        assert (body["pause_after_turns"], body["pause_after_seconds"]) == (1, 3600.0)
        cid = body["id"]
        sent = http.post(f"/api/conversations/{cid}/messages", json={"text": "Hello."})
        assert sent.status_code == 200, sent.text
        state = http.get(f"/api/conversations/{cid}").json()
        assert (state["phase"], state["paused_reason"]) == ("paused", "after 1 turn")
        refused = http.post(f"/api/conversations/{cid}/messages", json={"text": "More."})
        assert refused.status_code == 409
        resumed = http.post(f"/api/conversations/{cid}/resume", json={})
        assert resumed.status_code == 200, resumed.text
        for wrong in (
            {"pause_after_turns": 0},
            {"pause_after_seconds": -5},
            {"pause_after_turns": "2"},
        ):
            answer = http.post("/api/conversations", json=wrong)
            assert answer.status_code == 422, answer.text
            assert next(iter(wrong)) in answer.text


@pytest.fixture
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    plain_output(monkeypatch, "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "SEGUE_DATABASE_URL")


@pytest.mark.usefixtures("_offline")
def test_segue_chat_pauses_after_the_turns_it_was_told(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    chatted = invoke("chat", "--db", str(db), "--pause-after-turns", "2", stdin="One.\nTwo.\n")
    assert chatted.exit_code == 0, chatted.output
    assert "paused: snapshot v1 saved (after 2 turns)" in chatted.output
    shown = json.loads(invoke("list", "--db", str(db), "--json").stdout)[0]
    assert (shown["phase"], shown["pause_after_turns"]) == ("paused", 2)
    status = invoke("status", shown["id"], "--db", str(db))
    assert "after 2 turns" in status.output
    resumed = invoke(
        "chat", "--db", str(db), "--conversation", shown["id"], stdin="/resume\nThree.\n"
    )
    assert resumed.exit_code == 0, resumed.output
    # The resume's own turn and "Three." make two since the resume: paused again.
    assert "paused: snapshot v2 saved (after 2 turns)" in resumed.output


@pytest.mark.usefixtures("_offline")
@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--pause-after-turns", "0"),
        ("--pause-after-turns", "two"),
        ("--pause-after-seconds", "0"),
        ("--pause-after-seconds", "-30"),
        ("--pause-after-seconds", "nan"),
    ],
)
def test_a_trigger_flag_out_of_range_is_refused_in_the_clis_words(
    option: str, value: str, tmp_path: Path
) -> None:
    refused = invoke("chat", "--db", str(tmp_path / "no.db"), option, value, stdin="Hello.\n")
    assert refused.exit_code == 2
    assert option in refused.output
    assert "Input should be" not in refused.output
    assert not (tmp_path / "no.db").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("_offline")
def test_segue_serve_gives_new_conversations_its_triggers(tmp_path: Path) -> None:
    from serving import segue_serve  # a subprocess helper, slow to set up

    db = tmp_path / "served.db"
    flags = ["--db", str(db), "--pause-after-turns", "1", "--pause-after-seconds", "1800"]
    with segue_serve(*flags) as url, httpx2.Client(base_url=url, timeout=60) as http:
        info = http.get("/api/info").json()
        assert info["limits"] == {"pause_after_turns": 1, "pause_after_seconds": 1800.0}
        created = http.post("/api/conversations", json={}).json()
        assert (created["pause_after_turns"], created["pause_after_seconds"]) == (1, 1800.0)
        own = http.post("/api/conversations", json={"pause_after_turns": 5}).json()
        assert own["pause_after_turns"] == 5  # a request's own wins
        cid = created["id"]
        http.post(f"/api/conversations/{cid}/messages", json={"text": "Hello."}).read()
        state = http.get(f"/api/conversations/{cid}").json()
        assert (state["phase"], state["paused_reason"]) == ("paused", "after 1 turn")
