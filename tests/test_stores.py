"""Contract tests for every ``Store``: the same scenarios against each implementation.

Commits are built from real ``transition()`` outputs (a user turn, tool calls, the exhaustion
path, a pause), the way the executor builds them, so a store is tested on the effects and states
the core actually produces. The tests of persistent stores use a real database (``backend``):
a second store on it, a raw connection holding the write lock, a conflicting row planted to make
a commit fail half-way; ``test_postgres_store`` runs them, and the contract tests, on PostgreSQL.
The SQLite-only tests at the end check the file's mode and schema version.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sqlite3
import stat
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import pytest

from segue import (
    CheckpointResponse,
    ContinuationResponse,
    ConversationState,
    LlmResponse,
    Message,
    PauseRequested,
    ResumeRequested,
    ToolCall,
    ToolResult,
    Usage,
    UserCancel,
    UserMessage,
    new_conversation,
    transition,
)
from segue.effects import SaveSnapshot
from segue.executor.errors import (
    ConcurrentUpdateError,
    ConversationExistsError,
    ConversationNotFoundError,
    DuplicateMessageError,
    InvalidTextError,
    SegueError,
    StoreLockedError,
)
from segue.executor.models.scripted import ScriptedModel
from segue.executor.runtime import Runtime
from segue.executor.store_port import Commit, Store, StoredConversation
from segue.executor.stores.codec import dump_effect, dump_event, load_event
from segue.executor.stores.memory import MemoryStore
from segue.executor.stores.sqlite import SCHEMA_VERSION, SqliteStore
from segue.executor.stores.sqlite_schema import MIGRATIONS as SQLITE_MIGRATIONS
from segue.statemachine.checkpoint import SessionSnapshot
from segue.statemachine.content import (
    AgentToolResultBlock,
    AgentToolUseBlock,
    DocumentBlock,
    ImageBase64Source,
    ImageBlock,
    PdfBase64Source,
    PlainTextSource,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    UrlSource,
)

T = TypeVar("T")
MODEL = "claude-sonnet-4-5"  # 200k window: threshold 180,000
CALL_A = ToolCall(id="call_a", name="read_file", input={"path": "README.md"})
CALL_B = ToolCall(id="call_b", name="grep", input={"pattern": "segue"})


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine

    return asyncio.run(main())


def fresh(conversation_id: str = "c1", **kwargs: Any) -> ConversationState:
    return new_conversation(model=MODEL, conversation_id=conversation_id, **kwargs)


def make_commit(
    stored: StoredConversation,
    event: Any,
    *,
    completes: Sequence[int] = (),
    at: float = 0.0,
    expected_version: int | None = None,
) -> Commit:
    """What the executor commits after feeding ``event`` to the core."""
    state, effects = transition(stored.state, event)
    return Commit(
        conversation_id=stored.state.id,
        expected_version=stored.version if expected_version is None else expected_version,
        state=state,
        event_kind=event.kind,
        event_json=dump_event(event),
        from_phase=stored.state.phase.kind,
        reason=f"{stored.state.phase.kind} + {event.kind}",
        effects=effects,
        completes=tuple(completes),
        at=at,
        session=stored.state.session,
    )


async def step(
    store: Store,
    stored: StoredConversation,
    event: Any,
    *,
    completes: Sequence[int] = (),
    at: float = 0.0,
) -> StoredConversation:
    return await store.commit(make_commit(stored, event, completes=completes, at=at))


def pending_kinds(stored: StoredConversation) -> list[str]:
    return [pending.effect.kind for pending in stored.pending]


async def tool_turn(store: Store, conversation_id: str = "c1") -> StoredConversation:
    """A full turn: user -> LLM asks for a tool -> tool result -> LLM answers -> idle.

    Each response completes the request it answers, as the executor does.
    """
    stored = await store.create(fresh(conversation_id), system="be brief", at=1.0)
    stored = await step(store, stored, UserMessage(text="what is in README?"), at=2.0)
    request = stored.pending[0].id
    stored = await step(
        store,
        stored,
        LlmResponse(text="let me look", tool_calls=(CALL_A,), usage=Usage(input_tokens=1_000)),
        completes=(request,),
        at=3.0,
    )
    tools = stored.pending[0].id
    stored = await step(
        store,
        stored,
        ToolResult(tool_call_id=CALL_A.id, output="# segue"),
        completes=(tools,),
        at=4.0,
    )
    request = stored.pending[0].id
    return await step(
        store,
        stored,
        LlmResponse(text="It is segue's README.", usage=Usage(input_tokens=1_200, output_tokens=8)),
        completes=(request,),
        at=5.0,
    )


async def paused(
    store: Store, conversation_id: str = "c1"
) -> tuple[StoredConversation, list[SessionSnapshot]]:
    """Pause, resume, answer, pause again: two real snapshots from ``SaveSnapshot`` effects."""
    stored = await store.create(fresh(conversation_id), system=None)
    snapshots: list[SessionSnapshot] = []
    for reason in ("lunch", "the night"):
        stored = await step(store, stored, PauseRequested(reason=reason))
        stored = await step(
            store,
            stored,
            CheckpointResponse(text=f"<checkpoint>\n## Goal\nship it ({reason})\n</checkpoint>"),
            completes=[p.id for p in stored.pending],
        )
        snapshots += [
            p.effect.snapshot for p in stored.pending if isinstance(p.effect, SaveSnapshot)
        ]
        if len(snapshots) < 2:
            stored = await step(
                store, stored, ResumeRequested(), completes=[p.id for p in stored.pending]
            )
            stored = await step(
                store,
                stored,
                LlmResponse(text="resumed", usage=Usage(input_tokens=500)),
                completes=[p.id for p in stored.pending],
            )
    return stored, snapshots


# --------------------------------------------------------------------------- fixtures

STORES = ["memory", "sqlite"]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "s.db")
    yield made
    run(made.close())


# --------------------------------------------------------------------------- create and load


def test_create_then_load_gives_back_the_state(store: Store) -> None:
    async def scenario() -> None:
        state = fresh(behavior="compact_in_place", system_tokens=42)
        seed = [Message(kind="user", text="seed one"), Message(kind="assistant", text="seed two")]
        created = await store.create(state, system="you are terse", messages=seed, at=12.5)
        loaded = await store.load("c1")
        for stored in (created, loaded):
            assert stored.state == state
            assert stored.version == 1
            assert stored.system == "you are terse"
            assert stored.pending == ()
            assert stored.child_id is None
            assert stored.created_at == 12.5
        messages = await store.messages("c1")
        assert [(m.seq, m.kind, m.text) for m in messages] == [
            (1, "user", "seed one"),
            (2, "assistant", "seed two"),
        ]
        assert [m.message for m in messages] == seed
        assert await store.transitions("c1") == []

    run(scenario())


def test_creating_an_existing_id_fails_and_keeps_the_first(store: Store) -> None:
    async def scenario() -> None:
        await store.create(fresh(), system="first")
        with pytest.raises(ConversationExistsError, match="already exists"):
            await store.create(fresh(behavior="checkpoint_restart"), system="second")
        loaded = await store.load("c1")
        assert loaded.system == "first"
        assert loaded.state == fresh()

    run(scenario())


def test_unknown_ids_raise_conversation_not_found(store: Store) -> None:
    async def scenario() -> None:
        await store.create(fresh("known"), system=None)
        ghost = StoredConversation(state=fresh("ghost"), version=1, system=None)
        snapshot = SessionSnapshot(
            conversation_id="ghost", version=1, session=1, checkpoint="x", context_window=1
        )
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.load("ghost"),
            lambda: store.commit(make_commit(ghost, UserMessage(text="hi"))),
            lambda: store.complete("ghost", [1]),
            lambda: store.messages("ghost"),
            lambda: store.transitions("ghost"),
            lambda: store.link_child("ghost", "child"),
            lambda: store.save_snapshot(snapshot),
            lambda: store.snapshots("ghost"),
        ]
        for call in calls:
            with pytest.raises(ConversationNotFoundError, match="ghost"):
                await call()
        assert [c.state.id for c in await store.list_conversations()] == ["known"]

    run(scenario())


@pytest.mark.parametrize(
    "ghost", ["c\x00", "x" * 201, "y" * 100_000], ids=["nul", "too-long", "absurd"]
)
def test_an_id_no_conversation_can_have_is_an_unknown_one(store: Store, ghost: str) -> None:
    """An id with a NUL, or longer than a conversation's id may be, is not in any store: every
    call about one says so (PostgreSQL's driver would refuse the NUL with an error of its own,
    which a server turned into a 500 where SQLite gave a 404)."""

    async def scenario() -> None:
        await store.create(fresh("known"), system=None)
        snapshot = SessionSnapshot(
            conversation_id=ghost, version=1, session=1, checkpoint="x", context_window=1
        )
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.load(ghost),
            lambda: store.messages(ghost),
            lambda: store.messages(ghost, after_seq=3),
            lambda: store.transitions(ghost),
            lambda: store.snapshots(ghost),
            lambda: store.claim(ghost, 1, owner="a", lease_until=2.0, now=1.0),
            lambda: store.renew(ghost, [1], owner="a", lease_until=2.0),
            lambda: store.release(ghost, [1], owner="a"),
            lambda: store.complete(ghost, [1]),
            lambda: store.link_child(ghost, "child"),
            lambda: store.save_snapshot(snapshot),
        ]
        if len(ghost) <= 200:  # a state can carry it (a longer id is refused by the config)
            state = fresh(ghost)
            ghosted = StoredConversation(state=state, version=1, system=None)
            calls.append(lambda: store.commit(make_commit(ghosted, UserMessage(text="hi"))))
        for call in calls:
            with pytest.raises(ConversationNotFoundError):
                await call()
        assert [c.state.id for c in await store.list_conversations()] == ["known"]
        assert await store.with_pending() == []

    run(scenario())


# --------------------------------------------------------------------------- commit


def test_commit_appends_messages_and_queues_the_other_effects(store: Store) -> None:
    async def scenario() -> None:
        stored = await store.create(fresh(), system=None)
        commit = make_commit(stored, UserMessage(text="hello"), at=7.0)
        after = await store.commit(commit)
        assert after.version == 2
        assert after.state == commit.state
        assert after.state.phase.kind == "llm_requesting"
        assert pending_kinds(after) == ["request_llm"]
        assert [(m.seq, m.kind, m.text) for m in await store.messages("c1")] == [
            (1, "user", "hello")
        ]
        loaded = await store.load("c1")
        assert loaded.version == 2
        assert loaded.state == commit.state
        assert loaded.pending == after.pending

    run(scenario())


def test_commit_returns_the_conversation_as_loaded(store: Store) -> None:
    async def scenario() -> None:
        last = await tool_turn(store)
        loaded = await store.load("c1")
        assert last == loaded
        assert loaded.system == "be brief"
        assert loaded.created_at == 1.0

    run(scenario())


def test_a_stale_version_is_refused_and_leaves_nothing_behind(store: Store) -> None:
    async def scenario() -> None:
        stored = await store.create(fresh(), system=None)
        first = make_commit(stored, UserMessage(text="one"))
        rival = make_commit(stored, UserMessage(text="two"))
        winner = await store.commit(first)
        with pytest.raises(ConcurrentUpdateError, match="version 2, not 1"):
            await store.commit(rival)
        assert await store.load("c1") == winner
        assert [m.text for m in await store.messages("c1")] == ["one"]
        assert [t.event_json for t in await store.transitions("c1")] == [first.event_json]
        # A version from the future is as wrong as one from the past.
        with pytest.raises(ConcurrentUpdateError):
            await store.commit(make_commit(winner, UserCancel(), expected_version=7))
        assert (await store.load("c1")).version == 2

    run(scenario())


def test_a_commit_for_another_conversations_state_is_refused(store: Store) -> None:
    async def scenario() -> None:
        one = await store.create(fresh("one"), system=None)
        await store.create(fresh("two"), system=None)
        commit = make_commit(one, UserMessage(text="hi"))
        crossed = Commit(
            conversation_id="two",
            expected_version=1,
            state=commit.state,
            event_kind=commit.event_kind,
            event_json=commit.event_json,
            from_phase=commit.from_phase,
            reason=commit.reason,
            effects=commit.effects,
        )
        with pytest.raises(SegueError, match="state of 'one'"):
            await store.commit(crossed)
        assert (await store.load("two")).version == 1
        assert await store.messages("two") == []

    run(scenario())


def test_completes_removes_outbox_entries_and_ids_are_never_reused(store: Store) -> None:
    async def scenario() -> None:
        stored = await store.create(fresh(), system=None)
        stored = await step(store, stored, UserMessage(text="hi"))
        (request,) = stored.pending
        stored = await step(
            store,
            stored,
            LlmResponse(text="tools", tool_calls=(CALL_A, CALL_B), usage=Usage(input_tokens=50)),
            completes=(request.id,),
        )
        assert pending_kinds(stored) == ["execute_tools"]
        (tools,) = stored.pending
        assert tools.id > request.id
        stored = await step(store, stored, ToolResult(tool_call_id=CALL_A.id, output="a"))
        assert stored.pending == (tools,)  # one tool still running: nothing completed yet
        stored = await step(
            store, stored, ToolResult(tool_call_id=CALL_B.id, output="b"), completes=(tools.id,)
        )
        assert pending_kinds(stored) == ["request_llm"]
        assert stored.pending[0].id > tools.id
        assert (await store.load("c1")).pending == stored.pending

    run(scenario())


def test_commits_made_at_once_each_get_their_own_outcome(store: Store) -> None:
    """Commits made in the same turn of the event loop (which SQL stores write together): each
    lands or is refused on its own account. A stale version, a key already used, two commits to
    one conversation, an unknown conversation: those are refused, the others land."""
    answer = LlmResponse(text="reply", usage=Usage(input_tokens=100))

    async def scenario() -> None:
        asked = {}
        for cid in ("a", "b", "c", "d"):
            created = await store.create(fresh(cid), system=None)
            asked[cid] = await store.commit(
                dataclasses.replace(
                    make_commit(created, UserMessage(text=f"to {cid}")), idempotency_key=cid
                )
            )
        ghost = StoredConversation(state=fresh("ghost"), version=1, system=None)
        outcomes = await asyncio.gather(
            step(store, asked["a"], answer, completes=[1]),
            step(store, asked["b"], answer, completes=[1]),
            store.commit(make_commit(asked["c"], UserMessage(text="stale"), expected_version=1)),
            store.commit(
                dataclasses.replace(
                    make_commit(asked["d"], UserMessage(text="again")), idempotency_key="d"
                )
            ),
            step(store, asked["b"], UserMessage(text="b twice")),
            store.commit(make_commit(ghost, UserMessage(text="nobody"))),
            return_exceptions=True,
        )
        a, b, stale, again, twice, nobody = outcomes
        assert isinstance(a, StoredConversation)
        assert isinstance(b, StoredConversation)
        assert isinstance(stale, ConcurrentUpdateError)
        assert isinstance(again, DuplicateMessageError)
        assert isinstance(twice, ConcurrentUpdateError)
        assert isinstance(nobody, ConversationNotFoundError)
        for cid, landed in (("a", a), ("b", b)):
            assert landed == await store.load(cid)
            assert [m.text for m in await store.messages(cid)] == [f"to {cid}", "reply"]
            assert landed.pending == ()
        for cid in ("c", "d"):
            assert await store.load(cid) == asked[cid]
            assert len(await store.transitions(cid)) == 1

    run(scenario())


def test_an_effect_that_looks_like_an_outbox_entry_stays_pending(store: Store) -> None:
    """A tool call whose input reads like an outbox entry (``{"id": 1, "effect": ...}``) is
    pending as itself: a commit that completes id 1 (no longer pending) leaves it there."""

    async def scenario() -> None:
        call = ToolCall(id="call_x", name="lookup", input={"id": 1, "effect": {"id": 1}})
        stored = await step(store, await store.create(fresh(), system=None), UserMessage(text="q"))
        stored = await step(
            store,
            stored,
            LlmResponse(text="", tool_calls=(call,), usage=Usage(input_tokens=10)),
            completes=[1],
        )
        assert [(p.id, p.effect.kind) for p in stored.pending] == [(2, "execute_tools")]
        stale = await step(store, stored, UserCancel(), completes=[1])
        assert [p.id for p in stale.pending] == [2, 3]
        assert stale == await store.load("c1")

    run(scenario())


def test_complete_removes_effects_and_ignores_ids_already_gone(store: Store) -> None:
    async def scenario() -> None:
        stored = await store.create(fresh(), system=None)
        stored = await step(store, stored, UserMessage(text="hi"))
        # Crossing the warning threshold queues a notification next to the next request.
        stored = await step(
            store,
            stored,
            LlmResponse(text="t", tool_calls=(CALL_A,), usage=Usage(input_tokens=170_000)),
            completes=[p.id for p in stored.pending],
        )
        assert pending_kinds(stored) == ["notify_context_warning", "execute_tools"]
        warning, tools = stored.pending
        await store.complete("c1", [warning.id])
        assert (await store.load("c1")).pending == (tools,)
        await store.complete("c1", [warning.id, 999])  # again, and an id never handed out
        loaded = await store.load("c1")
        assert loaded.pending == (tools,)
        assert loaded.version == stored.version  # completing is not a transition

    run(scenario())


# --------------------------------------------------------------------------- reads


def test_messages_are_in_order_and_after_seq_skips_the_start(store: Store) -> None:
    async def scenario() -> None:
        await tool_turn(store)
        messages = await store.messages("c1")
        assert [(m.seq, m.kind) for m in messages] == [
            (1, "user"),
            (2, "assistant"),
            (3, "tool_result"),
            (4, "assistant"),
        ]
        assert messages[1].message.tool_calls == (CALL_A,)
        assert messages[2].message.tool_call_id == CALL_A.id
        assert messages[3].text == "It is segue's README."
        assert await store.messages("c1", after_seq=2) == messages[2:]
        assert await store.messages("c1", after_seq=4) == []
        assert await store.messages("c1", after_seq=40) == []

    run(scenario())


def test_last_seq_comes_with_every_read_of_the_conversation(store: Store) -> None:
    """``last_seq`` is read with the state, so a reader knows which messages go with it."""

    async def scenario() -> None:
        seed = [Message(kind="summary", text="before"), Message(kind="user", text="seeded")]
        created = await store.create(fresh(), system=None, messages=seed)
        assert created.last_seq == (await store.load("c1")).last_seq == 2
        stored = await step(store, created, UserMessage(text="hello"))
        assert stored.last_seq == (await store.load("c1")).last_seq == 3
        cancelled = await step(store, stored, UserCancel(), completes=[stored.pending[0].id])
        assert cancelled.version == stored.version + 1
        assert cancelled.last_seq == (await store.load("c1")).last_seq == 3  # nothing appended
        assert [m.seq for m in await store.messages("c1")] == [1, 2, 3]
        assert await store.messages("c1", after_seq=cancelled.last_seq) == []
        empty = await store.create(fresh("c2"), system=None)
        assert empty.last_seq == (await store.load("c2")).last_seq == 0

    run(scenario())


def test_transitions_log_every_step(store: Store) -> None:
    async def scenario() -> None:
        await tool_turn(store)
        log = await store.transitions("c1")
        assert [t.seq for t in log] == [1, 2, 3, 4]
        assert [(t.event_kind, t.from_phase, t.to_phase) for t in log] == [
            ("user_message", "idle", "llm_requesting"),
            ("llm_response", "llm_requesting", "tool_executing"),
            ("tool_result", "tool_executing", "llm_requesting"),
            ("llm_response", "llm_requesting", "idle"),
        ]
        assert [t.context_tokens for t in log] == [None, 1_000, 1_000, 1_208]
        assert [t.effect_kinds for t in log] == [
            ("append_message", "request_llm"),
            ("append_message", "execute_tools"),
            ("append_message", "request_llm"),
            ("append_message",),
        ]
        assert [t.at for t in log] == [2.0, 3.0, 4.0, 5.0]
        assert log[0].reason == "idle + user_message"
        assert load_event(log[2].event_json) == ToolResult(tool_call_id=CALL_A.id, output="# segue")

    run(scenario())


def test_the_exhaustion_path_is_stored_as_the_core_decided(store: Store) -> None:
    async def scenario() -> None:
        stored = await store.create(fresh(), system=None)
        stored = await step(store, stored, UserMessage(text="go"))
        stored = await step(
            store,
            stored,
            LlmResponse(text="t", tool_calls=(CALL_A, CALL_B), usage=Usage(input_tokens=185_000)),
            completes=[p.id for p in stored.pending],
        )
        assert stored.state.phase.kind == "awaiting_continuation"
        assert pending_kinds(stored) == ["notify_context_warning", "request_continuation"]
        stored = await step(
            store,
            stored,
            ContinuationResponse(summary="we read the README"),
            completes=[stored.pending[1].id],
        )
        assert stored.state.phase.kind == "context_exhausted"
        assert pending_kinds(stored) == ["notify_context_warning", "notify_context_exhausted"]
        kinds = [(m.kind, m.message.is_error) for m in await store.messages("c1")]
        assert kinds == [
            ("user", False),
            ("assistant", False),
            ("tool_result", True),  # the rejected tools are answered, never left unpaired
            ("tool_result", True),
            ("continuation", False),
        ]
        log = await store.transitions("c1")
        assert log[-1].to_phase == "context_exhausted"
        assert log[1].context_tokens == 185_000

    run(scenario())


def test_with_pending_lists_conversations_with_a_non_empty_outbox(store: Store) -> None:
    async def scenario() -> None:
        await tool_turn(store, "done")
        waiting = await store.create(fresh("waiting"), system=None)
        await store.create(fresh("untouched"), system=None)
        assert await store.with_pending() == []
        waiting = await step(store, waiting, UserMessage(text="hi"))
        assert await store.with_pending() == ["waiting"]
        await store.complete("waiting", [p.id for p in waiting.pending])
        assert await store.with_pending() == []

    run(scenario())


def test_list_conversations_is_oldest_first_without_pending(store: Store) -> None:
    async def scenario() -> None:
        await store.create(fresh("late"), system="s", at=30.0)
        early = await store.create(fresh("early"), system=None, at=10.0)
        await store.create(fresh("tie-1"), system=None, at=20.0)
        await store.create(fresh("tie-2"), system=None, at=20.0)
        early = await step(store, early, UserMessage(text="hi"))
        listed = await store.list_conversations()
        assert [c.state.id for c in listed] == ["early", "tie-1", "tie-2", "late"]
        assert listed[0].version == 2
        assert listed[0].state == early.state
        assert all(c.pending == () for c in listed)
        assert listed[-1].system == "s"

    run(scenario())


def test_link_child_records_one_child(store: Store) -> None:
    async def scenario() -> None:
        await store.create(fresh("parent"), system=None)
        assert await store.link_child("parent", "child-1") == "child-1"
        assert await store.link_child("parent", "child-2") == "child-1"
        loaded = await store.load("parent")
        assert loaded.child_id == "child-1"
        assert loaded.version == 1
        listed = await store.list_conversations()
        assert listed[0].child_id == "child-1"

    run(scenario())


def test_snapshots_round_trip_oldest_first(store: Store) -> None:
    async def scenario() -> None:
        stored, made = await paused(store)
        assert stored.state.phase.kind == "paused"
        assert [s.version for s in made] == [1, 2]
        assert made[1].sections == {"Goal": "ship it (the night)"}
        assert await store.snapshots("c1") == []  # the effect is pending, not yet performed
        for snapshot in reversed(made):
            await store.save_snapshot(snapshot)
        assert await store.snapshots("c1") == made
        await store.save_snapshot(made[0])  # finishing an outbox twice is harmless
        assert await store.snapshots("c1") == made
        changed = SessionSnapshot(**{**made[0].model_dump(), "checkpoint": "something else"})
        with pytest.raises(SegueError, match="never overwritten"):
            await store.save_snapshot(changed)
        assert await store.snapshots("c1") == made
        assert await store.load("c1") == stored  # saving snapshots is not a transition

    run(scenario())


def test_conversations_do_not_see_each_other(store: Store) -> None:
    async def scenario() -> None:
        await tool_turn(store, "a")
        b = await store.create(fresh("b"), system=None)
        b = await step(store, b, UserMessage(text="only b"))
        assert [m.text for m in await store.messages("b")] == ["only b"]
        assert len(await store.messages("a")) == 4
        assert [t.seq for t in await store.transitions("b")] == [1]
        assert b.pending[0].id == 1  # outbox ids count per conversation

    run(scenario())


# --------------------------------------------------------------------------- claims


def test_a_commit_claims_what_it_queues_for_its_owner(store: Store) -> None:
    async def scenario() -> None:
        stored = await store.create(fresh(), system=None)
        commit = dataclasses.replace(
            make_commit(stored, UserMessage(text="hi")), owner="rt-a", lease_until=100.0
        )
        committed = await store.commit(commit)
        for seen in (committed, await store.load("c1")):
            (pending,) = seen.pending
            assert (pending.owner, pending.lease_until) == ("rt-a", 100.0)
        unclaimed = await store.create(fresh("c2"), system=None)
        (pending,) = (await step(store, unclaimed, UserMessage(text="hi"))).pending
        assert (pending.owner, pending.lease_until) == (None, None)

    run(scenario())


def test_only_one_owner_holds_a_claim_until_its_lease_ends(store: Store) -> None:
    async def scenario() -> None:
        stored = await step(store, await store.create(fresh(), system=None), UserMessage(text="x"))
        effect_id = stored.pending[0].id
        first = await store.claim("c1", effect_id, owner="a", lease_until=10.0, now=1.0)
        assert first is not None
        assert (first.owner, first.lease_until) == ("a", 10.0)
        assert first.effect == stored.pending[0].effect
        # b is refused while a's lease lasts, and told who holds it.
        refused = await store.claim("c1", effect_id, owner="b", lease_until=20.0, now=5.0)
        assert refused is not None
        assert (refused.owner, refused.lease_until) == ("a", 10.0)
        # a renews; b still cannot take it at 15.
        assert await store.renew("c1", [effect_id], owner="a", lease_until=30.0)
        assert not await store.renew("c1", [effect_id], owner="b", lease_until=99.0)
        refused = await store.claim("c1", effect_id, owner="b", lease_until=40.0, now=15.0)
        assert refused is not None
        assert refused.owner == "a"
        # Past the lease anyone may take it over.
        taken = await store.claim("c1", effect_id, owner="b", lease_until=50.0, now=31.0)
        assert taken is not None
        assert (taken.owner, taken.lease_until) == ("b", 50.0)
        assert (await store.load("c1")).pending[0].owner == "b"
        # A holder known to be dead is taken from at once; a release frees the claim.
        taken = await store.claim(
            "c1", effect_id, owner="c", lease_until=60.0, now=32.0, take_from="b"
        )
        assert taken is not None
        assert taken.owner == "c"
        await store.release("c1", [effect_id], owner="b")  # not b's any more: changes nothing
        assert (await store.load("c1")).pending[0].owner == "c"
        await store.release("c1", [effect_id], owner="c")
        assert (await store.load("c1")).pending[0].owner is None
        again = await store.claim("c1", effect_id, owner="a", lease_until=70.0, now=33.0)
        assert again is not None
        assert again.owner == "a"

    run(scenario())


def test_claiming_what_is_no_longer_pending_gives_none(store: Store) -> None:
    async def scenario() -> None:
        stored = await step(store, await store.create(fresh(), system=None), UserMessage(text="x"))
        effect_id = stored.pending[0].id
        await store.complete("c1", [effect_id])
        assert await store.claim("c1", effect_id, owner="a", lease_until=9.0, now=1.0) is None
        assert not await store.renew("c1", [effect_id], owner="a", lease_until=9.0)
        with pytest.raises(ConversationNotFoundError):
            await store.claim("nope", 1, owner="a", lease_until=9.0, now=1.0)
        with pytest.raises(ConversationNotFoundError):
            await store.release("nope", [1], owner="a")

    run(scenario())


def test_two_claims_at_once_have_one_winner(store: Store) -> None:
    async def scenario() -> None:
        stored = await step(store, await store.create(fresh(), system=None), UserMessage(text="x"))
        effect_id = stored.pending[0].id
        results = await asyncio.gather(
            *(
                store.claim("c1", effect_id, owner=f"o{n}", lease_until=10.0, now=1.0)
                for n in range(5)
            )
        )
        owners = {result.owner for result in results if result is not None}
        assert len(owners) == 1

    run(scenario())


# --------------------------------------------------------------------------- idempotency


def test_a_key_is_refused_again_once_its_turn_is_over(store: Store) -> None:
    """The usual step (nothing pending, a message under a key) meets a key used turns ago."""

    async def scenario() -> None:
        stored = await store.create(fresh(), system=None)
        asked = await store.commit(
            dataclasses.replace(make_commit(stored, UserMessage(text="once")), idempotency_key="k")
        )
        answer = LlmResponse(text="hi", usage=Usage(input_tokens=100))
        idle = await step(store, asked, answer, completes=[p.id for p in asked.pending])
        assert idle.pending == ()
        again = dataclasses.replace(
            make_commit(idle, UserMessage(text="once")), idempotency_key="k"
        )
        with pytest.raises(DuplicateMessageError):
            await store.commit(again)
        assert await store.load("c1") == idle
        assert [m.text for m in await store.messages("c1")] == ["once", "hi"]
        assert len(await store.transitions("c1")) == 2

    run(scenario())


def test_a_second_commit_with_the_same_key_writes_nothing(store: Store) -> None:
    async def scenario() -> None:
        stored = await store.create(fresh(), system=None)
        first = dataclasses.replace(
            make_commit(stored, UserMessage(text="once")), idempotency_key="k1"
        )
        committed = await store.commit(first)
        again = dataclasses.replace(
            make_commit(committed, UserMessage(text="once")), idempotency_key="k1"
        )
        with pytest.raises(DuplicateMessageError) as caught:
            await store.commit(again)
        assert (caught.value.conversation_id, caught.value.key) == ("c1", "k1")
        # Refused even from a stale copy (a retry after a lost reply), before the version check.
        with pytest.raises(DuplicateMessageError):
            await store.commit(first)
        assert [m.text for m in await store.messages("c1")] == ["once"]
        assert (await store.load("c1")).version == committed.version
        # Keys are per conversation; a new key is a new message.
        other = await store.create(fresh("c2"), system=None)
        await store.commit(
            dataclasses.replace(make_commit(other, UserMessage(text="x")), idempotency_key="k1")
        )
        landed = await store.commit(dataclasses.replace(again, idempotency_key="k2"))
        assert landed.version == committed.version + 1
        assert len(await store.transitions("c1")) == 2

    run(scenario())


# --------------------------------------------------------------------------- what a store keeps


@pytest.mark.parametrize("where", ["id", "parent", "model", "system"])
def test_a_nul_in_an_id_model_or_system_prompt_is_refused_before_writing(
    store: Store, where: str
) -> None:
    async def scenario() -> None:
        fields: dict[str, Any] = {
            "conversation_id": "c\x00" if where == "id" else "c1",
            "parent_id": "p\x00" if where == "parent" else None,
        }
        state = new_conversation(
            model="claude\x00" if where == "model" else MODEL, context_window=200_000, **fields
        )
        system = "be\x00brief" if where == "system" else None
        with pytest.raises(InvalidTextError, match="NUL"):
            await store.create(state, system=system)
        assert await store.list_conversations() == []

    run(scenario())


def test_a_nul_in_message_text_round_trips(store: Store) -> None:
    async def scenario() -> None:
        stored = await store.create(fresh(), system=None)
        committed = await step(store, stored, UserMessage(text="a\x00b"))
        assert [m.text for m in await store.messages("c1")] == ["a\x00b"]
        with pytest.raises(InvalidTextError):
            await store.commit(
                dataclasses.replace(
                    make_commit(committed, UserMessage(text="x")), idempotency_key="k\x00"
                )
            )

    run(scenario())


_PNG = (  # a 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQ"
    "DwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
EVERY_BLOCK: Final = (
    TextBlock(text="text with a \x00 and \u2603"),
    ImageBlock(source=ImageBase64Source(media_type="image/png", data=_PNG)),
    ImageBlock(source=UrlSource(url="https://example.com/a.png")),
    DocumentBlock(
        source=PdfBase64Source(media_type="application/pdf", data="JVBERi0="), title="spec"
    ),
    DocumentBlock(source=UrlSource(url="https://example.com/a.pdf")),
    DocumentBlock(source=PlainTextSource(data="plain document"), context="ctx"),
    ThinkingBlock(thinking="let me think", signature="sig=="),
    RedactedThinkingBlock(data="opaque"),
    ToolUseBlock(id="toolu_1", name="lookup", input={"q": ["a", {"b": None}]}),
    AgentToolUseBlock(id="toolu_2", name="Bash", input={"command": "echo hi"}),
    AgentToolResultBlock(tool_use_id="toolu_2", output="hi\n", is_error=False),
)
"""One block of every kind and source a message can carry, with text that needs escaping."""


def test_the_log_says_which_session_each_event_happened_in(store: Store) -> None:
    """A checkpoint restart's answer belongs to the session it ended; what follows, to the new
    one. (A commit that does not say is logged with no session.)"""

    async def scenario() -> None:
        created = await store.create(fresh(behavior="checkpoint_restart"), system=None)
        asked = await step(store, created, UserMessage(text="go"))
        crossed = await step(store, asked, LlmResponse(text="x", usage=Usage(input_tokens=180_000)))
        restarted = await step(
            store, crossed, CheckpointResponse(text="<checkpoint>g</checkpoint>")
        )
        assert restarted.state.session == 2
        unsaid = dataclasses.replace(make_commit(restarted, UserMessage(text="more")), session=None)
        await store.commit(unsaid)
        log = await store.transitions("c1")
        assert [(r.event_kind, r.session) for r in log] == [
            ("user_message", 1),
            ("llm_response", 1),
            ("checkpoint_response", 1),
            ("user_message", None),
        ]

    run(scenario())


def test_every_content_block_round_trips(store: Store) -> None:
    """Seeds (``create``) and committed messages (``commit``) take different paths into the
    tables: every block comes back equal from both."""
    seeded = Message(kind="assistant", text="seed", content=EVERY_BLOCK)
    sent = UserMessage(
        text="look \x00",
        content=(
            TextBlock(text="look \x00"),
            ImageBlock(source=ImageBase64Source(media_type="image/png", data=_PNG)),
            DocumentBlock(source=PlainTextSource(data="doc")),
        ),
    )

    async def scenario() -> None:
        stored = await store.create(fresh(), system=None, messages=[seeded])
        await step(store, stored, sent)
        first, second = (m.message for m in await store.messages("c1"))
        assert first == seeded
        assert second.content == sent.content
        assert second.text == sent.text

    run(scenario())


# --------------------------------------------------------------------------- persistent stores


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """A database several stores (processes, say) can open at once, and what only another
    client of it can do: plant a row, hold a lock. ``test_postgres_store`` gives a PostgreSQL
    one, so the tests that take ``backend`` run on both persistent stores."""

    open: Callable[[], Store]
    """A new store on the database."""
    open_impatient: Callable[[], Store]
    """A new store that waits only 0.2 s for a lock held elsewhere."""
    execute: Callable[[str, tuple[Any, ...]], None]
    """Run one statement (``?`` placeholders) on a connection of its own, and commit."""
    holding_lock: Callable[[], AbstractContextManager[None]]
    """Hold, on a connection of its own, the lock a commit to ``c1`` needs."""
    integrity_error: type[Exception]
    """What the driver raises when a row's key is taken."""
    schema_version: int
    """The schema version this store writes (its ``SCHEMA_VERSION``)."""
    stamp_schema: Callable[[int], int]
    """Record another schema version in the database, as another segue would; return the one
    it replaces."""
    old_schema: Callable[[int], None]
    """Empty the database, then create the tables as schema ``version`` had them (running that
    version's migrations) and record the version, as an older segue left it."""
    columns: Callable[[str], set[str]]
    """The columns a table has now."""
    plant: Callable[[str], None]
    """Write, in ``messages`` or ``transitions``, the row with seq 1 of conversation ``c1``
    (kind ``planted``), where its first commit will write its own."""


