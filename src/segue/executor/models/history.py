"""The history as every provider must be sent it, whatever its shape: what an adapter needs
from segue's transcript and no provider owns (``docs/adapters.md`` walks through using it).

* **A normal turn** (``paired``): every tool call answered once, right after the reply that
  made it, as every API requires, so one bad transcript entry costs a sentence, not a failed
  conversation. ``role_text`` says which role a message is sent as.
* **The tool-less requests** (``purpose`` continuation, checkpoint, compaction): ``text_turns``
  gives the history as alternating plain-text turns, every tool block turned into a bounded
  line of prose (so nothing is left unpaired and no tool can be called), images and documents
  named rather than sent, the oldest ``trim_level`` quarters dropped after an overflow, the
  rejected tool calls named (``rejected_prose``) and the request's ``instruction`` last. An
  adapter maps each ``TextTurn`` to its provider's message shape.
* **Prose** for what cannot be sent as it is: a tool call or result without its pair, another
  provider's agent tools (``AGENT_BLOCKS``), attachments in a summary request; each bounded, so
  one huge output cannot overflow a summary.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from segue.executor.model_port import LlmRequest
from segue.statemachine import Message, ToolCall

Role = Literal["user", "assistant"]
"""The two roles every provider's turns alternate between."""

TRIM_FRACTION: Final = 0.25
"""Share of the history each ``trim_level`` drops, oldest first."""
MIN_KEPT_MESSAGES: Final = 4
"""Trimming never drops the last few messages: they are what the summary must not miss."""
TOOL_INPUT_CHARS: Final = 500
"""Bound on a tool call's JSON input when written as prose."""
TOOL_RESULT_CHARS: Final = 2_000
"""Bound on a tool result when written as prose: one huge output must not overflow a summary."""
REJECTED_INPUT_CHARS: Final = 200
"""Bound on the input of each rejected tool call named in prose."""
START_PLACEHOLDER: Final = "(The conversation continues below.)"
"""The first turn when the history starts with the model's words (providers want a user first)."""
CONTINUE: Final = "Continue."
"""The last turn when the history would end with the model's words (that would be a prefill)."""


# --------------------------------------------------------------------------- prose


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters]"


