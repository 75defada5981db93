"""The real-model tier: segue against llama.cpp's ``llama-server`` serving SmolLM2-135M-Instruct,
through its public API and the official ``openai`` client (``pytest -m real_model``).

Every other test speaks to a server this project wrote, which agrees with segue by
construction. Here the tokenizer, the KV cache, ``/props``, the overflow error and the event
stream are llama.cpp's: each behaviour is carried through two limits on the real model and
must end in its own state, never ``failed``; the server's overflow and a reply cut at its
context take segue's paths; the meter reads what the server counted; a cancelled stream frees
the server's slot; a server killed mid-turn is retried once it is back, and paid once.
"""

from __future__ import annotations

import asyncio

import pytest

from real_model import (
    MODEL,
    REPLY_TOKENS,
    SUMMARY_TOKENS,
    conversation,
    finished,
    note,
    runtime,
    send_until,
    text_of,
    texts,
)
from segue import (
    ContextExhaustionBehavior,
    ConversationState,
    ErrorKind,
    NoticeUpdate,
    OccupancyUpdate,
    Runtime,
    failure_of,
)
from segue.executor.updates import Update
from segue.testing.llama_server import LlamaServer, get_json

pytestmark = pytest.mark.real_model
B = ContextExhaustionBehavior


def test_the_window_is_the_one_the_server_serves(llama: LlamaServer) -> None:
    async def main() -> None:
        async with runtime(llama) as rt:
            state = await rt.create_conversation(model=MODEL)
            assert state.context_window == llama.n_ctx() == 2048
            assert state.config.window_source == "server"

    asyncio.run(main())


def test_continuation_twice_each_child_seeded_with_the_models_own_summary(
    llama: LlamaServer,
) -> None:
    async def main() -> None:
        async with runtime(llama) as rt:
            current, number = await conversation(rt, B.THRESHOLD_BASED_CONTINUATION), 0
            for _limit in range(2):
                state, number = await send_until(
                    rt, current.id, lambda s: s.phase.kind != "idle", first=number
                )
                assert state.phase.kind == "context_exhausted", state.phase
                summary = getattr(state.phase, "summary", "")
                assert summary.strip()
                usage = await rt.usage(current.id)
                written = usage.by_purpose["continuation"].output_tokens
                assert 0 < written <= SUMMARY_TOKENS
                child = await rt.start_new_from(current.id)
                seeded = await rt.messages(child.id)
                assert seeded[0].message.text.find(summary.strip()) >= 0
                assert child.parent_id == current.id
                current = child

    asyncio.run(main())


@pytest.mark.parametrize("behavior", [B.CHECKPOINT_RESTART, B.COMPACT_IN_PLACE])
def test_restart_and_compaction_go_on_through_two_limits(
    llama: LlamaServer, behavior: ContextExhaustionBehavior
) -> None:
    async def main() -> None:
        async with runtime(llama) as rt:
            start = await conversation(rt, behavior)
            state, _ = await send_until(rt, start.id, lambda s: s.continuations >= 2)
            assert state.phase.kind == "idle", state.phase
            assert state.continuations == 2
            if behavior is B.COMPACT_IN_PLACE:
                assert state.generation == 3
            else:
                assert state.session == 3
            purpose = "checkpoint" if behavior is B.CHECKPOINT_RESTART else "compaction"
            usage = await rt.usage(start.id)
            assert 0 < usage.by_purpose[purpose].output_tokens <= 2 * SUMMARY_TOKENS

    asyncio.run(main())


def test_sub_agents_end_in_the_typed_failure_at_their_limits(llama: LlamaServer) -> None:
    async def main() -> None:
        async with runtime(llama) as rt:
            lead = await conversation(rt, B.THRESHOLD_BASED_CONTINUATION)
            for _agent in range(2):
                worker = await conversation(rt, B.INTENTIONALLY_UNHANDLED, parent_id=lead.id)
                state, _ = await send_until(rt, worker.id, lambda s: s.phase.kind != "idle")
                failure = failure_of(state)
                assert failure is not None, state
                assert failure[0] is ErrorKind.CONTEXT_EXHAUSTED, failure

    asyncio.run(main())


@pytest.mark.parametrize("behavior", [B.THRESHOLD_BASED_CONTINUATION, B.CHECKPOINT_RESTART])
def test_the_servers_own_overflow_takes_the_behaviours_path(
    llama: LlamaServer, behavior: ContextExhaustionBehavior
) -> None:
    """A window given far larger than the server's: segue's threshold is never reached, the
    server refuses the prompt in its own words, and the behaviour's path is taken."""
    big = text_of(llama, 450)

    def left_idle(state: ConversationState) -> bool:
        return state.phase.kind != "idle" or state.continuations > 0

    async def main() -> None:
        async with runtime(llama) as rt:
            start = await conversation(rt, behavior, context_window=16_384)
            for number in range(12):
                state = await rt.send(start.id, f"Part {number}. {big} Answer in a sentence.")
                if left_idle(state):
                    break
            assert failure_of(state) is None, failure_of(state)
            if behavior is B.THRESHOLD_BASED_CONTINUATION:
                assert state.phase.kind == "context_exhausted", state.phase
            else:
                assert state.phase.kind == "idle", state.phase
                assert state.session == 2
            log = await rt.store.transitions(start.id)
            overflows = [r for r in log if '"context_overflow":true' in r.event_json]
            assert overflows, [r.event_kind for r in log]
            assert all(r.context_tokens is None or r.context_tokens < 2048 for r in log)

    asyncio.run(main())