def planted(table: str, *key: tuple[str, str]) -> tuple[str, tuple[Any, ...]]:
    """The INSERT of ``Backend.plant`` (``key``: a key column and the SQL of its value)."""
    names = [name for name, _ in key]
    values = [sql for _, sql in key]
    if table == "messages":
        message = Message(kind="user", text="planted").model_dump_json()
        columns = ", ".join([*names, "conversation_id", "seq", "kind", "message"])
        marks = ", ".join([*values, "'c1'", "1", "'user'", "?"])
        return f"INSERT INTO messages ({columns}) VALUES ({marks})", (message,)  # noqa: S608
    logged = ("conversation_id", "seq", "event_kind", "event", "from_phase", "to_phase")
    columns = ", ".join([*names, *logged, "reason", "effect_kinds", "at"])
    marks = ", ".join([*values, "'c1'", "1", "'planted'", "'{}'", "'idle'", "'idle'"])
    marks += ", '', '[]', 0"
    return f"INSERT INTO transitions ({columns}) VALUES ({marks})", ()  # noqa: S608


@pytest.fixture
def backend(tmp_path: Path) -> Backend:
    path = tmp_path / "segue.db"

    def execute(statement: str, parameters: tuple[Any, ...]) -> None:
        with contextlib.closing(sqlite3.connect(path)) as raw, raw:
            raw.execute(statement, parameters)

    @contextlib.contextmanager
    def holding_lock() -> Iterator[None]:
        holder = sqlite3.connect(path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            yield
            holder.execute("ROLLBACK")
        finally:
            holder.close()

    def stamp_schema(version: int) -> int:
        with contextlib.closing(sqlite3.connect(path)) as raw, raw:
            (replaced,) = raw.execute("PRAGMA user_version").fetchone()
            raw.execute(f"PRAGMA user_version = {int(version)}")
            return int(replaced)

    def old_schema(version: int) -> None:
        for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            leftover.unlink(missing_ok=True)
        with contextlib.closing(sqlite3.connect(path)) as raw, raw:
            for migration in SQLITE_MIGRATIONS[:version]:
                for statement in migration:
                    raw.execute(statement)
            raw.execute(f"PRAGMA user_version = {int(version)}")

    def columns(table: str) -> set[str]:
        with contextlib.closing(sqlite3.connect(path)) as raw:
            return {row[1] for row in raw.execute(f"PRAGMA table_info({table})")}

    def plant(table: str) -> None:
        key = "(SELECT ordinal * 4294967296 + 1 FROM conversations WHERE id = 'c1')"
        execute(*planted(table, ("rid", key)))

    return Backend(
        open=lambda: SqliteStore(path),
        open_impatient=lambda: SqliteStore(path, busy_timeout=0.2),
        execute=execute,
        holding_lock=holding_lock,
        integrity_error=sqlite3.IntegrityError,
        schema_version=SCHEMA_VERSION,
        stamp_schema=stamp_schema,
        old_schema=old_schema,
        columns=columns,
        plant=plant,
    )


def test_a_store_keeps_everything_across_close_and_reopen(backend: Backend) -> None:
    async def write() -> StoredConversation:
        store = backend.open()
        try:
            last = await tool_turn(store)
            await store.link_child("c1", "c2")
            waiting = await store.create(fresh("w"), system=None, at=9.0)
            await step(store, waiting, UserMessage(text="pending"))
            _, made = await paused(store, "p")
            await store.save_snapshot(made[0])
            return last
        finally:
            await store.close()

    async def read(last: StoredConversation) -> None:
        store = backend.open()
        try:
            assert await store.load("c1") == dataclasses.replace(last, child_id="c2")
            assert [m.kind for m in await store.messages("c1")] == [
                "user",
                "assistant",
                "tool_result",
                "assistant",
            ]
            assert len(await store.transitions("c1")) == 4
            assert sorted(await store.with_pending()) == ["p", "w"]
            assert pending_kinds(await store.load("w")) == ["request_llm"]
            assert [s.version for s in await store.snapshots("p")] == [1]
        finally:
            await store.close()

    run(read(run(write())))


def test_two_stores_on_one_database_one_commit_wins(backend: Backend) -> None:
    async def scenario() -> None:
        one, two = backend.open(), backend.open()
        try:
            await one.create(fresh(), system=None)
            seen_by_one = await one.load("c1")
            seen_by_two = await two.load("c1")
            results = await asyncio.gather(
                one.commit(make_commit(seen_by_one, UserMessage(text="from one"))),
                two.commit(make_commit(seen_by_two, UserMessage(text="from two"))),
                return_exceptions=True,
            )
            winners = [r for r in results if isinstance(r, StoredConversation)]
            losers = [r for r in results if isinstance(r, BaseException)]
            assert len(winners) == 1
            assert len(losers) == 1
            assert isinstance(losers[0], ConcurrentUpdateError)
            messages = await two.messages("c1")
            assert len(messages) == 1
            assert (await one.load("c1")) == winners[0]
            assert len(await one.transitions("c1")) == 1
        finally:
            await one.close()
            await two.close()

    run(scenario())


@pytest.mark.parametrize("table", ["messages", "transitions"])
def test_a_commit_failing_half_way_leaves_nothing(backend: Backend, table: str) -> None:
    """A row planted where the commit will write makes it fail after it wrote the conversation's
    row (its state, version and outbox): the message, or the log line after it."""

    async def scenario() -> None:
        store = backend.open()
        try:
            before = await store.create(fresh(), system=None)
            backend.plant(table)
            commit = make_commit(before, UserMessage(text="real"))
            with pytest.raises(backend.integrity_error):
                await store.commit(commit)
            after = await store.load("c1")
            assert after.version == 1
            assert after.state == before.state
            assert after.pending == ()
            assert [r.event_kind for r in await store.transitions("c1")] == (
                ["planted"] if table == "transitions" else []
            )
            planted_messages = await store.messages("c1")
            assert [m.text for m in planted_messages] == (
                ["planted"] if table == "messages" else []
            )
            # Remove the obstacle: the counters rolled back too, so the same commit now lands
            # exactly where it would have.
            backend.execute(f"DELETE FROM {table}", ())  # noqa: S608  # a literal table name
            landed = await store.commit(commit)
            assert landed.version == 2
            assert [(m.seq, m.text) for m in await store.messages("c1")] == [(1, "real")]
            assert [p.id for p in landed.pending] == [1]
            assert landed == await store.load("c1")
        finally:
            await store.close()

    run(scenario())


def test_closing_finishes_the_commits_under_way(backend: Backend) -> None:
    """Commits made just before ``close()`` (waiting for the end of the loop's turn, to go
    together) are made, and their callers told, before the store lets go of the database."""

    async def scenario() -> None:
        store = backend.open()
        created = [await store.create(fresh(cid), system=None) for cid in ("a", "b", "c")]
        pending = [
            asyncio.ensure_future(step(store, stored, UserMessage(text="last words")))
            for stored in created
        ]
        await asyncio.sleep(0)  # they are made, and wait for the end of the turn
        await store.close()
        assert [(await task).version for task in pending] == [2, 2, 2]
        reopened = backend.open()
        try:
            assert [(await reopened.load(cid)).version for cid in ("a", "b", "c")] == [2, 2, 2]
        finally:
            await reopened.close()

    run(scenario())


def test_a_lock_held_elsewhere_raises_store_locked(backend: Backend) -> None:
    async def scenario() -> None:
        store = backend.open_impatient()
        try:
            stored = await store.create(fresh(), system=None)
            blocked = make_commit(stored, UserMessage(text="blocked"))
            with (
                backend.holding_lock(),
                pytest.raises(StoreLockedError, match="database is locked: another process"),
            ):
                await store.commit(blocked)
            landed = await store.commit(make_commit(stored, UserMessage(text="later")))
            assert landed.version == 2
        finally:
            await store.close()

    run(scenario())


def test_a_closed_store_refuses_calls(backend: Backend) -> None:
    async def scenario() -> None:
        store = backend.open()
        await store.create(fresh(), system=None)
        await store.close()
        await store.close()  # twice is fine
        with pytest.raises(SegueError, match="closed"):
            await store.load("c1")

    run(scenario())


def test_a_runtime_closed_then_started_again_opens_its_store_again(store: Store) -> None:
    """``async with runtime:`` more than once (an application stopped and started again, one
    runtime under several test clients), on every store: each exit closes the store, the next
    start opens it again, and the conversations of the first run take turns there."""

    async def scenario() -> None:
        runtime = Runtime(store=store, llm=ScriptedModel(reply_chars=20))
        async with runtime:
            conv = await runtime.create_conversation(model=MODEL)
            await runtime.send(conv.id, "first run")
        for attempt in (2, 3):
            async with runtime:
                sent = await runtime.send(conv.id, f"run {attempt}")
                assert sent.phase.kind == "idle"
                kinds = [update.kind async for update in runtime.stream(conv.id, "streamed")]
                assert kinds[0] == "user_message"
                assert kinds[-1] == "done"
        async with runtime:
            users = [m.text for m in await runtime.messages(conv.id) if m.kind == "user"]
        assert users == ["first run", "run 2", "streamed", "run 3", "streamed"]

    run(scenario())


def test_the_schema_is_versioned_and_a_newer_one_is_refused(backend: Backend) -> None:
    run(_create_and_close(backend.open()))
    assert backend.stamp_schema(999) == backend.schema_version

    async def reopen() -> None:
        store = backend.open()
        try:
            with pytest.raises(SegueError, match="schema version 999"):
                await store.load("c1")
        finally:
            await store.close()

    run(reopen())


def _insert_present(backend: Backend, table: str, values: dict[str, Any]) -> None:
    """Insert ``values`` into ``table``, only the columns its schema version has."""
    present = {name: value for name, value in values.items() if name in backend.columns(table)}
    names = ", ".join(present)
    marks = ", ".join("?" for _ in present)
    backend.execute(
        f"INSERT INTO {table} ({names}) VALUES ({marks})",  # noqa: S608  # literal names
        tuple(present.values()),
    )


_ORDINALS: Final = {"w": 1, "done": 2}
"""Where SQLite's rows are keyed by the conversation's ordinal (from its version 5; a
PostgreSQL ordinal is an identity the database assigns)."""
_CLAIMED: Final = {"owner": "old-host/1/abcd", "lease_until": 99.5}


def _old_conversations(
    asked: ConversationState, answered: ConversationState, outbox: str, keyed: bool
) -> list[dict[str, Any]]:
    """The two conversations' rows: ``w`` with ``outbox`` pending, ``done`` with nothing."""
    return [
        {
            "id": cid,
            "state": state.model_dump_json(),
            "phase": state.phase.kind,
            "version": 2 if cid == "w" else 3,
            "system": "be brief",
            "message_count": count,
            "effect_count": 1,
            "created_at": 1.0,
            "updated_at": 2.0,
            "pending_count": pending,
            "outbox": outbox if pending else "[]",  # in the row from SQLite 5, PostgreSQL 4
            **({"ordinal": _ORDINALS[cid]} if keyed else {}),
        }
        for cid, state, count, pending in (("w", asked, 1, 1), ("done", answered, 2, 0))
    ]


def _plant_old_rows(backend: Backend) -> None:
    """What an older segue wrote: ``w`` waiting for the model (its request pending, claimed
    where claims existed, the message sent under an idempotency key where keys existed), and
    ``done`` with one exchange and nothing pending. Only the columns the schema has."""
    asked, effects = transition(fresh("w"), UserMessage(text="hello"))
    answered, _ = transition(
        transition(fresh("done"), UserMessage(text="hi"))[0],
        LlmResponse(text="hello", usage=Usage(input_tokens=100)),
    )
    keyed = "rid" in backend.columns("messages")
    request = next(effect for effect in effects if effect.kind == "request_llm")
    entry = json.dumps([{"id": 1, "effect": json.loads(dump_effect(request)), **_CLAIMED}])
    for row in _old_conversations(asked, answered, entry, keyed):
        _insert_present(backend, "conversations", row)
        if backend.columns("prompts"):  # SQLite 6 keeps the system prompt apart
            _insert_present(
                backend, "prompts", {"ordinal": row["ordinal"], "system": row["system"]}
            )
    for cid, seq, kind in (("w", 1, "user"), ("done", 1, "user"), ("done", 2, "assistant")):
        message = Message.model_validate({"kind": kind, "text": f"{cid} {seq}"})
        _insert_present(
            backend,
            "messages",
            {
                "conversation_id": cid,
                "seq": seq,
                "kind": kind,
                "message": message.model_dump_json(),
                "rid": _ORDINALS[cid] * 2**32 + seq,  # from SQLite 5
            },
        )
    _insert_present(
        backend,
        "transitions",
        {
            "conversation_id": "w",
            "seq": 1,
            "rid": _ORDINALS["w"] * 2**32 + 1,  # from SQLite 5
            "event_kind": "user_message",
            "event": dump_event(UserMessage(text="hello")),
            "from_phase": "idle",
            "to_phase": asked.phase.kind,
            "context_tokens": asked.context_tokens,
            "reason": "",
            "effect_kinds": '["append_message", "request_llm"]',
            "at": 2.0,
            "session": 1,
            "idempotency_key": "sent-once",  # on the event from SQLite 5, PostgreSQL 4
        },
    )
    if backend.columns("outbox"):  # a table of its own until then
        _insert_present(
            backend,
            "outbox",
            {"conversation_id": "w", "id": 1, "effect": dump_effect(request), **_CLAIMED},
        )
    if backend.columns("idempotency"):  # from version 2
        _insert_present(
            backend, "idempotency", {"conversation_id": "w", "key": "sent-once", "version": 2}
        )


def test_every_earlier_schema_is_upgraded_in_place(backend: Backend) -> None:
    """A database of each earlier schema version, as that version wrote it: opened for writing,
    it is upgraded, and every conversation goes on where it was, its pending work (and who
    claimed it), its log and its idempotency keys kept."""

    async def reopen(version: int) -> None:
        store = backend.open()
        try:
            waiting = await store.load("w")
            assert (waiting.version, waiting.system, waiting.last_seq) == (2, "be brief", 1)
            assert pending_kinds(waiting) == ["request_llm"]
            claimed = version > 1  # version 1 had no claims
            assert waiting.pending[0].owner == ("old-host/1/abcd" if claimed else None)
            assert waiting.pending[0].lease_until == (99.5 if claimed else None)
            assert await store.with_pending() == ["w"]
            log = await store.transitions("w")
            assert [(r.seq, r.event_kind, r.effect_kinds) for r in log] == [
                (1, "user_message", ("append_message", "request_llm"))
            ]
            if claimed:  # keys came with claims
                with pytest.raises(DuplicateMessageError):
                    await store.commit(
                        dataclasses.replace(
                            make_commit(waiting, UserMessage(text="hello")),
                            idempotency_key="sent-once",
                        )
                    )
            taken = await store.claim("w", 1, owner="new", lease_until=200.0, now=100.0)
            assert taken is not None
            assert (taken.owner, taken.effect) == ("new", waiting.pending[0].effect)
            # A cancel queues its own effect beside the request it leaves in place: the commit
            # sees the outbox as it was carried over, and the ids go on from the old ones.
            cancelled = await step(store, waiting, UserCancel())
            assert cancelled == await store.load("w")
            assert [(p.id, p.effect.kind) for p in cancelled.pending] == [
                (1, "request_llm"),
                (2, "cancel_request"),
            ]
            assert cancelled.pending[0].owner == "new"
            await store.complete("w", [1, 2])
            assert await store.with_pending() == []
            assert (await store.load("w")).pending == ()
            assert [m.text for m in await store.messages("done")] == ["done 1", "done 2"]
            assert [r.seq for r in await store.transitions("w")] == [1, 2]
        finally:
            await store.close()

    for version in range(1, backend.schema_version):
        backend.old_schema(version)
        _plant_old_rows(backend)
        run(reopen(version))
        assert backend.stamp_schema(backend.schema_version) == backend.schema_version


# --------------------------------------------------------------------------- SQLite only


def test_a_call_queued_behind_close_does_not_reopen_the_file(tmp_path: Path) -> None:
    """A read that reaches the store's thread after ``close()`` queued its work (a turn still
    running while its runtime closes) is refused: it used to open the file again, on a
    connection nothing would ever close, which kept the database locked for the life of the
    process (another connection could not leave WAL mode)."""
    path = tmp_path / "segue.db"

    async def scenario() -> None:
        store = SqliteStore(path)
        await store.create(fresh(), system=None)
        await store.load("c1")  # the thread and its connection are open
        closing = asyncio.create_task(store.close())
        await asyncio.sleep(0)  # close() has queued its work for the thread
        with pytest.raises(SegueError, match="closed"):
            await store.load("c1")
        await closing

    run(scenario())
    with contextlib.closing(sqlite3.connect(path, timeout=0.1)) as raw:
        assert raw.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)


