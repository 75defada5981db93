"""Continuation chains, auto-continue, forced pause and cost reports, through ``Runtime``.

The model is the offline ``ScriptedModel`` (usage per request, growing with the prompt), the
store the real ``MemoryStore``. Each test drives conversations to where the behaviour matters and
reads the result back the way an application would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

import pytest

from scenario import requirement
from segue import (
    CompactionBlock,
    ContextExhaustionBehavior,
    ErrorKind,
    LlmCallError,
    LlmReply,
    MemoryStore,
    Runtime,
    ScriptedModel,
    SegueError,
    Usage,
)
from segue.executor.errors import ConversationBusyError, UnsupportedOptionError
from segue.executor.model_port import ContextSupport, ProviderCompaction
from segue.executor.runtime import AUTO_CONTINUE_PROMPT

MODEL = "claude-sonnet-4-5"
WINDOW = 3_000


async def exhaust(rt: Runtime, conversation_id: str) -> None:
    for index in range(40):
        state = await rt.send(conversation_id, f"Question {index}: tell me more.")
        if state.phase.kind != "idle":
            return
    pytest.fail("never exhausted")


@requirement("REQ-SEG-037")
def test_seg037_a_chain_is_read_root_first_with_each_links_place_and_summary() -> None:
    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel(window=WINDOW)) as rt:
            root = await rt.create_conversation(model=MODEL)
            await exhaust(rt, root.id)
            second = await rt.start_new_from(root.id)
            await exhaust(rt, second.id)
            third = await rt.start_new_from(second.id)
            chain = await rt.lineage(second.id)
            assert [link.id for link in chain] == [root.id, second.id, third.id]
            assert [link.label for link in chain] == ["root", "2", "3"]
            assert chain[0].summary is not None
            assert chain[0].summary.startswith("Continuation summary")
            assert chain[1].summary is not None
            assert chain[2].summary is None  # still going on
            assert [link.id for link in await rt.lineage(third.id)] == [link.id for link in chain]

    asyncio.run(main())


@requirement("REQ-SEG-037")
def test_seg037_a_sub_agent_is_not_a_link_of_its_parents_chain() -> None:
    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel()) as rt:
            parent = await rt.create_conversation(model=MODEL)
            child = await rt.create_conversation(
                model=MODEL,
                parent_id=parent.id,
                behavior=ContextExhaustionBehavior.INTENTIONALLY_UNHANDLED,
            )
            assert [link.id for link in await rt.lineage(child.id)] == [child.id]
            assert [link.id for link in await rt.lineage(parent.id)] == [parent.id]

    asyncio.run(main())


@requirement("REQ-SEG-036")
def test_seg036_auto_continue_lands_in_a_conversation_that_already_answered() -> None:
    async def main() -> None:
        model = ScriptedModel(window=WINDOW)
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            root = await rt.create_conversation(model=MODEL)
            await exhaust(rt, root.id)
            child = await rt.start_new_from(root.id, auto_continue=True)
            assert child.phase.kind == "idle"
            kinds = [m.kind for m in await rt.messages(child.id)]
            assert kinds == ["summary", "user", "assistant"]
            assert (await rt.messages(child.id))[1].text == AUTO_CONTINUE_PROMPT
            asked = len(model.requests)
            again = await rt.start_new_from(root.id, auto_continue=True)
            assert again.id == child.id
            assert len(model.requests) == asked  # no second first turn
            with pytest.raises(ValueError, match="summary"):
                await rt.start_new_from(root.id, seed_with_summary=False, auto_continue=True)

    asyncio.run(main())


@requirement("REQ-SEG-039")
def test_seg039_a_conversation_that_failed_for_its_context_can_be_continued() -> None:
    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel(window=WINDOW)) as rt:
            agent = await rt.create_conversation(
                model=MODEL, behavior=ContextExhaustionBehavior.INTENTIONALLY_UNHANDLED
            )
            await exhaust(rt, agent.id)
            failed = await rt.state(agent.id)
            assert failed.phase.kind == "failed"
            assert getattr(failed.phase, "error_kind", None) is ErrorKind.CONTEXT_EXHAUSTED
            child = await rt.start_new_from(agent.id)
            assert child.parent_id == agent.id
            assert [link.id for link in await rt.lineage(child.id)] == [agent.id, child.id]
            live = await rt.create_conversation(model=MODEL)
            with pytest.raises(SegueError, match="only a conversation that ended"):
                await rt.start_new_from(live.id)

    asyncio.run(main())


@requirement("REQ-SEG-035")
def test_seg035_a_forced_pause_cancels_what_is_in_flight_after_the_timeout() -> None:
    async def main() -> None:
        model = ScriptedModel(delay=0.3)
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL, behavior="checkpoint_restart")
            sending = asyncio.ensure_future(rt.send(conv.id, "A long job."))
            await asyncio.sleep(0.05)
            state = await rt.pause(conv.id, "deploy window", timeout=0.05)
            assert state.phase.kind == "paused"
            await sending
            # It did not wait for the request: it cancelled it, then took the checkpoint.
            transitions = [t.event_kind for t in await rt.store.transitions(conv.id)]
            assert "user_cancel" in transitions
            assert "llm_response" not in transitions
            snapshot = (await rt.store.snapshots(conv.id))[-1]
            assert snapshot.reason == "deploy window"
            first = (await rt.messages(conv.id))[0]
            assert (first.kind, first.text) == ("user", "A long job.")  # nothing lost

    asyncio.run(main())


@requirement("REQ-SEG-035")
def test_seg035_a_pause_with_time_to_reach_the_boundary_does_not_cancel() -> None:
    async def main() -> None:
        model = ScriptedModel(delay=0.05)
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            sending = asyncio.ensure_future(rt.send(conv.id, "A short job."))
            await asyncio.sleep(0.01)
            state = await rt.pause(conv.id, "later", timeout=5)
            assert state.phase.kind == "paused"
            await sending
            transitions = [t.event_kind for t in await rt.store.transitions(conv.id)]
            assert "user_cancel" not in transitions
            assert "llm_response" in transitions  # the turn finished first

    asyncio.run(main())


@requirement("REQ-SEG-038")
def test_seg038_usage_is_totalled_by_purpose_and_session() -> None:
    async def main() -> None:
        model = ScriptedModel(window=WINDOW)
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await exhaust(rt, conv.id)
            report = await rt.usage(conv.id)
            turns = [m.message.usage for m in await rt.messages(conv.id) if m.kind == "assistant"]
            assert report.by_purpose["turn"].input_tokens == sum(
                u.input_tokens for u in turns if u is not None
            )
            assert set(report.by_session) == {1}
            assert report.total.output_tokens >= report.by_purpose["turn"].output_tokens
            assert report.requests >= len(turns)

    asyncio.run(main())


@requirement("REQ-SEG-038")
def test_seg038_usage_of_a_conversation_without_answers_is_zero() -> None:
    async def main() -> None:
        model = ScriptedModel([LlmReply(text="Hi.", usage=None)])
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            report = await rt.usage(conv.id)
            assert report.requests == 0
            assert report.total.context_tokens == 0

    asyncio.run(main())


@requirement("REQ-SEG-038")
def test_seg038_usage_tells_every_purpose_and_session_apart() -> None:
    """Each answer's usage counts under what it answered and the session it came in: a turn, a
    checkpoint (in the session it ended), the new session's turn; a continuation summary; and a
    refused summary that was asked for again, which left no message but was paid for."""
    turn = Usage(input_tokens=100, output_tokens=1)
    restart = ScriptedModel(
        [
            LlmReply(text="Working.", usage=Usage(input_tokens=2_800)),  # crosses 2,700
            LlmReply(text="<checkpoint>Goal: tides</checkpoint>", usage=Usage(input_tokens=300)),
            LlmReply(text="Fresh start.", usage=turn),
        ]
    )
    summarise = ScriptedModel(
        [
            LlmReply(text="Working.", usage=Usage(input_tokens=2_800)),
            LlmReply(text="I can't.", usage=Usage(input_tokens=700), stop_reason="refusal"),
            LlmReply(text="We talked about tides.", usage=Usage(input_tokens=600)),
        ]
    )

    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=restart) as rt:
            conv = await rt.create_conversation(
                model=MODEL, context_window=WINDOW, behavior="checkpoint_restart"
            )
            await rt.send(conv.id, "Go.")
            await rt.send(conv.id, "Go on.")
            report = await rt.usage(conv.id)
            assert report.by_purpose_and_session == {
                ("turn", 1): Usage(input_tokens=2_800),
                ("checkpoint", 1): Usage(input_tokens=300),
                ("turn", 2): turn,
            }
            assert report.requests == 3
        async with Runtime(store=MemoryStore(), llm=summarise) as rt:
            conv = await rt.create_conversation(model=MODEL, context_window=WINDOW)
            state = await rt.send(conv.id, "Go.")
            assert state.phase.kind == "context_exhausted"
            report = await rt.usage(conv.id)
            assert report.by_purpose["continuation"] == Usage(input_tokens=700 + 600)
            assert set(report.by_session) == {1}

    asyncio.run(main())


def test_a_conversation_failed_for_another_reason_goes_on_with_its_last_turns_or_nothing() -> None:
    """An error the adapter did not recognise ends the conversation; the user is not stuck:
    its child carries the last exchanges when asked (the message that failed among them), or
    nothing, and the failure stays visible on the old one."""
    broken = LlmCallError("the server said something nobody understands", status_code=418)

    async def main() -> None:
        model = ScriptedModel([LlmReply(text="Sure: tides follow the moon."), broken])
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.send(conv.id, "Why are there tides?")
            failed = await rt.send(conv.id, "And why twice a day?")
            assert failed.phase.kind == "failed"
            child = await rt.start_new_from(conv.id, recent_turns=2)
            seeded = [(m.kind, m.text) for m in await rt.messages(child.id)]
            assert seeded == [
                ("user", "Why are there tides?"),
                ("assistant", "Sure: tides follow the moon."),
                ("user", "And why twice a day?"),
            ]
            assert (await rt.state(conv.id)).phase.kind == "failed"  # the reason stays
            assert await rt.start_new_from(conv.id) == await rt.state(child.id)  # one child
            other = await rt.create_conversation(model=MODEL)
            await rt.send(other.id, "Hello?")
            model.extend([broken])
            assert (await rt.send(other.id, "Still there?")).phase.kind == "failed"
            fresh = await rt.start_new_from(other.id)
            assert await rt.messages(fresh.id) == []
            answered = await rt.send(fresh.id, "Starting over.")
            assert answered.phase.kind == "idle"

    asyncio.run(main())


class _ProviderCompacting(ScriptedModel):
    """The offline model, as an adapter whose provider compacts within a call."""

    def context_support(self, model: str) -> ContextSupport:
        return ContextSupport(compaction=True, on_demand=False)


@requirement("REQ-SEG-051")
def test_seg051_the_providers_compaction_is_paid_for_under_its_own_purpose() -> None:
    """The compaction iteration and the answer are both paid for; only the answer is what the
    context holds afterwards."""
    block = CompactionBlock(provider="anthropic", content="Tides so far.", signature="sig")
    iteration = Usage(input_tokens=2_700, output_tokens=120)
    answer = Usage(input_tokens=300, output_tokens=40)
    compacting = LlmReply(
        text="High tide at noon.",
        usage=answer,
        compactions=(ProviderCompaction(summary="Tides so far.", block=block, usage=iteration),),
    )
    first = Usage(input_tokens=2_600, output_tokens=50)

    async def main() -> None:
        model = _ProviderCompacting([LlmReply(text="Low tide at six.", usage=first), compacting])
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            conv = await rt.create_conversation(
                model=MODEL,
                behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE,
                compaction="provider",
                context_window=WINDOW,
            )
            await rt.send(conv.id, "When is low tide?")
            state = await rt.send(conv.id, "And high tide?")
            assert (state.generation, state.context_tokens) == (2, answer.context_tokens)
            asked = model.requests[1].compaction
            assert asked is not None
            assert asked.trigger_tokens == state.config.continuation_tokens
            report = await rt.usage(conv.id)
            assert report.by_purpose["provider_compaction"] == iteration
            assert report.by_purpose["turn"].output_tokens == 90
            assert report.total.context_tokens == (
                first.context_tokens + iteration.context_tokens + answer.context_tokens
            )
            assert report.by_purpose_and_model[("provider_compaction", MODEL)] == iteration
            summary = [m for m in await rt.messages(conv.id) if m.kind == "summary"]
            assert [m.message.content for m in summary] == [(block,)]

    asyncio.run(main())


def test_the_provider_compacts_only_for_an_adapter_that_can() -> None:
    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel()) as rt:
            with pytest.raises(UnsupportedOptionError, match="cannot have the provider compact"):
                await rt.create_conversation(
                    model=MODEL,
                    behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE,
                    compaction="provider",
                )
            edits = [{"type": "clear_thinking_20251015", "keep": "all"}]
            with pytest.raises(UnsupportedOptionError, match="clear_thinking_20251015"):
                await rt.create_conversation(model=MODEL, context_edits=edits)
            assert (await rt.list_conversations()).conversations == ()  # nothing stored

    asyncio.run(main())


class _FilesFailOnce(MemoryStore):
    """The real store, whose first deletion fails as it removes the second conversation's files
    (a disk error half-way through a chain)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    async def delete(
        self,
        conversation_id: str,
        *,
        also: Sequence[str] = (),
        idle_before: float | None = None,
        metadata: Mapping[str, str] | None = None,
        files: Callable[[str], object] | None = None,
    ) -> list[str]:
        seen: list[str] = []

        def failing(cid: str) -> None:
            if files is not None:
                files(cid)
            seen.append(cid)
            if len(seen) == 2 and not self.failed:
                self.failed = True
                raise OSError("the disk went away")

        return await super().delete(
            conversation_id, also=also, idle_before=idle_before, metadata=metadata, files=failing
        )


