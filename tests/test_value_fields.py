"""What a value knows of its own fields: a copy naming a field its class does not have is
refused (``replaced``, ``model_copy``), and a class made with ``remembers_given=True``
(``ConversationOptions``, the server's create request) keeps which fields it was given.

The first is what keeps the core honest: it copies values about 40 times, and a misspelt name
used to be kept beside the fields, never read, the copy equal to the original. The second is
what lets the server tell a field left out (its own setting applies) from one given the
library's default (the client's choice).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import segue.statemachine
from segue import ContextExhaustionBehavior, Usage, new_conversation
from segue.server.schemas import CreateConversation, Info
from segue.statemachine import ConversationOptions
from segue.statemachine._values import Frozen, replaced

CORE: Final = Path(segue.statemachine.__file__).parent


def _value_classes(cls: type[Frozen] = Frozen) -> list[type[Frozen]]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_value_classes(sub)]
    return found


CLASSES: Final = sorted(_value_classes(), key=lambda cls: cls.__qualname__)


def _any_value(cls: type[Frozen]) -> Frozen:
    """A value of ``cls`` with ``None`` for each required field (``_make`` does not validate:
    what matters here is which names a copy takes, not what they hold)."""
    required = {name for name, info in cls.model_fields.items() if info.is_required()}
    return cls._make(**dict.fromkeys(required, None))


def _misspellings(name: str) -> st.SearchStrategy[str]:
    """``name`` with one letter dropped, doubled or changed: a typo of the field."""
    index = st.integers(min_value=0, max_value=len(name) - 1)
    letter = st.sampled_from("abcdefghijklmnopqrstuvwxyz_")
    return st.one_of(
        index.map(lambda i: name[:i] + name[i + 1 :]),
        index.map(lambda i: name[:i] + name[i] + name[i:]),
        st.tuples(index, letter).map(lambda il: name[: il[0]] + il[1] + name[il[0] + 1 :]),
    )


@st.composite
def _typos(draw: st.DrawFn) -> tuple[type[Frozen], str]:
    cls = draw(st.sampled_from([cls for cls in CLASSES if cls.model_fields]))
    field = draw(st.sampled_from(sorted(cls.model_fields)))
    typo = draw(_misspellings(field).filter(lambda typo: typo not in cls.model_fields))
    return cls, typo


# --------------------------------------------------------------------------- misspelt fields


@settings(max_examples=300, deadline=None)
@given(_typos())
def test_a_misspelt_field_is_refused_by_every_value_class(typo: tuple[type[Frozen], str]) -> None:
    cls, name = typo
    value = _any_value(cls)
    first = next(iter(cls.model_fields))
    copies: list[Callable[[], Frozen]] = [
        lambda: replaced(value, {name: 5}),
        lambda: value.model_copy(update={name: 5}),
        lambda: replaced(value, {first: 1, name: 5}),  # beside a field that is one
    ]
    for copying in copies:
        with pytest.raises(TypeError) as raised:
            copying()
        message = str(raised.value)
        assert message.startswith(f"{cls.__qualname__} has no field {name!r}"), message
        if len(name) >= 4:  # one letter off a field of 4 or more: close enough to suggest
            assert "(did you mean '" in message, message


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__qualname__)
def test_every_field_of_every_class_can_be_changed(cls: type[Frozen]) -> None:
    value = _any_value(cls)
    for name in cls.model_fields:
        marker = object()
        changed = replaced(value, {name: marker})
        assert getattr(changed, name) is marker
        assert list(vars(changed)) == list(vars(value))


def test_the_suggestion_is_the_field_meant() -> None:
    state = new_conversation(model="claude-sonnet-4-5")
    with pytest.raises(TypeError, match=r"'pendng_tokens' \(did you mean 'pending_tokens'\?\)"):
        replaced(state, {"pendng_tokens": 5})
    with pytest.raises(TypeError, match=r"^Usage has no field 'zzz', 'yyy'$"):
        Usage(input_tokens=1).model_copy(update={"zzz": 1, "yyy": 2})


def _literal_changes(path: Path) -> list[tuple[int, set[str]]]:
    """The field names each ``replaced(value, {...})`` of ``path`` spells out."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "replaced"
            and len(node.args) == 2
            and isinstance(node.args[1], ast.Dict)
        ):
            keys = {
                key.value
                for key in node.args[1].keys
                if isinstance(key, ast.Constant) and isinstance(key.value, str)
            }
            found.append((node.lineno, keys))
    return found


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda path: path.name)
def test_every_name_the_core_changes_is_a_field_of_some_value(path: Path) -> None:
    """Each name a core copy spells out is some value class's field (the exploration runs
    most copies; this reads the ones it may not reach)."""
    fields = {name for cls in CLASSES for name in cls.model_fields}
    for line, names in _literal_changes(path):
        assert names <= fields, f"{path.name}:{line}: {names - fields}"


# --------------------------------------------------------------------------- fields given

