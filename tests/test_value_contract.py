"""What every segue value promises, however it was built: the contract of ``Frozen``.

Values are frozen dataclasses that pydantic validates when they are built from outside, and
that the core builds without validation (``Cls._make``, ``replaced``). Code outside the core,
and other people's code, relies on them behaving as the frozen pydantic models they were:
validated keyword construction, immutability, equality by value, hashing, pydantic's repr and
its methods (``model_dump``, ``model_copy``, ``model_validate``, ``model_fields``...), use
inside pydantic models and discriminated unions. These tests pin that on a few representative
classes, and hold what the core builds to what validation would have built, on generated
conversations.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import pickle
from pathlib import Path
from typing import Any, Final

import pydantic
import pytest
from annotated_types import MaxLen, MinLen
from hypothesis import given, settings
from pydantic import BaseModel, TypeAdapter, ValidationError

import segue.statemachine
from segue import (
    ConversationConfig,
    ConversationState,
    Event,
    LlmResponse,
    Message,
    RetryDue,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
    new_conversation,
    transition,
)
from segue.effects import AppendMessage, Effect, RequestLlm
from segue.executor.updates import OccupancyUpdate, Update
from segue.statemachine import ConversationOptions, Phase
from segue.statemachine._paths import record
from segue.statemachine._values import Frozen, replaced
from segue.statemachine.content import ImageBlock, TextBlock
from segue.statemachine.models import ModelSettings
from segue.statemachine.phases import IDLE, LlmRequesting, ToolExecuting
from segue.testing import EventSequence, event_sequences

ROOT: Final = Path(segue.statemachine.__file__).parents[3]


def _a_turn() -> list[Frozen]:
    """Every kind of value one ordinary turn makes the core build (without validation)."""
    call = ToolCall(id="toolu_1", name="bash", input={"cmd": "ls"})
    values: list[Frozen] = []
    state = new_conversation(model="claude-sonnet-4-5")
    for event in (
        UserMessage(text="hi"),
        LlmResponse(text="run", tool_calls=(call,), usage=Usage(input_tokens=170_000)),
        ToolResult(tool_call_id="toolu_1", output="a.txt"),
        LlmResponse(text="done", usage=Usage(input_tokens=170_100)),
    ):
        state, effects = transition(state, event)
        values += [state, state.phase, *effects]
    return values


TURN: Final = _a_turn()

# --------------------------------------------------------------------------- 1. construction


def test_keyword_construction_fills_the_defaults() -> None:
    usage = Usage(input_tokens=5)
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_input_tokens) == (5, 0, 0)
    assert ToolCall(id="t", name="n").input == {}
    assert ToolCall(id="t", name="n").input is not ToolCall(id="t", name="n").input


@pytest.mark.parametrize(
    ("build", "error_type"),
    [
        (lambda: Usage(input_tokens=-1), "greater_than_equal"),
        (lambda: Usage(input_tokens=True), "int_type"),  # StrictInt
        (lambda: Usage(input_tokens="5"), "int_type"),  # type: ignore[arg-type]
        (lambda: Usage(prompt_tokens=5), "unexpected_keyword_argument"),  # type: ignore[call-arg]
        (lambda: Usage(5), "unexpected_positional_argument"),  # type: ignore[call-arg]
        (lambda: Message(kind="user", session=0), "greater_than_equal"),
        (lambda: LlmRequesting(attempt=0), "greater_than_equal"),
        (lambda: AppendMessage(message={"kind": "x"}), "literal_error"),  # type: ignore[arg-type]
        (lambda: OccupancyUpdate(tokens=1, window=2, level="full", measured=True), "literal_error"),  # type: ignore[arg-type]
    ],
)
def test_invalid_input_raises_validation_error_at_construction(build: Any, error_type: str) -> None:
    with pytest.raises(ValidationError) as caught:
        build()
    assert caught.value.errors()[0]["type"] == error_type


def test_model_validators_keep_their_behaviour_and_messages() -> None:
    config = ConversationConfig(id="c", model="m", context_window=1_000, max_output_tokens=100)
    assert (config.warning_tokens, config.continuation_tokens) == (800, 900)
    assert config.max_tool_output_tokens == 256
    assert ConversationConfig.model_validate(dataclasses.asdict(config)) == config
    with pytest.raises(ValidationError, match="must not exceed continuation_threshold"):
        ConversationConfig(
            id="c",
            model="m",
            context_window=1_000,
            max_output_tokens=100,
            warning_threshold=0.95,
        )
    with pytest.raises(ValidationError, match="cannot be combined with a temperature"):
        ModelSettings(temperature=0.5, thinking_budget=2_000)
    with pytest.raises(ValidationError, match="must not exceed"):
        ConversationOptions(model="m", warning_threshold=0.95, continuation_threshold=0.9)
    blocks = (TextBlock(text="look"), TextBlock(text="here"))
    assert UserMessage(content=blocks).text == "look\nhere"  # type: ignore[call-arg]
    dumped = [block.model_dump() for block in blocks]
    assert UserMessage.model_validate({"content": dumped}).text == "look\nhere"
    with pytest.raises(ValidationError, match="text must be what the content says"):
        UserMessage(text="other", content=blocks)


# --------------------------------------------------------------------------- 2. immutability


@pytest.mark.parametrize("value", [Usage(input_tokens=5), *TURN], ids=lambda v: type(v).__name__)
def test_assigning_or_deleting_a_field_raises_frozen_instance(value: Frozen) -> None:
    name = dataclasses.fields(value)[0].name  # type: ignore[arg-type]
    before = value.model_dump_json()
    with pytest.raises(ValidationError) as caught:
        setattr(value, name, None)
    assert caught.value.errors()[0]["type"] == "frozen_instance"
    assert caught.value.errors()[0]["loc"] == (name,)
    with pytest.raises(ValidationError):
        delattr(value, name)
    with pytest.raises(ValidationError):
        value.not_a_field = 1
    assert value.model_dump_json() == before


# --------------------------------------------------------------------------- 3. equality, repr


def test_values_are_equal_by_value_and_hash_alike() -> None:
    made = Usage._make(input_tokens=5)
    validated = Usage(input_tokens=5)
    assert made == validated
    assert hash(made) == hash(validated)
    assert {made: "x"}[validated] == "x"
    assert Usage(input_tokens=6) != validated
    requesting: object = LlmRequesting()
    assert requesting != RequestLlm()  # the same fields, another class
    assert requesting != "llm_requesting"
    with pytest.raises(TypeError):  # a dict inside is unhashable, as in pydantic
        hash(ToolCall(id="t", name="n", input={"a": 1}))


def test_repr_is_pydantics() -> None:
    assert repr(Usage(input_tokens=5)) == (
        "Usage(input_tokens=5, output_tokens=0, cache_creation_input_tokens=0, "
        "cache_read_input_tokens=0)"
    )
    assert repr(AppendMessage(message=Message(kind="user", text="hi"))) == (
        "AppendMessage(kind='append_message', message=Message(kind='user', text='hi', "
        "tool_calls=(), tool_call_id=None, is_error=False, usage=None, session=1, "
        "generation=1, kept_messages=0, content=(), pinned=False, copy_of=None, summarises=None, "
        "carried=0))"
    )


@pytest.mark.parametrize("value", TURN, ids=lambda value: type(value).__name__)
def test_core_built_values_pickle_and_copy(value: Frozen) -> None:
    assert pickle.loads(pickle.dumps(value)) == value  # noqa: S301  # our own bytes
    assert copy.deepcopy(value) == value
    assert copy.copy(value) == value
    assert repr(type(value).model_validate_json(value.model_dump_json())) == repr(value)


# --------------------------------------------------------------------------- 4. the methods


def test_model_dump_and_dump_json() -> None:
    message = Message(kind="assistant", text="hi", usage=Usage(input_tokens=3))
    assert message.model_dump(include={"kind", "usage"}) == {
        "kind": "assistant",
        "usage": {
            "input_tokens": 3,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    assert message.model_dump(mode="json", exclude={"usage"})["tool_calls"] == []
    assert message.model_dump()["tool_calls"] == ()
    assert "usage" not in message.model_dump(exclude_none=True, exclude={"usage"})
    assert Usage(input_tokens=3).model_dump_json() == (
        '{"input_tokens":3,"output_tokens":0,"cache_creation_input_tokens":0,'
        '"cache_read_input_tokens":0}'
    )
    assert Usage().model_dump_json(indent=2).startswith('{\n  "input_tokens": 0,')
    assert RequestLlm().model_dump(exclude={"kind"}) == {"attempt": 1, "final": False}


def test_model_copy_changes_fields_without_validation() -> None:
    usage = Usage(input_tokens=3)
    copied = usage.model_copy(update={"input_tokens": -1})  # not validated, as pydantic's
    assert (copied.input_tokens, usage.input_tokens) == (-1, 3)
    assert usage.model_copy() == usage
    assert usage.model_copy() is not usage
    call = ToolCall(id="t", name="n", input={"a": [1]})
    deep = call.model_copy(deep=True)
    assert deep == call
    assert deep.input is not call.input
    assert call.model_copy().input is call.input
    assert [f.name for f in dataclasses.fields(copied)] == list(vars(copied))  # fields only


def test_model_validate_and_validate_json() -> None:
    usage = Usage(input_tokens=3)
    assert Usage.model_validate({"input_tokens": 3}) == usage
    assert Usage.model_validate(usage) is usage
    assert Usage.model_validate_json(b'{"input_tokens": 3}') == usage
    with pytest.raises(ValidationError):
        Usage.model_validate_json('{"input_tokens": -3}')
    assert ModelSettings.model_validate({"temperature": "0.5"}).temperature == 0.5
    with pytest.raises(ValidationError):  # the options are pydantic's, passed on
        ModelSettings.model_validate({"temperature": "0.5"}, strict=True)


def test_model_fields_and_json_schema() -> None:
    fields = ConversationConfig.model_fields
    assert list(fields) == [f.name for f in dataclasses.fields(ConversationConfig)]
    assert fields["id"].metadata == [MinLen(min_length=1), MaxLen(max_length=200)]
    assert fields["id"].is_required()
    assert fields["warning_threshold"].default == 0.80
    assert fields["parent_id"].annotation == str | None
    assert Usage.model_fields["input_tokens"].annotation is int
    assert LlmRequesting.model_fields["kind"].default == "llm_requesting"
    assert ToolCall.model_fields["input"].default_factory is dict
    assert Usage(input_tokens=1).model_fields is Usage.model_fields
    schema = Usage.model_json_schema()
    assert (schema["title"], schema["type"], schema["additionalProperties"]) == (
        "Usage",
        "object",
        False,
    )
    assert schema["properties"]["input_tokens"] == {
        "default": 0,
        "minimum": 0,
        "title": "Input Tokens",
        "type": "integer",
    }
    assert ToolCall.model_json_schema()["required"] == ["id", "name"]


class _Holder(BaseModel):
    """A pydantic model of the server's kind, holding segue values."""

    state: ConversationState
    phase: Phase
    usage: Usage | None = None


