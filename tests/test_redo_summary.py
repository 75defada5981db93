"""A summary that can be made again, and a compaction that can be taken back (REQ-SEG-063 to
065), on the real runtime with the scripted model and a memory store.

What the model is sent is compared as a model view: the fold of the whole transcript
(``current_view``, which the runtime's own view must equal) read as the messages a provider
is sent (kind, text, content, tool calls, pinned), without the bookkeeping of where a message
sits (its session, generation, the seq of its original, its usage).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scenario import requirement
from segue import (
    CompactionDoesNotFitError,
    ContextExhaustionBehavior,
    ConversationBusyError,
    LlmCallError,
    LlmReply,
    MemoryStore,
    Message,
    NoCompactionError,
    Runtime,
    ScriptedModel,
    Usage,
)
from segue.executor.cache import ViewCache
from segue.executor.model_port import LlmRequest
from segue.executor.transcript import current_view

MODEL = "claude-sonnet-4-5"
COMPACT = ContextExhaustionBehavior.COMPACT_IN_PLACE


def seen(messages: Any) -> list[tuple[object, ...]]:
    """Messages as a provider is sent them."""
    return [(m.kind, m.text, m.content, m.tool_calls, m.tool_call_id, m.pinned) for m in messages]


async def transcript(rt: Runtime, cid: str) -> list[Message]:
    return [item.message for item in await rt.store.messages(cid)]


async def model_view(rt: Runtime, cid: str) -> list[tuple[object, ...]]:
    """The model view, checked to be what the runtime itself would send."""
    stored = await rt.store.load(cid)
    state = stored.state
    whole = current_view(await transcript(rt, cid), state.session, state.generation)
    assert list(await ViewCache(rt.store).view(stored)) == whole
    return seen(whole)


def archives(directory: Path) -> tuple[list[Path], list[str]]:
    """The archive files in the order of their generations, and their messages' lines."""
    files = sorted(
        directory.iterdir(), key=lambda path: int(path.name.split(".gen")[1].split(".")[0])
    )
    return files, [line for path in files for line in path.read_text().splitlines()[1:]]


def summariser(label: str) -> Any:
    """Answers summaries with ``label`` and a count, turns with an echo; usage on each."""
    asked = iter(range(1, 10_000))

    def answer(request: LlmRequest) -> LlmReply | None:
        usage = Usage(input_tokens=50, output_tokens=7)
        if request.purpose == "compaction":
            return LlmReply(text=f"{label} summary {next(asked)}", usage=usage)
        return None

    return answer


async def conversation(rt: Runtime, turns: int = 8, *, window: int = 50_000) -> str:
    conv = await rt.create_conversation(
        model=MODEL, behavior=COMPACT, context_window=window, max_continuations=100
    )
    for turn in range(turns):
        await rt.send(conv.id, f"turn {turn}: note the code K-{turn}", pinned=turn == 1)
    return conv.id


@requirement("REQ-SEG-063")
def test_seg063_a_redo_replaces_the_summary_from_the_archived_generation() -> None:
    """The summary made again is asked from the generation the first one replaced (its
    messages, less the kept tail), with the redo's focus, prompt and model; it takes the old
    one's place before the same tail and what came after; the old one stays as a version,
    and the compaction requests' tokens count both."""

    async def main() -> None:
        model = ScriptedModel(default=summariser("s"))
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            cid = await conversation(rt)
            before = await model_view(rt, cid)
            compacted = await rt.continue_manually(cid)
            assert compacted.generation == 2
            await rt.send(cid, "after the compaction")
            first = await model_view(rt, cid)
            assert first[-2][1] == "after the compaction"
            assert first[0][0] == "user"
            assert first[0][5]  # the pinned one leads
            assert first[1][:2] == ("summary", "s summary 1")
            kept = len(first) - 4  # the pinned one, the summary, and the turn after
            redone = await rt.redo_summary(
                cid, focus="the codes", summary_prompt="Keep every code.", summary_model="m-2"
            )
            asked = model.requests[-1]
            assert asked.purpose == "compaction"
            assert asked.model == "m-2"
            assert asked.instruction is not None
            assert "Keep every code." in asked.instruction
            assert "the codes" in asked.instruction
            # From the archived generation: the view before the compaction, less its tail.
            assert seen(asked.messages) == before[: len(before) - kept]
            assert redone.generation == 3
            second = await model_view(rt, cid)
            assert second[1][:2] == ("summary", "s summary 2")
            assert second[:1] + second[2:] == first[:1] + first[2:]
            texts = [m.text for m in await transcript(rt, cid) if m.kind == "summary"]
            assert texts == ["s summary 1", "s summary 2"]  # the old one kept as a version
            usage = await rt.usage(cid)
            assert usage.by_purpose["compaction"].output_tokens == 14
            # The next turn is sent the new view.
            await rt.send(cid, "and on")
            assert seen(model.requests[-1].messages)[:-1] == second

    asyncio.run(main())


