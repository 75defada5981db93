"""The runtime over each provider's real client, against its local fake API: every test runs on
``AnthropicModel`` and on ``OpenAIModel`` (Chat Completions and Responses).

``Runtime`` -> adapter -> the unmodified SDK -> HTTP -> the fake server: the occupancy the
runtime acts on is what the SDK parsed from a real SSE stream, the errors are the SDK's own, and
what the runtime asked for is what the server recorded. The provider's answers are scripted and
what was sent is read back in neutral terms (``segue.testing.conformance``: ``Said``,
``Failure``, ``Sent``; the harnesses of ``segue.testing.harnesses``), so one test states one
behaviour for every provider.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

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
from segue.executor.instructions import COMPACTION_INSTRUCTION, CONTINUATION_INSTRUCTION
from segue.executor.runtime import Runtime
from segue.executor.store_port import Store
from segue.executor.stores.memory import MemoryStore
from segue.executor.stores.sqlite import SqliteStore
from segue.executor.tools import Tool
from segue.testing.conformance import Call, Failure, Harness, Said, Sent
from segue.testing.harnesses import AnthropicHarness, OpenAIHarness
from segue.testing.logs import capture_logs

WINDOW = 200_000  # thresholds: warning 160,000, continuation 180,000
Behavior = ContextExhaustionBehavior
StoreFactory = Callable[[], Store]
CROSSING = Said(text="Here is a very long answer.", prompt=184_900, cached=184_000, output=300)
PROVIDERS = ["anthropic", "openai-chat", "openai-responses"]


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


class Provider:
    """A started harness, and the model whose window its fake server reports as 200,000."""

    def __init__(self, harness: Harness, model: str) -> None:
        self.harness = harness
        self.model = model
        self.key = harness.key

    def script(self, *answers: Said | Failure) -> None:
        self.harness.script(*answers)

    def sent(self) -> list[Sent]:
        return self.harness.sent()

    @contextlib.asynccontextmanager
    async def runtime(
        self, store: Store, *, max_retries: int = 0, exact_preflight: bool = False, **options: Any
    ) -> AsyncIterator[Runtime]:
        """A runtime whose model is the adapter over a real client pointed at the fake."""
        async with (
            self.harness.model(max_retries=max_retries, exact_preflight=exact_preflight) as llm,
            Runtime(store=store, llm=llm, **options) as rt,
        ):
            yield rt


def start(name: str) -> tuple[Any, str]:
    if name == "anthropic":
        return AnthropicHarness().__enter__(), "claude-sonnet-4-6"  # the fake says 200k
    harness = OpenAIHarness("chat" if name == "openai-chat" else "responses").__enter__()
    # A compatible server that says its model's window (vLLM's max_model_len).
    harness.server.models["served-model"] = {"owned_by": "vllm", "max_model_len": WINDOW}
    return harness, "served-model"


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest) -> Iterator[Provider]:
    harness, model = start(request.param)
    try:
        yield Provider(harness, model)
    finally:
        harness.__exit__(None, None, None)


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "memory":
        memory = MemoryStore()
        return lambda: memory
    return lambda: SqliteStore(tmp_path / "segue.db")


def calls(sent: Sent) -> list[tuple[str, str, Any]]:
    return [call for turn in sent.turns for call in turn.calls]


def results(sent: Sent) -> list[tuple[str | None, str]]:
    return [(turn.result_for, turn.text) for turn in sent.turns if turn.result_for is not None]


# --------------------------------------------------------------------------- exact pre-flight


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "estimated"])
@pytest.mark.parametrize("name", PROVIDERS)
def test_exact_preflight_acts_on_the_providers_count(name: str, exact: bool) -> None:
    """The provider counts 60,000 tokens a message (segue's estimate: a few). Exactly counted,
    the second question makes the next prompt 180,000 tokens, the threshold: the summary is
    asked for instead of the question. Estimated, the question is sent. (Anthropic counts with
    its count_tokens endpoint, OpenAI with a tokenizer: here one that says 60,000 a message.)"""

    class SixtyThousand:
        def encode(self, text: str, *, disallowed_special: Any = ()) -> list[int]:
            return [0] * 60_000 if text.strip() else []

    harness, model = start(name)
    options: dict[str, Any] = {"exact_preflight": exact}
    if name == "anthropic":
        harness.server.count_tokens = lambda body: 60_000 * len(body["messages"])
    else:
        options["encoding"] = SixtyThousand()
    try:
        harness.script(
            Said(text="Hello.", prompt=100_000, output=10),
            Said(text="Summary of our chat.", prompt=100_050, output=20),
        )

        async def main() -> list[str]:
            async with (
                harness.model(**options) as llm,
                Runtime(store=MemoryStore(), llm=llm) as rt,
            ):
                conv = await rt.create_conversation(model=model)
                first = await rt.send(conv.id, "Hi there.")
                assert (first.phase.kind, first.context_tokens) == ("idle", 100_010)
                second = await rt.send(conv.id, "A small question.")
                return [m.kind for m in await rt.messages(conv.id)] + [second.phase.kind]

        kinds = asyncio.run(main())
        sent = harness.sent()
    finally:
        harness.__exit__(None, None, None)
    if exact:
        assert kinds == ["user", "assistant", "user", "continuation", "context_exhausted"]
        summary = sent[1]  # no tool can be called: none declared, or none callable
        assert not summary.tools or summary.tool_choice_none
    else:
        assert kinds == ["user", "assistant", "user", "assistant", "idle"]
    if name == "anthropic":
        counted = [r for r in harness.server.requests if r.path == "/v1/messages/count_tokens"]
        assert len(counted) == (2 if exact else 0)  # one per user message


# --------------------------------------------------------------------------- occupancy and tools


def test_occupancy_is_the_latest_responses_four_fields_never_a_sum(
    provider: Provider, make_store: StoreFactory
) -> None:
    provider.script(
        Said(
            text="Let me check.",
            calls=[Call("lookup", {"query": "tides"}, "toolu_tides")],
            prompt=9_200,
            cached=5_000,
            cache_write=3_000,
            output=40,
        ),
        Said(text="High tide is at noon.", prompt=9_340, cached=9_280, output=25),
        Said(text="Short.", prompt=500, output=10),
        Said(text="No usage figures.", prompt=0, output=0),  # says nothing
    )

    async def main() -> None:
        async with provider.runtime(make_store(), tools=[LOOKUP]) as rt:
            conv = await rt.create_conversation(model=provider.model)
            assert conv.context_window == WINDOW  # what the server reported, not the table
            state = await rt.send(conv.id, "When is high tide?")
            assert state.phase.kind == "idle"
            assert state.context_tokens == 9_340 + 25  # not 9,240 + 9,365
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
    sent = provider.sent()
    assert len(sent) == 4
    assert sent[0].tools == ("lookup",)
    assert calls(sent[1]) == [("toolu_tides", "lookup", {"query": "tides"})]
    assert results(sent[1]) == [("toolu_tides", "result for tides")]
    assert provider.harness.pending == 0


def test_an_overflowing_prompt_takes_the_exhaustion_path(
    provider: Provider, make_store: StoreFactory
) -> None:
    provider.script(
        Failure("overflow"),
        Said(text="Summary: the user pasted a whole book.", prompt=1_000, output=80),
    )

    async def main() -> None:
        async with provider.runtime(make_store(), tools=[LOOKUP]) as rt:
            conv = await rt.create_conversation(model=provider.model)
            state = await rt.send(conv.id, "Here is a book, read it all.")
            assert isinstance(state.phase, ContextExhausted)
            assert state.phase.summary == "Summary: the user pasted a whole book."
            transcript = await rt.messages(conv.id)
            assert [m.kind for m in transcript] == ["user", "continuation"]
            (record,) = [
                t for t in await rt.store.transitions(conv.id) if t.event_kind == "llm_error"
            ]
            assert "context_overflow" in record.event_json
            assert record.to_phase == "awaiting_continuation"

    asyncio.run(main())
    turn, summary = provider.sent()
    assert turn.tools
    # The turn's tools stay declared, so the request repeats the turn's cached prefix, but no
    # tool can be called (REQ-BED-020, REQ-SEG-047).
    assert summary.tools == turn.tools
    assert summary.tool_choice_none
    assert summary.tool_blocks == 0
    assert CONTINUATION_INSTRUCTION in summary.turns[-1].text
    assert "Here is a book, read it all." in summary.turns[0].text


def test_the_http_attempts_are_the_attempts_segue_reports_whatever_max_retries(
    provider: Provider, make_store: StoreFactory
) -> None:
    """A client built with its own retries on still makes one HTTP attempt per attempt segue
    counts (on top of segue's own, the SDK's made 12 HTTP attempts for "failed 4 times")."""
    provider.script(Failure("rate_limit"), Failure("server"), Failure("server"))
    sleep = SleepRecorder()

    async def main() -> None:
        async with provider.runtime(make_store(), max_retries=2, sleep=sleep) as rt:
            conv = await rt.create_conversation(model=provider.model, max_attempts=3)
            state = await rt.send(conv.id, "Hello?")
            assert isinstance(state.phase, Failed)
            assert state.phase.error_kind is ErrorKind.RETRIES_EXHAUSTED
            assert "failed 3 times" in state.phase.message

    asyncio.run(main())
    assert len(provider.sent()) == 3
    assert sleep.delays == [1.0, 2.0]


def test_the_runtime_waits_as_long_as_the_server_asked(
    provider: Provider, make_store: StoreFactory
) -> None:
    provider.script(Failure("rate_limit", retry_after=7), Said(text="Made it."))
    sleep = SleepRecorder()

    async def main() -> None:
        async with provider.runtime(make_store(), sleep=sleep) as rt:
            conv = await rt.create_conversation(model=provider.model)
            assert (await rt.send(conv.id, "Hello?")).phase.kind == "idle"

    asyncio.run(main())
    assert sleep.delays == [7.0]  # not the 1 s backoff: what the server asked


def test_rate_limits_and_server_errors_back_off_then_succeed(
    provider: Provider, make_store: StoreFactory
) -> None:
    provider.script(Failure("rate_limit"), Failure("server"), Said(text="Made it."))
    sleep = SleepRecorder()

    async def main() -> None:
        async with provider.runtime(make_store(), sleep=sleep) as rt:
            conv = await rt.create_conversation(model=provider.model)
            state = await rt.send(conv.id, "Hello?")
            assert state.phase.kind == "idle"
            assert [m.text for m in await rt.messages(conv.id)] == ["Hello?", "Made it."]
            errors = [t for t in await rt.store.transitions(conv.id) if t.event_kind == "llm_error"]
            assert len(errors) == 2
            assert '"retryable":true' in errors[0].event_json

    asyncio.run(main())
    assert len(provider.sent()) == 3
    assert sleep.delays == [1.0, 2.0]


# --------------------------------------------------------------------------- each behaviour


OPENING = (
    Said(
        text="Checking.",
        calls=[Call("lookup", {"query": "tides"}, "toolu_open")],
        prompt=3_000,
        cache_write=1_000,
        output=30,
    ),
    Said(text="Noon.", prompt=3_200, cached=3_100, output=10),
)
CHECKPOINT = (
    "<checkpoint>\n## Goal\nTrack the tides.\n\n## Completed Work\n- Looked up today\n\n"
    "## Remaining Tasks\n1. Tomorrow\n\n## Do Not Redo\n- Today\n\n"
    "## Key Decisions\n- Use lookup\n</checkpoint>"
)


async def paused_then_resumed(rt: Runtime, provider: Provider, state: ConversationState) -> None:
    """A CHECKPOINT_PAUSE conversation at its limit: paused with its snapshot, then resumed."""
    assert isinstance(state.phase, Paused)
    snapshot = (await rt.store.snapshots(state.id))[-1]
    assert (snapshot.trigger, snapshot.llm_calls) == ("exhaustion", 4)
    assert "## Goal\nTrack the tides." in snapshot.checkpoint
    resumed = await rt.resume(state.id)
    assert (resumed.session, resumed.phase.kind) == (2, "idle")
    fresh = provider.sent()[4]
    assert "Track the tides." in (fresh.system or "")  # the resume context
    assert "Tell me everything about tides." not in fresh.text


@pytest.mark.parametrize("behavior", list(Behavior))
def test_a_whole_conversation_per_behaviour(
    provider: Provider, make_store: StoreFactory, behavior: Behavior, tmp_path: Path
) -> None:
    answer = {
        Behavior.THRESHOLD_BASED_CONTINUATION: "Summary: tides were looked up.",
        Behavior.INTENTIONALLY_UNHANDLED: "never asked",
        Behavior.CHECKPOINT_RESTART: CHECKPOINT,
        Behavior.COMPACT_IN_PLACE: "Summary: the user asked about today's tides.",
        Behavior.CHECKPOINT_PAUSE: CHECKPOINT,
    }[behavior]
    provider.script(*OPENING, CROSSING, Said(text=answer), Said(text="Fresh."))
    archives = tmp_path / "archives"

    async def main() -> None:
        async with provider.runtime(
            make_store(), tools=[LOOKUP], archive_dir=archives, keep_recent=2
        ) as rt:
            conv = await rt.create_conversation(model=provider.model, behavior=behavior)
            assert (await rt.send(conv.id, "When is high tide?")).context_tokens == 3_210
            state = await rt.send(conv.id, "Tell me everything about tides.")
            sent = provider.sent()
            assert all(body.tools for body in sent[:3])
            if behavior is Behavior.INTENTIONALLY_UNHANDLED:
                assert isinstance(state.phase, Failed)
                assert state.phase.error_kind is ErrorKind.CONTEXT_EXHAUSTED
                assert len(sent) == 3  # no summary request
                return
            asked = sent[3]
            # The turn's tools declared (its cached prefix), none callable (REQ-SEG-047).
            assert asked.tools == sent[0].tools
            assert asked.tool_choice_none
            instruction = asked.turns[-1].text
            if behavior is Behavior.THRESHOLD_BASED_CONTINUATION:
                assert CONTINUATION_INSTRUCTION in instruction
                assert isinstance(state.phase, ContextExhausted)
                assert state.phase.summary == answer
                assert (await rt.messages(conv.id))[-1].kind == "continuation"
                return
            if behavior is Behavior.CHECKPOINT_PAUSE:
                assert CHECKPOINT_PROMPT in instruction
                await paused_then_resumed(rt, provider, state)
                return
            assert state.phase.kind == "idle"
            await rt.send(conv.id, "And tomorrow?")
            sent_text = provider.sent()[4].texts
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


def test_the_api_key_never_reaches_logs_state_or_transcript(provider: Provider) -> None:
    provider.script(Said(text="Hi."), Failure("server"), Failure("auth", echo=provider.key))
    store = MemoryStore()

    async def main() -> None:
        with capture_logs() as logs:
            async with provider.runtime(store, sleep=SleepRecorder()) as rt:
                conv = await rt.create_conversation(model=provider.model, system="Be brief.")
                await rt.send(conv.id, "Hello.")
                state = await rt.send(conv.id, "Again.")
                assert isinstance(state.phase, Failed)
                assert state.phase.error_kind is ErrorKind.LLM_ERROR
                assert "authentication" in state.phase.message
                assert "_API_KEY" in state.phase.message  # where the key comes from
                assert provider.key not in state.phase.message
                transitions = await rt.store.transitions(conv.id)
                assert transitions
                assert all(provider.key not in t.event_json for t in transitions)
                assert all(provider.key not in m.text for m in await rt.messages(conv.id))
        events = [entry["event"] for entry in logs]
        assert "transition" in events
        assert "llm_error" in events
        assert provider.key not in repr(logs)

    asyncio.run(main())
    headers = provider.sent()[0].headers
    assert provider.key in headers.get("authorization", "") + headers.get("x-api-key", "")


# --------------------------------------------------------------------------- bounded turns


def test_a_server_that_always_calls_a_tool_cannot_loop_one_message_forever(
    provider: Provider, make_store: StoreFactory
) -> None:
    """Seen with a compatible server: every answer a tool call, 2,280 round trips for one
    send(). Now: max_tool_rounds rounds, then one grace request with tool_choice none."""
    provider.harness.default(
        lambda: Said(text="Checking again.", calls=[Call("lookup", {"query": "x"})])
    )

    async def main() -> None:
        async with provider.runtime(make_store(), tools=[LOOKUP]) as rt:
            conv = await rt.create_conversation(model=provider.model, max_tool_rounds=3)
            with capture_logs() as logs:
                state = await rt.send(conv.id, "Find it.")
            assert state.phase.kind == "idle"
            kinds = [m.kind for m in await rt.messages(conv.id)]
            assert kinds.count("assistant") == 5  # 3 rounds, the 4th asked, the grace answer
            assert "notify" in [e["event"] for e in logs]
            # The next message has its own rounds again.
            await rt.send(conv.id, "Once more.")

    asyncio.run(main())
    sent = provider.sent()
    assert len(sent) == 5 + 5
    grace = sent[4]
    assert grace.tool_choice_none
    assert grace.tools  # still declared: the history holds tool calls
    assert "no tool can be called now" in grace.turns[-1].text
    assert all(body.callable_tools for body in sent[:4])


def test_a_turn_streams_over_the_real_client_as_the_server_sends_it(
    provider: Provider, make_store: StoreFactory
) -> None:
    """Runtime.stream over the SDK's own SSE parsing: the deltas join to the stored replies, the
    tool is told as it runs, the meter reads the usage the SDK parsed, done comes last."""
    provider.script(
        Said(
            text="Let me look that up for you.",
            calls=[Call("lookup", {"query": "tides"}, "toolu_1")],
            prompt=1_000,
            output=40,
            pieces=5,
        ),
        Said(text="High tide is at noon.", prompt=1_200, output=30),
    )

    async def main() -> None:
        async with provider.runtime(make_store(), tools=[LOOKUP]) as rt:
            conv = await rt.create_conversation(model=provider.model, context_window=WINDOW)
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
