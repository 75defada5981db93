"""The JSON of the core's values is what stores keep: it must not change between releases.

Why: a database written by the previous release must open on this one, and the outbox, the
transcript and the state rows are the values' ``model_dump_json()``. Two checks hold that:

- ``stored_values.jsonl`` is what the previous release wrote for one turn (the state after each
  event, then its effects, one JSON text a line): the same turn must give the same bytes.
- Over generated conversations, every value ``transition()`` returns serialises its fields under
  their names in the order the model declares them (pydantic writes them in the order of the
  instance's fields, so a value built some other way could reorder them).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from hypothesis import given

from added_fields import added_last, release_shape
from segue import (
    LlmResponse,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
    new_conversation,
    transition,
)
from segue.statemachine._values import Frozen
from segue.testing import EventSequence, event_sequences

STORED = Path(__file__).with_name("stored_values.jsonl")


def one_turn() -> list[str]:
    """The JSON of the turn ``stored_values.jsonl`` was written from: a tool call past the
    warning, its result, and the answer."""
    call = ToolCall(id="toolu_1", name="get_weather", input={"city": "Paris"})
    events = (
        UserMessage(text="Umbrella today?"),
        LlmResponse(
            text="Checking.",
            tool_calls=(call,),
            usage=Usage(input_tokens=150_000, cache_read_input_tokens=12_000, output_tokens=40),
            stop_reason="tool_use",
        ),
        ToolResult(tool_call_id="toolu_1", output="rain 70%"),
        LlmResponse(text="Yes, take one.", usage=Usage(input_tokens=170_000, output_tokens=9)),
    )
    # The bound on output new_conversation gave then (the model's maximum; 8,192 since).
    state = new_conversation(
        model="claude-sonnet-4-5", conversation_id="c-1", max_output_tokens=64_000
    )
    lines = []
    for event in events:
        state, effects = transition(state, event)
        lines += [state.model_dump_json(), *(effect.model_dump_json() for effect in effects)]
    return lines


def test_one_turn_serialises_as_the_previous_release_wrote_it() -> None:
    """Byte for byte, once the fields added since (``added_fields``: each with a default, each
    after the release's own) are taken out."""
    stored = STORED.read_text(encoding="utf-8").splitlines()
    parsed = [json.loads(line) for line in one_turn()]
    assert all(added_last(line) for line in parsed)
    now = [json.dumps(release_shape(line), separators=(",", ":")) for line in parsed]
    diff = "\n".join(difflib.unified_diff(stored, now, "stored", "now", lineterm="", n=0))
    assert now == stored, diff


def _declared_order(value: Frozen, dumped: Any, where: str) -> list[str]:
    """Where ``dumped`` (the value's JSON, parsed) has other names or another order than the
    fields ``value`` declares, recursively."""
    names = list(type(value).model_fields)
    wrong = [] if list(dumped) == names else [f"{where}: {list(dumped)} != {names}"]
    for name in names:
        wrong += _inner(getattr(value, name), dumped[name], f"{where}.{name}")
    return wrong


def _inner(value: Any, dumped: Any, where: str) -> list[str]:
    if isinstance(value, Frozen):
        return _declared_order(value, dumped, where)
    if isinstance(value, tuple | list):
        found = []
        for index, (item, item_dumped) in enumerate(zip(value, dumped, strict=True)):
            found += _inner(item, item_dumped, f"{where}[{index}]")
        return found
    return []


@given(event_sequences())
def test_every_value_serialises_its_fields_in_declared_order(sequence: EventSequence) -> None:
    for state, effects in sequence.replay():
        for value in (state, *effects):
            where = type(value).__name__
            assert not _declared_order(value, json.loads(value.model_dump_json()), where)
