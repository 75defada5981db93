"""The providers' own compaction and context editing, end to end (REQ-SEG-048 to REQ-SEG-051).

``Runtime`` -> ``AnthropicModel`` / ``OpenAIModel`` -> the unmodified SDK -> HTTP -> the fake
server, on SQLite and on PostgreSQL: what the runtime recorded is what the store holds, what it
sent is what the server received, and the costs are what the server reported.

Each conversation is made small enough to reach its limit in a few turns: a 100,000-token window
whose continuation threshold (60%, 60,000 tokens) is above Anthropic's minimum trigger of
50,000, messages of about 12,000 tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final

import anthropic
import openai
import pytest

from segue import (
    AnthropicModel,
    CompactionBlock,
    ContextExhaustionBehavior,
    ConversationState,
    MemoryStore,
    OpenAIModel,
    PostgresStore,
    ScriptedModel,
    SqliteStore,
    Store,
    Tool,
    Usage,
)
from segue.executor.errors import StoreUnavailableError, UnsupportedOptionError
from segue.executor.instructions import COMPACTION_INSTRUCTION
from segue.executor.model_port import ContextSupport, LlmReply, ProviderCompaction
from segue.executor.runtime import Runtime
from segue.executor.store_port import Commit, StoredConversation
from segue.executor.updates import ContextEditedUpdate, FallbackUpdate, Update
from segue.testing.anthropic_server import FakeAnthropicServer, MessageReply, ToolUse
from segue.testing.openai_server import FakeOpenAIServer, Reply
from segue.testing.postgres import ThrowawayCluster
from test_generations import cluster  # noqa: F401  # the module's throwaway PostgreSQL server
from test_readme import _run as run_as_a_user_does

KEY: Final = "sk-test-provider-compaction-0123456789"
CLAUDE: Final = "claude-sonnet-4-6"
GPT: Final = "gpt-4o"
WINDOW: Final = 100_000
THRESHOLD: Final = 60_000
PART: Final = "lorem ipsum dolor " * 2_000
"""About 12,000 tokens, as segue and the fakes estimate them."""
StoreFactory = Callable[[], Store]
_databases = itertools.count()


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the test's one store is: a SQLite file, or a PostgreSQL database's conninfo."""
    if request.param == "sqlite":
        return str(tmp_path / "segue.db")
    server: ThrowawayCluster = request.getfixturevalue("cluster")
    return server.create_database(f"provider_compaction_{next(_databases)}")


def open_store(where: str) -> Store:
    return PostgresStore(where) if where.startswith("host=") else SqliteStore(where)


@pytest.fixture
def make_store(where: str) -> StoreFactory:
    """The test's one store, opened again on each call (a runtime closes its store)."""
    return lambda: open_store(where)


@contextlib.asynccontextmanager
async def claude(
    server: FakeAnthropicServer, store: Store, archive: Path
) -> AsyncIterator[Runtime]:
    async with (
        anthropic.AsyncAnthropic(api_key=KEY, base_url=server.url) as client,
        Runtime(store=store, llm=AnthropicModel(client), archive_dir=archive) as rt,
    ):
        yield rt


@contextlib.asynccontextmanager
async def gpt(server: FakeOpenAIServer, store: Store, archive: Path) -> AsyncIterator[Runtime]:
    async with (
        openai.AsyncOpenAI(api_key=KEY, base_url=server.url) as client,
        Runtime(store=store, llm=OpenAIModel(client, api="responses"), archive_dir=archive) as rt,
    ):
        yield rt


async def compacting(rt: Runtime, model: str = CLAUDE, **options: Any) -> ConversationState:
    """A conversation whose provider compacts at 60,000 tokens."""
    settings: dict[str, Any] = {
        "behavior": ContextExhaustionBehavior.COMPACT_IN_PLACE,
        "compaction": "provider",
        "context_window": WINDOW,
        "warning_threshold": 0.5,
        "continuation_threshold": 0.6,
    }
    return await rt.create_conversation(model=model, **(settings | options))


async def turn(rt: Runtime, cid: str, text: str, updates: list[Update]) -> ConversationState:
    """Send ``text`` as a streamed turn, keeping its updates; the state it ended in."""
    async for update in rt.stream(cid, text):
        updates.append(update)
    return await rt.state(cid)


