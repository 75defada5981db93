"""One fold of updates: a watcher reading a conversation back from the store hears exactly what
the runtime driving it streamed.

The runtime that drives a turn folds each commit with ``updates_of`` as it commits; another
runtime on the same SQLite file (another ``segue serve`` worker) reads the event log and folds
each step it replays with the same function. For any run (a scripted model that calls tools,
fails, is retried, and fills the window so the conversation warns, compacts, restarts its
session or turns read-only), both lists are equal: kinds, order, reasons, every field. What
never reaches the store is left out, as ``segue.executor.updates`` documents: a reply's text
deltas (the streamed pieces of one response are joined before comparing, so the reply itself
is still compared) and a provider's own tool activity and context edits (the scripted model
has none).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segue import LlmReply, Runtime, ScriptedModel, ToolCall, Update, Usage
from segue.executor.errors import LlmCallError, SegueError
from segue.executor.stores.sqlite import SqliteStore
from segue.executor.tools import Tool
from segue.executor.updates import TextUpdate, updates_of
from segue.statemachine import UserMessage, new_conversation, transition

MODEL = "claude-sonnet-4-5"
WINDOW = 20_000
LIVE_ONLY = frozenset({"context_edited"})
"""Kinds only the driving runtime hears (a provider's own activity: never in the store)."""
BEHAVIORS = (
    "threshold_based_continuation",
    "checkpoint_restart",
    "compact_in_place",
    "intentionally_unhandled",
)


async def lookup(tool_input: dict[str, Any]) -> str:
    return f"found {tool_input.get('q')}"


async def broken(tool_input: dict[str, Any]) -> str:
    raise RuntimeError("the tool broke")


TOOLS = [
    Tool(name="lookup", description="Look up.", function=lookup),
    Tool(name="broken", description="Breaks.", function=broken),
]

_tokens = st.integers(min_value=200, max_value=WINDOW - 500)
_text = st.sampled_from(["", "Yes.", "High tide at noon, and low tide at six in the evening."])
_calls = st.lists(
    st.tuples(st.sampled_from(["lookup", "broken", "missing"]), st.sampled_from(["a", "b"])),
    min_size=1,
    max_size=3,
)


@st.composite
def _tool_reply(draw: st.DrawFn) -> LlmReply:
    calls = tuple(
        ToolCall(id=f"toolu_{draw(st.uuids()).hex[:12]}", name=name, input={"q": q})
        for name, q in draw(_calls)
    )
    return LlmReply(
        text=draw(_text),
        tool_calls=calls,
        usage=Usage(input_tokens=draw(_tokens), output_tokens=10),
        stop_reason="tool_use",
    )


_reply = st.builds(
    lambda text, tokens: LlmReply(
        text=text or "ok", usage=Usage(input_tokens=tokens, output_tokens=20)
    ),
    _text,
    _tokens,
)
_step = st.one_of(
    _reply,
    _tool_reply(),
    st.just(LlmCallError("overloaded", retryable=True)),
    st.just(LlmCallError("the request is invalid", retryable=False)),
)
_runs = st.tuples(
    st.sampled_from(BEHAVIORS),
    st.lists(_step, max_size=8),
    st.integers(min_value=1, max_value=3),
)


def _seen(updates: list[Update]) -> list[dict[str, Any]]:
    """``updates`` as compared: a response's text pieces joined into one reply (deltas are
    live only), responses not numbered (each runtime numbers its own), live-only kinds out."""
    seen: list[dict[str, Any]] = []
    response: int | None = None
    for update in updates:
        if update.kind in LIVE_ONLY:
            continue
        if isinstance(update, TextUpdate):
            if response == update.response and seen and seen[-1]["kind"] == "text":
                seen[-1]["text"] += update.text
            else:
                seen.append({"kind": "text", "text": update.text})
            response = update.response
            continue
        response = None
        seen.append(update.model_dump(mode="json"))
    return seen


async def _nap(_seconds: float) -> None:
    await asyncio.sleep(0)  # a retry's delay, not waited out


async def _run(where: Path, behavior: str, script: list[Any], messages: int) -> None:
    path = where / "shared.db"
    driver = Runtime(store=SqliteStore(path), llm=ScriptedModel(script), tools=TOOLS, sleep=_nap)
    reader = Runtime(store=SqliteStore(path), llm=ScriptedModel())
    try:
        state = await driver.create_conversation(
            model=MODEL, context_window=WINDOW, behavior=behavior, max_attempts=2
        )
        cid = state.id
        heard: list[Update] = []
        ended = asyncio.Event()
        watch = reader.watch(cid)
        await watch.start()

        async def listen() -> None:
            async for update in watch:
                heard.append(update)
                if update.kind == "done":
                    ended.set()

        listening = asyncio.create_task(listen())
        streamed: list[Update] = []
        for number in range(messages):
            try:
                async for update in driver.stream(cid, f"message {number}"):
                    streamed.append(update)
            except SegueError:
                break  # refused (the conversation ended): nothing of it was stored
        assert [u.kind for u in streamed].count("done") >= 1
        expected = _seen(streamed)
        turns = [u.kind for u in streamed].count("done")
        async with asyncio.timeout(20):  # the reader hears every turn end
            while [u.kind for u in heard].count("done") < turns:
                await ended.wait()
                ended.clear()
        await asyncio.sleep(0.2)  # and nothing more after
        assert _seen(heard) == expected
        listening.cancel()
        await watch.aclose()
    finally:
        await driver.close()
        await reader.close()


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(_runs)
def test_a_watcher_reading_the_store_hears_what_the_driving_runtime_streamed(
    run: tuple[str, list[Any], int],
) -> None:
    behavior, script, messages = run
    with tempfile.TemporaryDirectory() as where:
        asyncio.run(_run(Path(where), behavior, script, messages))


def test_the_fold_is_pure_one_step_gives_the_same_updates_each_time() -> None:
    before = new_conversation(model=MODEL, context_window=WINDOW)
    event = UserMessage(text="hello", pinned=True)
    after, effects = transition(before, event)
    appended = [e.message for e in effects if e.kind == "append_message"]
    first = updates_of(before, after, event, effects, appended)
    assert first == updates_of(before, after, event, effects, appended)
    assert [u.kind for u in first][:1] == ["user_message"]
    assert first[0].model_dump()["pinned"] is True
