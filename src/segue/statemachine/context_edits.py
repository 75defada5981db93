"""The provider's own context editing (REQ-SEG-050): the edits a conversation asks for, checked
when it is created.

Anthropic's context management clears old tool uses and thinking on the provider's side before
the model reads the prompt (``clear_tool_uses_20250919``, ``clear_thinking_20251015``). A
conversation created with ``context_edits=[...]`` sends them with every turn, as the provider's
own edit objects (its API reference documents them), checked here for the strategies segue
knows: a misspelt field or strategy is refused when the conversation is created, before anything
is stored, not by the provider at the first turn. The compaction strategy is not an edit here:
it is ``compaction="provider"``, which segue records and accounts for.

The core only carries the edits; the adapter sends them (``docs/providers.md``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final, Literal

from pydantic import Field, StrictBool, StrictInt, TypeAdapter, ValidationError

from segue.statemachine._values import Frozen

EDIT_STRATEGIES: Final = ("clear_thinking_20251015", "clear_tool_uses_20250919")
"""The context-editing strategies segue knows, in the order the provider takes them (thinking
first: the API refuses a clearing of thinking listed after another edit)."""
COMPACTION_STRATEGY: Final = "compact_20260112"


class _InputTokens(Frozen):
    type: Literal["input_tokens"]
    value: Annotated[StrictInt, Field(ge=1)]


class _ToolUses(Frozen):
    type: Literal["tool_uses"]
    value: Annotated[StrictInt, Field(ge=0)]


class _ThinkingTurns(Frozen):
    type: Literal["thinking_turns"]
    value: Annotated[StrictInt, Field(ge=1)]


class _AllTurns(Frozen):
    type: Literal["all"]


class ClearToolUses(Frozen):
    """``clear_tool_uses_20250919``: once the prompt reaches ``trigger``, the oldest tool
    results (and with ``clear_tool_inputs`` their calls' inputs) are cleared, ``keep`` of the
    latest kept, at least ``clear_at_least`` tokens cleared, ``exclude_tools`` never."""

    type: Literal["clear_tool_uses_20250919"]
    trigger: Annotated[_InputTokens | _ToolUses, Field(discriminator="type")] | None = None
    keep: _ToolUses | None = None
    clear_at_least: _InputTokens | None = None
    exclude_tools: tuple[str, ...] | None = None
    clear_tool_inputs: StrictBool | tuple[str, ...] | None = None


class ClearThinking(Frozen):
    """``clear_thinking_20251015``: thinking blocks of older turns are cleared, those of the
    latest ``keep`` turns kept (``"all"``: none cleared)."""

    type: Literal["clear_thinking_20251015"]
    keep: (
        Annotated[_ThinkingTurns | _AllTurns, Field(discriminator="type")] | Literal["all"] | None
    ) = None


_EDIT: Final[TypeAdapter[ClearToolUses | ClearThinking]] = TypeAdapter(
    Annotated[ClearToolUses | ClearThinking, Field(discriminator="type")]
)


def checked_edits(edits: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """``edits`` as they will be sent, once each is one the provider documents: a known
    strategy, each at most once, with its fields of the right shapes. ``ValueError`` says
    which edit is wrong and how; the provider's compaction is refused as an edit (it is
    ``compaction="provider"``)."""
    kept: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index, edit in enumerate(edits):
        if not isinstance(edit, Mapping):
            msg = f"context_edits[{index}] is not an edit object (a dict with its 'type')"
            raise ValueError(msg)  # pydantic reports ValueError, not TypeError
        kind = edit.get("type")
        if kind == COMPACTION_STRATEGY:
            msg = (
                f"context_edits[{index}]: the provider's compaction is not an edit here; create "
                'the conversation with compaction="provider" (and the compact_in_place behaviour)'
            )
            raise ValueError(msg)
        if kind not in EDIT_STRATEGIES:
            msg = (
                f"context_edits[{index}]: unknown strategy {kind!r}; segue knows "
                f"{', '.join(EDIT_STRATEGIES)}"
            )
            raise ValueError(msg)
        if kind in seen:
            msg = f"context_edits[{index}]: {kind} is given twice; give each strategy once"
            raise ValueError(msg)
        seen.add(kind)
        try:
            _EDIT.validate_python(dict(edit))
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in problem['loc'][1:]) or 'edit'}: {problem['msg']}"
                for problem in error.errors()
            )
            msg = f"context_edits[{index}] ({kind}) is not as the provider documents it: {problems}"
            raise ValueError(msg) from None
        kept.append(copy.deepcopy(dict(edit)))
    return tuple(kept)


def in_provider_order(edits: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``edits`` in the order the provider takes them (``EDIT_STRATEGIES``)."""
    rank = {kind: place for place, kind in enumerate(EDIT_STRATEGIES)}
    return sorted((dict(edit) for edit in edits), key=lambda edit: rank.get(edit["type"], 99))


__all__ = [
    "COMPACTION_STRATEGY",
    "EDIT_STRATEGIES",
    "ClearThinking",
    "ClearToolUses",
    "checked_edits",
    "in_provider_order",
]