def compact_edits(body: dict[str, Any]) -> list[dict[str, Any]]:
    edits = (body.get("context_management") or {}).get("edits") or []
    return [edit for edit in edits if edit["type"] == "compact_20260112"]


# --------------------------------------------------------------------------- Anthropic


def test_claude_compacts_three_times_in_its_own_calls(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    """One call per reply, no summary request of segue's, the meter below the threshold after
    every compaction, and the cost the sum of every iteration the provider reported."""

    async def main() -> None:
        with FakeAnthropicServer(default=MessageReply(text="Noted.")) as server:
            async with claude(server, make_store(), tmp_path / "archive") as rt:
                conv = await compacting(rt)
                updates: list[Update] = []
                after: list[int] = []
                replies = 0
                while len(after) < 3:
                    generation = (await rt.state(conv.id)).generation
                    state = await turn(rt, conv.id, f"Part {replies}: {PART}", updates)
                    replies += 1
                    assert state.phase.kind == "idle"
                    if state.generation > generation:
                        assert state.context_tokens is not None
                        after.append(state.context_tokens)
                sent = [r.body for r in server.message_requests()]
                report = await rt.usage(conv.id)
                messages = await rt.messages(conv.id)
                bill = server.bill
        assert len(sent) == replies  # one call per reply
        assert all(compact_edits(body) for body in sent)  # every one a turn that may compact
        assert not any(COMPACTION_INSTRUCTION in json.dumps(body) for body in sent)
        assert all(tokens < THRESHOLD for tokens in after)
        assert compact_edits(sent[0])[0]["trigger"]["value"] == THRESHOLD
        total = report.total
        assert total.input_tokens == bill.input_tokens
        assert total.cache_read_input_tokens == bill.cache_read_input_tokens
        assert total.cache_creation_input_tokens == bill.written_5m + bill.written_1h
        assert total.output_tokens == bill.output_tokens
        assert report.by_purpose["provider_compaction"].output_tokens > 0
        summaries = [m for m in messages if m.kind == "summary"]
        assert [m.message.generation for m in summaries] == [2, 3, 4]
        assert all(m.message.content[0].type == "compaction" for m in summaries)
        users = [m.text for m in messages if m.kind == "user"]
        assert users == [f"Part {index}: {PART}" for index in range(replies)]  # nothing lost
        assert [u.generation for u in updates if u.kind == "compacted"] == [2, 3, 4]
        # The block of a compaction went back verbatim, and nothing from before it (the last
        # request, the one the third compaction was made in, carries the second).
        last = sent[-1]["messages"]
        blocks = [b for m in last for b in m["content"] if b.get("type") == "compaction"]
        kept = summaries[-2].message.content[0]
        assert isinstance(kept, CompactionBlock)
        assert blocks == [
            {
                "type": "compaction",
                "content": kept.content,
                "encrypted_content": kept.encrypted_content,
                "signature": kept.signature,
                "tool_changes": [],
            }
        ]
        archives = sorted((tmp_path / "archive").iterdir())
        assert len(archives) == 3
        assert all(path.stat().st_mode & 0o777 == 0o600 for path in archives)

    asyncio.run(main())


def test_pinned_messages_follow_the_block_after_the_provider_pauses(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    async def main() -> None:
        with FakeAnthropicServer(default=MessageReply(text="Noted.")) as server:
            async with claude(server, make_store(), tmp_path / "archive") as rt:
                conv = await compacting(rt)
                await rt.send(conv.id, "Never touch the migrations folder.", pinned=True)
                updates: list[Update] = []
                replies = 1
                while (await rt.state(conv.id)).generation == 1:
                    await turn(rt, conv.id, f"Part {replies}: {PART}", updates)
                    replies += 1
                sent = [r.body for r in server.message_requests()]
        assert len(sent) == replies + 1  # the reply in which the provider compacted took two
        asked, went_on = sent[-2], sent[-1]
        assert compact_edits(asked)[0]["pause_after_compaction"] is True
        history = went_on["messages"]
        kinds = [[b["type"] for b in m["content"]] for m in history]
        assert kinds[1] == ["compaction"]  # after the placeholder the API drops
        carried = [b["text"] for b in history[2]["content"]]
        assert carried[0] == "Never touch the migrations folder."
        assert carried[-1] == f"Part {replies - 1}: {PART}"  # the turn that was asked

    asyncio.run(main())


def test_a_compaction_without_a_summary_falls_back_to_segues_own(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    async def main() -> None:
        with FakeAnthropicServer(default=MessageReply(text="Noted.")) as server:
            server.summarise = lambda _request: None  # the provider's summary fails
            async with claude(server, make_store(), tmp_path / "archive") as rt:
                conv = await compacting(rt)
                updates: list[Update] = []
                for index in range(8):
                    await turn(rt, conv.id, f"Part {index}: {PART}", updates)
                state = await rt.state(conv.id)
                messages = await rt.messages(conv.id)
                sent = [r.body for r in server.message_requests()]
        fallbacks = [u for u in updates if isinstance(u, FallbackUpdate)]
        assert len(fallbacks) == 1  # said once
        assert state.compaction_fallback
        assert state.phase.kind == "idle"
        assert state.generation > 1  # segue compacted it since
        summaries = [m.message for m in messages if m.kind == "summary"]
        assert summaries
        assert all(not m.content for m in summaries)  # segue's own, no provider block
        assert not any("provider" in m.text for m in summaries)
        assert any(COMPACTION_INSTRUCTION in json.dumps(body) for body in sent)
        users = [m.text for m in messages if m.kind == "user"]
        assert users == [f"Part {index}: {PART}" for index in range(8)]
        after_fallback = sent[sent.index(next(b for b in sent if compact_edits(b))) + 1 :]
        assert after_fallback
        assert not any(compact_edits(body) for body in sent[-3:])

    asyncio.run(main())


@pytest.mark.parametrize("how", ["refused", "unexpected stop"])
def test_a_provider_that_cannot_compact_costs_the_turn_nothing(how: str, tmp_path: Path) -> None:
    async def main() -> None:
        with FakeAnthropicServer(default=MessageReply(text="Noted.")) as server:
            if how == "refused":
                server.refuse_compaction = True
            else:
                server.enqueue(MessageReply(text="", stop_reason="compaction"))
            async with claude(server, SqliteStore(tmp_path / "db"), tmp_path / "a") as rt:
                conv = await compacting(rt)
                updates: list[Update] = []
                state = await turn(rt, conv.id, "Hello?", updates)
                sent = [r.body for r in server.message_requests()]
                messages = await rt.messages(conv.id)
        assert [u.kind for u in updates if isinstance(u, FallbackUpdate)] == ["fallback"]
        assert (state.phase.kind, state.compaction_fallback) == ("idle", True)
        assert [m.kind for m in messages] == ["user", "assistant"]
        assert messages[-1].text == "Noted."
        assert compact_edits(sent[0])
        assert not compact_edits(sent[-1])  # asked again, without the compaction

    asyncio.run(main())


def test_a_manual_compaction_asks_the_provider_at_the_current_size(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeAnthropicServer(default=MessageReply(text="Noted.")) as server:
            async with claude(server, SqliteStore(tmp_path / "db"), tmp_path / "a") as rt:
                small = await compacting(rt)
                await rt.send(small.id, "A short question.")
                await rt.continue_manually(small.id)  # below 50,000: segue compacts
                segue = server.message_requests()[-1].body
                big = await compacting(
                    rt, summary_prompt="Keep the decisions.", continuation_threshold=0.7
                )
                for index in range(5):  # about 60,000 tokens: the provider has not compacted
                    await rt.send(big.id, f"Part {index}: {PART}")
                size = (await rt.state(big.id)).context_tokens
                state = await rt.continue_manually(big.id, focus="the tides")
                asked = server.message_requests()[-1].body
                report = await rt.usage(big.id)
        assert COMPACTION_INSTRUCTION in json.dumps(segue)
        assert not compact_edits(segue)
        (edit,) = compact_edits(asked)
        assert size is not None
        assert edit["trigger"]["value"] <= size
        assert edit["pause_after_compaction"] is True
        assert edit["instructions"].startswith("Keep the decisions.")
        assert "the tides" in edit["instructions"]
        assert (state.phase.kind, state.generation) == ("idle", 2)
        assert report.by_purpose["provider_compaction"].output_tokens > 0
        assert "compaction" not in report.by_purpose  # no summary request of segue's

    asyncio.run(main())


def test_context_edits_are_sent_and_what_they_cleared_is_told(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    clear = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 20_000},
        "keep": {"type": "tool_uses", "value": 1},
    }

    async def read(tool_input: dict[str, Any]) -> str:
        return PART[:18_000]

    async def main() -> None:
        reading = [MessageReply(text="", tool_uses=(ToolUse("read", {"n": n}),)) for n in range(4)]
        with FakeAnthropicServer(default=MessageReply(text="Done.")) as server:
            server.enqueue(*reading)
            async with (
                anthropic.AsyncAnthropic(api_key=KEY, base_url=server.url) as client,
                Runtime(
                    store=make_store(),
                    llm=AnthropicModel(client),
                    tools=[Tool(name="read", description="Read.", function=read)],
                ) as rt,
            ):
                conv = await rt.create_conversation(
                    model=CLAUDE, context_window=WINDOW, context_edits=[clear]
                )
                updates: list[Update] = []
                state = await turn(rt, conv.id, "Read the four logs.", updates)
                sent = list(server.message_requests())
        edited = [u for u in updates if isinstance(u, ContextEditedUpdate)]
        assert edited
        assert all(u.strategy == "clear_tool_uses_20250919" for u in edited)
        assert all(u.cleared_input_tokens > 0 for u in edited)
        assert all(r.body["context_management"]["edits"] == [clear] for r in sent)
        assert all("context-management-2025-06-27" in r.headers["anthropic-beta"] for r in sent)
        # The meter follows the usage of the response that read the cleared context.
        meters = [u.tokens for u in updates if u.kind == "occupancy" and u.measured]
        assert state.context_tokens == meters[-1] < 30_000

    asyncio.run(main())


def test_claude_options_the_provider_cannot_honour_are_refused(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeAnthropicServer() as server:
            async with claude(server, SqliteStore(tmp_path / "db"), tmp_path / "a") as rt:
                with pytest.raises(UnsupportedOptionError, match="claude-haiku-4-5"):
                    await compacting(rt, model="claude-haiku-4-5")
                with pytest.raises(UnsupportedOptionError, match="clear_thinking"):
                    await rt.create_conversation(
                        model="claude-3-5-haiku-20241022",
                        context_edits=[{"type": "clear_thinking_20251015"}],
                    )
                assert (await rt.list_conversations()).conversations == ()

    asyncio.run(main())


# --------------------------------------------------------------------------- OpenAI


def test_the_openai_compaction_item_goes_back_verbatim_with_store_false(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    async def main() -> None:
        with FakeOpenAIServer(default=Reply(text="Noted.")) as server:
            async with gpt(server, make_store(), tmp_path / "archive") as rt:
                conv = await compacting(rt, model=GPT)
                updates: list[Update] = []
                index = 0
                while (await rt.state(conv.id)).generation == 1:
                    await turn(rt, conv.id, f"Part {index}: {PART}", updates)
                    index += 1
                compacted_at = len(server.model_requests())
                for later in range(3):
                    await turn(rt, conv.id, f"Later {later}.", updates)
                requests = [r.body for r in server.model_requests()]
                state = await rt.state(conv.id)
        item = next(
            i for i in _output_items(server) if i["type"] == "compaction"
        )  # as the provider returned it
        for body in requests[compacted_at:]:
            assert body["store"] is False
            assert body["input"][0] == item  # verbatim, first, what preceded it dropped
        assert requests[0]["context_management"] == [
            {"type": "compaction", "compact_threshold": THRESHOLD}
        ]
        assert state.context_tokens is not None
        assert state.context_tokens < THRESHOLD

    asyncio.run(main())


def _output_items(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    """The compaction items the fake put in its answers, read back from what segue sent."""
    return [
        item
        for request in server.model_requests()
        for item in request.body["input"]
        if isinstance(item, dict) and item.get("type") == "compaction"
    ]


def test_a_manual_compaction_on_openai_uses_responses_compact(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeOpenAIServer(default=Reply(text="Noted.")) as server:
            async with gpt(server, SqliteStore(tmp_path / "db"), tmp_path / "a") as rt:
                conv = await compacting(rt, model=GPT)
                await rt.send(conv.id, "When is high tide?")
                state = await rt.continue_manually(conv.id)
                await rt.send(conv.id, "And low tide?")
                paths = [r.path for r in server.requests if r.method == "POST"]
                last = server.model_requests()[-1].body
                report = await rt.usage(conv.id)
                with pytest.raises(UnsupportedOptionError, match="summary_prompt"):
                    await compacting(rt, model=GPT, summary_prompt="Keep the dates.")
        assert paths.count("/v1/responses/compact") == 1
        assert state.generation == 2
        kinds = [i.get("type") for i in last["input"]]
        assert kinds[:2] == ["message", "compaction"]  # the window compact kept, then its item
        assert report.by_purpose["provider_compaction"].input_tokens > 0

    asyncio.run(main())


def test_chat_completions_cannot_have_the_provider_compact(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeOpenAIServer() as server:
            async with (
                openai.AsyncOpenAI(api_key=KEY, base_url=server.url) as client,
                Runtime(store=SqliteStore(tmp_path / "db"), llm=OpenAIModel(client)) as rt,
            ):
                with pytest.raises(UnsupportedOptionError, match="compaction"):
                    await compacting(rt, model=GPT)

    asyncio.run(main())


# --------------------------------------------------------------------------- a crash

DYING_CHILD = """
import asyncio
import os
import signal
import sys

import anthropic

from segue.executor.models.anthropic import AnthropicModel
from segue.executor.runtime import Runtime
from segue.executor.stores.postgres import PostgresStore
from segue.executor.stores.sqlite import SqliteStore


def dying(base):
    class Dying(base):
        async def commit(self, commit):
            # The provider's answer, compaction and all, is here: die before it is stored.
            if commit.event_kind == "llm_response" and '"compactions":[{' in commit.event_json:
                print("KILLED", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return await super().commit(commit)

    return Dying


async def main(where, url, archive, conversation_id, part):
    store = dying(PostgresStore)(where) if where.startswith("host=") else dying(SqliteStore)(where)
    async with anthropic.AsyncAnthropic(api_key="test", base_url=url, max_retries=0) as client:
        async with Runtime(store=store, llm=AnthropicModel(client), archive_dir=archive) as rt:
            await rt.create_conversation(
                model="claude-sonnet-4-6",
                conversation_id=conversation_id,
                behavior="compact_in_place",
                compaction="provider",
                context_window=100_000,
                warning_threshold=0.5,
                continuation_threshold=0.6,
            )
            for index in range(10):
                await rt.send(conversation_id, f"Part {index}: " + part)
    print("FINISHED", flush=True)


asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_kill_between_the_compacting_answer_and_its_commit_records_it_once(
    where: str, tmp_path: Path
) -> None:
    """kill -9 after the provider answered with its compaction, before the answer was stored:
    nothing of it is in the store, and recovery asks again and records the compaction once."""
    conversation_id = "crash-compaction"
    script = tmp_path / "child.py"
    script.write_text(DYING_CHILD, encoding="utf-8")
    with FakeAnthropicServer(default=MessageReply(text="Noted.")) as server:
        child = subprocess.run(  # noqa: S603  # our own interpreter on our own script
            [
                sys.executable,
                str(script),
                *(where, server.url, str(tmp_path / "archive"), conversation_id, PART),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert child.returncode == -signal.SIGKILL, child.stderr
        assert "KILLED" in child.stdout
        assert "FINISHED" not in child.stdout
        asked = len(server.message_requests())

        async def main() -> None:
            store = open_store(where)
            try:
                before = await store.load(conversation_id)
            finally:
                await store.close()
            assert (before.state.generation, before.state.phase.kind) == (1, "llm_requesting")
            assert [p.effect.kind for p in before.pending] == ["request_llm"]
            async with claude(server, open_store(where), tmp_path / "archive") as rt:  # recovers
                state = await rt.state(conversation_id)
                messages = await rt.messages(conversation_id)
                assert await rt.store.with_pending() == []
            assert (state.phase.kind, state.generation, state.continuations) == ("idle", 2, 1)
            assert [m.kind for m in messages].count("summary") == 1
            assert messages[-1].kind == "assistant"
            assert messages[-2].kind == "summary"

        asyncio.run(main())
        sent = server.message_requests()
    assert len(sent) == asked + 1  # the lost answer asked once more, nothing else
    assert sent[-1].body["messages"] == sent[-2].body["messages"]
    assert len(list((tmp_path / "archive").iterdir())) == 1


# --------------------------------------------------------------------------- the page

PROVIDERS_PAGE: Final = Path(__file__).resolve().parents[1] / "docs" / "providers.md"


def page_examples() -> list[str]:
    """The Python examples of the page's section on the providers' own compaction."""
    text = PROVIDERS_PAGE.read_text(encoding="utf-8")
    section = text[text.index("## What the providers do to the context themselves") :]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


@pytest.mark.parametrize("index", range(3))
def test_the_pages_examples_run_as_written(index: int, tmp_path: Path) -> None:
    """Against the fakes, as an application reaches a compatible server (the SDKs' base-URL
    variables), each example runs, quietly."""
    example = page_examples()[index]
    with (
        FakeAnthropicServer(default=MessageReply(text="Noted.")) as claude_api,
        FakeOpenAIServer(default=Reply(text="Noted.")) as openai_api,
    ):
        env = {
            "ANTHROPIC_API_KEY": KEY,
            "ANTHROPIC_BASE_URL": claude_api.url,
            "OPENAI_API_KEY": KEY,
            "OPENAI_BASE_URL": openai_api.url,
            "HOME": str(tmp_path),  # archives, if any, stay in the test's directory
        }
        result = run_as_a_user_does(example, tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert len(page_examples()) == 3


class _Compacting(ScriptedModel):
    """The offline model as an adapter whose provider compacts: its second answer comes with
    the provider's compaction."""

    def context_support(self, model: str) -> ContextSupport:
        return ContextSupport(compaction=True)


class _Flaky(MemoryStore):
    """A store that fails the commit of the compacting answer ``fails`` times in a row, the
    first time after writing it when ``written`` (as when a commit's reply is lost)."""

    def __init__(self, *, fails: int, written: bool) -> None:
        super().__init__()
        self.fails = fails
        self.written = written

    async def commit(self, commit: Commit) -> StoredConversation:
        if '"compactions":[{' in commit.event_json and self.fails > 0:
            self.fails -= 1
            if self.written:
                self.written = False
                await super().commit(commit)
            raise StoreUnavailableError("the database went away")
        return await super().commit(commit)


@pytest.mark.parametrize(
    ("fails", "written"), [(1, True), (6, False)], ids=["reply lost", "store down"]
)
def test_an_answer_kept_after_a_failed_commit_records_its_compaction_once(
    fails: int, written: bool
) -> None:
    """The answer and the compaction it came with are one event: committed again after a
    failure (or found committed already), the compaction is never recorded twice, and the
    provider is not asked again."""
    block = CompactionBlock(provider="anthropic", content="Tides so far.", signature="sig")
    compacting_reply = LlmReply(
        text="High tide at noon.",
        usage=Usage(input_tokens=300, output_tokens=40),
        compactions=(ProviderCompaction(summary="Tides so far.", block=block),),
    )

    async def main() -> None:
        model = _Compacting([LlmReply(text="Low tide at six."), compacting_reply])
        store = _Flaky(fails=fails, written=written)
        async with Runtime(store=store, llm=model, archive_dir=None) as rt:
            conv = await compacting(rt, model="claude-sonnet-4-5")
            await rt.send(conv.id, "When is low tide?")
            if fails > 1:  # the store stayed down: the answer is kept for the next drive
                with pytest.raises(StoreUnavailableError):
                    await rt.send(conv.id, "And high tide?")
                await rt.recover()
            else:
                await rt.send(conv.id, "And high tide?")
            state = await rt.state(conv.id)
            kinds = [m.kind for m in await rt.messages(conv.id)]
        assert (state.generation, state.continuations, state.phase.kind) == (2, 1, "idle")
        assert kinds == ["user", "assistant", "user", "summary", "assistant"]
        assert len(model.requests) == 2  # committed as it was kept, never asked again

    asyncio.run(main())
