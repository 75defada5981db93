"""What the fake Anthropic server does to the context on its own side, as the API documents it:
context editing and server-side compaction (``context_management.edits``).

* **Betas.** Each strategy needs its beta (``compact-2026-01-12``,
  ``context-management-2025-06-27``) in the ``anthropic-beta`` header (or Bedrock's
  ``anthropic_beta`` field), and so does a ``compaction`` block in the history; without it the
  request is refused (400), as a missing beta is.
* **What the model reads.** The history starts at its last compaction block (the API drops
  every block before it; a block without a summary is a no-op). Then the edits apply in the
  order given: ``clear_thinking_20251015`` clears the thinking of all but the latest ``keep``
  assistant turns that thought (default 1); ``clear_tool_uses_20250919``, once the prompt
  reaches its ``trigger`` (input tokens, default 100,000, or a number of tool uses), clears
  the results of all but the latest ``keep`` tool uses (default 3), and their inputs with
  ``clear_tool_inputs``, sparing ``exclude_tools``, and only if that clears ``clear_at_least``
  tokens. Each applied edit is reported (``applied_edits``: what it cleared, how many tokens).
* **Compaction.** A ``compact_20260112`` edit (its trigger at least 50,000 input tokens,
  default 150,000) whose trigger the prompt reaches compacts it: the reply starts with a
  ``compaction`` block whose summary the server writes (``summarise``), and the message is
  answered from that summary alone; with ``pause_after_compaction`` the reply stops there
  (``stop_reason`` ``compaction``). ``anthropic_replies.Compacted`` says how both iterations
  are reported.

Token figures are segue's own estimate (``prompt_cache.text_tokens``), as everywhere in the
fake. Only the standard library is used.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from segue.testing.prompt_cache import plain_text, prompt_blocks

COMPACTION_BETA: Final = "compact-2026-01-12"
CONTEXT_EDITING_BETA: Final = "context-management-2025-06-27"
MIN_COMPACTION_TRIGGER: Final = 50_000
DEFAULT_COMPACTION_TRIGGER: Final = 150_000
DEFAULT_CLEARING_TRIGGER: Final = 100_000
DEFAULT_KEEP_TOOL_USES: Final = 3
CLEARED: Final = "[cleared to save context]"
"""What a cleared tool result (or input) holds after clearing."""
_BETAS: Final = {
    "compact_20260112": COMPACTION_BETA,
    "clear_tool_uses_20250919": CONTEXT_EDITING_BETA,
    "clear_thinking_20251015": CONTEXT_EDITING_BETA,
}


class ContextManagementError(ValueError):
    """The request's context management is not one the API takes (a 400)."""


@dataclass(slots=True)
class Managed:
    """A request as the model reads it, and what the server did to it."""

    request: dict[str, Any]
    """The request with its history from the last compaction on, and the edits applied."""
    applied: list[dict[str, Any]] | None
    """The applied edits to report (None: no context management was asked)."""
    compaction: dict[str, Any] | None = None
    """The compaction edit asked (None: none)."""


def betas_of(headers: Mapping[str, str], body: Mapping[str, Any]) -> set[str]:
    """The betas a request names: its ``anthropic-beta`` header, or Bedrock's field."""
    named = {part.strip() for part in headers.get("anthropic-beta", "").split(",") if part}
    listed = body.get("anthropic_beta")
    if isinstance(listed, list):
        named |= {str(beta) for beta in listed}
    return named


def prompt_tokens(request: Mapping[str, Any]) -> int:
    """What the prompt of ``request`` holds (tools, system, messages), as the fake counts it."""
    return sum(block.tokens for block in prompt_blocks(request))


def manage(request: Mapping[str, Any], betas: set[str]) -> Managed:
    """What the model reads of ``request`` (see the module docstring);
    ``ContextManagementError`` for what the API refuses."""
    managed = dict(request)
    managed["messages"] = _from_last_compaction(request.get("messages") or [], betas)
    config = request.get("context_management")
    if not isinstance(config, Mapping):
        return Managed(managed, None)
    edits = config.get("edits") or []
    applied: list[dict[str, Any]] = []
    compaction: dict[str, Any] | None = None
    for edit in edits:
        kind = edit.get("type") if isinstance(edit, Mapping) else None
        if kind not in _BETAS:
            raise ContextManagementError(f"context_management.edits: unknown type {kind!r}")
        if _BETAS[kind] not in betas:
            raise ContextManagementError(
                f"{kind} requires the anthropic-beta header {_BETAS[kind]}"
            )
        if kind == "compact_20260112":
            compaction = _compaction_edit(edit)
        elif kind == "clear_thinking_20251015":
            applied += _clear_thinking(managed, edit)
        else:
            applied += _clear_tool_uses(managed, edit)
    return Managed(managed, applied, compaction)


def trigger_of(compaction: Mapping[str, Any]) -> int:
    """The input tokens at which the compaction edit compacts."""
    trigger = compaction.get("trigger") or {}
    return int(trigger.get("value", DEFAULT_COMPACTION_TRIGGER))


def summarise(request: Mapping[str, Any]) -> str:
    """The summary the fake writes of a prompt: how much it held, and its last user text (so
    that a test can see what was compacted)."""
    messages = request.get("messages") or []
    last = ""
    for message in reversed(messages):
        if message.get("role") == "user":
            last = plain_text(message.get("content"))
            if last:
                break
    return f"Summary of {len(messages)} earlier messages. The latest request ends: {last[-300:]}"