def test_a_reply_cut_at_the_servers_context_is_kept_as_a_truncated_reply(
    llama: LlamaServer,
) -> None:
    """A prompt that fits but leaves little room: llama.cpp stops at ``n_ctx`` with
    ``finish_reason: length``, which segue records as a truncated reply, and says so."""

    async def main() -> None:
        async with runtime(llama, max_tokens=None) as rt:
            # The model samples: now and then it ends its reply within the room left. The
            # server cut it when the context is full; up to three tries for one it cut.
            for _try in range(3):
                start = await conversation(
                    rt,
                    B.THRESHOLD_BASED_CONTINUATION,
                    context_window=16_384,
                    max_output_tokens=1024,
                )
                prompt = f"{text_of(llama, llama.n_ctx() - 60)} Repeat all of the text above."
                updates = [u async for u in rt.stream(start.id, prompt)]
                done = finished(updates)
                assert done.state.phase.kind == "idle", done
                assert done.reply
                notices = [u.effect for u in updates if isinstance(u, NoticeUpdate)]
                if done.state.context_tokens == llama.n_ctx():  # the whole context, filled
                    assert notices == ["notify_truncated"], notices
                    return
                assert notices == [], notices  # a reply that ended by itself is no truncation
            pytest.fail("the server never cut a reply at its context in three tries")

    asyncio.run(main())


def test_a_streamed_turn_reports_the_servers_usage_and_the_meter_reads_its_count(
    llama: LlamaServer,
) -> None:
    async def main() -> None:
        async with runtime(llama) as rt:
            start = await rt.create_conversation(model=MODEL, max_output_tokens=REPLY_TOKENS)
            written = 0
            for number in range(2):  # the second reuses the slot's cache of the first
                predicted = llama.metrics()["tokens_predicted_total"]
                updates = [u async for u in rt.stream(start.id, note(number))]
                server_count = llama.slot_tokens() + 1  # and the last token it sampled
                reply_tokens = llama.metrics()["tokens_predicted_total"] - predicted
                usage = await rt.usage(start.id)
                assert usage.by_purpose["turn"].output_tokens == written + reply_tokens
                written = usage.by_purpose["turn"].output_tokens
                said = texts(updates)
                assert len(said) > 1  # streamed
                assert "".join(said) == finished(updates).reply
                meters = [u for u in updates if isinstance(u, OccupancyUpdate) and u.measured]
                assert meters[-1].tokens == server_count == finished(updates).state.context_tokens
                assert meters[-1].window == 2048

    asyncio.run(main())


def test_a_turn_cancelled_mid_stream_frees_the_servers_slot(llama: LlamaServer) -> None:
    async def main() -> None:
        async with runtime(llama, max_tokens=None) as rt:
            start = await rt.create_conversation(model=MODEL, max_output_tokens=1500)
            ask = "Count from 1 to 1000, one number per line."
            updates: list[Update] = []
            async for update in rt.stream(start.id, ask):
                updates.append(update)
                if (update.kind == "text" and len(updates) == 3) or update.kind == "done":
                    await rt.cancel(start.id)
            assert updates[-1].kind == "done"
            assert [u.kind for u in updates].count("text") < 100  # stopped long before the end
            await asyncio.wait_for(_slot_idle(llama), timeout=10)
            state = await asyncio.wait_for(rt.send(start.id, "Say hello."), timeout=120)
            assert state.phase.kind == "idle"
            assert state.context_tokens
            assert await rt.last_reply(start.id)

    asyncio.run(main())


async def _slot_idle(server: LlamaServer) -> None:
    """Return once the server's slot is not processing (polled: it is another process)."""
    while get_json(f"{server.root}/slots")[0]["is_processing"]:  # noqa: ASYNC110
        await asyncio.sleep(0.1)


def test_a_server_killed_mid_turn_and_restarted_is_retried_and_paid_once(
    llama: LlamaServer,
) -> None:
    async def main() -> None:
        async with runtime(llama, max_tokens=None) as rt:
            start = await rt.create_conversation(
                model=MODEL,
                max_output_tokens=200,
                max_attempts=10,
                retry_base_delay=0.2,
                retry_max_delay=2.0,
            )
            updates: list[Update] = []
            killed = False
            async for update in rt.stream(start.id, "Count from 1 to 100, one per line."):
                updates.append(update)
                if update.kind == "text" and not killed:
                    killed = True
                    llama.kill()  # a crash mid-stream: the connection drops
                    await asyncio.to_thread(llama.start)
            done = finished(updates)
            assert done.state.phase.kind == "idle", done
            assert [u.kind for u in updates].count("retry") >= 1
            usage = await rt.usage(start.id)
            assert usage.requests == 1  # the attempt the crash cut is not counted
            turn = usage.by_purpose["turn"]
            assert done.state.context_tokens == llama.slot_tokens() + 1  # what the server holds
            assert done.state.context_tokens == turn.input_tokens + turn.output_tokens + (
                turn.cache_read_input_tokens + turn.cache_creation_input_tokens
            )

    asyncio.run(main())


def test_two_conversations_at_once_each_get_their_own_answers(llama: LlamaServer) -> None:
    async def talk(rt: Runtime, topic: str) -> tuple[ConversationState, list[str]]:
        start = await rt.create_conversation(model=MODEL, max_output_tokens=REPLY_TOKENS)
        for number in range(3):
            state = await rt.send(start.id, f"{topic} question {number}: say one word.")
        texts = [m.message.text for m in await rt.messages(start.id)]
        return state, texts

    async def main() -> None:
        async with runtime(llama) as rt:
            (one, said_one), (two, said_two) = await asyncio.gather(
                talk(rt, "Tides"), talk(rt, "Lighthouses")
            )
            for state in (one, two):
                assert state.phase.kind == "idle", state.phase
                assert state.message_count == 6
            assert not any("Lighthouses" in text for text in said_one[::2])
            assert not any("Tides" in text for text in said_two[::2])

    asyncio.run(main())
