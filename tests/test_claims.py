"""Runtimes sharing a store, in one process: who performs pending work, and what a caller is
told. (``test_processes`` runs the same rules with real processes.)

Two ``Runtime`` objects on one store stand for two processes: each has its own owner id, its
own model and its own lock. Store failures are injected by a wrapper around a real store that
fails the commits of model answers, as a dropped database session would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gated import HOLD_AT_MOST, Gated
from segue import (
    DuplicateMessageError,
    InvalidMessageError,
    InvalidTextError,
    MessageRejectedError,
    Runtime,
    ScriptedModel,
    SegueError,
    SqliteStore,
    StoreUnavailableError,
)
from segue.executor.model_port import LlmReply, LlmRequest
from segue.executor.store_port import Commit, Store, StoredConversation

T = TypeVar("T")
MODEL = "claude-sonnet-4-5"


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine

    return asyncio.run(main())


class Hanging(ScriptedModel):
    """Never answers; ``asked`` is set once a request reached it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    async def complete(self, request: LlmRequest) -> LlmReply:
        self.requests.append(request)
        self.asked.set()
        await asyncio.Event().wait()
        raise AssertionError


class FailingAnswers:
    """A real store whose commits of model answers fail ``failures`` times (then succeed), as
    they would with the database unreachable."""

    def __init__(self, inner: Store, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    async def commit(self, commit: Commit) -> StoredConversation:
        if commit.event_kind == "llm_response" and self.failures > 0:
            self.failures -= 1
            msg = "server closed the connection unexpectedly"
            raise StoreUnavailableError(msg)
        return await self.inner.commit(commit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def kinds(messages: list[Any]) -> list[str]:
    return [m.kind for m in messages]


# --------------------------------------------------------------------------- claims


def test_a_message_sent_while_another_runtime_answers_waits_then_is_answered(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        store = SqliteStore(tmp_path / "s.db")
        first_model, second_model = Gated(), ScriptedModel()
        first = Runtime(store=store, llm=first_model)
        second = Runtime(store=store, llm=second_model)
        cid = (await first.create_conversation(model=MODEL)).id
        sending = asyncio.create_task(first.send(cid, "first"))
        assert await asyncio.to_thread(first_model.asked.wait, HOLD_AT_MOST)
        answering = asyncio.create_task(second.send(cid, "second"))
        await asyncio.sleep(0.1)  # the second is refused as busy by the core, then waits...
        first_model.gate.set()  # ...for the first turn, and is then taken
        state = await answering
        assert state.phase.kind == "idle"
        assert (await sending).phase.kind == "idle"
        assert (len(first_model.requests), len(second_model.requests)) == (1, 1)
        messages = await store.messages(cid)
        assert kinds(messages) == ["user", "assistant", "user", "assistant"]
        assert [m.text for m in messages if m.kind == "user"] == ["first", "second"]
        await store.close()

    run(scenario())


def test_recover_leaves_live_work_alone_and_takes_it_once_the_lease_ends(
    tmp_path: Path,
) -> None:
    """A runtime on another host (its death cannot be seen) stops renewing: only when its
    lease ends does another runtime ask the model again."""

    class Unreachable(SqliteStore):
        """The store as seen from a host that went away: nothing it asks arrives any more."""

        async def release(self, *_args: object, **_kwargs: object) -> None:
            return None

    async def scenario() -> None:
        store = SqliteStore(tmp_path / "s.db")
        stuck = Hanging()
        cut_off = Unreachable(tmp_path / "s.db")
        gone = Runtime(store=cut_off, llm=stuck, owner="elsewhere/1/a", lease=2.0)
        cid = (await gone.create_conversation(model=MODEL)).id
        sending = asyncio.create_task(gone.send(cid, "hello"))
        await stuck.asked.wait()
        sending.cancel()  # it stops renewing and cannot let go: as if its host went away
        await asyncio.gather(sending, return_exceptions=True)
        await cut_off.close()
        model = ScriptedModel()
        other = Runtime(store=store, llm=model)
        await other.recover()
        assert model.requests == []  # the lease is still running
        (pending,) = (await store.load(cid)).pending
        assert pending.owner == "elsewhere/1/a"
        await asyncio.sleep(2.1)
        await other.recover()
        assert len(model.requests) == 1
        assert kinds(await store.messages(cid)) == ["user", "assistant"]
        assert (await store.load(cid)).pending == ()
        await store.close()

    run(scenario())


def test_a_claim_is_renewed_while_its_work_runs(tmp_path: Path) -> None:
    """The model's request outlives its first lease: the claim's end moves on while it runs,
    past the first lease, and another runtime's recovery leaves the work to its owner."""

    async def scenario() -> None:
        store = SqliteStore(tmp_path / "s.db")
        slow = Gated()
        first = Runtime(store=store, llm=slow, owner="elsewhere/1/a", lease=1.0)
        cid = (await first.create_conversation(model=MODEL)).id
        sending = asyncio.create_task(first.send(cid, "hello"))
        try:
            assert await asyncio.to_thread(slow.asked.wait, HOLD_AT_MOST)
            (claimed,) = (await store.load(cid)).pending
            assert claimed.lease_until is not None
            renewed = claimed.lease_until
            async with asyncio.timeout(30):
                while renewed <= claimed.lease_until + 1.0:  # renewed past the first lease
                    await asyncio.sleep(0.05)
                    (pending,) = (await store.load(cid)).pending
                    assert pending.owner == "elsewhere/1/a"
                    assert pending.lease_until is not None
                    renewed = pending.lease_until
            model = ScriptedModel()
            await Runtime(store=store, llm=model).recover()
            assert model.requests == []
        finally:
            slow.gate.set()
        assert (await sending).phase.kind == "idle"
        assert len(slow.requests) == 1
        await store.close()

    run(scenario())


def test_close_lets_go_of_the_work_it_cancels(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = tmp_path / "s.db"
        stuck = Hanging()
        first = Runtime(store=SqliteStore(path), llm=stuck, owner="elsewhere/1/a")
        cid = (await first.create_conversation(model=MODEL)).id
        sending = asyncio.create_task(first.send(cid, "hello"))
        await stuck.asked.wait()
        await first.close()
        await asyncio.gather(sending, return_exceptions=True)
        store = SqliteStore(path)
        (pending,) = (await store.load(cid)).pending
        assert pending.owner is None  # let go: the next runtime need not wait out the lease
        model = ScriptedModel()
        await Runtime(store=store, llm=model).recover()
        assert len(model.requests) == 1
        assert kinds(await store.messages(cid)) == ["user", "assistant"]
        await store.close()

    run(scenario())


def test_a_busy_refusal_names_the_runtime_and_performs_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SqliteStore(tmp_path / "s.db")
        stuck = Hanging()
        first = Runtime(store=store, llm=stuck, owner="web-1/42/abc")
        cid = (await first.create_conversation(model=MODEL)).id
        sending = asyncio.create_task(first.send(cid, "hello"))
        await stuck.asked.wait()
        model = ScriptedModel()
        second = Runtime(store=store, llm=model)
        with pytest.raises(MessageRejectedError, match="web-1/42/abc") as refused:
            await second.send(cid, "me too", wait=False)
        assert refused.value.cause == "busy"
        assert model.requests == []
        assert len(stuck.requests) == 1
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        await store.close()

    run(scenario())


# --------------------------------------------------------------------------- idempotency


def test_a_send_retried_with_its_key_is_stored_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SqliteStore(tmp_path / "s.db")
        model = ScriptedModel()
        async with Runtime(store=store, llm=model) as rt:
            cid = (await rt.create_conversation(model=MODEL)).id
            first = await rt.send(cid, "once", idempotency_key="req-1")
            again = await rt.send(cid, "once", idempotency_key="req-1")
            assert again == first
            streamed = [u async for u in rt.stream(cid, "once", idempotency_key="req-1")]
            assert [u.kind for u in streamed] == ["done"]
            assert len(model.requests) == 1
            assert kinds(await rt.messages(cid)) == ["user", "assistant"]
            await rt.send(cid, "twice", idempotency_key="req-2")
            assert len(model.requests) == 2
            with pytest.raises(InvalidMessageError, match="idempotency key"):
                await rt.send(cid, "x", idempotency_key="")
            with pytest.raises(InvalidMessageError, match="idempotency key"):
                await rt.send(cid, "x", idempotency_key="a" * 257)

    run(scenario())


def test_a_refused_message_does_not_use_up_its_key(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SqliteStore(tmp_path / "s.db")
        stuck = Hanging()
        first = Runtime(store=store, llm=stuck, owner="elsewhere/1/a", lease=0.3)
        cid = (await first.create_conversation(model=MODEL)).id
        sending = asyncio.create_task(first.send(cid, "hello"))
        await stuck.asked.wait()
        model = ScriptedModel()
        second = Runtime(store=store, llm=model)
        with pytest.raises(MessageRejectedError):
            await second.send(cid, "later", idempotency_key="k", wait=False)
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        await asyncio.sleep(0.4)  # the stuck runtime's lease ends
        await second.send(cid, "later", idempotency_key="k")
        assert [m.text for m in await store.messages(cid) if m.kind == "user"] == [
            "hello",
            "later",
        ]
        assert len(model.requests) == 2  # the abandoned request, then "later"
        await store.close()

    run(scenario())


def test_the_store_refuses_a_duplicate_key_itself(tmp_path: Path) -> None:
    """The runtime's answer to a duplicate comes from the store, not from a cache."""

    async def scenario() -> None:
        path = tmp_path / "s.db"
        model = ScriptedModel()
        async with Runtime(store=SqliteStore(path), llm=model) as one:
            cid = (await one.create_conversation(model=MODEL)).id
            await one.send(cid, "once", idempotency_key="k")
        async with Runtime(store=SqliteStore(path), llm=model) as two:
            await two.send(cid, "once", idempotency_key="k")
            assert len(model.requests) == 1
            stored = await two.conversation(cid)
            commit = Commit(
                conversation_id=cid,
                expected_version=stored.version,
                state=stored.state,
                event_kind="user_message",
                event_json="{}",
                from_phase="idle",
                reason="",
                effects=(),
                idempotency_key="k",
            )
            with pytest.raises(DuplicateMessageError):
                await two.store.commit(commit)

    run(scenario())


# --------------------------------------------------------------------------- store failures


def test_an_answer_whose_commit_fails_a_few_times_is_stored_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = FailingAnswers(SqliteStore(tmp_path / "s.db"), failures=2)
        model = ScriptedModel()
        rt = Runtime(store=store, llm=model)  # a wrapped real store
        cid = (await rt.create_conversation(model=MODEL)).id
        state = await rt.send(cid, "hello")
        assert state.phase.kind == "idle"
        assert len(model.requests) == 1
        assert kinds(await rt.messages(cid)) == ["user", "assistant"]
        await rt.close()

    run(scenario())


def test_a_store_that_stays_down_never_wedges_the_conversation(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = FailingAnswers(SqliteStore(tmp_path / "s.db"), failures=10**6)
        model = ScriptedModel()
        rt = Runtime(store=store, llm=model)  # a wrapped real store
        cid = (await rt.create_conversation(model=MODEL)).id
        with pytest.raises(SegueError, match="could not be stored") as failed:
            await rt.send(cid, "hello")
        assert isinstance(failed.value.__cause__, StoreUnavailableError)
        stored = await store.load(cid)
        assert stored.state.phase.kind == "llm_requesting"
        (pending,) = stored.pending
        assert pending.owner is None  # let go of
        store.failures = 0  # the database is back
        state = await rt.send(cid, "are you there?")  # commits the kept answer, then this one
        assert state.phase.kind == "idle"
        messages = await rt.messages(cid)
        assert kinds(messages) == ["user", "assistant", "user", "assistant"]
        # The answer that could not be stored is committed on the next try, not asked for
        # again (it was paid for): the first message's and the new one's.
        assert len(model.requests) == 2
        await rt.close()

    run(scenario())


# --------------------------------------------------------------------------- what a store keeps


@pytest.mark.parametrize("where", ["conversation_id", "system", "model"])
def test_a_nul_in_an_id_or_system_prompt_is_refused_and_nothing_stored(
    tmp_path: Path, where: str
) -> None:
    async def scenario() -> None:
        async with Runtime(store=SqliteStore(tmp_path / "s.db"), llm=ScriptedModel()) as rt:
            options: dict[str, Any] = {"model": MODEL, "context_window": 200_000}
            options[where] = f"{options.get(where, 'x')}\x00"
            with pytest.raises(InvalidTextError, match="NUL"):
                await rt.create_conversation(**options)
            with pytest.raises(ValueError, match="NUL"):  # it is a ValueError too
                await rt.create_conversation(**options)
            assert await rt.conversations() == []
            cid = (await rt.create_conversation(model=MODEL)).id
            await rt.send(cid, "a\x00b")  # in message text a NUL is kept, on every store
            assert (await rt.messages(cid))[0].text == "a\x00b"

    run(scenario())


def test_the_lease_must_be_positive() -> None:
    with pytest.raises(ValueError, match="lease"):
        Runtime(store=SqliteStore(":memory:"), llm=ScriptedModel(), lease=0)