def compacted(request: Mapping[str, Any], block: Mapping[str, Any]) -> dict[str, Any]:
    """The prompt the message iteration reads after a compaction: the same tools and system
    prompt, and the compaction block alone as the history."""
    return {**request, "messages": [{"role": "assistant", "content": [dict(block)]}]}


# --------------------------------------------------------------------------- the history


def _from_last_compaction(messages: Sequence[Any], betas: set[str]) -> list[Any]:
    """The history from its last compaction block that holds a summary (the API drops what
    precedes it); a compaction block without the beta is refused."""
    start: tuple[int, int] | None = None
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for place, block in enumerate(content):
            if isinstance(block, Mapping) and block.get("type") == "compaction":
                if COMPACTION_BETA not in betas:
                    raise ContextManagementError(
                        f"compaction blocks require the anthropic-beta {COMPACTION_BETA}"
                    )
                if block.get("content") is not None:
                    start = (index, place)
    if start is None:
        return copy.deepcopy(list(messages))
    index, place = start
    first = dict(messages[index])
    first["content"] = list(first["content"])[place:]
    return copy.deepcopy([first, *messages[index + 1 :]])


def _blocks(messages: Iterable[Any], role: str, kind: str) -> list[tuple[int, dict[str, Any]]]:
    """Every block of ``kind`` in the ``role``'s messages, with its message's index."""
    found: list[tuple[int, dict[str, Any]]] = []
    for index, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") == role and isinstance(content, list):
            found += [(index, block) for block in content if block.get("type") == kind]
    return found


# --------------------------------------------------------------------------- the edits


def _compaction_edit(edit: Mapping[str, Any]) -> dict[str, Any]:
    trigger = edit.get("trigger")
    if trigger is not None:
        if trigger.get("type") != "input_tokens" or not isinstance(trigger.get("value"), int):
            raise ContextManagementError("compact_20260112.trigger must be an input_tokens trigger")
        if trigger["value"] < MIN_COMPACTION_TRIGGER:
            raise ContextManagementError(
                f"compact_20260112.trigger.value must be at least {MIN_COMPACTION_TRIGGER}"
            )
    return dict(edit)


def _clear_thinking(request: dict[str, Any], edit: Mapping[str, Any]) -> list[dict[str, Any]]:
    keep = edit.get("keep", {"type": "thinking_turns", "value": 1})
    if keep == "all" or (isinstance(keep, Mapping) and keep.get("type") == "all"):
        return []
    kept = int(keep.get("value", 1)) if isinstance(keep, Mapping) else 1
    messages = request["messages"]
    turns = sorted(
        {
            index
            for kind in ("thinking", "redacted_thinking")
            for index, _ in _blocks(messages, "assistant", kind)
        }
    )
    cleared_turns = turns[: max(0, len(turns) - kept)]
    if not cleared_turns:
        return []
    before = prompt_tokens(request)
    for index in cleared_turns:
        content = messages[index]["content"]
        messages[index]["content"] = [
            b for b in content if b.get("type") not in ("thinking", "redacted_thinking")
        ] or [{"type": "text", "text": CLEARED}]
    return [
        {
            "type": "clear_thinking_20251015",
            "cleared_thinking_turns": len(cleared_turns),
            "cleared_input_tokens": max(0, before - prompt_tokens(request)),
        }
    ]


def _clear_tool_uses(request: dict[str, Any], edit: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = request["messages"]
    uses = _blocks(messages, "assistant", "tool_use")
    trigger = edit.get("trigger") or {"type": "input_tokens", "value": DEFAULT_CLEARING_TRIGGER}
    reached = (
        len(uses) >= int(trigger.get("value", 0))
        if trigger.get("type") == "tool_uses"
        else prompt_tokens(request) >= int(trigger.get("value", DEFAULT_CLEARING_TRIGGER))
    )
    keep = int((edit.get("keep") or {}).get("value", DEFAULT_KEEP_TOOL_USES))
    spared = set(edit.get("exclude_tools") or ())
    inputs = edit.get("clear_tool_inputs") or False
    older = uses[: max(0, len(uses) - keep)]
    cleared = [block for _, block in older if block.get("name") not in spared]
    if not reached or not cleared:
        return []
    before = prompt_tokens(request)
    undo = copy.deepcopy(messages)
    ids = {block["id"] for block in cleared}
    for block in cleared:
        if inputs is True or (isinstance(inputs, list) and block.get("name") in inputs):
            block["input"] = {}
    for _, result in _blocks(messages, "user", "tool_result"):
        if result.get("tool_use_id") in ids:
            result["content"] = CLEARED
    saved = max(0, before - prompt_tokens(request))
    least = int((edit.get("clear_at_least") or {}).get("value", 0))
    if saved < least:
        request["messages"] = undo
        return []
    return [
        {
            "type": "clear_tool_uses_20250919",
            "cleared_tool_uses": len(cleared),
            "cleared_input_tokens": saved,
        }
    ]


__all__ = [
    "CLEARED",
    "COMPACTION_BETA",
    "CONTEXT_EDITING_BETA",
    "DEFAULT_COMPACTION_TRIGGER",
    "MIN_COMPACTION_TRIGGER",
    "ContextManagementError",
    "Managed",
    "betas_of",
    "compacted",
    "manage",
    "prompt_tokens",
    "summarise",
    "trigger_of",
]
