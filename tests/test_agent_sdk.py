"""``segue.agent_sdk`` end to end: a ``Runtime`` hosting Claude Agent SDK sessions, with the real
SDK and its bundled Claude Code CLI, which runs offline against the fake Anthropic server.

Nothing is mocked: the CLI runs its real agent loop (its real Bash tool included), compacts with
its real ``/compact``, writes its real session files under a temporary ``HOME``; the fake server
plays the model (``Agent`` below answers by what each request asks). Run them alone with
``pytest -m agent_sdk``.
"""

from __future__ import annotations

import asyncio
import json
import stat
import traceback
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    ResultMessage,
    StreamEvent,
    SystemMessage,
)
from claude_agent_sdk import TextBlock as SdkText
from claude_agent_sdk import ToolResultBlock as SdkToolResult
from claude_agent_sdk import ToolUseBlock as SdkToolUse
from claude_agent_sdk import UserMessage as SdkUser

from scripts import run_script
from segue import (
    ContextExhaustionBehavior,
    ErrorKind,
    MemoryStore,
    Runtime,
    ScriptedModel,
    SqliteStore,
)
from segue.agent_sdk import CONTINUE_PROMPT, AgentSdkModel, archive_transcript
from segue.agent_sdk._reading import QueryReader, summary_of
from segue.executor.errors import LlmCallError
from segue.executor.instructions import CONTINUATION_INSTRUCTION
from segue.executor.model_port import LlmReply, LlmRequest
from segue.executor.subagent import subagent_tool
from segue.statemachine import Message, ToolCall
from segue.testing.anthropic_server import (
    FakeAnthropicServer,
    MessageReply,
    RecordedRequest,
    Reply,
    ToolUse,
    Usage,
    overloaded,
)

pytestmark = [pytest.mark.agent_sdk, pytest.mark.slow]
T = TypeVar("T")
MODEL = "claude-sonnet-4-6"
WINDOW = 200_000  # the CLI's own window for this model; segue's threshold: 180,000
B = ContextExhaustionBehavior
SUMMARY_ASK = "Your task is to create a detailed summary of the conversation so far"
CHECKPOINT = (
    "<checkpoint>\n## Goal\nMigrate the tests.\n## Completed Work\nstep 1, step 2\n"
    "## Remaining Tasks\nstep 3\n</checkpoint>"
)


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine

    return asyncio.run(main())


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the last user message of a request body (string or blocks)."""
    for message in reversed(body.get("messages") or []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        return "\n".join(
            str(block.get("text", "")) for block in content or () if block.get("type") == "text"
        )
    return ""


def all_text(body: dict[str, Any]) -> str:
    return json.dumps(body.get("messages") or [])


def bash(command: str) -> ToolUse:
    return ToolUse("Bash", {"command": command, "description": command})


def step(tokens: int, *tools: ToolUse, text: str = "") -> MessageReply:
    """A main-loop answer whose usage says ``tokens`` of occupancy (cache reads, mostly)."""
    usage = Usage(input_tokens=1_000, cache_read_input_tokens=tokens - 1_010, output_tokens=10)
    stop = "tool_use" if tools else "end_turn"
    return MessageReply(
        text=text or ("Working." if tools else "Done."),
        tool_uses=tools,
        usage=usage,
        stop_reason=stop,
    )


@dataclass
class Agent:
    """The model behind the CLI: summary and checkpoint requests by their prompt, and the main
    loop's requests from ``turns`` in order (the CLI makes requests of its own, so a queue in
    arrival order would be consumed by the wrong ones)."""

    turns: list[Reply] = field(default_factory=list)
    summary: str = "The user is migrating tests; steps 1 and 2 are done."
    checkpoint: str = CHECKPOINT
    continuation: str = "We migrated two test files; the third is next."
    main_requests: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, body: dict[str, Any]) -> Reply:
        asked = last_user_text(body)
        small = Usage(input_tokens=2_000, output_tokens=200)
        if SUMMARY_ASK in asked:
            return MessageReply(
                text=f"<analysis>notes</analysis>\n<summary>{self.summary}</summary>", usage=small
            )
        if "CHECKPOINT REQUIRED" in asked:
            return MessageReply(text=self.checkpoint, usage=small)
        if CONTINUATION_INSTRUCTION[:60] in asked:
            return MessageReply(text=self.continuation, usage=small)
        self.main_requests.append(body)
        if not self.turns:
            return MessageReply(text="Nothing more to do.", usage=small)
        return self.turns.pop(0)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The CLI's HOME and working directory (its session files land here)."""
    place = tmp_path / "home"
    place.mkdir()
    return place