@requirement("REQ-SEG-058")
def test_seg058_a_chain_deletion_failing_half_way_leaves_it_whole_and_asking_again_ends_it() -> (
    None
):
    async def main() -> None:
        store = _FilesFailOnce()
        async with Runtime(store=store, llm=ScriptedModel(window=WINDOW)) as rt:
            root = await rt.create_conversation(model=MODEL)
            await exhaust(rt, root.id)
            second = await rt.start_new_from(root.id)
            await exhaust(rt, second.id)
            third = await rt.start_new_from(second.id)
            chain = [root.id, second.id, third.id]
            with pytest.raises(OSError, match="went away"):
                await rt.delete_conversation(third.id, chain=True)
            assert [link.id for link in await rt.lineage(root.id)] == chain
            assert all([await rt.messages(cid) for cid in chain])
            assert await rt.delete_conversation(root.id, chain=True) == chain
            assert await rt.conversations() == []

    asyncio.run(main())


@requirement("REQ-SEG-058")
def test_seg058_a_conversation_deleted_alone_leaves_no_link_on_either_neighbour() -> None:
    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel(window=WINDOW)) as rt:
            root = await rt.create_conversation(model=MODEL)
            await exhaust(rt, root.id)
            second = await rt.start_new_from(root.id)
            await exhaust(rt, second.id)
            third = await rt.start_new_from(second.id)
            assert await rt.delete_conversation(second.id) == [second.id]
            assert (await rt.conversation(root.id)).child_id is None
            assert (await rt.state(third.id)).parent_id is None
            assert (await rt.send(third.id, "Still here?")).parent_id is None
            assert [link.id for link in await rt.lineage(third.id)] == [third.id]

    asyncio.run(main())


