"""The compactions a provider makes, as the core's events (REQ-SEG-033, REQ-SEG-048).

A provider that compacts within a call (Anthropic's ``compact_20260112``, OpenAI's
``context_management``) or on demand returns its compaction with the answer; the core takes it
as a ``ProviderCompacted`` in the same step as the answer. What the core cannot know is worked
out here from the request that was sent: how much of the turn stays verbatim after a compaction
segue had the provider pause after, and what the next request will hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from segue.executor.model_port import LlmRequest, ProviderCompaction
from segue.statemachine import (
    OPAQUE_SUMMARY,
    Message,
    ProviderCompacted,
    estimate_content,
    estimate_tokens,
)


def compacted(request: LlmRequest, made: ProviderCompaction) -> ProviderCompacted:
    """The event of a compaction the provider made in answering ``request``. One that returned
    its block (REQ-SEG-048) comes with what the next request holds, estimated (the system
    prompt, the summary or its opaque form, the pinned messages carried after it, and, when
    segue had the provider pause after it, the turn that was asked, which stays verbatim)."""
    block = made.block
    said: dict[str, Any] = {
        "trigger": made.trigger,
        "pre_tokens": made.pre_tokens,
        "block": block,
        "usage": made.usage,
    }
    if block is None or block.failed:
        return ProviderCompacted(summary=made.summary, post_tokens=made.post_tokens, **said)
    asked = request.compaction
    kept = turn_asked(request.messages) if asked is not None and asked.pause_after else ()
    summary = made.summary.strip() or OPAQUE_SUMMARY
    # The block is what is sent (its summary, or its opaque form), not the summary's text.
    estimate = estimate_tokens(request.system or "") + estimate_content("", (block,))
    estimate += sum(estimate_tokens(m.text) for m in request.messages if m.pinned and m not in kept)
    estimate += sum(estimate_content(m.text, m.content) for m in kept)
    return ProviderCompacted(
        summary=summary,
        post_tokens=made.post_tokens if made.post_tokens is not None else estimate,
        kept_messages=len(kept),
        **said,
    )


def turn_asked(messages: Sequence[Message]) -> list[Message]:
    """The turn the request asked: from its last user message (not a pinned one carried
    before it) to its end, for a compaction that stops before answering it."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.kind == "user":
            return list(messages[index:])
        if message.kind == "summary":
            break
    return []