@pytest.fixture
def agent() -> Agent:
    return Agent()


@pytest.fixture
def server(agent: Agent) -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer(default=agent) as running:
        yield running


def sdk_options(server: FakeAnthropicServer, home: Path, **env: str) -> ClaudeAgentOptions:
    return ClaudeAgentOptions(
        env={
            "ANTHROPIC_BASE_URL": server.url,
            "ANTHROPIC_API_KEY": "test",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "HOME": str(home),
            "CLAUDE_CODE_TMPDIR": str(home / "tmp"),
            "CLAUDE_CODE_MAX_RETRIES": "0",  # segue retries; the CLI's backoff would be slow
            "CLAUDE_CODE_DISABLE_THINKING": "1",
            **env,
        },
        cwd=str(home),
        allowed_tools=["Bash"],
        setting_sources=[],
    )


def sdk_model(server: FakeAnthropicServer, home: Path, **env: str) -> AgentSdkModel:
    return AgentSdkModel(
        sdk_options(server, home, **env),
        archive_dir=home.parent / "archives",
        context_window=WINDOW,
    )


def session_of(request: RecordedRequest) -> str:
    return request.headers["x-claude-code-session-id"]


async def create(rt: Runtime, behavior: ContextExhaustionBehavior, **settings: Any) -> str:
    state = await rt.create_conversation(model=MODEL, behavior=behavior, **settings)
    assert state.context_window == WINDOW  # the adapter's, not segue's table's 1,000,000
    return state.id


# --------------------------------------------------------------------------- a turn


def test_a_turn_measures_one_response_once_and_records_the_tools_the_sdk_ran(
    server: FakeAnthropicServer, agent: Agent, home: Path
) -> None:
    """One response with text and two tool calls arrives as three AssistantMessages that repeat
    one usage: it counts once. The query's ResultMessage sums both API calls: never read."""
    agent.turns += [step(50_000, bash("echo alpha"), bash("echo beta")), step(55_000)]

    async def scenario() -> None:
        async with Runtime(store=MemoryStore(), llm=sdk_model(server, home)) as rt:
            cid = await create(rt, B.THRESHOLD_BASED_CONTINUATION)
            streamed, meters, reply, tools = "", [], None, []
            async for update in rt.stream(cid, "Run the two echoes."):
                if update.kind == "text":
                    streamed += update.text
                elif update.kind == "occupancy" and update.measured:
                    meters.append(update.tokens)
                elif update.kind in ("tool_started", "tool_finished"):
                    tools.append((update.kind, update.name))
                elif update.kind == "done":
                    reply, state = update.reply, update.state
            # The SDK's own tools are told as they run, as segue's own are.
            assert sorted(tools) == [("tool_finished", "Bash")] * 2 + [("tool_started", "Bash")] * 2
            assert tools[0] == ("tool_started", "Bash")
            assert state.context_tokens == 55_000  # the last response, whole (output included)
            assert meters[-1] == 55_000
            assert reply == streamed == "Working.\n\nDone."
            (answer,) = [m.message for m in await rt.messages(cid) if m.kind == "assistant"]
            kinds = [block.type for block in answer.content]
            assert kinds.count("agent_tool_use") == 2
            results = [b for b in answer.content if b.type == "agent_tool_result"]
            assert sorted(r.output.strip() for r in results) == ["alpha", "beta"]  # really ran
            assert state.provider_session == session_of(server.message_requests()[0])

    run(scenario())


def test_a_restarted_host_resumes_the_same_sdk_session(
    server: FakeAnthropicServer, agent: Agent, home: Path, tmp_path: Path
) -> None:
    """The session id is part of the stored state: a new Runtime (a restarted host, a new
    adapter) resumes the SDK session, whose history the CLI sends again."""
    agent.turns += [step(10_000, text="Noted: PELICAN."), step(12_000, text="It was PELICAN.")]
    database = tmp_path / "host.db"

    async def first() -> str:
        async with Runtime(store=SqliteStore(database), llm=sdk_model(server, home)) as rt:
            cid = await create(rt, B.CHECKPOINT_RESTART)
            await rt.send(cid, "Remember the word PELICAN.")
            return cid

    async def second(cid: str) -> None:
        async with Runtime(store=SqliteStore(database), llm=sdk_model(server, home)) as rt:
            state = await rt.send(cid, "What was the word?")
            assert await rt.last_reply(cid) == "It was PELICAN."
            assert state.context_tokens == 12_000

    cid = run(first())
    run(second(cid))
    before, after = server.message_requests()
    assert session_of(after) == session_of(before)
    assert "Remember the word PELICAN." in all_text(after.body)  # the history came back


