"""segue's transcript as a Messages API payload: what ``AnthropicModel`` sends, built apart from
sending it so it can be read, tested and counted (``count_tokens`` uses the same payload).

* **A normal turn** keeps tool blocks: every ``tool_use`` is answered by a ``tool_result`` in the
  very next user turn, roles alternate and a user turn comes first. A message's content blocks
  go out as they are: a user's images and documents, a tool result's images, and a reply's
  thinking blocks, which the API requires back unchanged (signature included) when thinking and
  tools meet.
* **The requests at the limit** (continuation summary, checkpoint, compaction; REQ-SEG-040)
  offer no callable tool. Given the turn's tools, they send the turn's prefix unchanged (the
  same tools, system prompt and history with its tool blocks) with ``tool_choice: none``, the
  rejected calls named and the instruction appended as the last user text, so the provider
  reads what it cached of that prefix instead of a new prompt. Given none (or after an
  overflow, ``trim_level``), the history goes *repaired*: every tool block a bounded line of
  prose, images and documents named, the oldest quarters dropped, the instruction last. With
  ``reuse_prefix`` (REQ-SEG-055) they are the turn's request exactly (its tool choice and
  thinking, its breakpoints) with the rejected calls and the instruction appended last and a
  breakpoint on them, so the whole prefix is read from the cache; a tool call in the answer
  comes back as one, for the core to refuse.
* **Prompt caching** is on by default: breakpoints on the tools, the system prompt and the last
  block of a turn, so each turn reads the history before it from the cache (the accounting
  already counts cache reads as part of the prompt). A request at the limit marks no
  breakpoint on its history: the conversation goes on in a new session or generation, so
  nothing would read it back, and writing it costs a quarter more than reading it plainly.
* **Model settings** (temperature, extended thinking, tool choice) come from the conversation.
  The grace request of a turn that reached its tool-round limit keeps the tools (the history
  holds tool blocks, which the API accepts only with tools declared) with ``tool_choice: none``.
* **What the provider does to the context itself** (``docs/providers.md``): a turn of a
  conversation whose provider compacts asks for it (``context_management`` with a
  ``compact_20260112`` edit, the ``compact-2026-01-12`` beta); its compaction block goes back
  as the assistant's, verbatim, first of the history (the API drops whatever precedes it);
  context edits go with every turn (the ``context-management-2025-06-27`` beta), clearing
  thinking first as the API requires. A compaction asked on demand sends the turn's history
  with a trigger at its size and a pause after the compaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from anthropic.types import (
    AssistantMessageParam,
    MessageParam,
    TextBlockParam,
    ToolParam,
    UserMessageParam,
)

from segue.executor.model_port import LlmRequest
from segue.executor.models.history import (
    AGENT_BLOCKS,
    CONTINUE,
    NOT_RECORDED,
    START_PLACEHOLDER,
    TOOL_RESULT_CHARS,
    Role,
    agent_prose,
    clip,
    rejected_prose,
    role_text,
    text_turns,
)
from segue.statemachine import Message, ToolCall
from segue.statemachine.context_edits import in_provider_order

Block = dict[str, Any]

CACHE: Final = {"type": "ephemeral"}
"""A prompt-cache breakpoint (the default five-minute cache)."""

_UNCACHEABLE: Final = frozenset({"thinking", "redacted_thinking"})
"""Blocks the API refuses a ``cache_control`` on."""
COMPACTION_BETA: Final = "compact-2026-01-12"
"""The beta of the provider's compaction (``compact_20260112``) and of its blocks."""
CONTEXT_EDITING_BETA: Final = "context-management-2025-06-27"
"""The beta of context editing (``clear_tool_uses_20250919``, ``clear_thinking_20251015``)."""
MIN_COMPACTION_TRIGGER: Final = 50_000
"""The smallest trigger the compaction takes, in input tokens."""
_BLOCK_FIELDS: Final = ("encrypted_content", "signature", "tool_changes")
"""A compaction block's opaque fields, sent back as they came when the provider sent them."""


@dataclass(slots=True)
class _Turn:
    """One API message under construction; ``results`` counts its leading tool_result blocks."""

    role: Role
    blocks: list[Block] = field(default_factory=list)
    results: int = 0


