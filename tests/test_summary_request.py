"""``summary_request`` (REQ-SEG-055 to REQ-SEG-057): the limit's requests as the turn's
request repeated, and a tool call in their answer refused and asked again, end to end through
the runtime and on each adapter's wire (Anthropic's payload with its breakpoints read from the
fake's prompt cache; OpenAI's Chat Completions and Responses payloads)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import anthropic
import pytest
from pydantic import ValidationError

from segue import ContextExhausted, ContextExhaustionBehavior, SqliteStore
from segue.executor.errors import UnsupportedOptionError
from segue.executor.model_port import BaseLlmModel, LlmReply, LlmRequest, ToolSpec
from segue.executor.models.anthropic import AnthropicModel
from segue.executor.models.anthropic_payload import build_payload as anthropic_payload
from segue.executor.models.openai_payload import build_payload as openai_payload
from segue.executor.models.scripted import ScriptedModel
from segue.executor.runtime import Runtime
from segue.executor.tools import Tool
from segue.statemachine import Message, ModelSettings, ToolCall
from segue.statemachine.options import ConversationOptions
from segue.testing.anthropic_server import FakeAnthropicServer, MessageReply, ToolUse

B = ContextExhaustionBehavior
RAN: list[dict[str, Any]] = []


async def _lookup(tool_input: dict[str, Any]) -> str:
    RAN.append(tool_input)
    return "The archive's record. " * 40


LOOKUP = Tool(
    name="lookup",
    description="Look a topic up in the archive.",
    function=_lookup,
    input_schema={"type": "object", "properties": {"topic": {"type": "integer"}}},
)


def _calling_summaries(calls: int) -> Any:
    """A model whose first ``calls`` answers at the limit call the tool, then summarise."""
    said = {"n": 0}

    def answer(request: LlmRequest) -> LlmReply:
        if request.purpose == "turn":
            return LlmReply(text="An answer about the archive. " * 10)
        said["n"] += 1
        if said["n"] <= calls:
            call = ToolCall(id=f"toolu_s{said['n']}", name="lookup", input={"topic": 9})
            return LlmReply(text="Let me check first.", tool_calls=(call,), stop_reason="tool_use")
        text = "<checkpoint>\n## Goal\nThe archive.\n</checkpoint>"
        return LlmReply(text=text if request.purpose == "checkpoint" else "Summary: the archive.")

    return answer


async def _at_the_limit(
    tmp_path: Path, behavior: B, calls: int, summary_request: str = "reuse_prefix"
) -> tuple[ScriptedModel, Runtime, str]:
    model = ScriptedModel(default=_calling_summaries(calls))
    runtime = Runtime(store=SqliteStore(tmp_path / "s.db"), llm=model, tools=[LOOKUP])
    state = await runtime.create_conversation(
        model="claude-sonnet-4-5", behavior=behavior, summary_request=summary_request
    )
    for question in ("What does the archive say?", "And about the tides?"):
        await runtime.send(state.id, question)
    await runtime.continue_manually(state.id)
    return model, runtime, state.id


@pytest.mark.parametrize(
    ("behavior", "purpose"),
    [
        (B.THRESHOLD_BASED_CONTINUATION, "continuation"),
        (B.CHECKPOINT_RESTART, "checkpoint"),
        (B.COMPACT_IN_PLACE, "compaction"),
    ],
)
def test_a_summary_that_calls_a_tool_is_refused_and_asked_again_with_the_prefix(
    tmp_path: Path, behavior: B, purpose: str
) -> None:
    """REQ-SEG-056: the call is never run, it is named to the model on the next ask, which
    repeats the turn's prefix again; both answers are on the bill."""
    RAN.clear()

    async def scenario() -> None:
        model, runtime, cid = await _at_the_limit(tmp_path, behavior, calls=1)
        async with runtime:
            asked = [r for r in model.requests if r.purpose == purpose]
            assert [r.reuse_prefix for r in asked] == [True, True]
            assert [c.name for c in asked[1].rejected_tool_calls] == ["lookup"]
            assert asked[0].rejected_tool_calls == ()
            assert RAN == []
            usage = await runtime.usage(cid)
            assert usage.requests == 2 + 2  # two turns, two answers at the limit
            messages = [m.message for m in await runtime.store.messages(cid)]
            assert not any(c.id.startswith("toolu_s") for m in messages for c in m.tool_calls)

    asyncio.run(scenario())


