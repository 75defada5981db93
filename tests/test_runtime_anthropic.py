"""The runtime over the real ``anthropic.AsyncAnthropic`` client, against a local fake API.

``Runtime`` -> ``AnthropicModel`` -> the unmodified SDK -> HTTP -> ``FakeAnthropicServer``: the
occupancy the runtime acts on is what the SDK parsed from a real SSE stream, the errors are the
SDK's own after its own retries, and what the runtime asked for is what the server recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from segue import (
    CHECKPOINT_PROMPT,
    ContextExhausted,
    ContextExhaustionBehavior,
    ConversationState,
    ErrorKind,
    Failed,
    Paused,
)
from segue.executor.models.anthropic import AnthropicModel
from segue.executor.ports import Store
from segue.executor.runtime import (
    COMPACTION_INSTRUCTION,
    CONTINUATION_INSTRUCTION,
    Runtime,
)
from segue.executor.stores.memory import MemoryStore
from segue.executor.stores.sqlite import SqliteStore
from segue.executor.tools import Tool
from segue.testing.anthropic_server import (
    ErrorReply,
    FakeAnthropicServer,
    MessageReply,
    RecordedRequest,
    ToolUse,
    Usage,
    overloaded,
    prompt_too_long,
    rate_limited,
    server_error,
)
from segue.testing.logs import capture_logs

KEY = "sk-ant-runtime-test-DO-NOT-LEAK-4242424242"
MODEL = "claude-sonnet-4-6"  # the fake reports a 200k window (the static table says 1M)
WINDOW = 200_000  # thresholds: warning 160,000, continuation 180,000
Behavior = ContextExhaustionBehavior
StoreFactory = Callable[[], Store]
CROSSING = MessageReply(
    text="Here is a very long answer.",
    usage=Usage(input_tokens=900, output_tokens=300, cache_read_input_tokens=184_000),
)


async def lookup(tool_input: dict[str, Any]) -> str:
    """A tool that answers at once."""
    return f"result for {tool_input.get('query', '?')}"


LOOKUP = Tool(name="lookup", description="Look something up.", function=lookup)


class SleepRecorder:
    """The runtime's ``sleep``: records each back-off delay and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def server() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer() as fake:
        yield fake


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "memory":
        memory = MemoryStore()
        return lambda: memory
    return lambda: SqliteStore(tmp_path / "segue.db")


@contextlib.asynccontextmanager
async def connected(
    server: FakeAnthropicServer,
    store: Store,
    *,
    max_retries: int = 0,
    exact_preflight: bool = False,
    **options: Any,
) -> AsyncIterator[Runtime]:
    """A runtime whose model is ``AnthropicModel`` over a real client pointed at ``server``."""
    async with (
        anthropic.AsyncAnthropic(
            api_key=KEY, base_url=server.url, max_retries=max_retries
        ) as client,
        Runtime(
            store=store, llm=AnthropicModel(client, exact_preflight=exact_preflight), **options
        ) as rt,
    ):
        yield rt


def bodies(server: FakeAnthropicServer) -> list[dict[str, Any]]:
    """The JSON bodies of every ``POST /v1/messages`` received, in order."""
    return [request_body(r) for r in server.message_requests()]


def request_body(recorded: RecordedRequest) -> dict[str, Any]:
    body: dict[str, Any] = recorded.body
    return body