def test_sqlite_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "new" / "deeper" / "segue.db"

    async def scenario() -> None:
        store = SqliteStore(path)
        try:
            await tool_turn(store)
            modes = {
                name: stat.S_IMODE(os.stat(p).st_mode)
                for name, p in {
                    "db": path,
                    "wal": Path(f"{path}-wal"),
                    "dir": path.parent,
                    "parent dir": path.parent.parent,
                }.items()
            }
            assert modes == {"db": 0o600, "wal": 0o600, "dir": 0o700, "parent dir": 0o700}
        finally:
            await store.close()

    old = os.umask(0o022)  # a typical umask: new files would be world-readable
    try:
        run(scenario())
    finally:
        os.umask(old)


def test_sqlite_file_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "segue.db"
    run(_create_and_close(SqliteStore(path)))
    with contextlib.closing(sqlite3.connect(path)) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_long_system_prompt_is_not_written_again_by_every_step(tmp_path: Path) -> None:
    """A step rewrites its conversation's row (SQLite writes a new record, overflow pages and
    all); a system prompt of many pages kept beside it would be written to the WAL by every
    step. Counted in WAL frames: what 20 steps write is the same with a prompt of 40 KB as
    with none."""
    path = tmp_path / "segue.db"

    async def frames_per_steps(cid: str, system: str | None) -> int:
        store = SqliteStore(path)
        try:
            stored = await store.create(fresh(cid), system=system)
            assert (await store.load(cid)).system == system
            before = _wal_frames(path)
            for _ in range(10):
                asked = await step(store, stored, UserMessage(text="hello"))
                answer = LlmResponse(text="hi", usage=Usage(input_tokens=100))
                stored = await step(store, asked, answer, completes=[p.id for p in asked.pending])
            assert stored.system == system
            return _wal_frames(path) - before
        finally:
            await store.close()

    plain = run(frames_per_steps("plain", None))
    prompted = run(frames_per_steps("prompted", "Answer in French. " * 2_300))
    assert prompted <= plain + 2  # a page more where a leaf splits, not ten per step


