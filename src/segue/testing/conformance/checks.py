"""The conformance kit's checks: one function per behaviour the port asks of an adapter, each
scripting the provider through a ``Harness`` in the kit's neutral terms and saying, when the
adapter gets it wrong, what is wrong and how to fix it. ``CHECKS`` lists them in the order
``run`` checks them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import traceback
from collections.abc import Sequence
from typing import Any

from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmModel, LlmReply, LlmRequest, ToolSpec, reuses_prefix
from segue.statemachine import Message, ToolCall
from segue.statemachine.content import ImageBase64Source, ImageBlock, TextBlock
from segue.testing.conformance.compaction import COMPACTION_CHECKS
from segue.testing.conformance.terms import (
    Call,
    Check,
    ConformanceError,
    Failure,
    Harness,
    NotApplicable,
    Said,
)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceError(message)


def _request(
    messages: Sequence[Message] = (),
    *,
    purpose: Any = "turn",
    tools: Sequence[ToolSpec] = (),
    **fields: Any,
) -> LlmRequest:
    return LlmRequest(
        conversation_id="conformance",
        model=fields.pop("model", "conformance-model"),
        purpose=purpose,
        system=fields.pop("system", "Be brief."),
        messages=tuple(messages) or (Message(kind="user", text="Hello?"),),
        tools=tuple(tools),
        **fields,
    )


LOOKUP = ToolSpec(
    name="lookup",
    description="Look something up.",
    input_schema={"type": "object", "properties": {"query": {"type": "string"}}},
)


async def _ask(model: LlmModel, request: LlmRequest, deltas: list[str] | None = None) -> LlmReply:
    if deltas is not None:
        request = dataclasses.replace(request, on_text=deltas.append)
    return await model.complete(request)


async def _fails(model: LlmModel, request: LlmRequest) -> LlmCallError:
    try:
        reply = await model.complete(request)
    except LlmCallError as error:
        return error
    except Exception as exc:  # that is the finding
        raise ConformanceError(
            f"complete() raised {type(exc).__name__}: an adapter must raise LlmCallError and "
            "nothing else (wrap the client's errors)"
        ) from exc
    raise ConformanceError(f"complete() returned {reply!r} where the provider failed")


async def text_streams(harness: Harness) -> None:
    """The reply's text is what the provider wrote; streamed, its deltas join to it exactly."""
    text = "High tide is at noon, and low tide at six."
    harness.script(Said(text=text, pieces=5))
    async with harness.model() as model:
        deltas: list[str] = []
        reply = await _ask(model, _request(), deltas)
        _require(reply.text == text, f"reply.text is {reply.text!r}, the provider wrote {text!r}")
        if deltas:  # an adapter that does not stream leaves them empty, and is shown whole
            _require(
                "".join(deltas) == text, f"on_text got {deltas!r}, which do not join to the text"
            )
            _require(len(deltas) > 1, "on_text was called once: pass each delta as it arrives")


async def usage_counts_each_token_once(harness: Harness) -> None:
    """Usage maps to the four fields with the cached part counted once: the occupancy is the
    prompt plus the output."""
    harness.script(Said(prompt=12_000, cached=9_000, cache_write=1_000, output=300))
    async with harness.model() as model:
        usage = (await _ask(model, _request())).usage
    _require(usage is not None, "a reply with usage came back with usage=None")
    assert usage is not None  # noqa: S101  # for the type checker
    _require(
        usage.context_tokens == 12_300,
        f"occupancy {usage.context_tokens:,} is not prompt + output (12,300): {usage!r}",
    )
    _require(
        (usage.cache_read_input_tokens, usage.output_tokens) == (9_000, 300),
        f"cache reads or output misread: {usage!r} (expected 9,000 read, 300 out)",
    )
    _require(
        usage.cache_creation_input_tokens in (0, 1_000),
        f"cache writes misread: {usage!r}",
    )


async def missing_usage_is_unknown(harness: Harness) -> None:
    """A reply that reports no usage says nothing about occupancy (usage None or all zero)."""
    harness.script(Said(prompt=None))
    async with harness.model() as model:
        reply = await _ask(model, _request())
    _require(
        reply.usage is None or not reply.usage.is_known,
        f"no usage was reported, yet the reply says {reply.usage!r}: return usage=None",
    )