@dataclass(frozen=True, slots=True)
class Payload:
    """What is sent for one request (besides ``model``): built once, used to call or to count.

    ``options`` are the request's other parameters (temperature, thinking, tool_choice), ready
    to be passed as keyword arguments."""

    system: str | list[TextBlockParam] | None
    messages: list[MessageParam]
    tools: list[ToolParam]
    max_tokens: int
    options: dict[str, Any] = field(default_factory=dict)

    def arguments(self) -> dict[str, Any]:
        """The prompt as keyword arguments, the same for ``messages.create`` and
        ``messages.count_tokens``: the messages, and the system prompt and tools when there
        are any (the API refuses an empty tool list)."""
        arguments: dict[str, Any] = {"messages": self.messages}
        if self.system is not None:
            arguments["system"] = self.system
        if self.tools:
            arguments["tools"] = self.tools
        return arguments


class _Turns:
    """Accumulates blocks into alternating turns, merging consecutive same-role blocks."""

    def __init__(self) -> None:
        self.turns: list[_Turn] = []

    def add(self, role: Role, block: Block) -> None:
        if not self.turns or self.turns[-1].role != role:
            self.turns.append(_Turn(role))
        self.turns[-1].blocks.append(block)

    def add_text(self, role: Role, text: str) -> None:
        # The API refuses empty text blocks, so an empty message contributes nothing.
        if text.strip():
            self.add(role, {"type": "text", "text": text})

    def add_result(self, block: Block) -> None:
        """A tool_result must precede any text in its user turn, so insert it after the others."""
        if not self.turns or self.turns[-1].role != "user":
            self.turns.append(_Turn("user"))
        turn = self.turns[-1]
        turn.blocks.insert(turn.results, block)
        turn.results += 1

    def params(self) -> list[MessageParam]:
        """The finished messages, a user turn first as the API requires."""
        if not self.turns or self.turns[0].role != "user":
            self.turns.insert(0, _Turn("user", [{"type": "text", "text": START_PLACEHOLDER}]))
        return [_message(turn.role, turn.blocks) for turn in self.turns]


def _message(role: Role, blocks: list[Block]) -> MessageParam:
    content = cast(Any, blocks)
    if role == "user":
        return UserMessageParam(role="user", content=content)
    return AssistantMessageParam(role="assistant", content=content)


def _param(block: Any) -> Block:
    """A content block as the API takes it (its JSON, without unset optional fields)."""
    dumped: Block = block.model_dump(mode="json", exclude_none=True)
    return dumped


# --------------------------------------------------------------------------- a normal turn


def turn_messages(messages: Sequence[Message]) -> list[MessageParam]:
    """The history with tool blocks and content blocks, for a normal turn.

    The core pairs every ``tool_use`` outside ``ToolExecuting``; this still holds the line the API
    enforces, so one bad transcript entry costs a sentence, not a failed conversation: a result
    whose call is not in the preceding assistant turn becomes text, and a call left without a
    result gets an error result before the next assistant turn.
    """
    turns = _Turns()
    open_calls: dict[str, str] = {}

    def close_open_calls() -> None:
        for call_id in open_calls:
            turns.add_result(
                {
                    "type": "tool_result",
                    "tool_use_id": call_id,
                    "content": NOT_RECORDED,
                    "is_error": True,
                }
            )
        open_calls.clear()

    def add_call(call_id: str, block: Block) -> None:
        if call_id in open_calls:
            return  # the API refuses duplicate ids; the first one is the one answered
        turns.add("assistant", block)
        open_calls[call_id] = block["name"]

    for message in messages:
        compaction = compaction_param(message)
        if compaction is not None:  # the provider's own, sent back as the assistant's
            close_open_calls()
            turns.add("assistant", compaction)
            continue
        if message.kind == "tool_result":
            if open_calls.pop(message.tool_call_id or "", None) is None:
                turns.add_text("user", f"[tool result: {clip(message.text, TOOL_RESULT_CHARS)}]")
                continue
            result: Block = {"type": "tool_result", "tool_use_id": message.tool_call_id}
            if message.content:
                result["content"] = [_param(b) for b in message.content if _sendable(b)]
            elif message.text:
                result["content"] = message.text
            if message.is_error:
                result["is_error"] = True
            turns.add_result(result)
            continue
        role, text = role_text(message)
        if role == "assistant":
            close_open_calls()
        if message.content and message.kind in ("user", "assistant"):
            _add_blocks(turns, role, message, add_call)
            continue
        turns.add_text(role, text)
        for call in message.tool_calls if message.kind == "assistant" else ():
            add_call(call.id, _tool_use(call))
    close_open_calls()
    return turns.params()