def test_a_session_the_sdk_lost_goes_on_in_a_new_one_with_segues_record(
    server: FakeAnthropicServer, agent: Agent, home: Path
) -> None:
    agent.turns += [step(10_000, text="Noted: PELICAN."), step(12_000, text="PELICAN.")]

    async def scenario() -> None:
        async with Runtime(store=MemoryStore(), llm=sdk_model(server, home)) as rt:
            cid = await create(rt, B.CHECKPOINT_RESTART)
            await rt.send(cid, "Remember the word PELICAN.")
            for transcript in (home / ".claude" / "projects").rglob("*.jsonl"):
                transcript.unlink()  # the SDK's record is gone
            state = await rt.send(cid, "What was the word?")
            assert state.phase.kind == "idle"
            assert await rt.last_reply(cid) == "PELICAN."
            first, last = server.message_requests()[0], server.message_requests()[-1]
            assert session_of(last) != session_of(first)
            assert state.provider_session == session_of(last)
            sent = all_text(last.body)
            assert "Remember the word PELICAN." in sent  # from segue's own transcript
            assert "Noted: PELICAN." in sent

    run(scenario())


def test_an_api_error_is_retried_by_segue(
    server: FakeAnthropicServer, agent: Agent, home: Path
) -> None:
    agent.turns += [overloaded(), step(9_000, text="Recovered.")]

    async def scenario() -> None:
        async with Runtime(store=MemoryStore(), llm=sdk_model(server, home)) as rt:
            cid = await create(rt, B.THRESHOLD_BASED_CONTINUATION)
            state = await rt.send(cid, "Hello.")
            assert state.phase.kind == "idle"
            assert await rt.last_reply(cid) == "Recovered."
            assert len(server.message_requests()) == 2

    run(scenario())


def test_a_cli_that_cannot_start_is_fatal_and_shows_no_credential(tmp_path: Path) -> None:
    """The port's promise holds here too: the SDK's failure comes out as an ``LlmCallError``,
    and the credentials the CLI was given appear nowhere in its chain (here a path holds one,
    which the SDK's error and the ``OSError`` below it both show)."""
    key = "sk-ant-sdk-DO-NOT-LEAK-0123456789"
    options = ClaudeAgentOptions(
        cli_path=str(tmp_path / key / "claude"), env={"ANTHROPIC_API_KEY": key}
    )
    model = AgentSdkModel(options, archive_dir=tmp_path / "archives")
    request = LlmRequest(
        conversation_id="c",
        model=MODEL,
        purpose="turn",
        system=None,
        messages=(Message(kind="user", text="Hello."),),
    )
    with pytest.raises(LlmCallError) as info:
        run(model.complete(request))
    assert info.value.fatal
    assert "not found" in info.value.message
    assert key not in "".join(traceback.format_exception(info.value))


# --------------------------------------------------------------------------- at the limit