async def tool_calls_come_back_whole(harness: Harness) -> None:
    """A tool call comes back with its id, name and input parsed from its joined fragments."""
    harness.script(Said(text="Let me look.", calls=[Call("lookup", {"query": "tides"}, "call_a")]))
    async with harness.model() as model:
        reply = await _ask(model, _request(tools=[LOOKUP]))
    calls = [(c.name, c.input) for c in reply.tool_calls]
    _require(calls == [("lookup", {"query": "tides"})], f"tool calls read as {calls!r}")
    _require(reply.tool_calls[0].id == "call_a", "the call's id must be the provider's")


async def invalid_arguments_are_never_run(harness: Harness) -> None:
    """A call whose arguments are not JSON is an error, never a call with partial input."""
    harness.script(Said(text="", calls=[Call("lookup", '{"query": "ti', "call_b")]))
    async with harness.model() as model:
        await _fails(model, _request(tools=[LOOKUP]))


def _history_with_a_tool_round() -> list[Message]:
    call = ToolCall(id="call_t", name="lookup", input={"query": "tides"})
    return [
        Message(kind="user", text="When is high tide?"),
        Message(kind="assistant", text="Checking.", tool_calls=(call,)),
        Message(kind="tool_result", text="noon", tool_call_id="call_t"),
        Message(kind="assistant", text="At noon."),
        Message(kind="user", text="And low tide?"),
    ]


async def tools_and_results_go_back_paired(harness: Harness) -> None:
    """A normal turn declares the tools and sends each call with its result, by id."""
    if not harness.wire:
        raise NotApplicable("no wire to read")
    harness.script(Said())
    async with harness.model() as model:
        await _ask(model, _request(_history_with_a_tool_round(), tools=[LOOKUP]))
    sent = harness.sent()[-1]
    _require(sent.tools == ("lookup",), f"declared tools {sent.tools!r}, expected ('lookup',)")
    calls = [c for turn in sent.turns for c in turn.calls]
    _require(calls == [("call_t", "lookup", {"query": "tides"})], f"calls sent as {calls!r}")
    results = [(t.result_for, t.text) for t in sent.turns if t.result_for is not None]
    _require(results == [("call_t", "noon")], f"results sent as {results!r}")


async def the_grace_request_forbids_tools(harness: Harness) -> None:
    """At ``max_tool_rounds`` (``final``) the tools stay declared but cannot be called, and the
    instruction comes last."""
    if not harness.wire:
        raise NotApplicable("no wire to read")
    harness.script(Said())
    request = _request(
        _history_with_a_tool_round(), tools=[LOOKUP], final=True, instruction="Answer now."
    )
    async with harness.model() as model:
        await _ask(model, request)
    sent = harness.sent()[-1]
    _require(not sent.callable_tools, "the grace request left tools callable: tool_choice none")
    _require(
        sent.turns[-1].role == "user" and "Answer now." in sent.turns[-1].text,
        "the instruction must come last",
    )


async def requests_at_the_limit_offer_no_tool(harness: Harness) -> None:
    """A summary request (continuation, checkpoint, compaction) offers no callable tool:
    without the turn's tools (or trimmed) it declares none, turns tool blocks into text, names
    the rejected calls, honours ``trim_level`` and ends with the instruction; given the turn's
    tools it may send the turn's prefix instead (REQ-SEG-047), tools declared with the
    provider's "none" tool choice, the rejected calls named and the instruction last."""
    if not harness.wire:
        raise NotApplicable("no wire to read")
    history = [Message(kind="user", text="The very first question.")]
    history += [Message(kind="assistant", text=f"Answer {i}.") for i in range(3)]
    history += _history_with_a_tool_round()
    rejected = (ToolCall(id="call_r", name="delete_everything", input={}),)
    harness.script(Said(text="Summary."))
    request = _request(
        history,
        purpose="continuation",
        instruction="Summarise the conversation.",
        rejected_tool_calls=rejected,
        trim_level=1,
    )
    async with harness.model() as model:
        await _ask(model, request)
    sent = harness.sent()[-1]
    _require(not sent.tools, f"a summary request declared tools {sent.tools!r}")
    _require(sent.tool_blocks == 0, "a summary request holds tool blocks: write them as text")
    _require("delete_everything" in sent.text, "the rejected tool calls must be named in prose")
    _require("The very first question." not in sent.text, "trim_level=1 must drop the oldest")
    _require("noon" in sent.text, "tool results must stay, as text")
    last = sent.turns[-1]
    _require(
        last.role == "user" and "Summarise the conversation." in last.text,
        "the instruction must come last",
    )
    harness.script(Said(text="Summary."))
    with_tools = dataclasses.replace(request, tools=(LOOKUP,), trim_level=0)
    async with harness.model() as model:
        await _ask(model, with_tools)
    sent = harness.sent()[-1]
    _require(
        not sent.tools or sent.tool_choice_none,
        f"a summary request declared tools {sent.tools!r} that can be called",
    )
    _require("delete_everything" in sent.text, "the rejected tool calls must be named in prose")
    _require("Summarise the conversation." in sent.turns[-1].text, "the instruction must come last")


