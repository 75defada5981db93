"""``AnthropicModel`` through the real ``anthropic.AsyncAnthropic`` client and a local fake API.

Nothing of the SDK is mocked: the payload is what the fake server received over HTTP, usage and
tool calls are what the SDK accumulated from a real SSE stream, and the errors are the SDK's own
exception classes after its own retries.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anthropic
import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmModel, LlmReply, LlmRequest, Purpose, ToolSpec
from segue.executor.models.anthropic import AnthropicModel, call_error
from segue.executor.models.anthropic_payload import turn_messages
from segue.executor.models.history import MIN_KEPT_MESSAGES, TOOL_RESULT_CHARS
from segue.executor.models.windows import Window
from segue.statemachine import Message, ToolCall
from segue.statemachine import Usage as SegueUsage
from segue.testing.anthropic_server import (
    Disconnect,
    ErrorReply,
    FakeAnthropicServer,
    MessageReply,
    ModelSpec,
    RawReply,
    ToolUse,
    Usage,
    authentication,
    context_limit,
    overloaded,
    prompt_too_long,
    rate_limited,
    server_error,
)
from segue.testing.logs import capture_logs

T = TypeVar("T")
KEY = "sk-ant-test-DO-NOT-LEAK-0123456789"
MODEL = "claude-sonnet-4-6"  # not in the SDK's DEPRECATED_MODELS (that warns)
SYSTEM = "You are a careful assistant."
TOOLS = (
    ToolSpec(
        name="bash",
        description="Run a shell command.",
        input_schema={"type": "object", "properties": {"cmd": {"type": "string"}}},
    ),
)
LS = ToolCall(id="toolu_1", name="bash", input={"cmd": "ls"})
CAT = ToolCall(id="toolu_2", name="bash", input={"cmd": "cat README.md"})
HISTORY = (
    Message(kind="user", text="What is in this repo?"),
    Message(kind="assistant", text="Let me look.", tool_calls=(LS, CAT)),
    Message(kind="tool_result", text="README.md\nsrc", tool_call_id=LS.id),
    Message(kind="tool_result", text="No such file", tool_call_id=CAT.id, is_error=True),
    Message(kind="assistant", text="A README and a src folder."),
    Message(kind="user", text="Thanks. Now summarise the README."),
)
INSTRUCTION = "Summarise the conversation so far for a fresh start."


def request(
    purpose: Purpose = "turn",
    messages: Sequence[Message] = HISTORY,
    **overrides: Any,
) -> LlmRequest:
    fields: dict[str, Any] = {
        "conversation_id": "c1",
        "model": MODEL,
        "purpose": purpose,
        "system": SYSTEM,
        "messages": messages,
        "tools": TOOLS if purpose == "turn" else (),
        "instruction": None if purpose == "turn" else INSTRUCTION,
    }
    fields.update(overrides)
    return LlmRequest(**fields)


def run(
    server: FakeAnthropicServer,
    fn: Callable[[AnthropicModel], Awaitable[T]],
    *,
    max_retries: int = 0,
    **options: Any,
) -> T:
    """Run ``fn`` against a fresh adapter over a real client, in its own event loop."""

    async def main() -> T:
        async with anthropic.AsyncAnthropic(
            api_key=KEY, base_url=server.url, max_retries=max_retries
        ) as client:
            return await fn(AnthropicModel(client, **options))

    return asyncio.run(main())


def complete(
    server: FakeAnthropicServer, req: LlmRequest | None = None, **options: Any
) -> LlmReply:
    return run(server, lambda model: model.complete(req or request()), **options)


def failure(server: FakeAnthropicServer, *replies: Any, **options: Any) -> LlmCallError:
    """Script ``replies``, make one call and return the ``LlmCallError`` it must raise."""
    server.enqueue(*replies)
    with pytest.raises(LlmCallError) as info:
        complete(server, **options)
    return info.value


def uncached(body: Any) -> Any:
    """``body`` without its prompt-cache marks (the system prompt back to a plain string), so
    tests of the payload's structure read as the API's examples do; ``test_prompt_caching_*``
    check the marks themselves."""
    if isinstance(body, list):
        return [uncached(item) for item in body]
    if not isinstance(body, dict):
        return body
    plain = {key: uncached(value) for key, value in body.items() if key != "cache_control"}
    system = plain.get("system")
    if isinstance(system, list) and len(system) == 1 and system[0].get("type") == "text":
        plain["system"] = system[0]["text"]
    return plain


def last_body(server: FakeAnthropicServer, *, raw: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = server.message_requests()[-1].body
    return body if raw else uncached(body)


def blocks(body: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [b for m in body["messages"] for b in m["content"] if b["type"] == kind]


def texts(message: dict[str, Any]) -> list[str]:
    return [b["text"] for b in message["content"] if b["type"] == "text"]


# --------------------------------------------------------------------------- replies


def test_satisfies_the_port() -> None:
    async def check(model: AnthropicModel) -> None:
        port: LlmModel = model
        assert port is model

    with FakeAnthropicServer() as server:
        run(server, check)


def test_text_reply_maps_all_four_usage_fields_exactly() -> None:
    usage = Usage(1234, 56, cache_creation_input_tokens=78, cache_read_input_tokens=910)
    with FakeAnthropicServer() as server:
        server.enqueue(MessageReply(text="Hello there, friend.", usage=usage))
        reply = complete(server)
        assert last_body(server)["stream"] is True  # always streamed
    assert reply.text == "Hello there, friend."
    assert reply.tool_calls == ()
    assert reply.stop_reason == "end_turn"
    assert reply.usage == SegueUsage(
        input_tokens=1234,
        output_tokens=56,
        cache_creation_input_tokens=78,
        cache_read_input_tokens=910,
    )


def test_null_cache_fields_become_zero() -> None:
    usage = Usage(300, 20, cache_creation_input_tokens=None, cache_read_input_tokens=None)
    with FakeAnthropicServer() as server:
        server.enqueue(MessageReply(usage=usage))
        reply = complete(server)
    assert reply.usage == SegueUsage(input_tokens=300, output_tokens=20)


@pytest.mark.parametrize("reason", ["max_tokens", "model_context_window_exceeded", "refusal"])
def test_stop_reason_passes_through(reason: str) -> None:
    with FakeAnthropicServer() as server:
        server.enqueue(MessageReply(stop_reason=reason))
        assert complete(server).stop_reason == reason


def test_streamed_tool_use_round_trip() -> None:
    """The tool call the model streams comes back whole, and goes out again paired."""
    call = ToolUse("bash", {"cmd": "grep -rn 'segue' src | head", "timeout": 30})
    with FakeAnthropicServer() as server:
        server.enqueue(
            MessageReply(text="Searching.", tool_uses=[call], stop_reason="tool_use"),
            MessageReply(text="Found it."),
        )

        async def two_turns(model: AnthropicModel) -> tuple[LlmReply, LlmReply]:
            first = await model.complete(request(messages=HISTORY[:1]))
            history = (
                HISTORY[0],
                Message(kind="assistant", text=first.text, tool_calls=first.tool_calls),
                Message(kind="tool_result", text="src/x.py:1", tool_call_id=first.tool_calls[0].id),
            )
            return first, await model.complete(request(messages=history))

        first, second = run(server, two_turns)
        body = last_body(server)
    assert first.stop_reason == "tool_use"
    assert first.text == "Searching."
    assert first.tool_calls == (ToolCall(id=call.id, name="bash", input=dict(call.input)),)
    assert second.text == "Found it."
    assert blocks(body, "tool_use") == [
        {"type": "tool_use", "id": call.id, "name": "bash", "input": dict(call.input)}
    ]
    assert blocks(body, "tool_result") == [
        {"type": "tool_result", "tool_use_id": call.id, "content": "src/x.py:1"}
    ]


# --------------------------------------------------------------------------- payloads


def test_turn_payload_pairs_tools_and_alternates_roles() -> None:
    with FakeAnthropicServer() as server:
        complete(server)
        body = last_body(server)
    messages = body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert body["system"] == SYSTEM
    assert body["tools"] == [
        {"name": t.name, "description": t.description, "input_schema": t.input_schema}
        for t in TOOLS
    ]
    assert body["model"] == MODEL
    assert messages[1]["content"] == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": LS.id, "name": "bash", "input": LS.input},
        {"type": "tool_use", "id": CAT.id, "name": "bash", "input": CAT.input},
    ]
    # Both results in ONE user message, right after the calls, with is_error carried over.
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": LS.id, "content": "README.md\nsrc"},
        {"type": "tool_result", "tool_use_id": CAT.id, "content": "No such file", "is_error": True},
    ]
    assert texts(messages[4]) == ["Thanks. Now summarise the README."]


def test_turn_payload_text_kinds_and_first_message_is_user() -> None:
    history = (
        Message(kind="checkpoint", text="## Done\nparsed the config"),
        Message(kind="summary", text="We parsed the config.", generation=2),
        Message(kind="user", text="Go on."),
        Message(kind="user", text="Please."),
        Message(kind="continuation", text="Summary: config parsed."),
        Message(kind="assistant", text=""),  # nothing to say: must not become an empty block
        Message(kind="user", text="And now?"),
    )
    with FakeAnthropicServer() as server:
        complete(server, request(messages=history))
        messages = last_body(server)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[1]["content"] == [{"type": "text", "text": "## Done\nparsed the config"}]
    assert texts(messages[2]) == [
        "Summary of the earlier conversation: We parsed the config.",
        "Go on.",
        "Please.",
    ]
    assert texts(messages[3]) == ["Summary: config parsed."]
    assert texts(messages[4]) == ["And now?"]


def test_continuation_payload_has_no_tools_and_names_rejected_calls() -> None:
    rejected = (
        ToolCall(id="toolu_9", name="bash", input={"cmd": "make test"}),
        ToolCall(id="toolu_10", name="patch", input={"file": "a.py"}),
    )
    history = (
        *HISTORY,
        Message(kind="assistant", text="Running the tests.", tool_calls=rejected),
        *(
            Message(kind="tool_result", text="Not run.", tool_call_id=c.id, is_error=True)
            for c in rejected
        ),
    )
    req = request("continuation", history, rejected_tool_calls=rejected, max_tokens=50_000)
    with FakeAnthropicServer() as server:
        complete(server, req, max_tokens=30_000, summary_max_tokens=2_000)
        body = last_body(server)
    assert "tools" not in body
    assert "tool_choice" not in body
    assert body["system"] == SYSTEM
    assert body["max_tokens"] == 2_000  # bounded by summary_max_tokens, not the turn bound
    assert not blocks(body, "tool_use")
    assert not blocks(body, "tool_result")
    roles = [m["role"] for m in body["messages"]]
    assert roles[0] == "user"
    assert all(a != b for a, b in itertools.pairwise(roles))
    everything = "\n".join(b["text"] for b in blocks(body, "text"))
    assert '[called tool bash with {"cmd": "ls"}]' in everything
    assert "[tool result from bash: README.md\nsrc]" in everything
    assert "[tool error from bash: No such file]" in everything
    final = body["messages"][-1]
    assert final["role"] == "user"
    assert texts(final)[-1] == INSTRUCTION
    assert texts(final)[-2] == (
        'You were about to call: bash({"cmd": "make test"}), patch({"file": "a.py"}); '
        "they were not run."
    )


@pytest.mark.parametrize("purpose", ["checkpoint", "compaction"])
def test_other_summary_purposes_are_tool_less_too(purpose: Purpose) -> None:
    with FakeAnthropicServer() as server:
        complete(server, request(purpose))
        body = last_body(server)
    assert "tools" not in body
    assert not blocks(body, "tool_use")
    assert texts(body["messages"][-1])[-1] == INSTRUCTION


@pytest.mark.parametrize("purpose", ["continuation", "checkpoint", "compaction"])
def test_requests_at_the_limit_keep_the_turns_prefix_and_forbid_every_tool(
    purpose: Purpose,
) -> None:
    """REQ-SEG-040: given the turn's tools, a request at the limit is the turn's prefix with
    ``tool_choice: none`` and the instruction last, and marks no breakpoint on its history
    (nothing reads it back)."""
    rejected = (ToolCall(id="toolu_r", name="bash", input={"cmd": "rm -rf /"}),)
    with FakeAnthropicServer() as server:
        complete(server, request("turn", tools=TOOLS))
        complete(server, request(purpose, tools=TOOLS, rejected_tool_calls=rejected))
        turn, limit = (r.body for r in server.message_requests())
    assert limit["tools"] == turn["tools"]  # the breakpoint on the last tool included
    assert limit["system"] == turn["system"]
    assert (limit["tool_choice"], "tool_choice" in turn) == ({"type": "none"}, False)
    last = len(turn["messages"]) - 1
    assert limit["messages"][:last] == turn["messages"][:last]
    assert blocks(limit, "tool_use") == blocks(turn, "tool_use")
    closing = texts(limit["messages"][-1])[-1]
    assert closing.endswith(INSTRUCTION)
    assert 'bash({"cmd": "rm -rf /"}); they were not run.' in closing
    assert "cache_control" not in str(limit["messages"])
    assert "cache_control" in str(turn["messages"])


def test_a_turns_last_round_marks_no_breakpoint_on_its_history() -> None:
    with FakeAnthropicServer() as server:
        complete(server, request("turn", tools=TOOLS, final=True, instruction=INSTRUCTION))
        body = last_body(server, raw=True)
    assert body["tool_choice"] == {"type": "none"}
    assert "cache_control" not in str(body["messages"])
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}


def test_tool_results_are_clipped_in_summary_requests() -> None:
    huge = "x" * (TOOL_RESULT_CHARS * 10)
    history = (
        Message(kind="user", text="dump it"),
        Message(kind="assistant", tool_calls=(LS,)),
        Message(kind="tool_result", text=huge, tool_call_id=LS.id),
    )
    with FakeAnthropicServer() as server:
        complete(server, request("continuation", history))
        body = last_body(server)
    sent = sum(len(b["text"]) for b in blocks(body, "text"))
    assert sent < TOOL_RESULT_CHARS + 1_000
    assert f"[{len(huge) - TOOL_RESULT_CHARS} more characters]" in str(body)


def test_trim_level_drops_the_oldest_history() -> None:
    history = tuple(
        Message(kind="user" if i % 2 == 0 else "assistant", text=f"message {i:02d} " + "z" * 200)
        for i in range(20)
    )
    sent: dict[int, dict[str, Any]] = {}
    with FakeAnthropicServer() as server:
        for level in (0, 1, 2, 9):
            complete(server, request("continuation", history, trim_level=level))
            sent[level] = last_body(server)

    def words(body: dict[str, Any]) -> str:
        return "\n".join(b["text"] for b in blocks(body, "text"))

    sizes = {level: len(words(body)) for level, body in sent.items()}
    assert sizes[0] > sizes[1] > sizes[2] > sizes[9]
    assert len(sent[0]["messages"]) > len(sent[1]["messages"])
    assert "message 00" in words(sent[0])
    assert "message 00" not in words(sent[1])
    assert "message 04" not in words(sent[1])  # a quarter of 20
    assert "message 05" in words(sent[1])
    assert "5 earlier messages were omitted" in words(sent[1])
    for body in sent.values():  # the most recent history and the instruction always survive
        assert f"message {20 - MIN_KEPT_MESSAGES:02d}" in words(body)
        assert texts(body["messages"][-1])[-1] == INSTRUCTION
        assert body["messages"][0]["role"] == "user"


def test_max_tokens_for_turns() -> None:
    with FakeAnthropicServer() as server:
        complete(server, request(max_tokens=1_500))
        assert last_body(server)["max_tokens"] == 1_500
        complete(server, request(max_tokens=1_500), max_tokens=16_000)
        assert last_body(server)["max_tokens"] == 16_000


def test_turn_payload_repairs_unpaired_tool_blocks() -> None:
    """A transcript the core should never produce still yields a payload the API accepts."""
    history = (
        Message(kind="user", text="hi"),
        Message(kind="tool_result", text="orphan", tool_call_id="toolu_gone"),
        Message(kind="assistant", text="", tool_calls=(LS, CAT)),
        Message(kind="user", text="interjection"),
        Message(kind="tool_result", text="late", tool_call_id=LS.id),
        Message(kind="assistant", text="done"),
    )
    messages = turn_messages(history)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[0]["content"] == [
        {"type": "text", "text": "hi"},
        {"type": "text", "text": "[tool result: orphan]"},
    ]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": LS.id, "content": "late"},
        {
            "type": "tool_result",
            "tool_use_id": CAT.id,
            "content": "Not run: no result was recorded for this tool call.",
            "is_error": True,
        },
        {"type": "text", "text": "interjection"},
    ]


_ids = st.sampled_from(["t1", "t2", "t3", "t4"])
_calls = st.builds(ToolCall, id=_ids, name=st.just("bash"), input=st.just({}))
_messages = st.one_of(
    st.builds(
        Message,
        kind=st.sampled_from(["user", "summary", "continuation", "checkpoint"]),
        text=st.sampled_from(["", " ", "text"]),
    ),
    st.builds(
        Message,
        kind=st.just("assistant"),
        text=st.sampled_from(["", "text"]),
        tool_calls=st.lists(_calls, max_size=3).map(tuple),
    ),
    st.builds(
        Message,
        kind=st.just("tool_result"),
        text=st.sampled_from(["", "out"]),
        tool_call_id=_ids,
        is_error=st.booleans(),
    ),
)


@given(st.lists(_messages, max_size=12))
def test_turn_payload_always_satisfies_the_api_rules(history: list[Message]) -> None:
    # Through JSON, as the SDK sends it (and as plain dicts, which the block unions are not).
    messages: list[dict[str, Any]] = json.loads(json.dumps(turn_messages(history)))
    assert messages
    assert messages[0]["role"] == "user"
    for before, after in itertools.pairwise(messages):
        assert before["role"] != after["role"]
    for index, message in enumerate(messages):
        content = list(message["content"])
        assert content, "the API refuses empty content"
        for block in content:
            assert block["type"] != "text" or block["text"].strip()
        uses = [b["id"] for b in content if b["type"] == "tool_use"]
        assert len(uses) == len(set(uses))
        if uses:  # answered, each exactly once, first thing in the very next message
            following = list(messages[index + 1]["content"])
            answered = [b["tool_use_id"] for b in following if b["type"] == "tool_result"]
            assert sorted(answered) == sorted(uses)
            assert all(b["type"] == "tool_result" for b in following[: len(answered)])
        results = [b for b in content if b["type"] == "tool_result"]
        if results:
            previous = list(messages[index - 1]["content"]) if index else []
            called = {b["id"] for b in previous if b["type"] == "tool_use"}
            assert {b["tool_use_id"] for b in results} <= called


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "reply",
    [
        prompt_too_long(210_000, 200_000),
        context_limit(190_000, 20_000, 200_000),
        ErrorReply(413, "request_too_large", "Request exceeds the maximum allowed size"),
    ],
    ids=["prompt_too_long", "context_limit", "request_too_large"],
)
def test_overflow_is_context_overflow_and_never_retried(reply: ErrorReply) -> None:
    with FakeAnthropicServer() as server:
        error = failure(server, reply, MessageReply(), max_retries=2)
        assert server.pending == 1
    assert error.context_overflow
    assert not error.retryable
    assert not error.fatal
    assert error.status_code == reply.status
    assert reply.message in error.message


def test_other_bad_request_is_plain_and_carries_the_provider_message() -> None:
    bad = ErrorReply(400, "invalid_request_error", "messages.0.content: field required")
    with FakeAnthropicServer() as server:
        error = failure(server, bad)
    assert (error.context_overflow, error.retryable, error.fatal) == (False, False, False)
    assert "messages.0.content: field required" in error.message
    assert error.status_code == 400


@pytest.mark.parametrize("max_retries", [0, 2, 5])
def test_one_call_is_one_http_attempt_whatever_the_clients_max_retries(max_retries: int) -> None:
    """segue owns retries (the core schedules and counts them): on top of the SDK's, 4
    reported attempts were 12 HTTP requests."""
    with FakeAnthropicServer() as server:
        late = MessageReply(text="too late")
        error = failure(server, rate_limited(), late, max_retries=max_retries)
        assert len(server.message_requests()) == 1
        assert server.pending == 1
    assert error.retryable
    assert error.status_code == 429


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "7", "retry-after-ms": "250"}, 0.25),
        ({"retry-after": "86400"}, 3600.0),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_is_read_from_the_response(
    headers: dict[str, str], seconds: float | None
) -> None:
    busy = ErrorReply(429, "rate_limit_error", "slow down", headers)
    with FakeAnthropicServer() as server:
        error = failure(server, busy)
    assert error.retry_after == seconds


def test_retry_after_as_an_http_date_is_seconds_from_now() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    busy = ErrorReply(503, "api_error", "maintenance", {"retry-after": when})
    with FakeAnthropicServer() as server:
        error = failure(server, busy)
    assert error.retry_after is not None
    assert 25 <= error.retry_after <= 31


def test_text_is_streamed_as_it_arrives_and_joins_to_the_reply() -> None:
    deltas: list[str] = []
    with FakeAnthropicServer() as server:
        server.enqueue(MessageReply(text="The quick brown fox jumps over the dog.", pieces=6))
        reply = run(
            server,
            lambda model: model.complete(dataclasses.replace(request(), on_text=deltas.append)),
        )
    assert len(deltas) == 6
    assert "".join(deltas) == reply.text == "The quick brown fox jumps over the dog."


@pytest.mark.parametrize("cut_after", [3, 5, 7])
def test_a_stream_cut_off_before_message_stop_is_a_retryable_error(cut_after: int) -> None:
    """Cut inside the text, inside the tool input JSON, or after the message_delta: each time
    the reply is incomplete, and a tool must never run with a cut-off input."""
    call = ToolUse(name="bash", input={"cmd": "rm -rf build && make all"})
    cut = MessageReply(text="Let me build it.", tool_uses=(call,), stop_reason="tool_use")
    with FakeAnthropicServer() as server:
        error = failure(server, MessageReply(text=cut.text, tool_uses=(call,), cut_after=cut_after))
    assert error.retryable
    assert "message_stop" in error.message


def test_a_reply_without_usage_is_a_reply_with_unknown_usage() -> None:
    with FakeAnthropicServer() as server:
        server.enqueue(MessageReply(text="no usage here", usage=None))
        reply = complete(server)
    assert reply.text == "no usage here"
    assert reply.usage is None


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"<html><body>502 Bad gateway</body></html>", "text/html"),
        (b'{"choices": [{"text": "I am not Anthropic"}]}', "application/json"),
        (b"", "text/plain"),
    ],
)
def test_a_200_that_is_not_a_message_says_what_it_was(body: bytes, content_type: str) -> None:
    with FakeAnthropicServer() as server:
        error = failure(server, RawReply(body=body, content_type=content_type))
    assert "HTTP 200" in error.message
    assert content_type in error.message
    assert not error.retryable


def test_an_event_stream_that_ends_before_any_message_is_a_cut_stream() -> None:
    """An event stream closed before its first event (a proxy timing out) is what a stream
    cut later is: incomplete, and worth another attempt; as on OpenAI's adapter."""
    with FakeAnthropicServer() as server:
        error = failure(server, RawReply(body=b"", content_type="text/event-stream"))
    assert error.retryable
    assert "message_stop" in error.message


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        (overloaded(), 529),
        (server_error(), 500),
        (rate_limited(), 429),
        (ErrorReply(408, "timeout_error", "Request timeout"), 408),
        (ErrorReply(409, "conflict_error", "Conflict"), 409),
        (ErrorReply(502, "api_error", "Bad gateway"), 502),
        (ErrorReply(503, "api_error", "Unavailable"), 503),
        (ErrorReply(504, "timeout_error", "Gateway timeout"), 504),
    ],
)
def test_transient_statuses_are_retryable_once_the_sdk_gives_up(
    reply: ErrorReply, status: int
) -> None:
    with FakeAnthropicServer() as server:
        error = failure(server, reply, max_retries=0)
    assert (error.retryable, error.context_overflow, error.fatal) == (True, False, False)
    assert error.status_code == status


