"""Reading one streamed Messages API response into segue's ``LlmReply``.

segue reads the raw server-sent events itself rather than through the SDK's accumulating
``MessageStream``, for three reasons the accumulator gets wrong for us:

* A compatible server that sends no ``usage`` (several do) makes the SDK's accumulator raise on
  ``message_delta``; here a missing report is simply unknown usage, which the core knows how to
  keep (the last figure stands).
* A stream that ends before ``message_stop`` leaves the SDK a partial message whose tool inputs
  are parsed from cut-off JSON. Here such a stream is a retryable error, and a tool input counts
  only once its block closed and its JSON parsed.
* Thinking blocks must be sent back exactly (text and signature), so they are kept as blocks.

Usage is what the API says it is: the ``message_start`` counts, overridden field by field by the
cumulative counts of ``message_delta`` when it carries them (a null field is "not said").

The provider's own context management (``docs/providers.md``): a ``compaction`` block (its
opaque fields from the block's start, its summary from its ``compaction_delta``) becomes the
reply's compaction, kept whole to be sent back; ``usage.iterations`` splits what the call cost
between the compaction and the message, whose usage alone is the reply's (the top-level usage
is the message iteration's: occupancy is never the compaction's); the applied context edits
become the reply's ``context_edits``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from segue.executor.errors import LlmCallError
from segue.executor.model_port import ContextEdit, LlmReply, ProviderCompaction, TextSink
from segue.executor.models.replies import token_count
from segue.statemachine import ToolCall, Usage
from segue.statemachine.content import (
    CompactionBlock,
    ContentBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
)

_USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


@dataclass(slots=True)
class _Block:
    """One content block as it streams in."""

    kind: str
    start: Any
    parts: list[str] = field(default_factory=list)
    signature: str = ""
    encrypted: str = ""
    """A compaction block's opaque content, from its ``compaction_delta``."""
    closed: bool = False


@dataclass(slots=True)
class StreamReader:
    """Accumulates the events of one response; ``reply()`` once ``message_stop`` has come."""

    on_text: TextSink | None = None
    stopped: bool = False
    stop_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    usage_said: bool = False
    blocks: dict[int, _Block] = field(default_factory=dict)
    iterations: list[Any] = field(default_factory=list)
    """``usage.iterations``: what each sampling iteration of the call cost, in order."""
    applied: list[Any] = field(default_factory=list)
    """``context_management.applied_edits``: what the provider cleared before answering."""
    response_id: str | None = None
    """The message's id (``message_start``), for tracing (``gen_ai.response.id``)."""
    response_model: str | None = None
    """The model that answered, as the provider names it (``message_start``)."""

    def feed(self, event: Any) -> None:
        """Take one raw stream event (an SDK ``RawMessageStreamEvent``)."""
        kind = getattr(event, "type", None)
        if kind == "message_start":
            message = getattr(event, "message", None)
            self._take_usage(getattr(message, "usage", None))
            self.response_id = _text_or_none(getattr(message, "id", None))
            self.response_model = _text_or_none(getattr(message, "model", None))
        elif kind == "content_block_start":
            start = event.content_block
            self.blocks[event.index] = _Block(kind=getattr(start, "type", "unknown"), start=start)
        elif kind == "content_block_delta":
            self._delta(self.blocks.get(event.index), event.delta)
        elif kind == "content_block_stop":
            block = self.blocks.get(event.index)
            if block is not None:
                block.closed = True
        elif kind == "message_delta":
            self.stop_reason = getattr(event.delta, "stop_reason", None) or self.stop_reason
            self._take_usage(getattr(event, "usage", None))
            managed = getattr(event, "context_management", None)
            self.applied = list(getattr(managed, "applied_edits", None) or self.applied)
        elif kind == "message_stop":
            self.stopped = True

    def _delta(self, block: _Block | None, delta: Any) -> None:
        if block is None:
            return
        kind = getattr(delta, "type", None)
        if kind == "text_delta":
            block.parts.append(delta.text)
            if self.on_text is not None and delta.text:
                self.on_text(delta.text)
        elif kind == "input_json_delta":
            block.parts.append(delta.partial_json)
        elif kind == "thinking_delta":
            block.parts.append(delta.thinking)
        elif kind == "signature_delta":
            block.signature += delta.signature
        elif kind == "compaction_delta":  # the whole summary at once, as the SDK takes it
            block.parts[:] = [getattr(delta, "content", None) or ""]
            block.encrypted = getattr(delta, "encrypted_content", None) or ""

    def _take_usage(self, usage: Any) -> None:
        if usage is None:
            return
        iterations = getattr(usage, "iterations", None)
        if iterations:
            self.iterations = list(iterations)
        for name in _USAGE_FIELDS:
            value = token_count(getattr(usage, name, None))
            if value is not None:
                self.usage[name] = value
                self.usage_said = True

    def reply(self) -> LlmReply:
        """The complete reply; ``LlmCallError`` (retryable) if the stream was cut off."""
        if not self.stopped:
            msg = "the response stream ended before message_stop (the reply is incomplete)"
            raise LlmCallError(msg, retryable=True)
        texts: list[str] = []
        calls: list[ToolCall] = []
        content: list[ContentBlock] = []
        compactions: list[ProviderCompaction] = []
        thinking = False
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if block.kind == "compaction":
                compactions.append(self._compaction(block, len(compactions)))
            elif block.kind == "text":
                text = "".join(block.parts) or getattr(block.start, "text", "") or ""
                texts.append(text)
                content.append(TextBlock(text=text))
            elif block.kind == "tool_use":
                call = _tool_call(block)
                calls.append(call)
                content.append(ToolUseBlock(id=call.id, name=call.name, input=call.input))
            elif block.kind == "thinking":
                thinking = True
                text = "".join(block.parts) or getattr(block.start, "thinking", "") or ""
                signature = block.signature or getattr(block.start, "signature", "") or ""
                content.append(ThinkingBlock(thinking=text, signature=signature))
            elif block.kind == "redacted_thinking":
                thinking = True
                content.append(RedactedThinkingBlock(data=getattr(block.start, "data", "")))
        return LlmReply(
            text="".join(texts),
            tool_calls=tuple(calls),
            usage=self._usage(),
            stop_reason=self.stop_reason or "end_turn",
            # Only a reply with thinking needs its blocks kept: everything else is its text and
            # tool calls, which the transcript holds already.
            content=tuple(content) if thinking else (),
            compactions=tuple(compactions),
            context_edits=tuple(_edits(self.applied)),
            response_id=self.response_id,
            response_model=self.response_model,
        )

    def _compaction(self, block: _Block, index: int) -> ProviderCompaction:
        """The ``index``-th compaction block of the reply, whole, with what its iteration cost
        (``usage.iterations``' ``index``-th ``compaction`` entry)."""
        start = block.start
        said = "".join(block.parts) if block.parts else getattr(start, "content", None)
        encrypted = block.encrypted or getattr(start, "encrypted_content", None)
        changes = getattr(start, "tool_changes", None)
        compaction = CompactionBlock(
            provider="anthropic",
            content=said if said else None,
            encrypted_content=encrypted or None,
            signature=getattr(start, "signature", None),
            tool_changes=None if changes is None else tuple(_plain(c) for c in changes),
        )
        spent = [i for i in self.iterations if getattr(i, "type", None) == "compaction"]
        cost = _usage_of(spent[index]) if index < len(spent) else None
        return ProviderCompaction(summary=said or "", block=compaction, usage=cost)

    def _usage(self) -> Usage | None:
        if not self.usage_said:
            return None
        try:
            return Usage(**self.usage)
        except ValidationError:
            return None  # a malformed report says nothing; the core keeps its last figure