def test_values_inside_pydantic_models_validate_and_dump_as_before() -> None:
    state = new_conversation(model="claude-sonnet-4-5", conversation_id="c")
    held = _Holder.model_validate(
        {"state": state.model_dump(), "phase": {"kind": "llm_requesting", "attempt": 2}}
    )
    assert held.state == state
    assert held.phase == LlmRequesting(attempt=2)
    dumped = held.model_dump_json()
    assert dumped.startswith('{"state":' + state.model_dump_json() + ',"phase":{"kind"')
    assert _Holder.model_validate_json(dumped) == held
    with pytest.raises(ValidationError):
        _Holder(state=state, phase={"kind": "llm_requesting", "attempt": 0})
    schema = _Holder.model_json_schema()
    assert "ConversationState" in schema["$defs"]
    assert schema["properties"]["phase"]["discriminator"]["propertyName"] == "kind"


# --------------------------------------------------------------------------- 5. unions


def test_discriminated_unions_validate_by_kind() -> None:
    events: TypeAdapter[Event] = TypeAdapter(Event)
    event = events.validate_python({"kind": "retry_due", "attempt": 2})
    assert isinstance(event, RetryDue)
    assert event == RetryDue(attempt=2)
    effects: TypeAdapter[Effect] = TypeAdapter(Effect)
    effect = effects.validate_json('{"kind": "request_llm"}')
    assert isinstance(effect, RequestLlm)
    updates: TypeAdapter[Update] = TypeAdapter(Update)
    update = updates.validate_python(
        {"kind": "occupancy", "tokens": 1, "window": 2, "level": "ok", "measured": True}
    )
    assert isinstance(update, OccupancyUpdate)
    block = TypeAdapter(ImageBlock).validate_python(
        {"source": {"type": "url", "url": "https://example.com/a.png"}}
    )
    assert block.source.type == "url"
    with pytest.raises(ValidationError) as caught:
        TypeAdapter(Phase).validate_python({"kind": "sleeping"})
    assert caught.value.errors()[0]["type"] == "union_tag_invalid"
    assert isinstance(IDLE, Frozen)
    assert dataclasses.is_dataclass(IDLE)