def _wal_frames(path: Path) -> int:
    """Pages written to the WAL (of 4 KB, each with its frame header) since it last restarted."""
    return Path(f"{path}-wal").stat().st_size // (4096 + 24)


async def _create_and_close(store: Store) -> None:
    try:
        await store.create(fresh(), system=None)
    finally:
        await store.close()


def _traced(store: SqliteStore) -> Awaitable[list[tuple[str, bool]]]:
    """Record every statement the store's connection runs, and whether it ran on the thread of
    the event loop calling this (or on the store's own)."""
    loop_thread = threading.get_ident()
    statements: list[tuple[str, bool]] = []

    def trace(statement: str) -> None:
        statements.append((statement, threading.get_ident() == loop_thread))

    async def install() -> list[tuple[str, bool]]:
        await store._run(lambda conn: conn.set_trace_callback(trace))
        return statements

    return install()


def test_writes_of_one_loop_iteration_share_one_transaction_on_the_loop(tmp_path: Path) -> None:
    """Commits made in the same turn of the event loop, with nothing in their way, are written
    together on the loop's own thread (no hand-off to the store's thread): the one that is
    refused (it checks before it writes) leaves no trace and does not spoil the others."""
    answer = LlmResponse(text="reply", usage=Usage(input_tokens=100))

    async def scenario() -> None:
        store = SqliteStore(tmp_path / "inline.db")
        try:
            a1 = await step(
                store, await store.create(fresh("a"), system=None), UserMessage(text="1")
            )
            b1 = await step(
                store, await store.create(fresh("b"), system=None), UserMessage(text="2")
            )
            statements = await _traced(store)
            answered, other, again = await asyncio.gather(
                step(store, a1, answer, completes=[a1.pending[0].id]),
                step(store, b1, answer, completes=[b1.pending[0].id]),
                step(store, a1, UserMessage(text="stale"), completes=[a1.pending[0].id]),
                return_exceptions=True,
            )
            assert isinstance(answered, StoredConversation)
            assert isinstance(other, StoredConversation)
            assert isinstance(again, ConcurrentUpdateError)
            written = [statement for statement, on_loop in statements if on_loop]
            assert [s for s, on_loop in statements if not on_loop] == []
            assert written.count("BEGIN IMMEDIATE") == written.count("COMMIT") == 1
            assert [m.text for m in await store.messages("a")] == ["1", "reply"]
            assert (await store.load("a")).pending == () == answered.pending
            assert [m.text for m in await store.messages("b")] == ["2", "reply"]
        finally:
            await store.close()

    run(scenario())