def test_checkpoint_restart_stops_the_query_at_the_threshold_and_starts_a_new_session(
    server: FakeAnthropicServer, agent: Agent, home: Path
) -> None:
    """An autonomous query is interrupted by the response that reaches 90%, not after it ran
    on; the same session is asked for a checkpoint with no tools; a new SDK session (no resume)
    starts at once from the continuation prompt; one more crossing is past the bound."""
    agent.turns += [
        step(100_000, bash("echo step1")),
        step(185_000, bash("echo step2")),  # crosses 180,000: the query stops here
        step(150_000, bash("echo never")),  # what the model would have asked next
    ]

    async def scenario() -> None:
        async with Runtime(store=MemoryStore(), llm=sdk_model(server, home)) as rt:
            cid = await create(rt, B.CHECKPOINT_RESTART, max_continuations=1)
            agent.turns.insert(2, step(20_000, text="Step 3 done."))  # the new session's answer
            state = await rt.send(cid, "Run every step.")
            assert (state.phase.kind, state.session, state.continuations) == ("idle", 2, 1)
            assert state.context_tokens == 20_000
            requests = server.message_requests()
            # Two main-loop calls, then the checkpoint, then the new session's first call.
            assert len(requests) == 4
            first, crossing, checkpoint, fresh = requests
            assert session_of(first) == session_of(crossing) == session_of(checkpoint)
            assert checkpoint.body["tools"] == []
            assert "CHECKPOINT REQUIRED" in last_user_text(checkpoint.body)
            assert session_of(fresh) != session_of(first)
            assert "Migrate the tests." in all_text(fresh.body)  # the checkpoint seeds it
            assert "Run every step." not in all_text(fresh.body)  # ... and the old history not
            assert state.provider_session == session_of(fresh)
            kinds = [m.kind for m in await rt.messages(cid)]
            assert "checkpoint" in kinds
            # Past the bound (max_continuations=1), the next crossing fails instead of looping.
            agent.turns[:] = [step(190_000, bash("echo again"))]
            state = await rt.send(cid, "Keep going.")
            assert state.phase.kind == "failed"
            assert state.phase.error_kind is ErrorKind.CONTINUATION_LIMIT

    run(scenario())


def test_threshold_continuation_summarises_and_the_child_starts_a_new_session(
    server: FakeAnthropicServer, agent: Agent, home: Path
) -> None:
    agent.turns += [step(181_000, text="Here is a long answer.")]

    async def scenario() -> None:
        async with Runtime(store=MemoryStore(), llm=sdk_model(server, home)) as rt:
            cid = await create(rt, B.THRESHOLD_BASED_CONTINUATION)
            state = await rt.send(cid, "Explain everything.")
            assert state.phase.kind == "context_exhausted"
            assert state.phase.summary == agent.continuation
            asked, summary = server.message_requests()
            assert session_of(summary) == session_of(asked)
            assert summary.body["tools"] == []
            child = await rt.start_new_from(cid, seed_with_summary=True)
            agent.turns.append(step(8_000, text="Continuing."))
            done = await rt.send(child.id, "Next part, please.")
            assert done.phase.kind == "idle"
            fresh = server.message_requests()[-1]
            assert session_of(fresh) != session_of(asked)
            sent = all_text(fresh.body)
            assert agent.continuation in sent
            assert "Next part, please." in sent

    run(scenario())


def test_compact_in_place_asks_the_sdk_to_compact_after_archiving_its_transcript(
    server: FakeAnthropicServer, agent: Agent, home: Path
) -> None:
    """At the threshold segue runs the SDK's /compact; the PreCompact hook copies the session's
    transcript first (private, same extension); the summary is a new generation, and the task
    goes on in the same, compacted session, measured afresh."""
    agent.turns += [
        step(60_000, text="Read the first files."),
        step(120_000, text="Read more."),
        step(182_000, bash("echo working")),  # crosses: compaction, then the task goes on
        step(30_000, text="Finished after compaction."),
    ]
    archives = home.parent / "archives"

    async def scenario() -> None:
        async with Runtime(
            store=MemoryStore(), llm=sdk_model(server, home), archive_dir=home.parent / "segue"
        ) as rt:
            cid = await create(rt, B.COMPACT_IN_PLACE)
            await rt.send(cid, "Read the first files.")
            await rt.send(cid, "Read more.")
            state = await rt.send(cid, "Now do the work.")
            assert (state.phase.kind, state.generation) == ("idle", 2)
            assert state.context_tokens == 30_000
            assert await rt.last_reply(cid) == "Finished after compaction."
            messages = [m.message for m in await rt.messages(cid)]
            summaries = [m for m in messages if m.kind == "summary"]
            assert [m.text for m in summaries] == [agent.summary]
            requests = server.message_requests()
            compact = next(r for r in requests if SUMMARY_ASK in last_user_text(r.body))
            after = requests[-1]
            assert session_of(compact) == session_of(after) == state.provider_session
            assert agent.summary in all_text(after.body)
            assert "Read the first files." not in all_text(after.body)  # compacted away
            assert CONTINUE_PROMPT in all_text(after.body)

    run(scenario())
    (copy,) = archives.iterdir()
    assert stat.S_IMODE(archives.stat().st_mode) == 0o700
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert copy.suffix == ".jsonl"
    assert "Read the first files." in copy.read_text()  # the history the SDK compacted away