class _WrittenMeanwhile(MemoryStore):
    """The real store; between a purge's listing and its deletions, ``meanwhile`` runs."""

    def __init__(self) -> None:
        super().__init__()
        self.meanwhile: Callable[[list[str]], Awaitable[None]] | None = None

    async def inactive(
        self, *, before: float, metadata: Mapping[str, str] | None = None
    ) -> list[str]:
        found = await super().inactive(before=before, metadata=metadata)
        if self.meanwhile is not None:
            await self.meanwhile(found)
        return found


@requirement("REQ-SEG-059")
def test_seg059_a_purge_spares_what_was_written_since_and_a_running_turn_is_not_exported() -> None:
    async def main() -> None:
        store = _WrittenMeanwhile()
        now = [1_000.0]
        writer = Runtime(store=store, llm=ScriptedModel(delay=0.3), clock=lambda: 5_000.0)
        async with writer, Runtime(store=store, llm=ScriptedModel(), clock=lambda: now[0]) as rt:
            ids = [(await rt.create_conversation(model=MODEL)).id for _ in range(3)]

            async def meanwhile(found: list[str]) -> None:
                await writer.send(found[-1], "still here")

            store.meanwhile = meanwhile
            now[0] = 5_500.0
            assert await rt.purge(older_than=2_000) == 2
            store.meanwhile = None
            assert [c.state.id for c in await rt.conversations()] == [ids[-1]]
            turn = asyncio.ensure_future(writer.send(ids[-1], "and again"))
            for _ in range(1_000):  # until the writer's turn has begun
                if (await rt.state(ids[-1])).phase.kind != "idle":
                    break
                await asyncio.sleep(0.01)
            with pytest.raises(ConversationBusyError, match="runs its turn"):
                await rt.export_conversation(ids[-1])
            await turn
            document = await rt.export_conversation(ids[-1])
            assert document["conversation"]["version"] == len(document["transitions"]) + 1
            assert [m["kind"] for m in document["messages"]] == ["user", "assistant"] * 2

    asyncio.run(main())