@requirement("REQ-SEG-064")
def test_seg064_an_undo_after_a_redo_restores_the_view_from_before_the_compaction(
    tmp_path: Path,
) -> None:
    """The view from before the compaction comes back exactly, after two redos; and the
    archives, one per generation left (compacted, redone, taken back), still hold the whole
    transcript up to the current generation, in order."""

    async def main() -> None:
        model = ScriptedModel(default=summariser("s"))
        async with Runtime(store=MemoryStore(), llm=model, archive_dir=tmp_path) as rt:
            cid = await conversation(rt)
            before = await model_view(rt, cid)
            await rt.continue_manually(cid)
            await rt.send(cid, "after the compaction", pinned=True)
            after = (await model_view(rt, cid))[-2:]
            await rt.redo_summary(cid, focus="codes")
            await rt.redo_summary(cid)
            length = len(await transcript(rt, cid))
            undone = await rt.undo_compaction(cid)
            assert undone.generation == 5
            assert await model_view(rt, cid) == before + after
            whole = await transcript(rt, cid)
            assert len(whole) > length  # nothing deleted: the undo appended copies
            files, archived = archives(tmp_path)
            before_now = [m for m in whole if m.generation < undone.generation]
            assert len(files) == 4
            assert archived == [message.model_dump_json() for message in before_now]
            with pytest.raises(NoCompactionError):
                await rt.undo_compaction(cid)  # the latest was taken back
            with pytest.raises(NoCompactionError):
                await rt.redo_summary(cid)

    asyncio.run(main())


@requirement("REQ-SEG-064")
def test_seg064_an_undo_that_does_not_fit_is_refused_with_the_figures() -> None:
    async def main() -> None:
        model = ScriptedModel(default=summariser("s"))
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            cid = await conversation(rt, turns=0, window=3_000)
            for turn in range(40):
                state = await rt.send(cid, f"turn {turn}: " + "tides and moons " * 30)
                if state.generation > 1:
                    break
            assert state.generation == 2
            length = len(await transcript(rt, cid))
            with pytest.raises(CompactionDoesNotFitError) as refused:
                await rt.undo_compaction(cid)
            error = refused.value
            assert error.threshold_tokens == state.config.continuation_tokens
            assert error.needed_tokens >= error.threshold_tokens
            assert f"{error.needed_tokens:,}" in str(error)
            assert len(await transcript(rt, cid)) == length
            assert (await rt.state(cid)).generation == 2

    asyncio.run(main())


@requirement("REQ-SEG-063")
def test_seg063_nothing_to_redo_or_undo_before_a_compaction_and_other_behaviours() -> None:
    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel()) as rt:
            cid = await conversation(rt, turns=1)
            with pytest.raises(NoCompactionError):
                await rt.redo_summary(cid)
            with pytest.raises(NoCompactionError):
                await rt.undo_compaction(cid)
            other = await rt.create_conversation(model=MODEL)
            with pytest.raises(NoCompactionError, match="compact_in_place"):
                await rt.redo_summary(other.id)
            with pytest.raises(ValueError, match="focus"):
                await rt.redo_summary(cid, focus="   ")

    asyncio.run(main())


@requirement("REQ-SEG-065")
def test_seg065_neither_runs_while_a_turn_does() -> None:
    async def main() -> None:
        model = ScriptedModel(default=summariser("s"), delay=0.2)
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            cid = await conversation(rt, turns=2)
            await rt.continue_manually(cid)
            turn = asyncio.create_task(rt.send(cid, "a slow turn"))
            await asyncio.sleep(0.05)
            length = len(await transcript(rt, cid))
            with pytest.raises(ConversationBusyError):
                await rt.redo_summary(cid)
            with pytest.raises(ConversationBusyError):
                await rt.undo_compaction(cid)
            assert len(await transcript(rt, cid)) == length
            await turn
            assert (await rt.redo_summary(cid)).generation == 3

    asyncio.run(main())