def test_the_sdk_compacting_on_its_own_is_a_new_generation_measured_by_the_next_answer(
    server: FakeAnthropicServer, agent: Agent, home: Path
) -> None:
    """With COMPACT_IN_PLACE the SDK's own auto-compaction stays on (here at 67,000 tokens of a
    100,000 window): mid-turn, the compact boundary becomes segue's new generation."""
    agent.turns += [
        step(30_000, text="One."),
        step(40_000, text="Two."),
        step(50_000, bash("echo a")),
        step(70_000, bash("echo b")),  # past the SDK's own threshold: it compacts next
        step(12_000, text="Done after the SDK compacted."),
    ]

    async def scenario() -> None:
        model = sdk_model(server, home, CLAUDE_CODE_AUTO_COMPACT_WINDOW="100000")
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            cid = await create(rt, B.COMPACT_IN_PLACE)
            await rt.send(cid, "One.")
            await rt.send(cid, "Two.")
            state = await rt.send(cid, "Three, with tools.")
            assert (state.phase.kind, state.generation, state.continuations) == ("idle", 2, 0)
            assert state.context_tokens == 12_000  # measured after the compaction
            messages = [m.message for m in await rt.messages(cid)]
            summary = next(m for m in messages if m.kind == "summary")
            assert (summary.text, summary.generation) == (agent.summary, 2)
            assert messages[-1].kind == "assistant"
            assert messages[-1].generation == 2

    run(scenario())
    assert list((home.parent / "archives").iterdir())  # auto-compaction archives too


def test_other_behaviours_turn_the_sdks_own_compaction_off(
    server: FakeAnthropicServer, agent: Agent, home: Path
) -> None:
    """The same crossing of the SDK's threshold with CHECKPOINT_RESTART: segue's policy decides,
    so the SDK does not compact behind its back."""
    agent.turns += [step(30_000), step(40_000), step(50_000, bash("echo a")), step(70_000)]

    async def scenario() -> None:
        model = sdk_model(server, home, CLAUDE_CODE_AUTO_COMPACT_WINDOW="100000")
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            cid = await create(rt, B.CHECKPOINT_RESTART)
            for text in ("One.", "Two.", "Three."):
                state = await rt.send(cid, text)
            assert (state.generation, state.context_tokens) == (1, 70_000)
            asked = [r for r in server.message_requests() if SUMMARY_ASK in last_user_text(r.body)]
            assert asked == []

    run(scenario())


def test_a_sub_agent_session_fails_at_its_limit_and_the_parent_respawns_it(
    server: FakeAnthropicServer, agent: Agent, home: Path, tmp_path: Path
) -> None:
    """A parent (any model) delegates to SDK sub-agents: one that reaches its threshold ends
    Failed(CONTEXT_EXHAUSTED), the parent is told as with any sub-agent and spawns another."""
    agent.turns += [step(190_000, bash("echo huge")), step(9_000, text="The title is Lorem.")]
    big = ToolCall(id="toolu_big", name="subagent", input={"task": "Read everything."})
    small = ToolCall(id="toolu_small", name="subagent", input={"task": "Just the title."})
    parent_model = ScriptedModel(
        [
            LlmReply(text="Delegating.", tool_calls=(big,), stop_reason="tool_use"),
            LlmReply(text="Narrower.", tool_calls=(small,), stop_reason="tool_use"),
            LlmReply(text="The title is Lorem."),
        ]
    )
    database = tmp_path / "shared.db"

    async def scenario() -> None:
        async with (
            Runtime(store=SqliteStore(database), llm=sdk_model(server, home)) as agents,
            Runtime(store=SqliteStore(database), llm=parent_model) as parents,
        ):
            parents.tools.add(subagent_tool(agents, model=MODEL))
            parent = await parents.create_conversation(model="claude-sonnet-4-5")
            state = await parents.send(parent.id, "Find the title with a sub-agent.")
            assert state.phase.kind == "idle"
            results = [
                m.message for m in await parents.messages(parent.id) if m.kind == "tool_result"
            ]
            assert results[0].is_error
            assert "context_exhausted" in results[0].text
            assert not results[1].is_error
            assert results[1].text == "The title is Lorem."
            children = [
                c.state for c in await agents.store.list_conversations() if c.state.parent_id
            ]
            first, second = children
            assert first.phase.kind == "failed"
            assert first.phase.error_kind is ErrorKind.CONTEXT_EXHAUSTED
            assert second.phase.kind == "idle"

    run(scenario())