def test_overload_mid_stream_is_retryable() -> None:
    """HTTP 200 was already sent: the SDK raises a bare APIStatusError with status 200."""
    with FakeAnthropicServer() as server:
        error = failure(server, overloaded(mid_stream=True), MessageReply(), max_retries=2)
        assert server.pending == 1  # the SDK does not retry a broken stream; the core will
    assert error.retryable
    assert error.status_code is None
    assert "overloaded_error" in error.message


def test_connection_failure_is_retryable() -> None:
    with FakeAnthropicServer() as server:
        error = failure(server, Disconnect(), max_retries=0)
    assert error.retryable
    assert error.status_code is None


@pytest.mark.parametrize(
    "reply",
    [
        authentication(),
        ErrorReply(403, "permission_error", "Your API key does not have permission"),
        # A provider that echoes the credential must not make us repeat it.
        ErrorReply(401, "authentication_error", f"invalid x-api-key: {KEY}"),
    ],
    ids=["401", "403", "401-echoing-the-key"],
)
def test_authentication_failure_is_fatal_and_never_shows_the_key(reply: ErrorReply) -> None:
    with FakeAnthropicServer() as server:
        error = failure(server, reply, MessageReply(), max_retries=2)
        assert server.pending == 1
    assert (error.fatal, error.retryable, error.context_overflow) == (True, False, False)
    assert error.message.startswith("authentication failed: check ANTHROPIC_API_KEY")
    assert KEY not in error.message
    assert KEY not in str(error)