async def summaries_can_repeat_the_turn(harness: Harness) -> None:
    """An adapter that says it can repeat the turn's request at the limit (``PrefixReusing``,
    REQ-SEG-055, REQ-SEG-057) sends, for ``reuse_prefix``, the turn's tools callable as the turn
    has them, the same system prompt, the turn's history unchanged, then the rejected calls and
    the instruction; and a tool call in the answer comes back as a call, for the core to refuse
    (REQ-SEG-056). Not applicable to an adapter that does not say so."""
    history = _history_with_a_tool_round()
    turn = _request(history, tools=[LOOKUP])
    summary = dataclasses.replace(
        turn,
        purpose="continuation",
        instruction="Summarise the conversation.",
        rejected_tool_calls=(ToolCall(id="call_r", name="delete_everything", input={}),),
        reuse_prefix=True,
    )
    called = Said(text="", calls=[Call("lookup", {"query": "more"}, "call_s")])
    async with harness.model() as model:
        if not reuses_prefix(model):
            raise NotApplicable("the adapter does not say it can (PrefixReusing)")
        if not harness.wire:
            raise NotApplicable("no wire to read")
        harness.script(Said(), called)
        await _ask(model, turn)
        reply = await _ask(model, summary)
    before, after = harness.sent()[-2:]
    _require(after.tools == before.tools, f"declared {after.tools!r}, the turn {before.tools!r}")
    _require(
        after.callable_tools == before.callable_tools,
        "the tool choice must be the turn's (a changed tool choice misses the cached history)",
    )
    _require(after.system == before.system, "the system prompt must be the turn's")
    count = len(before.turns)
    _require(
        after.turns[: count - 1] == before.turns[: count - 1],
        "the history must be sent as the turn sent it (tool blocks and all)",
    )
    last, same = before.turns[count - 1], after.turns[count - 1]
    _require(
        (same.role, same.calls, same.result_for) == (last.role, last.calls, last.result_for)
        and same.parts[: len(last.parts)] == last.parts,
        "the turn's last message must stay as it was, the instruction after it",
    )
    closing = after.turns[-1]
    _require(
        closing.role == "user" and "Summarise the conversation." in closing.text,
        "the instruction must come last",
    )
    _require("delete_everything" in closing.text, "the rejected tool calls must be named last")
    calls = [(c.id, c.name) for c in reply.tool_calls]
    _require(
        calls == [("call_s", "lookup")],
        f"a tool call in the summary's answer came back as {calls!r}: return it, the core "
        "refuses it",
    )


async def overflow_takes_the_exhaustion_path(harness: Harness) -> None:
    """The provider's "prompt too long" is ``context_overflow``."""
    harness.script(Failure("overflow"))
    async with harness.model() as model:
        error = await _fails(model, _request())
    _require(
        error.context_overflow,
        f"an overflow came back as {error.message!r} without context_overflow",
    )


async def rate_limits_are_retried_when_asked(harness: Harness) -> None:
    """A 429 is retryable and carries the provider's Retry-After."""
    harness.script(Failure("rate_limit", retry_after=7))
    async with harness.model() as model:
        error = await _fails(model, _request())
    _require(error.retryable, "a 429 must be retryable (by segue, with the client's retries off)")
    _require(error.retry_after == 7, f"Retry-After 7 came back as retry_after={error.retry_after}")


async def server_errors_are_retryable(harness: Harness) -> None:
    """A 5xx, and an error in a stream that had started, are retryable."""
    harness.script(Failure("server"), Failure("mid_stream"))
    async with harness.model() as model:
        for what in ("a 5xx", "an error event mid-stream"):
            error = await _fails(model, _request())
            _require(error.retryable, f"{what} must be retryable: {error.message!r}")


async def a_cut_stream_is_never_a_reply(harness: Harness) -> None:
    """A stream that ends before its end is a retryable error, never a reply."""
    harness.script(Said(text="A reply that never ends properly.", cut=True))
    async with harness.model() as model:
        error = await _fails(model, _request())
    _require(error.retryable, "a cut stream must be retryable")


