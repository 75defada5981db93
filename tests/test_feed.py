"""``Runtime.watch`` hears turns that another runtime drives, read back from the shared store.

A second ``segue serve`` worker on the same database, or a second ``Runtime`` in one process:
the watcher's runtime never drives the turn, yet its watch yields the user's message, the
reply, tools started and finished, the meter, the warning, the end of the conversation and
``done``, in order. What the watcher's own runtime drives comes live and is never read back
(no update twice). The same holds across processes, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from segue import LlmReply, Runtime, ScriptedModel, ToolCall, Update, Usage
from segue.executor import feed
from segue.executor.store_port import Store, StoredConversation
from segue.executor.stores.memory import MemoryStore
from segue.executor.stores.postgres import PostgresStore
from segue.executor.stores.sqlite import SqliteStore
from segue.executor.tools import Tool
from test_postgres_store import cluster, database  # noqa: F401  # the shared PostgreSQL fixtures

T = TypeVar("T")
MODEL = "claude-sonnet-4-5"
WORKER = Path(__file__).with_name("gated_worker.py")
TIMEOUT = 60


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine

    return asyncio.run(main())


async def lookup(tool_input: dict[str, Any]) -> str:
    return f"found {tool_input.get('q')}"


LOOKUP = Tool(name="lookup", description="Look up.", function=lookup)
SCRIPT = [
    LlmReply(
        text="Looking.",
        tool_calls=(ToolCall(id="toolu_1", name="lookup", input={"q": "tides"}),),
        usage=Usage(input_tokens=1_000, output_tokens=10),
        stop_reason="tool_use",
    ),
    LlmReply(text="High tide at noon.", usage=Usage(input_tokens=17_000, output_tokens=20)),
]


async def collect(watch: Any, until: str = "done") -> list[Update]:
    """Updates of ``watch`` up to and including the first of kind ``until``."""
    seen: list[Update] = []
    async with asyncio.timeout(TIMEOUT):
        async for update in watch:
            seen.append(update)
            if update.kind == until:
                return seen
    raise AssertionError(seen)


StoreFactory = Callable[[Path], Store]
_SHARED: dict[Path, MemoryStore] = {}
STORES: dict[str, StoreFactory] = {
    "memory": lambda where: _SHARED.setdefault(where, MemoryStore()),
    "sqlite": lambda where: SqliteStore(where / "shared.db"),
}


@pytest.mark.parametrize("kind", STORES)
def test_a_watch_hears_a_turn_another_runtime_drives(tmp_path: Path, kind: str) -> None:
    make = STORES[kind]

    async def scenario() -> None:
        driver = Runtime(store=make(tmp_path), llm=ScriptedModel(SCRIPT), tools=[LOOKUP])
        watcher = Runtime(store=make(tmp_path), llm=ScriptedModel())
        cid = (await driver.create_conversation(model=MODEL, context_window=20_000)).id
        watch = watcher.watch(cid)
        await watch.start()  # reading the store from here on: the next commit is heard
        listening = asyncio.create_task(collect(watch))
        await driver.send(cid, "When is high tide?", pinned=True)
        updates = await listening
        # The meter comes with each read that saw it move: once when one read saw the whole
        # turn, more often when the feed read while it ran (a poll can fall mid-turn).
        told = [u for u in updates if u.kind != "occupancy"]
        assert [u.kind for u in told] == [
            "user_message",
            "text",
            "tool_started",
            "tool_finished",
            "text",
            "warning",
            "done",
        ]
        assert getattr(told[0], "pinned", None) is True  # another tab marks it at once
        texts = [getattr(u, "text", None) for u in told]
        assert texts[:2] == ["When is high tide?", "Looking."]
        assert texts[4] == "High tide at noon."
        finished: Any = told[3]
        assert (finished.name, finished.output, finished.is_error) == (
            "lookup",
            "found tides",
            False,
        )
        kinds = [u.kind for u in updates]
        last_meter = max(i for i, kind in enumerate(kinds) if kind == "occupancy")
        assert last_meter < kinds.index("warning")  # the meter shows the warning's figure
        meter: Any = updates[last_meter]
        assert (meter.tokens, meter.level) == (17_020, "warning")
        done: Any = updates[-1]
        assert done.reply == "High tide at noon."
        assert done.state.phase.kind == "idle"
        await watch.aclose()
        await driver.close()
        if kind != "memory":
            await watcher.close()

    run(scenario())


def test_what_the_watchers_own_runtime_drives_is_heard_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SqliteStore(tmp_path / "s.db")
        rt = Runtime(store=store, llm=ScriptedModel(reply_chars=40))
        cid = (await rt.create_conversation(model=MODEL)).id
        async with rt.watch(cid) as watch:
            await watch.start()
            listening = asyncio.create_task(collect(watch))
            await rt.send(cid, "hello")
            first = await listening
            # Let the feed read the store a few times: it must not tell the turn again.
            await asyncio.sleep(1.5)
            other = Runtime(store=SqliteStore(tmp_path / "s.db"), llm=ScriptedModel())
            second_turn = asyncio.create_task(collect(watch))
            await other.send(cid, "and you?")
            second = await second_turn
            await other.close()
        assert [u.kind for u in first].count("done") == 1
        assert [u.kind for u in second if u.kind == "user_message"] == ["user_message"]
        assert getattr(second[0], "text", None) == "and you?"  # nothing of the first turn again
        await rt.close()

    run(scenario())


def test_a_watch_of_an_unknown_conversation_raises_on_the_first_read(tmp_path: Path) -> None:
    from segue import ConversationNotFoundError

    async def scenario() -> None:
        rt = Runtime(store=SqliteStore(tmp_path / "s.db"), llm=ScriptedModel())
        watch = rt.watch("nobody")
        with pytest.raises(ConversationNotFoundError):
            await anext(watch)
        assert not rt._feeds  # nothing keeps reading
        started = rt.watch("nobody either")
        with pytest.raises(ConversationNotFoundError):
            await started.start()
        assert not rt._feeds
        with pytest.raises(StopAsyncIteration):  # a watch that failed to start is over
            await anext(started)
        await rt.close()

    run(scenario())


# --------------------------------------------------------------------------- two processes


def _across_processes(where: str, open_store: Callable[[], Store]) -> None:
    async def create() -> str:
        async with Runtime(store=open_store(), llm=ScriptedModel()) as rt:
            return (await rt.create_conversation(model=MODEL)).id

    cid = run(create())

    async def watch_the_worker() -> list[Update]:
        async with Runtime(store=open_store(), llm=ScriptedModel()) as rt:
            watch = rt.watch(cid)
            await watch.start()
            listening = asyncio.create_task(collect(watch))
            worker = await asyncio.create_subprocess_exec(
                sys.executable,
                str(WORKER),
                where,
                cid,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                async with asyncio.timeout(TIMEOUT):
                    out, err = await worker.communicate(b"answer\n")
            finally:
                if worker.returncode is None:
                    worker.kill()
                    await worker.wait()
            assert worker.returncode == 0, err
            assert json.loads(out.splitlines()[-1])["phase"] == "idle"
            updates = await listening
            await watch.aclose()
            return updates

    updates = run(watch_the_worker())
    # The meter comes with each read that saw it move: after the message as well when the feed
    # read between the worker's two commits (woken by a notification, or a poll that fell
    # there), only at the end when one read saw both.
    assert [u.kind for u in updates] in (
        ["user_message", "text", "occupancy", "done"],
        ["user_message", "occupancy", "text", "occupancy", "done"],
    )
    done: Any = updates[-1]
    assert done.reply is not None
    assert done.reply == next(getattr(u, "text", None) for u in updates if u.kind == "text")


@pytest.mark.slow
def test_a_watch_hears_another_process_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    _across_processes(str(path), lambda: SqliteStore(path))


@pytest.mark.slow
def test_a_watch_hears_another_process_on_postgres(database: str) -> None:  # noqa: F811
    _across_processes(database, lambda: PostgresStore(database))


class CountingStore(PostgresStore):
    """A ``PostgresStore`` that counts the conversation reads made through it."""

    loads = 0

    async def load(self, conversation_id: str) -> StoredConversation:
        self.loads += 1
        return await super().load(conversation_id)


@pytest.mark.slow
def test_a_watch_on_postgres_is_woken_by_the_other_process(
    database: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LISTEN/NOTIFY wakes the feed when the other process commits: its polls are an hour apart
    here (without the notifications it would hear nothing before the test gives up), yet it
    hears the whole turn, reading only when told (once at the start, once registered, then
    once per notification at most)."""
    monkeypatch.setattr(feed, "BUSY_POLL", 3600.0)
    monkeypatch.setattr(feed, "IDLE_POLL", 3600.0)
    opened: list[CountingStore] = []

    def open_store() -> Store:
        opened.append(CountingStore(database))
        return opened[-1]

    _across_processes(database, open_store)
    creator, watcher = opened
    assert creator.loads == 0
    assert 1 < watcher.loads <= 4  # the worker commits twice: its message, then the reply