def test_after_two_answers_that_call_a_tool_the_summary_is_asked_tool_less(
    tmp_path: Path,
) -> None:
    """REQ-SEG-056: the path ends: the third ask lets no tool be called (REQ-SEG-047)."""
    RAN.clear()

    async def scenario() -> None:
        model, runtime, cid = await _at_the_limit(tmp_path, B.THRESHOLD_BASED_CONTINUATION, 2)
        async with runtime:
            asked = [r for r in model.requests if r.purpose == "continuation"]
            assert [r.reuse_prefix for r in asked] == [True, True, False]
            assert [c.id for c in asked[2].rejected_tool_calls] == ["toolu_s1", "toolu_s2"]
            state = await runtime.state(cid)
            assert isinstance(state.phase, ContextExhausted)
            assert state.phase.summary == "Summary: the archive."
            assert RAN == []

    asyncio.run(scenario())


def test_tool_less_reads_a_summary_answer_for_its_text(tmp_path: Path) -> None:
    """The default (REQ-BED-020 as written): one tool-less ask; a call the model should not
    have been able to make is neither run nor a reason to ask again."""

    async def scenario() -> None:
        model, runtime, cid = await _at_the_limit(
            tmp_path, B.THRESHOLD_BASED_CONTINUATION, 1, summary_request="tool_less"
        )
        async with runtime:
            asked = [r for r in model.requests if r.purpose == "continuation"]
            assert [r.reuse_prefix for r in asked] == [False]
            state = await runtime.state(cid)
            assert isinstance(state.phase, ContextExhausted)
            assert state.phase.summary == "Let me check first."

    asyncio.run(scenario())


def test_an_adapter_that_cannot_repeat_the_turn_is_refused_at_creation(tmp_path: Path) -> None:
    """REQ-SEG-055: nothing is stored for a conversation its adapter cannot serve."""

    class Plain(BaseLlmModel):
        async def complete(self, request: LlmRequest) -> LlmReply:
            return LlmReply(text="ok")

    async def scenario() -> None:
        async with Runtime(store=SqliteStore(tmp_path / "p.db"), llm=Plain()) as runtime:
            with pytest.raises(UnsupportedOptionError, match="PrefixReusing"):
                await runtime.create_conversation(
                    model="claude-sonnet-4-5", summary_request="reuse_prefix"
                )
            assert await runtime.store.list_conversations() == []
            await runtime.create_conversation(model="claude-sonnet-4-5")  # tool_less: fine

    asyncio.run(scenario())


def test_reuse_prefix_with_another_summary_model_is_refused() -> None:
    """The turn's request includes its model: another has no cache of it."""
    with pytest.raises(ValidationError, match="summary_model"):
        ConversationOptions(model="m", summary_request="reuse_prefix", summary_model="small")
    with pytest.raises(ValidationError):
        ConversationOptions(model="m", summary_request="both")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the wire

SPEC = ToolSpec(
    name="lookup", description="Look it up.", input_schema={"type": "object", "properties": {}}
)
HISTORY = (
    Message(kind="user", text="When is high tide?"),
    Message(
        kind="assistant",
        text="Let me look.",
        tool_calls=(ToolCall(id="call_t", name="lookup", input={}),),
    ),
    Message(kind="tool_result", text="noon", tool_call_id="call_t"),
    Message(kind="assistant", text="At noon."),
    Message(kind="user", text="And low tide?"),
    Message(kind="assistant", text="At six."),
)
SETTINGS = ModelSettings(thinking_budget=2048, tool_choice={"type": "auto"})


def _request(purpose: Any, **fields: Any) -> LlmRequest:
    return LlmRequest(
        conversation_id="c",
        model="claude-sonnet-4-6",
        purpose=purpose,
        system="Be brief.",
        messages=HISTORY,
        tools=(SPEC,),
        settings=SETTINGS,
        **fields,
    )