def test_unknown_model_is_fatal() -> None:
    missing = ErrorReply(404, "not_found_error", "model: claude-nonexistent-9")
    with FakeAnthropicServer() as server:
        error = failure(server, missing)
    assert error.fatal
    assert error.message.startswith(f"unknown model {MODEL!r}")
    assert "claude-nonexistent-9" in error.message


def test_unexpected_exceptions_become_llm_call_errors() -> None:
    """A tool input the JSON encoder cannot handle fails inside the SDK, before any HTTP."""
    odd = ToolCall(id="toolu_odd", name="bash", input={"handle": object()})
    history = (
        Message(kind="user", text="go"),
        Message(kind="assistant", tool_calls=(odd,)),
        Message(kind="tool_result", text="ok", tool_call_id=odd.id),
    )
    with FakeAnthropicServer() as server:
        with pytest.raises(LlmCallError) as info:
            complete(server, request(messages=history))
        assert server.requests == []
    flags = (info.value.retryable, info.value.fatal, info.value.context_overflow)
    assert flags == (False, False, False)
    assert "TypeError" in info.value.message


def test_call_error_classifies_without_a_server() -> None:
    assert call_error(RuntimeError(f"boom {KEY}"), model=MODEL, secrets=[KEY]).message == (
        "unexpected RuntimeError from the Anthropic client: boom [redacted]"
    )
    already = LlmCallError("x", retryable=True)
    assert call_error(already, model=MODEL) is already