REMEMBERING: Final = [ConversationOptions, CreateConversation]
OPTIONAL: Final = sorted(set(ConversationOptions.model_fields) - {"model"})


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(REMEMBERING),
    st.sets(st.sampled_from(OPTIONAL)),
    st.sets(st.sampled_from(OPTIONAL)),
)
def test_the_fields_given_are_remembered(
    cls: type[ConversationOptions], asked: set[str], changed: set[str]
) -> None:
    """Given their defaults, the fields still count as given: after construction, after
    validation from a dict and from JSON, and after a copy (the changed ones added)."""
    defaults = {name: ConversationOptions.model_fields[name].get_default() for name in asked}
    fields = {"model": "claude-sonnet-4-5", **defaults}
    expected = {"model", *asked}
    built = cls(**fields)
    from_dict = cls.model_validate(fields)
    from_json = cls.model_validate_json(
        ConversationOptions(**fields).model_dump_json(include=expected)
    )
    for value in (built, from_dict, from_json):
        assert value.model_fields_set == expected
        assert set(value.model_dump(exclude_unset=True)) == expected
        changes = {name: getattr(value, name) for name in changed}
        assert replaced(value, changes).model_fields_set == expected | changed
        assert value.model_copy(update=changes).model_fields_set == expected | changed
        assert value.model_fields_set == expected  # the original is left as it was


def test_the_record_is_no_part_of_the_value() -> None:
    """Equality, hash, repr, dumps and the fields are the fields'; a copy, a deep copy and a
    pickle keep the record."""
    asked = ConversationOptions(model="m", max_attempts=4)
    whole = ConversationOptions(**ConversationOptions(model="m").model_dump())
    assert asked == whole
    assert hash(asked) == hash(whole)
    assert repr(asked) == repr(whole)
    assert asked.model_dump_json() == whole.model_dump_json()
    assert [field.name for field in dataclasses.fields(asked)] == list(whole.model_fields)
    assert whole.model_fields_set == set(ConversationOptions.model_fields)
    for kept in (copy.copy(asked), copy.deepcopy(asked), pickle.loads(pickle.dumps(asked))):  # noqa: S301
        assert kept.model_fields_set == {"model", "max_attempts"}


def test_exclude_unset_keeps_what_exclude_leaves_out() -> None:
    options = ConversationOptions(model="m", system="s", max_attempts=2)
    assert options.model_dump(exclude_unset=True, exclude={"system"}) == {
        "model": "m",
        "max_attempts": 2,
    }
    dumped = options.model_dump_json(exclude_unset=True, exclude={"system": True})
    assert dumped == '{"model":"m","max_attempts":2}'


@pytest.mark.parametrize(
    "cls",
    [cls for cls in CLASSES if cls not in REMEMBERING],
    ids=lambda cls: cls.__qualname__,
)
def test_a_class_that_does_not_remember_counts_every_field_as_given(cls: type[Frozen]) -> None:
    """As a pydantic dataclass does: the core's values and the stores' keep no record (it
    would cost every value read from JSON the parsed dict pydantic hands a validator)."""
    assert _any_value(cls).model_fields_set == set(cls.model_fields)
    assert Usage(input_tokens=1).model_fields_set == set(Usage.model_fields)


# --------------------------------------------------------------------------- the create request


def _info(**fields: Any) -> Info:
    return Info(
        version="0",
        offline=True,
        model="server-model",
        behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE,
        **fields,
    )


def test_the_servers_settings_fill_only_what_the_request_left_out() -> None:
    info = _info(context_window=40_000, limits={"max_attempts": 2, "retry_base_delay": 0.5})
    left_out = CreateConversation.model_validate({}).options(info)
    assert (left_out.model, left_out.behavior) == ("server-model", info.behavior)
    assert (left_out.context_window, left_out.max_attempts, left_out.retry_base_delay) == (
        40_000,
        2,
        0.5,
    )
    # The library's defaults, given: the client's choice, not the server's.
    default = ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION
    asked = CreateConversation.model_validate(
        {"model": "mine", "behavior": default.value, "max_attempts": 4, "context_window": 9_000}
    ).options(info)
    assert (asked.model, asked.behavior, asked.max_attempts, asked.context_window) == (
        "mine",
        default,
        4,
        9_000,
    )
    assert asked.retry_base_delay == 0.5  # still the server's: the request left it out


@pytest.mark.parametrize(
    "body",
    [{"model": ""}, {"warning_threshold": "0.8"}, {"max_attempts": None}],
)
def test_a_create_request_is_validated_as_the_options_are(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        CreateConversation.model_validate(body)


@pytest.mark.parametrize(
    "body", [{"model": None}, {"behavior": None}, {"model": None, "behavior": None}]
)
def test_a_null_model_or_behaviour_is_left_out(body: dict[str, Any]) -> None:
    """Clients of earlier servers send null for "the server's": it is taken as left out."""
    request = CreateConversation.model_validate(body)
    assert request.model_fields_set == set()