OPS = st.lists(st.sampled_from(["send", "pin", "compact", "redo", "undo"]), min_size=1, max_size=14)


@requirement("REQ-SEG-064", "REQ-SEG-065")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_seg065_redo_and_undo_never_lose_a_generation_and_undo_returns_the_view(
    ops: list[str],
) -> None:
    """Any sequence of turns, pinned turns, compactions, redos and undos: the transcript only
    grows (every archived generation stays, message for message), and an undo returns the
    model view from before the latest compaction, redone or not, plus what came after."""

    async def main() -> None:
        model = ScriptedModel(default=summariser("p"))
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            cid = await conversation(rt, turns=1)
            stack: list[tuple[list[Any], int]] = []  # (view before, length of the view after)
            said = 0
            for op in ops:
                old = await transcript(rt, cid)
                if op in ("send", "pin"):
                    said += 1
                    await rt.send(cid, f"said {said}", pinned=op == "pin")
                elif op == "compact":
                    view = await model_view(rt, cid)
                    await rt.continue_manually(cid)
                    stack.append((view, len(await model_view(rt, cid))))
                elif op == "redo":
                    if not stack:
                        with pytest.raises(NoCompactionError):
                            await rt.redo_summary(cid)
                        continue
                    length = len(await model_view(rt, cid))
                    await rt.redo_summary(cid)
                    assert len(await model_view(rt, cid)) == length
                else:
                    if not stack:
                        with pytest.raises(NoCompactionError):
                            await rt.undo_compaction(cid)
                        continue
                    view, compacted = stack.pop()
                    now = await model_view(rt, cid)
                    await rt.undo_compaction(cid)
                    assert await model_view(rt, cid) == view + now[compacted:]
                    stack.clear()  # an undone compaction cannot be taken back further
                new = await transcript(rt, cid)
                assert new[: len(old)] == old  # append-only: nothing lost, nothing changed

    asyncio.run(main())


async def exhausted(rt: Runtime) -> str:
    """A THRESHOLD_BASED_CONTINUATION conversation sent to its limit: read-only."""
    conv = await rt.create_conversation(model=MODEL, context_window=3_000)
    for turn in range(40):
        state = await rt.send(conv.id, f"turn {turn}: " + "tides and moons " * 30)
        if state.phase.kind == "context_exhausted":
            return conv.id
    raise AssertionError  # pragma: no cover


def continuation_answers() -> Any:
    """Answers continuation summaries with "hand-over N", N counting them."""
    asked = iter(range(1, 10_000))

    def answer(request: LlmRequest) -> LlmReply | None:
        if request.purpose == "continuation":
            usage = Usage(input_tokens=40, output_tokens=3)
            return LlmReply(text=f"hand-over {next(asked)}", usage=usage)
        return None

    return answer


@requirement("REQ-SEG-063")
def test_seg063_an_exhausted_conversations_summary_is_made_again_before_a_child() -> None:
    """The continuation summary is asked again from the session it summarised (not from the
    summary it ended with), with the focus; the child is seeded with the new one; the old one
    stays; a failed ask changes nothing; once a child exists it is refused."""

    async def main() -> None:
        model = ScriptedModel(default=continuation_answers())
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            cid = await exhausted(rt)
            assert (await rt.state(cid)).phase.summary == "hand-over 1"  # type: ignore[union-attr]
            model.extend([LlmCallError("overloaded", retryable=True)])
            with pytest.raises(LlmCallError):
                await rt.redo_summary(cid, focus="the tides")
            state = await rt.state(cid)
            assert state.phase.summary == "hand-over 1"  # type: ignore[union-attr]
            state = await rt.redo_summary(cid, focus="the tides", summary_model="m-2")
            asked = model.requests[-1]
            assert asked.model == "m-2"
            assert asked.instruction is not None
            assert "the tides" in asked.instruction
            assert not any(m.kind == "continuation" for m in asked.messages)  # the session's
            assert state.phase.kind == "context_exhausted"
            assert state.phase.summary == "hand-over 2"
            kept = [m.text for m in await transcript(rt, cid) if m.kind == "continuation"]
            assert len(kept) == 2
            usage = await rt.usage(cid)
            assert usage.by_purpose["continuation"].output_tokens == 6
            child = await rt.start_new_from(cid)
            seed = await transcript(rt, child.id)
            assert "hand-over 2" in seed[0].text
            with pytest.raises(NoCompactionError, match="started from its summary"):
                await rt.redo_summary(cid)

    asyncio.run(main())