def texts(message: dict[str, Any]) -> str:
    """All text of one API message (string content or text blocks), joined."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return "\n".join(b["text"] for b in content if b["type"] == "text")


def text_blocks(message: dict[str, Any]) -> list[str]:
    content = message["content"]
    if isinstance(content, str):
        return [content]
    return [b["text"] for b in content if b["type"] == "text"]


def blocks(body: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [
        b
        for m in body["messages"]
        if not isinstance(m["content"], str)
        for b in m["content"]
        if b["type"] == kind
    ]


# --------------------------------------------------------------------------- exact pre-flight


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "estimated"])
def test_exact_preflight_acts_on_the_providers_count(exact: bool) -> None:
    """The provider counts 60,000 tokens a message (segue's estimate: a few). Exactly counted,
    the second question makes the next prompt 180,000 tokens, the threshold: the summary is
    asked for instead of the question. Estimated, the question is sent."""

    def count(body: dict[str, Any]) -> int:
        return 60_000 * len(body["messages"])

    with FakeAnthropicServer(count_tokens=count) as server:
        server.enqueue(
            MessageReply(text="Hello.", usage=Usage(100_000, 10, 0, 0)),
            MessageReply(text="Summary of our chat.", usage=Usage(100_050, 20, 0, 0)),
        )

        async def main() -> list[str]:
            async with connected(server, MemoryStore(), exact_preflight=exact) as rt:
                conv = await rt.create_conversation(model=MODEL)
                first = await rt.send(conv.id, "Hi there.")
                assert (first.phase.kind, first.context_tokens) == ("idle", 100_010)
                second = await rt.send(conv.id, "A small question.")
                return [m.kind for m in await rt.messages(conv.id)] + [second.phase.kind]

        kinds = asyncio.run(main())
        counted = [r for r in server.requests if r.path == "/v1/messages/count_tokens"]
    if exact:
        assert len(counted) == 2  # one per user message
        assert kinds == ["user", "assistant", "user", "continuation", "context_exhausted"]
        summary_request = request_body(server.message_requests()[1])
        assert "tools" not in summary_request
    else:
        assert counted == []
        assert kinds == ["user", "assistant", "user", "assistant", "idle"]


# --------------------------------------------------------------------------- occupancy and tools


def test_occupancy_is_the_latest_responses_four_fields_never_a_sum(
    server: FakeAnthropicServer, make_store: StoreFactory
) -> None:
    call = ToolUse("lookup", {"query": "tides"}, id="toolu_tides")
    first = Usage(1_200, 40, cache_creation_input_tokens=3_000, cache_read_input_tokens=5_000)
    second = Usage(60, 25, cache_creation_input_tokens=0, cache_read_input_tokens=9_280)
    server.enqueue(
        MessageReply(text="Let me check.", tool_uses=[call], stop_reason="tool_use", usage=first),
        MessageReply(text="High tide is at noon.", usage=second),
        MessageReply(text="Short.", usage=Usage(500, 10, None, None)),  # cache fields absent
        MessageReply(text="No usage figures.", usage=Usage(0, 0, 0, 0)),  # says nothing
    )

    async def main() -> None:
        async with connected(server, make_store(), tools=[LOOKUP]) as rt:
            conv = await rt.create_conversation(model=MODEL)
            assert conv.context_window == WINDOW  # from models.retrieve, not the static table
            state = await rt.send(conv.id, "When is high tide?")
            assert state.phase.kind == "idle"
            assert state.context_tokens == 60 + 25 + 0 + 9_280  # not 9,240 + 9,365
            measured = [t.context_tokens for t in await rt.store.transitions(conv.id)]
            assert measured == [None, 9_240, 9_240, 9_365]

            transcript = await rt.messages(conv.id)
            assert [(m.kind, m.text) for m in transcript] == [
                ("user", "When is high tide?"),
                ("assistant", "Let me check."),
                ("tool_result", "result for tides"),
                ("assistant", "High tide is at noon."),
            ]
            assert transcript[1].message.tool_calls[0].id == "toolu_tides"
            assert transcript[1].message.tool_calls[0].input == {"query": "tides"}

            state = await rt.send(conv.id, "Thanks.")
            assert state.context_tokens == 510  # the latest figure, even though it fell
            state = await rt.send(conv.id, "And tomorrow?")
            assert state.context_tokens == 510  # an all-zero report keeps the last figure
            assert state.pending_tokens > 0

    asyncio.run(main())
    sent = bodies(server)
    assert len(sent) == 4
    assert [t["name"] for t in sent[0]["tools"]] == ["lookup"]
    assert blocks(sent[1], "tool_use") == [
        {"type": "tool_use", "id": "toolu_tides", "name": "lookup", "input": {"query": "tides"}}
    ]
    results = blocks(sent[1], "tool_result")
    assert [(r["tool_use_id"], r["content"]) for r in results] == [
        ("toolu_tides", "result for tides")
    ]
    assert server.pending == 0


def test_prompt_too_long_takes_the_exhaustion_path(
    server: FakeAnthropicServer, make_store: StoreFactory
) -> None:
    server.enqueue(
        prompt_too_long(210_000, 200_000),
        MessageReply(text="Summary: the user pasted a whole book.", usage=Usage(1_000, 80)),
    )

    async def main() -> None:
        async with connected(server, make_store(), tools=[LOOKUP]) as rt:
            conv = await rt.create_conversation(model=MODEL)
            state = await rt.send(conv.id, "Here is a book, read it all.")
            assert isinstance(state.phase, ContextExhausted)
            assert state.phase.summary == "Summary: the user pasted a whole book."
            transcript = await rt.messages(conv.id)
            assert [m.kind for m in transcript] == ["user", "continuation"]
            (record,) = [
                t for t in await rt.store.transitions(conv.id) if t.event_kind == "llm_error"
            ]
            assert "prompt is too long" in record.event_json
            assert record.to_phase == "awaiting_continuation"

    asyncio.run(main())
    turn, summary = bodies(server)
    assert "tools" in turn
    assert "tools" not in summary
    assert not blocks(summary, "tool_use")
    assert not blocks(summary, "tool_result")
    assert CONTINUATION_INSTRUCTION in texts(summary["messages"][-1])
    assert "Here is a book, read it all." in texts(summary["messages"][0])


def test_the_http_attempts_are_the_attempts_segue_reports_whatever_max_retries(
    server: FakeAnthropicServer, make_store: StoreFactory
) -> None:
    """A client built with SDK retries on still makes one HTTP attempt per attempt segue
    counts (on top of segue's own, the SDK's made 12 HTTP attempts for "failed 4 times")."""
    failures = [rate_limited(), overloaded(), server_error()]
    server.enqueue(*failures)
    sleep = SleepRecorder()

    async def main() -> None:
        async with connected(server, make_store(), max_retries=2, sleep=sleep) as rt:
            conv = await rt.create_conversation(model=MODEL, max_attempts=3)
            state = await rt.send(conv.id, "Hello?")
            assert isinstance(state.phase, Failed)
            assert state.phase.error_kind is ErrorKind.RETRIES_EXHAUSTED
            assert "failed 3 times" in state.phase.message

    asyncio.run(main())
    assert len(server.message_requests()) == 3
    assert sleep.delays == [1.0, 2.0]


def test_the_runtime_waits_as_long_as_the_server_asked(
    server: FakeAnthropicServer, make_store: StoreFactory
) -> None:
    slow_down = ErrorReply(429, "rate_limit_error", "slow down", {"retry-after": "7"})
    server.enqueue(slow_down, MessageReply(text="Made it."))
    sleep = SleepRecorder()

    async def main() -> None:
        async with connected(server, make_store(), sleep=sleep) as rt:
            conv = await rt.create_conversation(model=MODEL)
            assert (await rt.send(conv.id, "Hello?")).phase.kind == "idle"

    asyncio.run(main())
    assert sleep.delays == [7.0]  # not the 1 s backoff: what the server asked


def test_rate_limit_and_overload_left_to_the_runtime_back_off_then_succeed(
    server: FakeAnthropicServer, make_store: StoreFactory
) -> None:
    server.enqueue(rate_limited(), overloaded(), MessageReply(text="Made it."))
    sleep = SleepRecorder()

    async def main() -> None:
        async with connected(server, make_store(), max_retries=0, sleep=sleep) as rt:
            conv = await rt.create_conversation(model=MODEL)
            state = await rt.send(conv.id, "Hello?")
            assert state.phase.kind == "idle"
            assert [m.text for m in await rt.messages(conv.id)] == ["Hello?", "Made it."]
            errors = [t for t in await rt.store.transitions(conv.id) if t.event_kind == "llm_error"]
            assert len(errors) == 2
            assert '"retryable":true' in errors[0].event_json

    asyncio.run(main())
    assert len(server.message_requests()) == 3
    assert sleep.delays == [1.0, 2.0]


# --------------------------------------------------------------------------- each behaviour


OPENING = (
    MessageReply(
        text="Checking.",
        tool_uses=[ToolUse("lookup", {"query": "tides"}, id="toolu_open")],
        stop_reason="tool_use",
        usage=Usage(2_000, 30, cache_creation_input_tokens=1_000),
    ),
    MessageReply(text="Noon.", usage=Usage(100, 10, cache_read_input_tokens=3_100)),
)
CHECKPOINT = (
    "<checkpoint>\n## Goal\nTrack the tides.\n\n## Completed Work\n- Looked up today\n\n"
    "## Remaining Tasks\n1. Tomorrow\n\n## Do Not Redo\n- Today\n\n"
    "## Key Decisions\n- Use lookup\n</checkpoint>"
)


async def paused_then_resumed(
    rt: Runtime, server: FakeAnthropicServer, state: ConversationState
) -> None:
    """A CHECKPOINT_PAUSE conversation at its limit: paused with its snapshot, then resumed."""
    assert isinstance(state.phase, Paused)
    snapshot = (await rt.store.snapshots(state.id))[-1]
    assert (snapshot.trigger, snapshot.llm_calls) == ("exhaustion", 4)
    assert "## Goal\nTrack the tides." in snapshot.checkpoint
    resumed = await rt.resume(state.id)
    assert (resumed.session, resumed.phase.kind) == (2, "idle")
    fresh = bodies(server)[4]
    assert "Track the tides." in str(fresh["system"])  # the resume context
    assert "Tell me everything about tides." not in str(fresh["messages"])


@pytest.mark.parametrize("behavior", list(Behavior))
def test_a_whole_conversation_per_behaviour(
    server: FakeAnthropicServer,
    make_store: StoreFactory,
    behavior: Behavior,
    tmp_path: Path,
) -> None:
    answer = {
        Behavior.THRESHOLD_BASED_CONTINUATION: "Summary: tides were looked up.",
        Behavior.INTENTIONALLY_UNHANDLED: "never asked",
        Behavior.CHECKPOINT_RESTART: CHECKPOINT,
        Behavior.COMPACT_IN_PLACE: "Summary: the user asked about today's tides.",
        Behavior.CHECKPOINT_PAUSE: CHECKPOINT,
    }[behavior]
    server.enqueue(*OPENING, CROSSING, MessageReply(text=answer), MessageReply(text="Fresh."))
    archives = tmp_path / "archives"

    async def main() -> None:
        async with connected(
            server, make_store(), tools=[LOOKUP], archive_dir=archives, keep_recent=2
        ) as rt:
            conv = await rt.create_conversation(model=MODEL, behavior=behavior)
            assert (await rt.send(conv.id, "When is high tide?")).context_tokens == 3_210
            state = await rt.send(conv.id, "Tell me everything about tides.")
            sent = bodies(server)
            assert all("tools" in body for body in sent[:3])
            if behavior is Behavior.INTENTIONALLY_UNHANDLED:
                assert isinstance(state.phase, Failed)
                assert state.phase.error_kind is ErrorKind.CONTEXT_EXHAUSTED
                assert len(sent) == 3  # no summary request
                return
            asked = sent[3]
            assert "tools" not in asked
            assert not blocks(asked, "tool_use")
            instruction = texts(asked["messages"][-1])
            if behavior is Behavior.THRESHOLD_BASED_CONTINUATION:
                assert CONTINUATION_INSTRUCTION in instruction
                assert isinstance(state.phase, ContextExhausted)
                assert state.phase.summary == answer
                assert (await rt.messages(conv.id))[-1].kind == "continuation"
                return
            if behavior is Behavior.CHECKPOINT_PAUSE:
                assert CHECKPOINT_PROMPT in instruction
                await paused_then_resumed(rt, server, state)
                return
            assert state.phase.kind == "idle"
            await rt.send(conv.id, "And tomorrow?")
            fresh = bodies(server)[4]
            sent_text = [text for m in fresh["messages"] for text in text_blocks(m)]
            assert "When is high tide?" not in sent_text  # the oldest turn is gone
            assert sent_text[-1] == "And tomorrow?"
            if behavior is Behavior.CHECKPOINT_RESTART:
                assert CHECKPOINT_PROMPT in instruction
                assert state.session == 2
                assert len(sent_text) == 2  # a fresh session: the seed, then the new message
                assert "## Goal\nTrack the tides." in sent_text[0]
                assert "Tell me everything about tides." not in sent_text
            else:
                assert COMPACTION_INSTRUCTION in instruction
                assert state.generation == 2
                assert sent_text[0] == f"Summary of the earlier conversation: {answer}"
                # keep_recent=2: the last exchange follows the summary verbatim
                assert sent_text[1:] == [
                    "Tell me everything about tides.",
                    CROSSING.text,
                    "And tomorrow?",
                ]
                assert len(list(archives.iterdir())) == 1
            assert (await rt.messages(conv.id))[-1].text == "Fresh."

    asyncio.run(main())


# --------------------------------------------------------------------------- secrets


def test_the_api_key_never_reaches_logs_state_or_transcript(server: FakeAnthropicServer) -> None:
    leaky = ErrorReply(401, "authentication_error", f"invalid x-api-key: {KEY}")
    server.enqueue(MessageReply(text="Hi."), overloaded(), leaky)
    store = MemoryStore()

    async def main() -> None:
        with capture_logs() as logs:
            async with connected(server, store, sleep=SleepRecorder()) as rt:
                conv = await rt.create_conversation(model=MODEL, system="Be brief.")
                await rt.send(conv.id, "Hello.")
                state = await rt.send(conv.id, "Again.")
                assert isinstance(state.phase, Failed)
                assert state.phase.error_kind is ErrorKind.LLM_ERROR
                assert "authentication" in state.phase.message
                assert KEY not in state.phase.message
                transitions = await rt.store.transitions(conv.id)
                assert transitions
                assert all(KEY not in t.event_json for t in transitions)
                assert all(KEY not in m.text for m in await rt.messages(conv.id))
        events = [entry["event"] for entry in logs]
        assert "transition" in events
        assert "llm_error" in events
        assert KEY not in repr(logs)

    asyncio.run(main())
    sent_with = server.message_requests()[0].headers
    assert KEY in sent_with.get("authorization", "") + sent_with.get("x-api-key", "")


# --------------------------------------------------------------------------- bounded turns


def test_a_server_that_always_calls_a_tool_cannot_loop_one_message_forever(
    server: FakeAnthropicServer, make_store: StoreFactory
) -> None:
    """Seen with a compatible server: every answer a tool call, 2,280 round trips for one
    send(). Now: max_tool_rounds rounds, then one grace request with tool_choice none."""
    server.default = lambda _body: MessageReply(
        text="Checking again.",
        tool_uses=[ToolUse("lookup", {"query": "x"})],
        stop_reason="tool_use",
    )

    async def main() -> None:
        async with connected(server, make_store(), tools=[LOOKUP]) as rt:
            conv = await rt.create_conversation(model=MODEL, max_tool_rounds=3)
            with capture_logs() as logs:
                state = await rt.send(conv.id, "Find it.")
            assert state.phase.kind == "idle"
            kinds = [m.kind for m in await rt.messages(conv.id)]
            assert kinds.count("assistant") == 5  # 3 rounds, the 4th asked, the grace answer
            assert "notify" in [e["event"] for e in logs]
            # The next message has its own rounds again.
            await rt.send(conv.id, "Once more.")

    asyncio.run(main())
    sent = bodies(server)
    assert len(sent) == 5 + 5
    grace = sent[4]
    assert grace["tool_choice"] == {"type": "none"}
    assert grace["tools"]  # still declared: the history holds tool blocks
    assert "no tool can be called now" in texts(grace["messages"][-1])
    assert all("tool_choice" not in body for body in sent[:4])


def test_a_turn_streams_over_the_real_client_as_the_server_sends_it(
    server: FakeAnthropicServer, make_store: StoreFactory
) -> None:
    """Runtime.stream over the SDK's own SSE parsing: the deltas join to the stored replies, the
    tool is told as it runs, the meter reads the usage the SDK accumulated, done comes last."""
    server.enqueue(
        MessageReply(
            text="Let me look that up for you.",
            tool_uses=[ToolUse("lookup", {"query": "tides"}, id="toolu_1")],
            stop_reason="tool_use",
            usage=Usage(input_tokens=1_000, output_tokens=40),
            pieces=5,
        ),
        MessageReply(
            text="High tide is at noon.", usage=Usage(input_tokens=1_200, output_tokens=30)
        ),
    )

    async def main() -> None:
        async with connected(server, make_store(), tools=[LOOKUP]) as rt:
            conv = await rt.create_conversation(model=MODEL, context_window=WINDOW)
            kinds: list[str] = []
            text = ""
            async for update in rt.stream(conv.id, "When is high tide?"):
                kinds.append(update.kind)
                if update.kind == "text":
                    text += update.text
                elif update.kind == "done":
                    done = update
            stored = [m.text for m in await rt.messages(conv.id) if m.kind == "assistant"]
            assert text == "".join(stored) == "Let me look that up for you.High tide is at noon."
            assert kinds.count("text") >= 6  # delivered in pieces, as they came
            assert kinds.index("tool_started") < kinds.index("tool_finished")
            assert kinds[-1] == "done"
            assert done.reply == "High tide is at noon."
            assert done.state.context_tokens == 1_230

    asyncio.run(main())
