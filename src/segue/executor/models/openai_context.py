"""What OpenAI's Responses API does to the context on its own side, for ``OpenAIModel``.

* **Which** (``openai_context_support``): the Responses API compacts the context of OpenAI's
  models, within a call (``context_management=[{"type": "compaction", "compact_threshold":
  N}]``) or on demand (``responses.compact``). It takes no instructions for its summary and
  applies no context edits; Chat Completions does neither, and neither does a compatible
  server's model segue cannot tell is OpenAI's.
* **The item, back** (``compaction_items``): the compaction is an opaque ``compaction`` item
  (``encrypted_content``) that stands in for everything before it; it goes back as it came,
  after the items of the window ``responses.compact`` returned with it, on every later turn,
  with ``store=False`` too (segue keeps the history and sends it whole).
* **Reading** (``compaction_of``, ``compacted_reply``): an output item of type ``compaction``
  becomes the reply's compaction; what ``responses.compact`` returns becomes a reply whose
  compaction holds the item, the window before it, and the usage of the compaction pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from segue.executor.model_port import ContextSupport, LlmReply, ProviderCompaction
from segue.executor.models.openai_usage import read_usage
from segue.statemachine import Message
from segue.statemachine.content import CompactionBlock
from segue.statemachine.models import provider_of

Item = dict[str, Any]
COMPACTION: Final = "compaction"


def openai_context_support(api: str, model: str) -> ContextSupport:
    """What the API does to the context of ``model`` (see the module docstring)."""
    compacts = api == "responses" and provider_of(model) == "openai"
    return ContextSupport(compaction=compacts, instructions=False, on_demand=compacts)


def compaction_items(message: Message) -> list[Item] | None:
    """The items a summary message holding OpenAI's compaction is sent back as: the window's
    items, then the compaction item, as they came (None for any other message)."""
    if message.kind != "summary":
        return None
    for block in message.content:
        if block.type == COMPACTION and block.provider == "openai" and not block.failed:
            item: Item = {"type": COMPACTION, "encrypted_content": block.encrypted_content}
            if block.id is not None:
                item["id"] = block.id
            return [*(dict(entry) for entry in block.window), item]
    return None


def compaction_of(item: Mapping[str, Any], window: tuple[Item, ...] = ()) -> ProviderCompaction:
    """A ``compaction`` output item as the reply's compaction (opaque: no summary text)."""
    encrypted = item.get("encrypted_content")
    identifier = item.get("id")
    block = CompactionBlock(
        provider="openai",
        encrypted_content=encrypted if isinstance(encrypted, str) and encrypted else None,
        id=identifier if isinstance(identifier, str) else None,
        window=window,
    )
    return ProviderCompaction(summary="", block=block)


def compacted_reply(compacted: Any) -> LlmReply:
    """What ``responses.compact`` returned (a ``CompactedResponse``, or its JSON) as a reply
    whose compaction holds the item, the window before it and what the pass cost; a reply
    without a compaction when it returned none."""
    output = _field(compacted, "output") or []
    items = [_plain(entry) for entry in output]
    last = max((i for i, item in enumerate(items) if item.get("type") == COMPACTION), default=-1)
    said = _field(compacted, "id")
    named = said if isinstance(said, str) and said else None  # its id; it names no model
    if last < 0:
        return LlmReply(stop_reason=COMPACTION, response_id=named)
    made = compaction_of(items[last], tuple(items[:last]))
    usage = read_usage(_field(compacted, "usage"))
    compaction = ProviderCompaction(summary="", trigger="manual", block=made.block, usage=usage)
    return LlmReply(stop_reason=COMPACTION, compactions=(compaction,), response_id=named)


def _field(value: Any, name: str) -> Any:
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)


def _plain(value: Any) -> Item:
    """An item as the JSON it came as (the client's object, or already a dict)."""
    if isinstance(value, Mapping):
        return dict(value)
    # The client's objects are built without validation: an item of a shape its types do not
    # foresee (a user message among output items) must come back as it came, not warn.
    dumped: Item = value.model_dump(mode="json", exclude_none=True, warnings=False)
    return dumped


__all__ = [
    "COMPACTION",
    "compacted_reply",
    "compaction_items",
    "compaction_of",
    "openai_context_support",
]