def test_an_archive_that_fails_never_blocks_the_sdks_compaction(
    server: FakeAnthropicServer, agent: Agent, home: Path
) -> None:
    agent.turns += [step(60_000), step(120_000), step(182_000), step(30_000, text="After.")]
    blocked = home.parent / "not-a-directory"
    blocked.write_text("a file where the archive directory should be")

    async def scenario() -> None:
        model = AgentSdkModel(
            sdk_options(server, home), archive_dir=blocked / "archives", context_window=WINDOW
        )
        async with Runtime(store=MemoryStore(), llm=model, archive_dir=home.parent / "s") as rt:
            cid = await create(rt, B.COMPACT_IN_PLACE)
            for text in ("One.", "Two.", "Three."):
                state = await rt.send(cid, text)
            assert (state.phase.kind, state.generation) == ("idle", 2)

    run(scenario())


# --------------------------------------------------------------------------- the reading rules
# The SDK's own message types, built as the SDK builds them from the CLI's output.


def assistant(
    message_id: str, usage: dict[str, int], *blocks: Any, parent: str | None = None
) -> Any:
    return AssistantMessage(
        content=list(blocks),
        model=MODEL,
        usage=usage,
        message_id=message_id,
        parent_tool_use_id=parent,
    )


def stream(event: dict[str, Any], parent: str | None = None) -> StreamEvent:
    return StreamEvent(uuid="u", session_id="s", event=event, parent_tool_use_id=parent)


def test_one_response_counts_once_whatever_the_number_of_its_messages() -> None:
    reader = QueryReader(stop_at=100_000)
    usage = {"input_tokens": 40_000, "cache_read_input_tokens": 30_000, "output_tokens": 1}
    for block in (SdkText("Looking."), SdkToolUse("t1", "Bash", {}), SdkToolUse("t2", "Bash", {})):
        assert not reader.take(assistant("msg_1", usage, block))
    assert reader.occupancy == 70_001  # not 210,003
    reader.take(SdkUser(content=[SdkToolResult("t1", "ok")]))
    reader.take(assistant("msg_2", {"input_tokens": 20_000, "cache_read_input_tokens": 60_000}))
    assert reader.occupancy == 80_000  # the latest response alone, never a sum
    aggregate = {"input_tokens": 60_000, "cache_read_input_tokens": 90_000, "output_tokens": 20}
    reader.take(ResultMessage("success", 1, 1, False, 2, "s", usage=aggregate))
    assert reader.occupancy == 80_000  # the query's aggregate is not occupancy
    assert reader.text == "Looking."


def test_a_response_reaching_the_threshold_stops_the_query_once() -> None:
    reader = QueryReader(stop_at=150_000)
    assert not reader.take(assistant("msg_1", {"input_tokens": 149_999}))
    assert reader.take(assistant("msg_2", {"input_tokens": 150_000}))
    assert not reader.take(assistant("msg_3", {"input_tokens": 170_000}))  # told once


def test_the_streamed_output_count_refines_the_response_it_belongs_to() -> None:
    texts: list[str] = []
    reader = QueryReader(stop_at=100_000, on_text=texts.append)
    start: dict[str, Any] = {"id": "msg_1", "usage": {"input_tokens": 99_000, "output_tokens": 1}}
    reader.take(stream({"type": "message_start", "message": start}))
    reader.take(stream({"type": "content_block_start", "content_block": {"type": "text"}}))
    reader.take(
        stream({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "a"}})
    )
    reader.take(assistant("msg_1", start["usage"], SdkText("a")))
    assert reader.occupancy == 99_001
    reached = reader.take(stream({"type": "message_delta", "usage": {"output_tokens": 1_000}}))
    assert reached
    assert reader.occupancy == 100_000
    reader.take(stream({"type": "content_block_start", "content_block": {"type": "text"}}))
    reader.take(
        stream({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "b"}})
    )
    reader.take(assistant("msg_2", {"input_tokens": 10}, SdkText("b")))
    assert "".join(texts) == reader.text == "a\n\nb"


def test_a_sub_agents_messages_are_not_the_sessions() -> None:
    reader = QueryReader(stop_at=50_000)
    reader.take(assistant("msg_1", {"input_tokens": 10_000}, SdkText("Delegating.")))
    reader.take(assistant("msg_s", {"input_tokens": 90_000}, SdkText("sub"), parent="toolu_task"))
    reader.take(
        stream(
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}},
            "toolu_task",
        )
    )
    assert (reader.occupancy, reader.text, reader.reached) == (10_000, "Delegating.", False)