# --------------------------------------------------------------------------- windows and counts


def test_context_window_comes_from_the_models_api_and_is_cached() -> None:
    """The server's figure wins; a model it does not describe gets the table's, and one the
    table does not know either the smallest of Anthropic's windows, said to be a guess."""
    models = {MODEL: ModelSpec(max_input_tokens=1_000_000), "bare": ModelSpec(None, None)}

    async def ask(model: AnthropicModel) -> list[Window]:
        return [
            await model.window(MODEL),
            await model.window(MODEL),
            await model.window("bare"),
            await model.window("claude-unknown"),
            await model.window("claude-haiku-4-5"),
        ]

    with FakeAnthropicServer(models=models) as server, capture_logs() as logs:
        assert run(server, ask) == [
            Window(1_000_000, "server"),
            Window(1_000_000, "server"),
            Window(200_000, "assumed"),
            Window(200_000, "assumed"),
            Window(200_000, "table"),
        ]
        assert run(server, lambda m: m.context_window(MODEL)) == 1_000_000
        paths = [r.path for r in server.requests]
    assert paths.count(f"/v1/models/{MODEL}") == 2  # once per adapter
    unknown = [e for e in logs if e["event"] == "model_window_unknown"]
    assert [(e["model"], e["assumed_window"]) for e in unknown] == [
        ("bare", 200_000),
        ("claude-unknown", 200_000),
    ]