# --------------------------------------------------------------------------- the core's builds


def _same(built: Any, validated: Any, where: str) -> list[str]:
    """Where ``built`` differs from ``validated`` in value or in the type of any part (a list
    for a tuple, an int for a float, a dict for a value: what equality alone can miss)."""
    if type(built) is not type(validated):
        return [f"{where}: {type(built).__name__} != {type(validated).__name__}"]
    if isinstance(built, Frozen):
        wrong: list[str] = []
        for field in dataclasses.fields(built):  # type: ignore[arg-type]
            name = field.name
            wrong += _same(getattr(built, name), getattr(validated, name), f"{where}.{name}")
        return wrong
    if isinstance(built, tuple):
        if len(built) != len(validated):
            return [f"{where}: {len(built)} items != {len(validated)}"]
        return [
            problem
            for index, (one, other) in enumerate(zip(built, validated, strict=True))
            for problem in _same(one, other, f"{where}[{index}]")
        ]
    return [] if built == validated else [f"{where}: {built!r} != {validated!r}"]


def _revalidated(value: Frozen) -> Frozen:
    """What validation builds from ``value``'s fields (its JSON, then pydantic)."""
    return type(value).model_validate_json(value.model_dump_json(warnings="error"))


@settings(max_examples=60, deadline=None)
@given(event_sequences())
def test_what_the_core_builds_is_what_validation_builds(sequence: EventSequence) -> None:
    """For generated conversations, every state and effect ``transition()`` returns (built
    without validation) is exactly what pydantic builds from the same fields: the same values,
    of the same types, with the same defaults; and serialising it
    raises no warning of a value that does not fit its field."""
    for state, effects in sequence.replay():
        for value in (state, state.phase, *effects):
            assert not _same(value, _revalidated(value), type(value).__name__)
            required = {
                field.name: getattr(value, field.name)
                for field in dataclasses.fields(value)
                if type(value).model_fields[field.name].is_required()
            }
            assert not _same(type(value)._make(**required), type(value)(**required), "defaults")