def test_a_step_failing_after_it_wrote_is_undone_alone(tmp_path: Path) -> None:
    """In a batch written on the loop (no savepoints), a step that fails after writing (a row
    planted where its message goes) rolls the batch back; the store's thread writes it again,
    each step in a savepoint: the others land, the failing one leaves nothing."""
    path = tmp_path / "undone.db"

    async def scenario() -> None:
        store = SqliteStore(path)
        try:
            a0 = await store.create(fresh("a"), system=None)
            b0 = await store.create(fresh("b"), system=None)
            with contextlib.closing(sqlite3.connect(path)) as raw, raw:
                raw.execute(
                    "INSERT INTO messages (rid, conversation_id, seq, kind, message)"
                    " SELECT ordinal * 4294967296 + 1, id, 1, 'user', ? FROM conversations"
                    " WHERE id = 'b'",
                    (Message(kind="user", text="planted").model_dump_json(),),
                )
            statements = await _traced(store)
            landed, failed = await asyncio.gather(
                step(store, a0, UserMessage(text="for a")),
                step(store, b0, UserMessage(text="for b")),
                return_exceptions=True,
            )
            assert isinstance(landed, StoredConversation)
            assert isinstance(failed, sqlite3.IntegrityError)
            assert ("ROLLBACK TO step", False) in statements  # done again, in the thread
            assert [here for s, here in statements if s == "COMMIT"] == [False]
            assert [m.text for m in await store.messages("a")] == ["for a"]
            assert [m.text for m in await store.messages("b")] == ["planted"]
            assert (await store.load("b")).version == 1
            assert landed == await store.load("a")
        finally:
            await store.close()

    run(scenario())


