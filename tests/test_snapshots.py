"""Snapshots as the runtime stores them: what the session did and cost, the errors it met, the
decisions it stated, when it was saved, and the application's context; resuming from them, with a
git HEAD that moved since the pause stated in the resume context.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from segue import (
    ContextExhaustionBehavior,
    LlmCallError,
    LlmReply,
    MemoryStore,
    Runtime,
    ScriptedModel,
    SqliteStore,
    ToolCall,
    Usage,
    git_context,
)
from segue.effects import SaveSnapshot
from segue.executor.store_port import Commit
from segue.executor.tools import Tool

MODEL = "claude-sonnet-4-5"
GIT = shutil.which("git") or "git"
NOW = 1_800_000_000.0
CHECKPOINT = "<checkpoint>\n## Goal\nG\n## Key Decisions\n- Ship Friday\n</checkpoint>"


async def no_wait(_seconds: float) -> None:
    return None


async def lookup(_input: dict[str, Any]) -> str:
    return "found it"


def scripted() -> ScriptedModel:
    calls = (ToolCall(id="toolu_1", name="lookup", input={}),)
    return ScriptedModel(
        [
            LlmReply(text="Let me look.", tool_calls=calls, usage=Usage(input_tokens=100)),
            LlmCallError("overloaded right now", retryable=True, status_code=529),
            LlmReply(text="Decision: we keep SQLite.", usage=Usage(input_tokens=200)),
            LlmReply(text=CHECKPOINT),
        ]
    )


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_paused_session_is_stored_with_what_it_did(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "s.db")
        context = {"task": {"id": 7, "step": "tests"}}
        async with Runtime(
            store=store,
            llm=scripted(),
            tools=[Tool(name="lookup", description="Look.", function=lookup)],
            clock=lambda: NOW,
            sleep=no_wait,
            snapshot_context=lambda _cid: context,
        ) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.send(conv.id, "Plan the release.")
            state = await rt.pause(conv.id, "end of day")
            assert state.phase.kind == "paused"
            snapshot = (await rt.store.snapshots(conv.id))[-1]
            assert snapshot.created_at == NOW
            assert (snapshot.llm_calls, snapshot.tool_calls) == (4, 1)  # incl. failed, checkpoint
            assert snapshot.usage is not None
            assert snapshot.usage.input_tokens >= 300
            assert snapshot.errors == ("overloaded right now",)
            assert snapshot.decisions == ("Ship Friday", "we keep SQLite.")
            assert snapshot.context == context
            resumed = await rt.resume(conv.id)
            assert resumed.session == 2
            assert resumed.resume_context is not None
            assert '"step": "tests"' in resumed.resume_context
            assert "we keep SQLite." in resumed.resume_context
            system = [r.system for r in rt.llm.requests][-1]  # type: ignore[attr-defined]
            assert system is not None
            assert "## Session Resume Context" in system

    asyncio.run(main())


def test_a_failing_context_callable_never_fails_the_pause() -> None:
    def broken(_cid: str) -> dict[str, Any]:
        raise RuntimeError("the task tracker is down")

    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel(), snapshot_context=broken) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.send(conv.id, "Hi.")
            assert (await rt.pause(conv.id)).phase.kind == "paused"
            assert (await rt.store.snapshots(conv.id))[-1].context is None

    asyncio.run(main())


def test_saving_the_same_snapshot_again_after_a_crash_keeps_the_first() -> None:
    async def main() -> None:
        times = iter([NOW, NOW + 60, NOW + 120, NOW + 180, NOW + 240])
        store = MemoryStore()
        async with Runtime(store=store, llm=ScriptedModel(), clock=lambda: next(times)) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.pause(conv.id)
            first = (await store.snapshots(conv.id))[-1]
            # A crash after the snapshot was saved, before its effect left the outbox: the
            # restarted runtime performs the effect again.
            stored = await store.load(conv.id)
            phase: Any = stored.state.phase
            await store.commit(
                Commit(
                    conversation_id=conv.id,
                    expected_version=stored.version,
                    state=stored.state,
                    event_kind="pause_requested",
                    event_json="{}",
                    from_phase="paused",
                    reason="",
                    effects=(SaveSnapshot(snapshot=phase.snapshot),),
                )
            )
            assert [p.effect.kind for p in (await store.load(conv.id)).pending] == ["save_snapshot"]
            await rt.recover()
            assert not (await store.load(conv.id)).pending
            assert await store.snapshots(conv.id) == [first]

    asyncio.run(main())


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_context_captures_the_repository_and_a_moved_head_is_stated(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> None:
        subprocess.run(  # noqa: S603  # git with fixed arguments in a test repository
            [GIT, "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=T", *args],
            check=True,
            capture_output=True,
        )

    git("init", "-q", "-b", "main")
    (repo / "a.txt").write_text("one", encoding="utf-8")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")

    async def main() -> None:
        model = ScriptedModel()
        async with Runtime(
            store=MemoryStore(), llm=model, snapshot_context=git_context(repo)
        ) as rt:
            conv = await rt.create_conversation(
                model=MODEL, behavior=ContextExhaustionBehavior.CHECKPOINT_RESTART
            )
            (repo / "b.txt").write_text("dirty", encoding="utf-8")
            await rt.pause(conv.id, "lunch")
            snapshot = (await rt.store.snapshots(conv.id))[-1]
            assert snapshot.context is not None
            captured = snapshot.context["git"]
            assert captured["branch"] == "main"
            assert captured["dirty"] == ["b.txt"]
            git("add", "b.txt")
            git("commit", "-q", "-m", "two")
            resumed = await rt.resume(conv.id)
            assert resumed.resume_context is not None
            assert f"from {captured['head']} to" in resumed.resume_context

    asyncio.run(main())


def test_git_context_outside_a_repository_is_nothing(tmp_path: Path) -> None:
    capture = git_context(tmp_path)
    assert asyncio.run(capture("c")) is None  # type: ignore[arg-type]