async def a_bad_key_fails_without_the_key(harness: Harness) -> None:
    """401 is fatal, names where the key comes from, and the key is nowhere in the error: not
    its message, ``str``, ``repr`` nor its traceback with every chained exception."""
    harness.script(Failure("auth", echo=harness.key))
    async with harness.model() as model:
        error = await _fails(model, _request())
    _require(error.fatal, "a 401 must be fatal (no retry fixes a bad key)")
    _require("API_KEY" in error.message, f"say which variable holds the key: {error.message!r}")
    shown = "".join(traceback.format_exception(error)) + str(error) + repr(error)
    chained: BaseException | None = error
    while chained is not None:
        shown += str(chained) + repr(chained) + repr(chained.args)
        chained = chained.__cause__ or chained.__context__
    _require(harness.key not in shown, "the API key appears in the error or its chain: redact it")


async def images_are_sent(harness: Harness) -> None:
    """A user's image goes to the provider."""
    if not harness.wire:
        raise NotApplicable("no wire to read")
    pixel = (
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
        "AAAABJRU5ErkJggg=="
    )
    image = ImageBlock(source=ImageBase64Source(media_type="image/png", data=pixel))
    message = Message(
        kind="user", text="What is this?", content=(TextBlock(text="What is this?"), image)
    )
    harness.script(Said())
    async with harness.model() as model:
        await _ask(model, _request([message]))
    sent = harness.sent()[-1]
    _require(sum(t.images for t in sent.turns) == 1, "the image was not sent")


async def cancellation_stops_the_call(harness: Harness) -> None:
    """A call cancelled mid-stream stops at once with ``CancelledError`` (not an
    ``LlmCallError``), and the adapter answers the next call."""
    harness.script(Said(text="word " * 200, pieces=200, chunk_delay=0.05), Said(text="Again."))
    async with harness.model() as model:
        deltas: list[str] = []
        task = asyncio.ensure_future(_ask(model, _request(), deltas))
        for _ in range(400):
            if deltas or task.done():
                break
            await asyncio.sleep(0.01)
        task.cancel()
        try:
            await asyncio.wait_for(task, timeout=10)
        except asyncio.CancelledError:
            pass
        else:
            raise ConformanceError("the call finished although it was cancelled mid-stream")
        reply = await _ask(model, _request())
        _require(reply.text == "Again.", "after a cancelled call the next one must work")


async def windows_and_counts_answer_or_say_none(harness: Harness) -> None:
    """``context_window`` and ``count_tokens`` answer a number or None, never raise."""
    async with harness.model() as model:
        window = await model.context_window("conformance-model")
        counted = await model.count_tokens(_request())
    _require(window is None or window > 0, f"context_window answered {window!r}")
    _require(counted is None or counted > 0, f"count_tokens answered {counted!r}")


CHECKS: tuple[Check, ...] = (
    text_streams,
    usage_counts_each_token_once,
    missing_usage_is_unknown,
    tool_calls_come_back_whole,
    invalid_arguments_are_never_run,
    tools_and_results_go_back_paired,
    the_grace_request_forbids_tools,
    requests_at_the_limit_offer_no_tool,
    summaries_can_repeat_the_turn,
    overflow_takes_the_exhaustion_path,
    rate_limits_are_retried_when_asked,
    server_errors_are_retryable,
    a_cut_stream_is_never_a_reply,
    a_bad_key_fails_without_the_key,
    images_are_sent,
    cancellation_stops_the_call,
    windows_and_counts_answer_or_say_none,
    *COMPACTION_CHECKS,  # the provider's own compaction, where it has one
)
"""Every behaviour, in the order ``run`` checks them."""


__all__ = [
    "CHECKS",
    "a_bad_key_fails_without_the_key",
    "a_cut_stream_is_never_a_reply",
    "cancellation_stops_the_call",
    "images_are_sent",
    "invalid_arguments_are_never_run",
    "missing_usage_is_unknown",
    "overflow_takes_the_exhaustion_path",
    "rate_limits_are_retried_when_asked",
    "requests_at_the_limit_offer_no_tool",
    "server_errors_are_retryable",
    "summaries_can_repeat_the_turn",
    "text_streams",
    "the_grace_request_forbids_tools",
    "tool_calls_come_back_whole",
    "tools_and_results_go_back_paired",
    "usage_counts_each_token_once",
    "windows_and_counts_answer_or_say_none",
]