def test_a_lock_held_elsewhere_sends_writes_to_the_thread_and_groups_them(tmp_path: Path) -> None:
    """While another connection holds the write lock, a write tries it once on the loop without
    waiting (the loop must not stall for the busy timeout) and goes to the store's thread, which
    waits; commits that come meanwhile are written there in one transaction, each in a
    savepoint. The lock is held by this very loop: a write that waited for it on the loop
    would wait for ever (and fail after the busy timeout)."""
    path = tmp_path / "group.db"
    answer = LlmResponse(text="reply", usage=Usage(input_tokens=100))

    async def scenario() -> None:
        store = SqliteStore(path)
        try:
            a0 = await store.create(fresh("a"), system=None)
            a1 = await step(store, a0, UserMessage(text="1"))
            b1 = await step(
                store, await store.create(fresh("b"), system=None), UserMessage(text="2")
            )
            c0 = await store.create(fresh("c"), system=None)
            statements = await _traced(store)
            with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as holder:
                holder.execute("BEGIN IMMEDIATE")  # the store's thread waits behind this lock
                blocked = asyncio.ensure_future(step(store, c0, UserMessage(text="3")))
                for _ in range(500):  # until the thread is in this first job, waiting
                    if ("BEGIN IMMEDIATE", False) in statements:
                        break
                    await asyncio.sleep(0.01)
                on_loop = [s for s, here in statements if here and not s.startswith("PRAGMA")]
                assert on_loop == ["BEGIN IMMEDIATE"]  # tried once, refused at once
                # ... and the thread tries again and again, until the lock is free.
                assert {s for s, here in statements if not here} == {"BEGIN IMMEDIATE"}
                grouped = asyncio.gather(
                    step(store, b1, answer, completes=[b1.pending[0].id]),
                    step(store, a0, UserMessage(text="late"), completes=[a1.pending[0].id]),
                    return_exceptions=True,
                )
                await asyncio.sleep(0.1)
                assert not blocked.done()
                holder.execute("COMMIT")
            await blocked
            answered, refused = await grouped
            assert isinstance(refused, ConcurrentUpdateError)
            assert isinstance(answered, StoredConversation)
            assert answered.pending == ()
            commits = [here for s, here in statements if s == "COMMIT"]
            assert commits == [False, False]  # the first job alone, then the group, both there
            assert [m.text for m in await store.messages("b")] == ["2", "reply"]
            # The refused step's removal of a's pending request went with it.
            assert [m.text for m in await store.messages("a")] == ["1"]
            assert pending_kinds(await store.load("a")) == ["request_llm"]
            done = await step(store, a1, answer, completes=[a1.pending[0].id])
            assert done.pending == () == (await store.load("a")).pending
        finally:
            await store.close()

    run(scenario())