@pytest.mark.parametrize("value", TURN, ids=lambda value: type(value).__name__)
def test_replaced_copies_without_touching_the_original(value: Frozen) -> None:
    name = dataclasses.fields(value)[-1].name  # type: ignore[arg-type]
    before = value.model_dump_json()
    changed = replaced(value, {name: getattr(value, name)})
    assert changed == value
    assert changed is not value
    assert list(vars(changed)) == list(vars(value))
    assert value.model_dump_json() == before


def test_make_builds_without_validation_and_refuses_unknown_names() -> None:
    """``_make`` is the core's: it trusts its input (so nothing else may call it)."""
    assert Usage._make(input_tokens=-1).input_tokens == -1  # not validated: the core's only
    assert ToolExecuting._make(tool_calls=(), pending=()) == ToolExecuting(
        tool_calls=(), pending=()
    )
    with pytest.raises(TypeError):
        ToolCall._make(id="toolu_1")  # a required field left out
    with pytest.raises(TypeError):
        Usage._make(prompt_tokens=1)


def _unvalidated_builds(path: Path) -> list[str]:
    """Where ``path`` calls the core's builders: ``X._make``, or anything of ``_values`` but
    the base class (``replaced``, ``given_fields``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in ("_make", "replaced"):
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_values"):
            found += [f"line {node.lineno}: {a.name}" for a in node.names if a.name != "Frozen"]
    return found


@pytest.mark.parametrize(
    "path",
    sorted(
        path
        for folder in ("src", "bench", "examples")
        for path in (ROOT / folder).rglob("*.py")
        if "statemachine" not in path.parts
    ),
    ids=lambda path: str(path.relative_to(ROOT)),
)
def test_nothing_outside_the_core_builds_values_without_validation(path: Path) -> None:
    """Outside ``segue.statemachine`` values are built by their constructors (validated), or
    changed with the public ``model_copy``; the core's unvalidated builders stay the core's."""
    assert not _unvalidated_builds(path)


def test_the_check_for_unvalidated_builds_finds_them(tmp_path: Path) -> None:
    source = tmp_path / "leak.py"
    source.write_text(
        "from segue.statemachine._values import Frozen, replaced\n"
        "from segue import Usage\n"
        "Usage._make(input_tokens=1)\n",
        encoding="utf-8",
    )
    assert _unvalidated_builds(source) == ["line 1: replaced", "line 3: ._make"]


# --------------------------------------------------------------------------- the classes


def _value_classes(cls: type[Frozen] = Frozen) -> list[type[Frozen]]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_value_classes(sub)]
    return found


@pydantic.dataclasses.dataclass(kw_only=True, config=pydantic.ConfigDict(extra="forbid"))
class _Plain:
    """What pydantic itself puts on a dataclass, to tell it from what segue adds."""

    field: int = 0


_PYDANTICS: Final = {"model_dump", "model_dump_json", "model_copy", "model_validate"}


@pytest.mark.parametrize("cls", _value_classes(), ids=lambda cls: cls.__qualname__)
def test_value_classes_are_pydantic_dataclasses_and_nothing_more(cls: type[Frozen]) -> None:
    """Each class is what pydantic's public decorator makes (nothing of pydantic's written by
    segue, no method of pydantic's redefined per class: they live once, on ``Frozen``), with
    its own generated ``_make``."""
    own = set(vars(cls))
    assert not {name for name in own - set(vars(_Plain)) if name.startswith("__pydantic")}
    assert not own & (_PYDANTICS | {"model_fields", "model_json_schema", "__setattr__"})
    assert "_make" in own
    made = inspect.signature(cls._make).parameters
    assert list(made) == list(cls.model_fields)
    for name, info in cls.model_fields.items():
        if info.is_required():
            assert made[name].default is inspect.Parameter.empty, name
        elif info.default_factory is None:
            assert made[name].default == info.default, name
    assert dataclasses.is_dataclass(cls)
    assert pydantic.dataclasses.is_pydantic_dataclass(cls)


def test_a_subclass_of_a_value_is_a_value() -> None:
    class Regional(Usage):
        region: str = "eu"

    value = Regional(input_tokens=3, region="us")
    assert value.context_tokens == 3
    assert value.model_dump_json().endswith('"cache_read_input_tokens":0,"region":"us"}')
    assert Regional._make(input_tokens=3, region="us") == value
    with pytest.raises(ValidationError):
        Regional(region=1)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        value.region = "eu"  # type: ignore[misc]


def test_the_cores_record_defaults_are_the_messages() -> None:
    """``record`` spells out ``Message``'s fields (keywords passed on cost as much as the
    message): its defaults must stay the message's."""
    parameters = inspect.signature(record).parameters
    own = {"state", "kind", "text"}
    assert set(parameters) - own == set(Message.model_fields) - own - {"session", "generation"}
    for name, parameter in parameters.items():
        if name not in own:
            assert parameter.default == Message.model_fields[name].get_default(), name