def test_context_window_is_the_tables_when_the_api_is_unreachable() -> None:
    with FakeAnthropicServer() as server:
        url = server.url

    async def ask() -> Window:
        async with anthropic.AsyncAnthropic(api_key=KEY, base_url=url, max_retries=0) as client:
            return await AnthropicModel(client).window(MODEL)

    assert asyncio.run(ask()) == Window(1_000_000, "table")


class _Flaky(httpx2.AsyncHTTPTransport):
    """A connection that fails while ``down``: an API unreachable for a while."""

    down = True

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if self.down:
            raise httpx2.ConnectError("connection refused", request=request)
        return await super().handle_async_request(request)


def test_a_window_is_asked_again_after_a_failure_but_not_after_an_answer() -> None:
    """An unknown model's 404 is an answer, kept like a window; an unreachable API is not,
    so the next conversation asks again instead of living with the table's guess."""
    transport = _Flaky()

    async def ask(url: str) -> list[int]:
        async with (
            httpx2.AsyncClient(transport=transport) as http,
            anthropic.AsyncAnthropic(api_key=KEY, base_url=url, http_client=http) as client,
        ):
            model = AnthropicModel(client)
            unreachable = await model.context_window(MODEL)
            transport.down = False
            return [
                unreachable,
                await model.context_window(MODEL),
                await model.context_window("claude-unknown"),
                await model.context_window("claude-unknown"),
            ]

    with FakeAnthropicServer(models={MODEL: ModelSpec(max_input_tokens=900_000)}) as server:
        assert asyncio.run(ask(server.url)) == [1_000_000, 900_000, 200_000, 200_000]
        paths = [r.path for r in server.requests]
    assert paths.count("/v1/models/claude-unknown") == 1