def test_a_large_write_goes_to_the_thread(tmp_path: Path) -> None:
    """A step that writes a large document (a tool's output of a few hundred kilobytes) is
    written by the store's thread, so that copying it does not hold up the event loop; the
    small steps around it stay on the loop."""
    big = "segue " * 60_000

    async def scenario() -> None:
        store = SqliteStore(tmp_path / "large.db")
        try:
            asked = await step(
                store, await store.create(fresh(), system=None), UserMessage(text="a")
            )
            statements = await _traced(store)
            answered = await step(
                store, asked, LlmResponse(text=big, usage=Usage(input_tokens=100)), completes=[1]
            )
            on_thread = [s for s, here in statements if not here]
            assert "COMMIT" in on_thread
            assert ("COMMIT", True) not in statements
            statements.clear()
            await step(store, answered, UserMessage(text="small again"))
            assert ("COMMIT", True) in statements
            assert ("COMMIT", False) not in statements
            assert [m.text for m in await store.messages("c1")] == ["a", big, "small again"]
        finally:
            await store.close()

    run(scenario())


def test_a_conversation_writing_alone_is_written_at_once(tmp_path: Path) -> None:
    """Step after step of one conversation, with no other write in between, each commit is
    written as it is made (no turn of the event loop in between: a callback scheduled before it
    has not run when it returns); once another conversation writes, commits wait for the end of
    the loop's turn again, to share its transaction."""
    answer = LlmResponse(text="reply", usage=Usage(input_tokens=100))

    async def scenario() -> None:
        store = SqliteStore(tmp_path / "alone.db")
        loop = asyncio.get_running_loop()
        try:
            stored = await store.create(fresh("a"), system=None)
            stored = await step(store, stored, UserMessage(text="1"))  # a's first: batched
            turns: list[int] = []
            loop.call_soon(turns.append, 1)
            stored = await step(store, stored, answer, completes=[stored.pending[0].id])
            stored = await step(store, stored, UserMessage(text="2"))
            assert turns == []  # both written without a turn of the loop
            other = await store.create(fresh("b"), system=None)  # someone else wrote
            turns.clear()
            loop.call_soon(turns.append, 2)
            await step(store, stored, answer, completes=[stored.pending[0].id])
            assert turns == [2]  # a waited for the end of the turn
            assert [m.text for m in await store.messages("a")] == ["1", "reply", "2", "reply"]
            assert (await store.load("b")).version == other.version
        finally:
            await store.close()

    run(scenario())


