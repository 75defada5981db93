"""Refusals form one tree (``segue.errors`` draws it): whatever a conversation refuses
a message for, the caller catches ``MessageRejectedError``, or the leaf that says why, and reads
``cause`` as data. Each refusal is raised here through a real runtime, not built by hand."""

from __future__ import annotations

import asyncio

import pytest

from segue import (
    ConcurrentUpdateError,
    ConversationBusyError,
    ConversationExhaustedError,
    ConversationFailedError,
    ConversationPausedError,
    InvalidMessageError,
    LlmCallError,
    MemoryStore,
    MessageRejectedError,
    MessageTooLargeError,
    Runtime,
    ScriptedModel,
    SegueError,
    StoreError,
    StoreFullError,
    StoreLockedError,
    StoreUnavailableError,
    SubAgentFailedError,
)
from segue.executor.model_port import LlmReply, LlmRequest

MODEL = "claude-sonnet-4-5"


def test_every_refusal_is_a_message_rejected_error_and_keeps_its_older_bases() -> None:
    for leaf in (
        InvalidMessageError,
        ConversationBusyError,
        ConversationPausedError,
        ConversationFailedError,
        ConversationExhaustedError,
        MessageTooLargeError,
    ):
        assert issubclass(leaf, MessageRejectedError), leaf
    assert issubclass(MessageRejectedError, SegueError)
    assert issubclass(InvalidMessageError, ValueError)  # ``except ValueError`` still catches it
    for store_error in (StoreLockedError, StoreUnavailableError, StoreFullError):
        assert issubclass(store_error, StoreError)
    assert issubclass(ConcurrentUpdateError, StoreError)
    assert issubclass(SubAgentFailedError, SegueError)
    assert not issubclass(StoreError, MessageRejectedError)


class _Held(ScriptedModel):
    """Holds its first answer until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__(reply_chars=20)
        self.asked = asyncio.Event()
        self.gate = asyncio.Event()

    async def complete(self, request: LlmRequest) -> LlmReply:
        if not self.asked.is_set():
            self.asked.set()
            await self.gate.wait()
        return await super().complete(request)


def test_each_refusal_of_a_real_runtime_raises_its_leaf_with_its_cause() -> None:
    async def scenario() -> None:
        model = _Held()
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            cid = (await rt.create_conversation(model=MODEL)).id

            with pytest.raises(InvalidMessageError) as empty:
                await rt.send(cid, "   ")
            assert (empty.value.cause, empty.value.conversation_id) == ("invalid", cid)
            assert isinstance(empty.value, MessageRejectedError | ValueError)

            turn = asyncio.create_task(rt.send(cid, "a long task"))
            await model.asked.wait()
            with pytest.raises(ConversationBusyError) as busy:
                await rt.send(cid, "me too", wait=False)
            assert busy.value.cause == "busy"
            model.gate.set()
            await turn

            with pytest.raises(MessageTooLargeError) as large:
                await rt.send(cid, "word " * 1_000_000)
            assert large.value.cause == "too_large"

            await rt.pause(cid, "a break")
            with pytest.raises(ConversationPausedError) as paused:
                await rt.send(cid, "still there?")
            assert (paused.value.cause, paused.value.conversation_id) == ("paused", cid)

            read_only = (await rt.create_conversation(model=MODEL)).id
            await rt.send(read_only, "hello")
            assert (await rt.continue_manually(read_only)).phase.kind == "context_exhausted"
            with pytest.raises(MessageRejectedError) as exhausted:  # what the README catches
                await rt.send(read_only, "one more")
            assert isinstance(exhausted.value, ConversationExhaustedError)
            assert exhausted.value.cause == "exhausted"

        # A conversation whose context ran out with nothing set to handle it fails for good.
        overflow = LlmCallError("prompt is too long", context_overflow=True, status_code=400)
        async with Runtime(store=MemoryStore(), llm=ScriptedModel([overflow])) as rt:
            cid = (await rt.create_conversation(model=MODEL, behavior="intentionally_unhandled")).id
            assert (await rt.send(cid, "hello")).phase.kind == "failed"
            with pytest.raises(ConversationFailedError) as failed:
                await rt.send(cid, "again")
            assert failed.value.cause == "failed"

    asyncio.run(scenario())


def test_a_refused_stream_raises_the_same_leaf_before_any_update() -> None:
    async def scenario() -> None:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel()) as rt:
            cid = (await rt.create_conversation(model=MODEL)).id
            await rt.pause(cid)
            updates = rt.stream(cid, "hello")
            with pytest.raises(ConversationPausedError):
                await anext(updates)

    asyncio.run(scenario())