def _add_blocks(turns: _Turns, role: Role, message: Message, add_call: Any) -> None:
    """A message's content blocks in order; its tool calls missing from them come after."""
    placed: set[str] = set()
    for block in message.content:
        if block.type == "tool_use":
            placed.add(block.id)
            add_call(block.id, _param(block))
        elif block.type in AGENT_BLOCKS:
            turns.add_text(role, agent_prose(block))
        elif _sendable(block):
            turns.add(role, _param(block))
    for call in message.tool_calls:
        if call.id not in placed:
            add_call(call.id, _tool_use(call))


def compaction_param(message: Message) -> Block | None:
    """The provider's compaction block a summary message holds, as the API takes it back:
    its summary and every opaque field it came with (None for any other message)."""
    if message.kind != "summary":
        return None
    for block in message.content:
        if block.type == "compaction" and block.provider == "anthropic" and not block.failed:
            param: Block = {"type": "compaction", "content": block.content}
            for name in _BLOCK_FIELDS:
                value = getattr(block, name)
                if value is not None:
                    param[name] = [dict(v) for v in value] if name == "tool_changes" else value
            return param
    return None


def _sendable(block: Any) -> bool:
    kind = block.type
    if kind in AGENT_BLOCKS:
        return False  # what another provider's agent did: told in prose (``agent_prose``)
    return kind != "text" or bool(block.text.strip())


def _tool_use(call: ToolCall) -> Block:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}


# --------------------------------------------------------------------------- tool-less requests


def text_messages(request: LlmRequest) -> list[MessageParam]:
    """The history as plain text, for the tool-less requests (``history.text_turns``), each
    paragraph a text block."""
    return [
        _message(turn.role, [{"type": "text", "text": part} for part in turn.parts])
        for turn in text_turns(request)
    ]


# --------------------------------------------------------------------------- the payload


def build_payload(request: LlmRequest, *, max_tokens: int, caching: bool = True) -> Payload:
    """The Messages API payload for ``request``: a turn's, or a request at the limit (the
    turn's prefix when the turn's tools come with it, else the history as text)."""
    settings = request.settings
    options: dict[str, Any] = {}
    # REQ-SEG-055: the turn's request repeated, the rejected calls and the instruction last.
    reuse = request.purpose != "turn" and request.reuse_prefix and request.trim_level == 0
    if request.purpose == "compaction" and request.compaction is not None:
        # The provider compacts on demand: the turn's history, blocks and all, then a note.
        messages = _with_final_user_text(
            turn_messages(request.messages), request.instruction or CONTINUE
        )
        tools = _tool_params(request)
        if tools:
            options["tool_choice"] = {"type": "none"}
    elif request.purpose != "turn" and request.tools and request.trim_level == 0 and not reuse:
        messages = turn_messages(request.messages)
        closing = "\n\n".join(
            text
            for text in (rejected_prose(request.rejected_tool_calls), request.instruction)
            if text
        )
        messages = _with_final_user_text(messages, closing or CONTINUE)
        tools = _tool_params(request)
        options["tool_choice"] = {"type": "none"}
    elif request.purpose == "turn" or reuse:
        messages = turn_messages(request.messages)
        last = request.instruction
        if reuse:
            said = (rejected_prose(request.rejected_tool_calls), request.instruction)
            last = "\n\n".join(text for text in said if text) or CONTINUE
        if last:
            messages = _with_final_user_text(messages, last)
        tools = _tool_params(request)
        if settings.thinking_budget is not None:
            options["thinking"] = {"type": "enabled", "budget_tokens": settings.thinking_budget}
            max_tokens = max(max_tokens, settings.thinking_budget + 1)
        if tools and request.final:
            options["tool_choice"] = {"type": "none"}
        elif tools and settings.tool_choice is not None:
            options["tool_choice"] = dict(settings.tool_choice)
    else:
        messages = text_messages(request)
        tools = []
    if settings.temperature is not None and "thinking" not in options:
        # The SDK (API version 2026-10-21) has no sampling parameters, and Anthropic's API
        # refuses them; compatible servers and older API versions take one, so a conversation
        # that asks for a temperature gets it sent as is.
        options["extra_body"] = {"temperature": settings.temperature}
    options.update(context_options(request, messages))
    system: str | list[TextBlockParam] | None = request.system or None
    if caching:
        # Nothing reads back the history of a request at the limit, nor of a turn's last
        # round (tool_choice none: the next turn's prefix is keyed without it).
        # A summary that repeats the turn's request marks its breakpoints, the last on the
        # instruction: it reads the turn's prefix, and a second ask reads the first's.
        history = (request.purpose == "turn" and not request.final) or reuse
        system = _cache_marked(request.system or None, tools, messages, history=history)
    return Payload(
        system=system,
        messages=messages,
        tools=tools,
        max_tokens=max(1, max_tokens),
        options=options,
    )


