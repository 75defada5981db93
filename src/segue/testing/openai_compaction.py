"""What the fake OpenAI server does to the context on its own side: the Responses API's
compaction, as OpenAI documents it.

* **Within a call.** A ``responses.create`` whose ``context_management`` holds
  ``{"type": "compaction", "compact_threshold": N}`` and whose input reaches N tokens is
  compacted first: the output starts with a ``compaction`` item (``encrypted_content``,
  opaque) and the message is answered from it alone.
* **On demand.** ``POST /v1/responses/compact`` returns the input's user messages followed by
  one ``compaction`` item, with the usage of the compaction pass.
* **Back.** A later input reads from its last ``compaction`` item on: the item stands in for
  everything before it (which the client may drop), with ``store=False`` as well.

The fake's "encryption" is base64 of the summary it wrote, so that it can count what an item
holds when it comes back; a client must treat it as opaque, as OpenAI's. Token figures are
segue's own estimate (``prompt_cache.text_tokens``). Only the standard library is used.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

from segue.testing.prompt_cache import plain_text, text_tokens

COMPACTION: Final = "compaction"
_PREFIX: Final = "fake-enc:"


def encrypted(summary: str) -> str:
    """The opaque content of an item holding ``summary``."""
    return _PREFIX + base64.b64encode(summary.encode()).decode()


def summary_of(content: object) -> str:
    """What an item's opaque content holds, as the fake reads it back ("" when it cannot)."""
    if not isinstance(content, str) or not content.startswith(_PREFIX):
        return ""
    try:
        return base64.b64decode(content.removeprefix(_PREFIX)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return ""


def compaction_item(summary: str) -> dict[str, Any]:
    """A ``compaction`` output item holding ``summary``."""
    return {
        "type": COMPACTION,
        "id": f"cmp_fake{uuid.uuid4().hex[:20]}",
        "encrypted_content": encrypted(summary),
    }


def threshold_of(request: Mapping[str, Any]) -> int | None:
    """The ``compact_threshold`` a request's ``context_management`` asks for (None: none)."""
    for entry in request.get("context_management") or ():
        if isinstance(entry, Mapping) and entry.get("type") == COMPACTION:
            value = entry.get("compact_threshold")
            return value if isinstance(value, int) else 0
    return None


def from_last_compaction(items: Sequence[Any]) -> list[Any]:
    """The input from its last ``compaction`` item on, that item read as the summary it holds
    (what the model reads of it)."""
    start = 0
    for index, item in enumerate(items):
        if isinstance(item, Mapping) and item.get("type") == COMPACTION:
            start = index
    read: list[Any] = []
    for item in items[start:]:
        if isinstance(item, Mapping) and item.get("type") == COMPACTION:
            read.append({"role": "assistant", "content": summary_of(item.get("encrypted_content"))})
        else:
            read.append(item)
    return read


def summarise(items: Sequence[Any]) -> str:
    """The summary the fake writes of an input: how much it held and its last user text."""
    last = ""
    for item in reversed(items):
        if isinstance(item, Mapping) and item.get("role") == "user":
            last = plain_text(item.get("content"))
            if last:
                break
    return f"Summary of {len(items)} earlier items. The latest request ends: {last[-300:]}"


def user_messages(items: Sequence[Any]) -> list[dict[str, Any]]:
    """The input's user messages as ``responses.compact`` returns them (before its item)."""
    kept: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, Mapping) and item.get("role") == "user":
            text = plain_text(item.get("content"))
            kept.append(
                {
                    "type": "message",
                    "id": f"msg_fake{uuid.uuid4().hex[:16]}",
                    "role": "user",
                    "status": "completed",
                    "content": [{"type": "input_text", "text": text}],
                }
            )
    return kept


def input_tokens(request: Mapping[str, Any], items: Sequence[Any]) -> int:
    """What the model reads of ``items`` with the request's instructions and tools."""
    tokens = text_tokens(request.get("instructions") or "") if request.get("instructions") else 0
    for item in items:
        for key in ("content", "output", "arguments", "tool_calls"):
            value = item.get(key) if isinstance(item, Mapping) else None
            if value:
                tokens += text_tokens(value)
    if request.get("tools"):
        tokens += text_tokens(request["tools"])
    return tokens


__all__ = [
    "COMPACTION",
    "compaction_item",
    "encrypted",
    "from_last_compaction",
    "input_tokens",
    "summarise",
    "summary_of",
    "threshold_of",
    "user_messages",
]