def to_json(value: object) -> str:
    """Compact, stable JSON of a tool input (for prose and for providers that take a string)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def role_text(message: Message) -> tuple[Role, str]:
    """The role and text a non-tool message is sent as (a summary stands in for the user's
    earlier turns; continuations and checkpoints are the model's own words)."""
    if message.kind == "summary":
        return "user", f"Summary of the earlier conversation: {message.text}"
    if message.kind in ("assistant", "continuation", "checkpoint"):
        return "assistant", message.text
    return "user", message.text


def rejected_prose(calls: Iterable[ToolCall]) -> str:
    """One sentence naming tool calls that were asked for but never run ("" for none)."""
    named = [f"{c.name}({clip(to_json(c.input), REJECTED_INPUT_CHARS)})" for c in calls]
    if not named:
        return ""
    return f"You were about to call: {', '.join(named)}; they were not run."


def attachments_prose(message: Message) -> str:
    """A message's images and documents, named in prose (the tool-less requests do not send
    them); "" when it has none."""
    names: list[str] = []
    for block in message.content:
        if block.type == "image":
            names.append("an image")
        elif block.type == "document":
            names.append(f"the document {block.title!r}" if block.title else "a document")
    return f"[attached: {', '.join(names)}]" if names else ""


AGENT_BLOCKS: Final = frozenset({"agent_tool_use", "agent_tool_result"})
"""Blocks that record what another provider's own agent ran: sent as prose (``agent_prose``)."""


def agent_prose(block: Any) -> str:
    """A tool another provider's own agent ran (``agent_tool_use`` / ``agent_tool_result``), as a
    bounded line of the reply's text: no provider can be sent it as a tool block."""
    if block.type == "agent_tool_use":
        return f"[ran tool {block.name} with {clip(to_json(block.input), TOOL_INPUT_CHARS)}]"
    label = "tool error" if block.is_error else "tool result"
    return f"[{label}: {clip(block.output, TOOL_RESULT_CHARS)}]"


def tool_result_prose(text: str, *, name: str = "a tool", is_error: bool = False) -> str:
    """A tool result as a bounded line of text (for a result whose call cannot be sent)."""
    label = "tool error" if is_error else "tool result"
    return f"[{label} from {name}: {clip(text, TOOL_RESULT_CHARS)}]"


def tool_call_prose(call: ToolCall) -> str:
    """A tool call as a bounded line of the model's text."""
    return f"[called tool {call.name} with {clip(to_json(call.input), TOOL_INPUT_CHARS)}]"


# --------------------------------------------------------------------------- a normal turn

NOT_RECORDED: Final = "Not run: no result was recorded for this tool call."


def paired(messages: Sequence[Message]) -> list[Message]:
    """The history of a normal turn with every tool call answered once, right after the reply
    that made it, as every provider requires.

    The core pairs every call outside ``ToolExecuting``; this still holds the line the APIs
    enforce, so one bad transcript entry costs a sentence, not a failed conversation: a result
    whose call is not open becomes a user's line of text, a call left without a result gets an
    error result before the next message, and a call id seen twice is answered once.
    """
    out: list[Message] = []
    open_calls: dict[str, str] = {}
    seen: set[str] = set()
    stray: list[Message] = []  # results without their call, said once the open calls are answered

    def close_open_calls() -> None:
        for call_id in open_calls:
            out.append(
                Message(kind="tool_result", text=NOT_RECORDED, tool_call_id=call_id, is_error=True)
            )
        open_calls.clear()
        out.extend(stray)
        stray.clear()

    for message in messages:
        if message.kind == "tool_result":
            if open_calls.pop(message.tool_call_id or "", None) is None:
                text = tool_result_prose(message.text, is_error=message.is_error)
                stray.append(Message(kind="user", text=text, session=message.session))
                continue
            out.append(message)
            continue
        close_open_calls()
        calls = tuple(c for c in message.tool_calls if c.id not in seen)
        seen.update(c.id for c in calls)
        open_calls.update((c.id, c.name) for c in calls)
        if len(calls) != len(message.tool_calls):
            out.append(message.model_copy(update={"tool_calls": calls}))
        else:
            out.append(message)
    close_open_calls()
    return out


# --------------------------------------------------------------------------- tool-less requests


def offers_tools(request: LlmRequest) -> bool:
    """Whether the request may declare tools at all: only a normal turn does. The requests at
    the limit (continuation, checkpoint, compaction) must offer no callable tool."""
    return request.purpose == "turn" and bool(request.tools)


def trim(messages: Sequence[Message], trim_level: int) -> tuple[Sequence[Message], int]:
    """Drop the oldest ``TRIM_FRACTION * trim_level`` of ``messages``; return (kept, dropped)."""
    count = len(messages)
    if trim_level <= 0 or count <= MIN_KEPT_MESSAGES:
        return messages, 0
    dropped = min(count - MIN_KEPT_MESSAGES, math.ceil(count * TRIM_FRACTION * trim_level))
    return messages[dropped:], dropped


@dataclass(slots=True)
class TextTurn:
    """One turn of a tool-less request: a role and its paragraphs, in order (an adapter sends
    them as separate text blocks or joined with blank lines)."""

    role: Role
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The paragraphs joined with blank lines."""
        return "\n\n".join(self.parts)


def text_turns(request: LlmRequest) -> list[TextTurn]:
    """The history of a tool-less request as alternating plain-text turns, user first and last.

    With no tools declared a provider refuses any tool block, and an overflowing history may
    have lost the call a result answers, so no tool block survives: each becomes a bounded line
    of prose. ``trim_level`` drops the oldest messages (saying how many), the rejected calls are
    named and the ``instruction`` comes last.
    """
    kept, dropped = trim(request.messages, request.trim_level)
    names = {c.id: c.name for m in request.messages for c in m.tool_calls}
    turns: list[TextTurn] = []

    def add(role: Role, text: str) -> None:
        if not text.strip():
            return  # providers refuse empty text, so an empty message contributes nothing
        if not turns or turns[-1].role != role:
            turns.append(TextTurn(role))
        turns[-1].parts.append(text)

    if dropped:
        add("user", f"[{dropped} earlier messages were omitted to fit the context window.]")
    for message in kept:
        if message.kind == "tool_result":
            name = names.get(message.tool_call_id or "", "a tool")
            add("user", tool_result_prose(message.text, name=name, is_error=message.is_error))
            continue
        role, text = role_text(message)
        add(role, text)
        if message.content:
            add(role, attachments_prose(message))
        for call in message.tool_calls:
            add("assistant", tool_call_prose(call))
    add("user", rejected_prose(request.rejected_tool_calls))
    add("user", request.instruction or "")
    if not turns or turns[0].role != "user":
        turns.insert(0, TextTurn("user", [START_PLACEHOLDER]))
    if turns[-1].role == "assistant":
        add("user", CONTINUE)  # never end on the model's words (that is a prefill)
    return turns


__all__ = [
    "AGENT_BLOCKS",
    "CONTINUE",
    "MIN_KEPT_MESSAGES",
    "NOT_RECORDED",
    "REJECTED_INPUT_CHARS",
    "START_PLACEHOLDER",
    "TOOL_INPUT_CHARS",
    "TOOL_RESULT_CHARS",
    "TRIM_FRACTION",
    "Role",
    "TextTurn",
    "agent_prose",
    "attachments_prose",
    "clip",
    "offers_tools",
    "paired",
    "rejected_prose",
    "role_text",
    "text_turns",
    "to_json",
    "tool_call_prose",
    "tool_result_prose",
    "trim",
]
