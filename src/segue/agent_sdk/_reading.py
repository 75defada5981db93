"""Reading one SDK query's messages: what segue records of it, and what it occupies.

Why a separate, synchronous reader: the accounting is where the seed system went wrong six
times, so it is kept free of I/O and tested on its own. Its rules:

- **Occupancy is one API call's usage.** Every ``AssistantMessage`` of one API response carries
  the same ``message_id`` and repeats the same ``usage`` (one message per content block), so a
  response is counted once, by its id. Its occupancy is the four fields summed (input, cache
  creation, cache read, output), the output refined by the stream's ``message_delta`` when
  partial messages are on (``AssistantMessage.usage`` is the usage of ``message_start``).
- **``ResultMessage.usage`` is never occupancy**: it sums every API call of the query.
- **Sub-agents are not the session**: messages with a ``parent_tool_use_id`` belong to a
  sub-agent's own context; their text and usage are not the session's.
- **A compaction resets the measure**: after a ``compact_boundary`` the session's context is the
  summary, and only a later response measures it again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final, Literal

from segue.executor.model_port import AgentToolActivity, ProviderCompaction
from segue.statemachine import (
    ContentBlock,
    TextBlock,
    ThinkingBlock,
    Usage,
)
from segue.statemachine.content import AgentToolResultBlock, AgentToolUseBlock

_SYNTHETIC: Final = "<synthetic>"
"""The model name of messages the CLI writes itself."""
_SUMMARY_START: Final = "Summary:\n"
_SUMMARY_ENDS: Final = (
    "\n\nIf you need specific details from before compaction",
    "\nContinue the conversation from where it left off",
)


def summary_of(text: str) -> str:
    """The summary inside the message the CLI writes after compacting (its own wrapping cut
    off), or the whole text when it does not have that shape."""
    start = text.find(_SUMMARY_START)
    if start < 0:
        return text.strip()
    body = text[start + len(_SUMMARY_START) :]
    for marker in _SUMMARY_ENDS:
        end = body.find(marker)
        if end >= 0:
            body = body[:end]
            break
    return body.strip()


def _usage(raw: dict[str, Any] | None) -> dict[str, int]:
    """The four counted fields of a raw usage dict (absent or null fields are 0)."""
    fields = (
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    )
    raw = raw or {}
    return {name: int(raw.get(name) or 0) for name in fields}


@dataclasses.dataclass
class QueryReader:
    """Takes the messages of one query in order; ``reply_parts`` says what they amount to.

    ``stop_at`` is the occupancy at which the query must stop (the conversation's continuation
    threshold); ``take`` returns True the first time a response reaches it. ``on_text`` gets
    the session's reply text as it streams (separators between text blocks included, so the
    pieces join to exactly ``text``).
    """

    stop_at: int | None = None
    on_text: Callable[[str], None] | None = None
    on_tool: Callable[[AgentToolActivity], None] | None = None
    session_id: str | None = None
    texts: list[str] = dataclasses.field(default_factory=list)
    content: list[ContentBlock] = dataclasses.field(default_factory=list)
    compactions: list[ProviderCompaction] = dataclasses.field(default_factory=list)
    result: Any = None
    notices: list[str] = dataclasses.field(default_factory=list)
    """What the CLI said in messages of its own (errors), not part of the reply."""
    measured_before: list[int | None] = dataclasses.field(default_factory=list)
    """The occupancy measured just before each of ``compactions`` (None: not measured this
    query), in the same order."""
    overflow: bool = False
    """The CLI refused locally because the prompt is too long (a synthetic message)."""
    reached: bool = False
    _usages: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    _latest: str | None = None
    _streaming: str | None = None
    _streamed_text: bool = False
    _awaiting_summary: dict[str, Any] | None = None
    _tool_names: dict[str, str] = dataclasses.field(default_factory=dict)

    # ------------------------------------------------------------------ taking messages

    def take(self, message: Any) -> bool:
        """Read one message; True when it is the first to reach ``stop_at``."""
        kind = type(message).__name__
        if kind == "SystemMessage":
            self._system(message)
        elif kind == "StreamEvent":
            return self._stream(message)
        elif kind == "AssistantMessage":
            return self._assistant(message)
        elif kind == "UserMessage":
            self._user(message)
        elif kind == "ResultMessage":
            self.result = message
            self.session_id = message.session_id or self.session_id
        return False

    def _system(self, message: Any) -> None:
        data = message.data or {}
        if message.subtype == "init":
            self.session_id = data.get("session_id") or self.session_id
        elif message.subtype == "compact_boundary":
            # What was measured goes with the compaction once its summary arrives.
            self._awaiting_summary = {
                **(data.get("compact_metadata") or {}),
                "measured": self.occupancy,
            }
            self._latest = None  # the compacted context is measured afresh

    def _stream(self, message: Any) -> bool:
        if message.parent_tool_use_id is not None:
            return False
        event = message.event or {}
        kind = event.get("type")
        if kind == "message_start":
            body = event.get("message") or {}
            self._streaming = body.get("id")
            if self._streaming:
                self._usages.setdefault(self._streaming, _usage(body.get("usage")))
        elif kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "text" and self._streamed_text:
                self._emit("\n\n")
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta" and delta.get("text"):
                self._streamed_text = True
                self._emit(str(delta["text"]))
        elif kind == "message_delta" and self._streaming in self._usages:
            output = (event.get("usage") or {}).get("output_tokens")
            if output is not None:
                self._usages[self._streaming]["output_tokens"] = int(output)
                return self._check(self._streaming)
        return False

    def _emit(self, text: str) -> None:
        if self.on_text is not None:
            self.on_text(text)

    def _assistant(self, message: Any) -> bool:
        if message.parent_tool_use_id is not None:
            return False
        if message.model == _SYNTHETIC:
            # The CLI's own words (an API error, "Prompt is too long"), never the model's.
            self.notices += [b.text for b in message.content or () if hasattr(b, "text")]
            self.overflow = self.overflow or message.error == "invalid_request"
            return False
        for block in message.content or ():
            self._block(block)
        message_id = message.message_id
        if message_id is None or message.usage is None:
            return False
        known = self._usages.get(message_id)
        if known is None:
            self._usages[message_id] = _usage(message.usage)
        self._latest = message_id
        return self._check(message_id)

    def _block(self, block: Any) -> None:
        kind = type(block).__name__
        if kind == "TextBlock":
            self.texts.append(block.text)
            self.content.append(TextBlock(text=block.text))
        elif kind == "ThinkingBlock":
            self.content.append(ThinkingBlock(thinking=block.thinking, signature=block.signature))
        elif kind == "ToolUseBlock":
            tool_input = dict(block.input or {})
            self.content.append(AgentToolUseBlock(id=block.id, name=block.name, input=tool_input))
            self._tool_names[block.id] = block.name
            if self.on_tool is not None:
                self.on_tool(AgentToolActivity(id=block.id, name=block.name, input=tool_input))

    def _user(self, message: Any) -> None:
        if message.parent_tool_use_id is not None:
            return
        content = message.content
        if self._awaiting_summary is not None:
            text = content if isinstance(content, str) else _joined_text(content)
            if text:
                self._compacted(text)
            return
        if isinstance(content, str):
            return
        for block in content:
            if type(block).__name__ != "ToolResultBlock":
                continue
            output, failed = _result_text(block.content), bool(block.is_error)
            self.content.append(
                AgentToolResultBlock(tool_use_id=block.tool_use_id, output=output, is_error=failed)
            )
            if self.on_tool is not None:
                name = self._tool_names.get(block.tool_use_id, "tool")
                done = AgentToolActivity(
                    id=block.tool_use_id, name=name, finished=True, is_error=failed, output=output
                )
                self.on_tool(done)

    def _compacted(self, text: str) -> None:
        meta = self._awaiting_summary or {}
        self._awaiting_summary = None
        trigger: Literal["auto", "manual"] = "manual" if meta.get("trigger") == "manual" else "auto"
        self.compactions.append(
            ProviderCompaction(
                summary=summary_of(text),
                trigger=trigger,
                pre_tokens=_count(meta.get("pre_tokens")),
                post_tokens=_count(meta.get("post_tokens")),
            )
        )
        self.measured_before.append(meta.get("measured"))

    def _check(self, message_id: str) -> bool:
        if self._latest is None:
            self._latest = message_id
        if self.reached or self.stop_at is None or message_id != self._latest:
            return False
        if self.occupancy is not None and self.occupancy >= self.stop_at:
            self.reached = True
            return True
        return False

    # ------------------------------------------------------------------ what it amounts to

    @property
    def usage(self) -> Usage | None:
        """The latest API response's usage (since the last compaction), or None."""
        if self._latest is None:
            return None
        return Usage(**self._usages[self._latest])

    @property
    def aggregate(self) -> int | None:
        """What ``ResultMessage.usage`` sums to: every API call of the query (for comparison
        in logs; never occupancy)."""
        result = self.result
        if result is None or not result.usage:
            return None
        return sum(_usage(result.usage).values())

    @property
    def responses(self) -> int:
        """How many API responses of the session this query read."""
        return len(self._usages)

    @property
    def occupancy(self) -> int | None:
        usage = self.usage
        return None if usage is None else usage.context_tokens

    @property
    def text(self) -> str:
        """The session's words this query, every text block in order."""
        return "\n\n".join(self.texts)


def _joined_text(blocks: Any) -> str:
    return "\n".join(
        str(getattr(block, "text", "")) for block in blocks if type(block).__name__ == "TextBlock"
    )


def _result_text(content: Any) -> str:
    """A tool result's content as text (the CLI sends a string or a list of blocks)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for item in content:
        if isinstance(item, dict) and item.get("type") == "text":
            parts.append(str(item.get("text", "")))
        elif isinstance(item, dict):
            parts.append(f"[{item.get('type', 'content')}]")
    return "\n".join(parts)


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and value >= 0 else None