def _plain(value: Any) -> Any:
    """``value`` without its cache breakpoints (what the prefix's identity is)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def test_anthropic_repeats_the_turns_request_with_a_breakpoint_on_the_instruction() -> None:
    turn = anthropic_payload(_request("turn"), max_tokens=4096)
    rejected = (ToolCall(id="call_r", name="delete_everything", input={}),)
    summary_request = _request(
        "continuation", instruction="Summarise.", rejected_tool_calls=rejected, reuse_prefix=True
    )
    summary = anthropic_payload(summary_request, max_tokens=4096)
    assert summary.tools == turn.tools  # breakpoint on the last tool included
    assert summary.system == turn.system
    assert summary.options == turn.options  # thinking and the turn's tool choice
    assert _plain(summary.messages[:-1]) == _plain(turn.messages)
    last = summary.messages[-1]
    assert last["role"] == "user"
    closing: Any = list(last["content"])[-1]
    assert "delete_everything" in closing["text"]
    assert closing["text"].endswith("Summarise.")
    assert closing["cache_control"] == {"type": "ephemeral"}
    tool_less = anthropic_payload(
        dataclasses.replace(summary_request, reuse_prefix=False), max_tokens=4096
    )
    assert tool_less.options["tool_choice"] == {"type": "none"}
    trimmed = dataclasses.replace(summary_request, trim_level=1)
    assert anthropic_payload(trimmed, max_tokens=4096).tools == []  # after an overflow: as text


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_repeats_the_turns_request_tool_choice_included(api: Any) -> None:
    settings = ModelSettings(tool_choice={"type": "any", "disable_parallel_tool_use": True})
    turn = openai_payload(
        dataclasses.replace(_request("turn"), settings=settings), api=api, max_tokens=512
    )
    summary = openai_payload(
        dataclasses.replace(
            _request("compaction", instruction="Summarise.", reuse_prefix=True),
            settings=settings,
        ),
        api=api,
        max_tokens=512,
    )
    assert summary.tools == turn.tools
    assert summary.options == turn.options  # "required", no parallel calls: the turn's
    assert summary.items[: len(turn.items)] == turn.items
    assert summary.items[-1] == {"role": "user", "content": "Summarise."}
    tool_less = openai_payload(
        _request("compaction", instruction="Summarise."), api=api, max_tokens=512
    )
    assert tool_less.options["tool_choice"] == "none"


def test_the_limits_request_reads_its_prefix_from_the_prompt_cache(tmp_path: Path) -> None:
    """Against the fake that bills Anthropic's caching rules: with ``reuse_prefix`` the
    summary request reads nearly all its input from the cache; ``tool_less`` reads only the
    tools and the system prompt."""

    def answer(body: dict[str, Any]) -> MessageReply:
        last = str(body["messages"][-1])
        if "continuation summary" in last:
            return MessageReply(text="Summary: the archive.")
        if "tool_result" not in last and "topic 3" in last:
            return MessageReply(
                text="Checking.",
                tool_uses=[ToolUse("lookup", {"topic": 3})],
                stop_reason="tool_use",
            )
        return MessageReply(text="From the archive: " + "a finding. " * 60)

    async def share(summary_request: str) -> float:
        with FakeAnthropicServer(default=answer) as server:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=server.url, max_retries=0)
            store = SqliteStore(tmp_path / f"{summary_request}.db")
            async with (
                client,
                Runtime(store=store, llm=AnthropicModel(client), tools=[LOOKUP]) as rt,
            ):
                state = await rt.create_conversation(
                    model="claude-sonnet-4-6",
                    system="You answer from the archive. " * 200,
                    summary_request=summary_request,
                )
                for i in range(1, 6):
                    await rt.send(state.id, f"Tell me about topic {i}. " * 30)
                await rt.continue_manually(state.id)
            last = server.bill.entries[-1][0]
            total = (
                last.input_tokens + last.cache_read_input_tokens + last.cache_creation_input_tokens
            )
            return last.cache_read_input_tokens / total

    reused, tool_less = asyncio.run(share("reuse_prefix")), asyncio.run(share("tool_less"))
    assert reused >= 0.9, reused
    assert tool_less < 0.6, tool_less


# --------------------------------------------------------------------------- the surfaces


@pytest.mark.slow
def test_rest_create_takes_it_and_the_servers_default_applies(tmp_path: Path) -> None:
    """``segue serve --summary-request`` is the default of what a create leaves out; a create
    may say otherwise; a value that is neither is a 422, nothing stored."""
    import httpx2

    from api import create, error
    from segue.server.run import ServerConfig, build_app
    from segue.testing import live_server

    config = ServerConfig(db=tmp_path / "s.db", summary_request="reuse_prefix")
    with live_server(build_app(config)) as url, httpx2.Client(base_url=url) as http:
        assert create(http)["summary_request"] == "reuse_prefix"
        assert create(http, summary_request="tool_less")["summary_request"] == "tool_less"
        refused = http.post("/api/conversations", json={"summary_request": "sometimes"})
        error(refused, 422, "invalid_request")
        assert len(http.get("/api/conversations").json()) == 2


@pytest.mark.slow
def test_segue_chat_takes_the_flag_in_the_clis_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from cli_run import invoke, plain_output

    plain_output(monkeypatch, "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "SEGUE_DATABASE_URL")
    db = tmp_path / "chat.db"
    chatted = invoke("chat", "--db", str(db), "--summary-request", "reuse-prefix", stdin="Hi.\n")
    assert chatted.exit_code == 0, chatted.output
    shown = json.loads(invoke("list", "--db", str(db), "--json").stdout)[0]
    assert shown["summary_request"] == "reuse_prefix"
    refused = invoke("chat", "--db", str(tmp_path / "no.db"), "--summary-request", "x", stdin="")
    assert refused.exit_code == 2
    assert "choose tool_less or reuse_prefix" in refused.output
    assert not (tmp_path / "no.db").exists()