def test_opening_a_new_file_waits_while_another_process_writes_it(tmp_path: Path) -> None:
    """A file still in rollback mode, written by another process when segue opens it (two
    workers starting at once on a new database): ``PRAGMA journal_mode = WAL`` needs the file
    to itself and SQLite answers "locked" without waiting, so the open must wait for it."""
    path = tmp_path / "new.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE other (x)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO other VALUES (1)")
    released = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
    released.start()

    async def open_and_read() -> list[str]:
        store = SqliteStore(path, busy_timeout=10)
        try:
            return list(await store.with_pending())
        finally:
            await store.close()

    try:
        assert run(open_and_read()) == []
    finally:
        released.join()
        holder.close()


def test_the_event_log_is_read_from_a_seq_on(backend: Backend) -> None:
    """A watcher reads the lines after the last it saw, not the whole log each time."""

    async def main() -> None:
        store = backend.open()
        try:
            await tool_turn(store)
            whole = await store.transitions("c1")
            assert [line.seq for line in whole] == list(range(1, len(whole) + 1))
            for after in range(len(whole) + 2):
                assert await store.transitions("c1", after_seq=after) == whole[after:]
            with pytest.raises(ConversationNotFoundError):
                await store.transitions("nobody", after_seq=2)
        finally:
            await store.close()

    run(main())