def test_a_compaction_is_read_and_the_next_response_measures_the_context_again() -> None:
    reader = QueryReader()
    reader.take(assistant("msg_1", {"input_tokens": 160_000}, SdkText("Before.")))
    meta = {"trigger": "auto", "pre_tokens": 160_050, "post_tokens": 9_000}
    reader.take(SystemMessage("compact_boundary", {"compact_metadata": meta}))
    assert reader.usage is None  # unknown until a response measures the compacted context
    written = (
        "This session is being continued from a previous conversation that ran out of context. "
        "The summary below covers the earlier portion of the conversation.\n\nSummary:\n"
        "1. The user wants the parser.\n\nIf you need specific details from before compaction, "
        "read the full transcript at: /x.jsonl"
    )
    reader.take(SdkUser(content=written))
    reader.take(assistant("msg_2", {"input_tokens": 12_000}, SdkText("After.")))
    (compaction,) = reader.compactions
    assert compaction.summary == "1. The user wants the parser."
    assert (compaction.trigger, compaction.pre_tokens, compaction.post_tokens) == (
        "auto",
        160_050,
        9_000,
    )
    assert reader.occupancy == 12_000
    assert summary_of("no wrapping at all") == "no wrapping at all"


def test_a_query_without_per_response_usage_says_nothing_about_occupancy() -> None:
    """No usage on any response: the reply's usage is None, and the core keeps the last figure
    (REQ-SEG-002) instead of reading 0 or the aggregate."""
    reader = QueryReader(stop_at=10)
    no_usage = AssistantMessage(content=[SdkText("Hi.")], model=MODEL, message_id="msg_1")
    assert not reader.take(no_usage)
    reader.take(ResultMessage("success", 1, 1, False, 1, "s", usage={"input_tokens": 99}))
    assert (reader.usage, reader.occupancy, reader.text) == (None, None, "Hi.")


def test_the_clis_own_messages_are_never_the_reply() -> None:
    reader = QueryReader()
    error = AssistantMessage(
        content=[SdkText("API Error: 529 Overloaded.")], model="<synthetic>", error="unknown"
    )
    reader.take(error)
    assert (reader.text, reader.notices) == ("", ["API Error: 529 Overloaded."])
    too_long = AssistantMessage(
        content=[SdkText("Prompt is too long")], model="<synthetic>", error="invalid_request"
    )
    reader.take(too_long)
    assert reader.overflow


# --------------------------------------------------------------------------- the archive


@pytest.mark.parametrize(
    "conversation_id", ["../../etc/passwd", "a/b", "x" * 500, "\u00e9t\u00e9 \U0001f600"]
)
def test_an_archive_is_private_and_no_id_steers_its_path(
    tmp_path: Path, conversation_id: str
) -> None:
    source = tmp_path / "session.jsonl"
    source.write_text('{"type": "user"}\n')
    directory = tmp_path / "deep" / "archives"
    path, size = run(archive_transcript(directory, source, conversation_id=conversation_id))
    assert path.parent == directory
    assert path.suffix == ".jsonl"
    assert size == source.stat().st_size
    assert path.read_bytes() == source.read_bytes()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, _ = run(archive_transcript(directory, source, conversation_id=conversation_id))
    assert again != path  # a second compaction never overwrites the first copy


def test_an_archive_of_what_is_not_a_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a file"):
        run(archive_transcript(tmp_path / "a", tmp_path / "missing.jsonl", conversation_id="c"))
    odd = tmp_path / "odd.json;rm -rf"
    odd.write_text("x")
    path, _ = run(archive_transcript(tmp_path / "a", odd, conversation_id="c"))
    assert ";" not in path.name  # an extension that is not plain letters and digits is dropped


# --------------------------------------------------------------------------- the example


@pytest.mark.parametrize(
    ("behavior", "expected"),
    [("checkpoint_restart", "stopped: segue measured"), ("compact_in_place", "the SDK compacted")],
)
def test_the_autonomous_example_runs_offline(behavior: str, expected: str) -> None:
    result = run_script("examples/agent_sdk_autonomous.py", "--steps", "16", "--behavior", behavior)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "All 16 steps are done." in result.stdout
    assert expected in result.stdout