def test_count_tokens_uses_the_same_payload_when_enabled() -> None:
    def count(body: dict[str, Any]) -> int:
        return 1000 * len(body["messages"]) + len(body.get("tools", []))

    with FakeAnthropicServer(count_tokens=count) as server:
        assert run(server, lambda m: m.count_tokens(request())) is None  # disabled by default
        assert server.requests == []
        counted = run(server, lambda m: m.count_tokens(request()), exact_preflight=True)
        summary = run(
            server, lambda m: m.count_tokens(request("continuation")), exact_preflight=True
        )
        complete(server)
        counted_body, summary_body, sent = (uncached(r.body) for r in server.requests)
    assert counted == 5_001
    assert summary is not None
    assert summary < counted
    assert counted_body["messages"] == sent["messages"]
    assert counted_body["tools"] == sent["tools"]
    assert counted_body["system"] == SYSTEM
    assert "max_tokens" not in counted_body
    assert "tools" not in summary_body


def test_count_tokens_is_none_on_error() -> None:
    def refuse(body: dict[str, Any]) -> int:
        raise ValueError("cannot count")

    with FakeAnthropicServer(count_tokens=refuse) as server:
        assert run(server, lambda m: m.count_tokens(request()), exact_preflight=True) is None


# --------------------------------------------------------------------------- logs