def _text_or_none(value: object) -> str | None:
    """A field a compatible server may leave out, or send empty: a string, else None."""
    return value if isinstance(value, str) and value else None


def _plain(value: Any) -> dict[str, Any]:
    """An SDK object (or a dict) as the JSON it came as."""
    if isinstance(value, dict):
        return dict(value)
    dumped: dict[str, Any] = value.model_dump(mode="json", exclude_none=True, warnings=False)
    return dumped


def _usage_of(iteration: Any) -> Usage | None:
    """One iteration's usage, in segue's four fields (None when malformed)."""
    fields = {name: token_count(getattr(iteration, name, None)) or 0 for name in _USAGE_FIELDS}
    try:
        return Usage(**fields)
    except ValidationError:
        return None


def _edits(applied: list[Any]) -> list[ContextEdit]:
    """The edits the provider applied, in segue's terms (what it cleared, and how much)."""
    edits: list[ContextEdit] = []
    for edit in applied:
        strategy = getattr(edit, "type", None)
        cleared = getattr(edit, "cleared_tool_uses", None)
        if cleared is None:
            cleared = getattr(edit, "cleared_thinking_turns", None)
        tokens = token_count(getattr(edit, "cleared_input_tokens", None))
        if isinstance(strategy, str) and tokens is not None:
            edits.append(
                ContextEdit(
                    strategy=strategy,
                    cleared=token_count(cleared) or 0,
                    cleared_input_tokens=tokens,
                )
            )
    return edits


def _tool_call(block: _Block) -> ToolCall:
    start = block.start
    raw = "".join(block.parts)
    if not block.closed:
        msg = f"the tool call {getattr(start, 'name', '?')!r} was cut off before its input ended"
        raise LlmCallError(msg, retryable=True)
    try:
        arguments = json.loads(raw) if raw.strip() else (getattr(start, "input", None) or {})
    except ValueError:
        msg = f"the tool call {getattr(start, 'name', '?')!r} has an input that is not JSON"
        raise LlmCallError(msg, retryable=True) from None
    if not isinstance(arguments, dict):
        arguments = {"input": arguments}
    return ToolCall(id=start.id, name=start.name, input=arguments)
