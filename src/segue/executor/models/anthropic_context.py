"""What Anthropic's API does to the context on its own side, for ``AnthropicModel``.

* **Which models** (``anthropic_context_support``): the server-side compaction
  (``compact_20260112``) is the newest models' (Claude Opus 4.6 and 4.7, Sonnet 4.6, Mythos
  Preview, and the generations after them); context editing (clearing old tool uses and
  thinking) every Claude 4 model's. A model segue does not know (a gateway's own name) is
  assumed to do neither: a conversation that asks for it is refused when it is created, not
  failed at its first turn.
* **A refusal** (``call_errors.refuses_compaction``): an error that says the compaction cannot
  be had (a model or an account without the beta) when segue asked for one: the conversation
  falls back to segue's own compaction (REQ-SEG-049).
* **An answer segue did not ask for** (``unexpected_compaction_stop``): a response stopped with
  ``compaction`` that segue did not ask to pause, or that holds no compaction.
"""

from __future__ import annotations

import re
from typing import Final

from segue.executor.model_port import ContextSupport, LlmReply, LlmRequest
from segue.executor.models.anthropic_payload import MIN_COMPACTION_TRIGGER
from segue.statemachine.context_edits import EDIT_STRATEGIES

COMPACTING_MODELS: Final = ("claude-opus-4-6", "claude-opus-4-7", "claude-sonnet-4-6")
"""The models whose compaction the API documents (besides Mythos Preview and the later
generations)."""
_GENERATION: Final = re.compile(r"^claude-(?:opus|sonnet|haiku)-(\d+)(?:-\d+)*$")


def anthropic_context_support(model: str) -> ContextSupport:
    """What the API does to the context of ``model`` (its name as segue's table knows it)."""
    name = model.strip().lower()
    later = _GENERATION.match(name)
    generation = int(later.group(1)) if later is not None else 0
    compacts = name in COMPACTING_MODELS or name.startswith("claude-mythos") or generation >= 5
    edits = name.startswith("claude-mythos") or generation >= 4
    return ContextSupport(
        compaction=compacts,
        min_trigger=MIN_COMPACTION_TRIGGER,
        instructions=True,
        on_demand=compacts,
        edits=frozenset(EDIT_STRATEGIES) if edits else frozenset(),
    )


def unexpected_compaction_stop(request: LlmRequest, reply: LlmReply) -> str | None:
    """Why a reply that stopped with ``compaction`` is not what segue asked for (None when it
    is, or when it did not stop so)."""
    if reply.stop_reason != "compaction":
        return None
    asked = request.compaction
    if asked is None or not asked.pause_after:
        return "the provider stopped after compacting, which segue did not ask it to"
    if not reply.compactions:
        return "the provider stopped for a compaction it did not return"
    return None


__all__ = [
    "COMPACTING_MODELS",
    "anthropic_context_support",
    "unexpected_compaction_stop",
]