def test_logs_say_what_happened_and_never_the_key() -> None:
    usage = Usage(100, 10, cache_creation_input_tokens=None, cache_read_input_tokens=7)
    with FakeAnthropicServer() as server, capture_logs() as logs:
        server.enqueue(MessageReply(usage=usage, stop_reason="max_tokens"))
        complete(server, request("compaction"))
        failure(server, ErrorReply(401, "authentication_error", f"bad key {KEY}"))
        run(server, lambda m: m.context_window("claude-unknown"))
        run(server, lambda m: m.count_tokens(request()), exact_preflight=True)
    assert logs, "nothing was logged"
    assert KEY not in repr(logs)
    assert "Bearer" not in repr(logs)
    guesses = [e for e in logs if e["event"] == "model_window_unknown"]
    assert [e["log_level"] for e in guesses] == ["warning"]  # the one thing a user must know
    assert all(entry["log_level"] == "debug" for entry in logs if entry not in guesses)
    reply = next(e for e in logs if e["event"] == "llm.reply")
    assert reply["purpose"] == "compaction"
    assert reply["model"] == MODEL
    assert reply["stop_reason"] == "max_tokens"
    assert reply["usage"] == {
        "input_tokens": 100,
        "output_tokens": 10,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 7,
    }
    assert reply["duration_s"] >= 0
    error = next(e for e in logs if e["event"] == "llm.error")
    assert error["fatal"] is True
    assert error["status_code"] == 401
