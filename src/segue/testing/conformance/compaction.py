"""The conformance kit's checks of an adapter whose provider compacts the context itself
(``compaction="provider"``, REQ-SEG-048 to REQ-SEG-051).

Each runs only for an adapter that says its provider compacts the harness's
``compacting_model`` (``ContextManaging.context_support``); for any other the report says, by
name, that it does not apply and why, so an adapter's author learns whether segue will let a
conversation hand its compaction to the provider. They are part of ``checks.CHECKS``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from segue.executor.errors import LlmCallError
from segue.executor.model_port import CompactionAsk, ContextManaging, LlmModel, LlmRequest
from segue.statemachine import Message
from segue.testing.conformance.terms import (
    CompactingHarness,
    Compaction,
    ConformanceError,
    Failure,
    Harness,
    NotApplicable,
    Said,
)

ASK = CompactionAsk(trigger_tokens=60_000, instructions="Keep the dates.", pause_after=False)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceError(message)


def _request(model: str, *messages: Message, ask: CompactionAsk | None = ASK) -> LlmRequest:
    return LlmRequest(
        conversation_id="conformance",
        model=model,
        purpose="turn",
        system="Be brief.",
        messages=messages or (Message(kind="user", text="When is high tide?"),),
        compaction=ask,
    )


@asynccontextmanager
async def _compacting(harness: Harness) -> AsyncIterator[tuple[LlmModel, str]]:
    """The adapter and a model whose provider it says compacts; ``NotApplicable`` otherwise."""
    if not isinstance(harness, CompactingHarness):
        raise NotApplicable("the harness names no compacting_model its provider compacts")
    model_name = harness.compacting_model
    async with harness.model() as model:
        if not isinstance(model, ContextManaging):
            raise NotApplicable("the adapter says nothing of the provider's own compaction")
        if not model.context_support(model_name).compaction:
            raise NotApplicable(f"the adapter says its provider does not compact {model_name}")
        yield model, model_name


async def compaction_is_asked_at_the_trigger(harness: Harness) -> None:
    """A request that asks the provider to compact says so, at no less than its trigger; one
    that does not ask says nothing of it."""
    async with _compacting(harness) as (model, name):
        await model.complete(_request(name))
        await model.complete(_request(name, ask=None))
    if not harness.wire:
        raise NotApplicable("the harness has no wire to read the request from")
    asked, plain = harness.sent()[-2:]
    _require(asked.compaction_trigger is not None, "the provider was not asked to compact")
    assert asked.compaction_trigger is not None  # noqa: S101  # for the type checker
    _require(
        asked.compaction_trigger >= ASK.trigger_tokens,
        f"asked to compact at {asked.compaction_trigger:,} tokens, below the trigger "
        f"{ASK.trigger_tokens:,}: the provider would compact early",
    )
    _require(plain.compaction_trigger is None, "a request that did not ask asked to compact")


async def a_compaction_comes_back_whole_and_apart(harness: Harness) -> None:
    """The provider's compaction comes back as the reply's, with its block; the reply's usage
    is the answer's alone (never the compaction's, which read the whole context), and the
    compaction's own cost is kept apart when the provider reports it."""
    compacted = Compaction(prompt=150_000, output=800)
    async with _compacting(harness) as (model, name):
        harness.script(
            Said(text="High tide at noon.", prompt=1_200, output=40, compacted=compacted)
        )
        reply = await model.complete(_request(name))
    _require(len(reply.compactions) == 1, f"{len(reply.compactions)} compactions came back")
    made = reply.compactions[0]
    _require(made.block is not None, "the compaction came back without its block to send back")
    assert made.block is not None  # noqa: S101  # for the type checker
    _require(not made.block.failed, f"a compaction that worked reads as failed: {made.block!r}")
    _require(reply.text == "High tide at noon.", f"the answer is {reply.text!r}")
    _require(
        reply.usage is not None and reply.usage.context_tokens == 1_240,
        f"the reply's usage is not the answer's (1,240 tokens): {reply.usage!r}",
    )
    if made.usage is not None:
        _require(
            made.usage.context_tokens == 150_800,
            f"the compaction's cost is misread: {made.usage!r} (150,800 tokens)",
        )


async def the_block_goes_back_first_and_verbatim(harness: Harness) -> None:
    """The block a compaction returned goes back as it came, and its summary is not sent as
    text of segue's: the provider reads the block, and drops what precedes it."""
    async with _compacting(harness) as (model, name):
        harness.script(Said(text="Noted.", compacted=Compaction()))
        first = await model.complete(_request(name))
        block = first.compactions[0].block if first.compactions else None
        _require(block is not None, "no compaction came back to send")
        assert block is not None  # noqa: S101  # for the type checker
        summary = Message(kind="summary", text=first.compactions[0].summary, content=(block,))
        pinned = Message(kind="user", text="Never touch the migrations.", pinned=True)
        asking = Message(kind="user", text="And low tide?")
        await model.complete(_request(name, summary, pinned, asking))
    if not harness.wire:
        raise NotApplicable("the harness has no wire to read the request from")
    sent = json.dumps(harness.sent()[-1].raw)
    opaque = block.encrypted_content or block.content or ""
    _require(bool(opaque) and opaque in sent, "the compaction did not go back as it came")
    _require(
        sent.index(opaque) < sent.index("Never touch the migrations."),
        "the compaction does not come first: the provider drops what precedes it",
    )
    _require(
        "Summary of the earlier conversation" not in sent,
        "the provider's summary went as segue's text besides its block",
    )


async def a_refusal_to_compact_is_said_as_such(harness: Harness) -> None:
    """A provider that cannot compact for the model answers ``compaction_refused``, so that
    the conversation falls back to segue's own compaction (REQ-SEG-049)."""
    async with _compacting(harness) as (model, name):
        harness.script(Failure("compaction_refused"))
        try:
            reply = await model.complete(_request(name))
        except LlmCallError as error:
            _require(
                error.compaction_refused,
                f"the refusal came as {error!r}: set compaction_refused, or the conversation "
                "fails instead of compacting on its own",
            )
            _require(not error.retryable, "a refusal to compact is not worth another attempt")
            return
    raise ConformanceError(f"complete() returned {reply!r} where the provider refused")


async def a_failed_compaction_is_never_a_summary(harness: Harness) -> None:
    """A compaction whose summary failed comes back as failed (or not at all), never as a
    summary segue would store and send back."""
    async with _compacting(harness) as (model, name):
        harness.script(Said(text="Noted.", compacted=Compaction(summary=None)))
        reply = await model.complete(_request(name))
    blocks: list[Any] = [c.block for c in reply.compactions]
    _require(
        all(block is None or block.failed for block in blocks),
        f"a compaction without a summary came back as one that worked: {blocks!r}",
    )
    _require(reply.text == "Noted.", f"the answer is {reply.text!r}")


COMPACTION_CHECKS = (
    compaction_is_asked_at_the_trigger,
    a_compaction_comes_back_whole_and_apart,
    the_block_goes_back_first_and_verbatim,
    a_refusal_to_compact_is_said_as_such,
    a_failed_compaction_is_never_a_summary,
)
"""The checks of this module, in the order ``run`` runs them (after the others)."""

__all__ = [
    "COMPACTION_CHECKS",
    "a_compaction_comes_back_whole_and_apart",
    "a_failed_compaction_is_never_a_summary",
    "a_refusal_to_compact_is_said_as_such",
    "compaction_is_asked_at_the_trigger",
    "the_block_goes_back_first_and_verbatim",
]