def context_options(request: LlmRequest, messages: list[MessageParam]) -> dict[str, Any]:
    """The request's ``context_management`` and the betas it needs: the conversation's context
    edits (clearing thinking first), the compaction asked (a trigger of at least the API's
    minimum, the instructions, the pause), and the compaction beta wherever the history holds
    a compaction block (the API reads the block only under it)."""
    edits = in_provider_order(request.context_edits)
    betas: list[str] = [CONTEXT_EDITING_BETA] if edits else []
    asked = request.compaction
    if asked is not None:
        edit: dict[str, Any] = {
            "type": "compact_20260112",
            "trigger": {
                "type": "input_tokens",
                "value": max(asked.trigger_tokens, MIN_COMPACTION_TRIGGER),
            },
            "pause_after_compaction": asked.pause_after,
        }
        if asked.instructions:
            edit["instructions"] = asked.instructions
        edits.append(edit)
    holds = any(
        isinstance(message["content"], list)
        and any(cast(Block, block).get("type") == "compaction" for block in message["content"])
        for message in messages
    )
    if asked is not None or holds:
        betas.append(COMPACTION_BETA)
    options: dict[str, Any] = {}
    if edits:
        options["context_management"] = {"edits": edits}
    if betas:
        options["betas"] = betas
    return options


def _tool_params(request: LlmRequest) -> list[ToolParam]:
    return [
        ToolParam(name=t.name, description=t.description, input_schema=dict(t.input_schema))
        for t in request.tools
    ]


def _cache_marked(
    system: str | None,
    tools: list[ToolParam],
    messages: list[MessageParam],
    *,
    history: bool = True,
) -> list[TextBlockParam] | None:
    """Mark the prompt-cache breakpoints (tools, system, and with ``history`` the latest
    turn); the system prompt becomes a block list, the only form that carries one."""
    if tools:
        tools[-1] = cast(ToolParam, {**tools[-1], "cache_control": CACHE})
    if messages and history:
        last = messages[-1]
        blocks = last["content"]
        if not isinstance(blocks, str):
            marked = list(blocks)
            for index in range(len(marked) - 1, -1, -1):
                block = cast(Block, marked[index])
                if block.get("type") not in _UNCACHEABLE:
                    marked[index] = cast(Any, {**block, "cache_control": CACHE})
                    break
            messages[-1] = cast(MessageParam, {**last, "content": marked})
    if system is None:
        return None
    return [TextBlockParam(type="text", text=system, cache_control=cast(Any, CACHE))]


def _with_final_user_text(messages: list[MessageParam], text: str) -> list[MessageParam]:
    last = messages[-1]
    block = {"type": "text", "text": text}
    if last["role"] == "user" and not isinstance(last["content"], str):
        blocks: list[Any] = [*last["content"], block]
        return [*messages[:-1], UserMessageParam(role="user", content=blocks)]
    return [*messages, UserMessageParam(role="user", content=cast(Any, [block]))]


__all__ = [
    "CACHE",
    "COMPACTION_BETA",
    "CONTEXT_EDITING_BETA",
    "MIN_COMPACTION_TRIGGER",
    "Payload",
    "build_payload",
    "compaction_param",
    "context_options",
    "text_messages",
    "turn_messages",
]
