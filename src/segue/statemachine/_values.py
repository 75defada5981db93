"""The base of every segue value: a frozen dataclass that pydantic validates at the edges.

Every value class (``class Usage(Frozen): ...``) is made a pydantic dataclass when it is
defined, through pydantic's public decorator (keyword-only, unknown fields refused), so what
enters from outside is validated as it is built: ``Usage(input_tokens=5)``,
``Usage.model_validate(...)``, a store's ``TypeAdapter``. Pydantic also writes their JSON, so
the stored shapes are pydantic's (fields under their names, in declaration order).

Inside the core nothing needs validating again: everything a handler combines was validated
when it entered, or was built by the core from such values. So the core builds its values in
plain Python: ``Cls._make(**fields)`` (a function generated per class, as ``dataclasses``
writes an ``__init__``, with the defaults filled in) and ``replaced(value, changes)`` (a copy
with some fields changed). A value is an ordinary object whose ``__dict__`` holds its fields,
which is what a dataclass is; nothing here reads or writes pydantic's own attributes, so a
pydantic release cannot change what the core builds. Building a value this way costs
0.15-0.45 us (a state's copy about 0.25 us), where validating it costs 0.5-1.5 us and a
``model_copy`` of a pydantic model about 1.5 us (``docs/design.md`` section 4).

Why a ``__dict__`` and not ``__slots__``: the core copies a state (17 fields) on nearly every
event, which costs about 0.25 us through its dict and 0.9 us slot by slot; a slot is read a
little faster (about 8 ns against 10), which does not make up for it.

The pydantic methods callers know (``model_dump``, ``model_dump_json``, ``model_copy``,
``model_validate``, ``model_validate_json``, ``model_json_schema``, ``model_fields``,
``model_fields_set``) are written once here, over one ``TypeAdapter`` per class.

Two mistakes a plain dataclass would hide are caught here. A copy names only fields the class
has: ``replaced(state, {"pendng_tokens": 5})`` raises a ``TypeError`` naming the class, the
field and the one meant (the core makes about 40 copies, each of which would otherwise return
an equal value and lose the change). And a value of a class made with ``remembers_given=True``
(``ConversationOptions``) remembers which fields it was given (``model_fields_set``), so that a
field left out is told from one given its default: the server fills in its own model and
behaviour only where the client said nothing.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, Literal, Self, TypeVar, dataclass_transform

from pydantic import (
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic.fields import FieldInfo
from pydantic.json_schema import DEFAULT_REF_TEMPLATE, GenerateJsonSchema, JsonSchemaMode
from pydantic_core import ArgsKwargs, PydanticUndefined

V = TypeVar("V", bound="Frozen")
IncEx = set[int] | set[str] | Mapping[int, Any] | Mapping[str, Any] | None

_CONFIG: ConfigDict = ConfigDict(extra="forbid")
_new = object.__new__
_GIVEN: Final = "__fields_given__"
"""Where a value of a class that remembers what it was given (``remembers_given``), validated
without some of its fields, keeps the names of those it was given: a ``frozenset`` in its
``__dict__`` after the fields, outside equality, hash, repr and dumps. A value given every
field, or built by the core, keeps none: every field counts as given."""


class _ModelFields:
    """``Cls.model_fields``: each field's ``FieldInfo`` (its annotation, default and
    constraints), built with pydantic's public constructors from the class's annotations."""

    def __get__(self, instance: object, owner: type[Frozen]) -> dict[str, FieldInfo]:
        return _fields_of(owner)


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(Field,))
class Frozen:
    """Base of every segue value: immutable, keyword-only, unknown fields refused, equal by
    value and hashable (when its fields are), validated when built from outside. A subclass
    of a value (one more field, say) is a value of its own, made so the same way."""

    model_fields: ClassVar[_ModelFields] = _ModelFields()
    _width: ClassVar[int] = 0
    """How many fields the class has: the keys a copy of one of its values holds, unless it
    remembers what it was given (``replaced``)."""

    def __init_subclass__(cls, *, remembers_given: bool = False, **kwargs: Any) -> None:
        """Makes ``cls`` a value. ``remembers_given``: its values keep the names of the fields
        they were given, however pydantic validated them (a request's body, a nested dict);
        a subclass inherits it. It costs about 0.4 us per value built and doubles the time of
        reading one from JSON (pydantic then hands the validator the parsed dict), so it is
        for what applications ask with (``ConversationOptions``), not what the core and the
        stores build by the thousand."""
        super().__init_subclass__(**kwargs)
        if remembers_given:  # before pydantic collects the class's validators
            setattr(cls, "_remember_given", model_validator(mode="wrap")(_remember_given))  # noqa: B010
        # Not pydantic's ``frozen``: that is the dataclass's, which raises a
        # ``FrozenInstanceError`` where a frozen pydantic model raises ``ValidationError``.
        # ``unsafe_hash`` gives the hash a frozen dataclass has.
        pydantic_dataclass(cls, kw_only=True, unsafe_hash=True, config=_CONFIG)
        setattr(cls, "_make", staticmethod(_maker(cls)))  # noqa: B010  # replaces the stub
        cls._width = len(dataclasses.fields(cls))  # type: ignore[arg-type]

    @classmethod
    def _make(cls, **fields: Any) -> Self:
        """An instance from fields that are already valid, without validation; the defaults
        of the fields left out are filled in. For the core only (``segue.statemachine``):
        everything else builds values with the constructor, which validates. (A stub: each
        class gets its own, generated when the class is defined.)"""
        raise NotImplementedError

    @property
    def model_fields_set(self) -> set[str]:
        """The fields given when the value was validated (the constructor, ``model_validate``,
        a request's body) or changed since (``model_copy``, ``replaced``), as pydantic's: a
        field left out to take its default is not in it. Only a class made with
        ``remembers_given=True`` keeps a record; any other value, like a value the core
        built, counts every field as given (as a pydantic dataclass does)."""
        given = self.__dict__.get(_GIVEN)
        return set(type(self).model_fields if given is None else given)

    def __setattr__(self, name: str, value: Any) -> None:
        raise _frozen(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise _frozen(self, name, None)

    # ----------------------------------------------------------------- pydantic's methods

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied, not validated (as pydantic's)."""
        value = copy.deepcopy(self) if deep else self
        return replaced(value, update or {})

    def model_dump(
        self,
        *,
        mode: Literal["json", "python"] = "python",
        include: IncEx = None,
        exclude: IncEx = None,
        by_alias: bool | None = None,
        exclude_unset: bool = False,
        exclude_defaults: bool = False,
        exclude_none: bool = False,
        round_trip: bool = False,
        warnings: bool | Literal["none", "warn", "error"] = True,
    ) -> dict[str, Any]:
        """The value as a dict (``mode="json"``: of JSON types), as pydantic dumps it.

        ``exclude_unset`` leaves out the fields not in ``model_fields_set``; a value inside
        it is dumped whole (pydantic keeps no record for a dataclass, so this is the value's
        own)."""
        dumped: dict[str, Any] = _adapter(type(self)).dump_python(
            self,
            mode=mode,
            include=include,
            exclude=_unset(self, exclude) if exclude_unset else exclude,
            by_alias=by_alias,
            exclude_unset=exclude_unset,
            exclude_defaults=exclude_defaults,
            exclude_none=exclude_none,
            round_trip=round_trip,
            warnings=warnings,
        )
        return dumped

    def model_dump_json(
        self,
        *,
        indent: int | None = None,
        include: IncEx = None,
        exclude: IncEx = None,
        by_alias: bool | None = None,
        exclude_unset: bool = False,
        exclude_defaults: bool = False,
        exclude_none: bool = False,
        round_trip: bool = False,
        warnings: bool | Literal["none", "warn", "error"] = True,
    ) -> str:
        """The value as JSON text, as pydantic writes it (what stores keep);
        ``exclude_unset`` as ``model_dump``'s."""
        return (
            _adapter(type(self))
            .dump_json(
                self,
                indent=indent,
                include=include,
                exclude=_unset(self, exclude) if exclude_unset else exclude,
                by_alias=by_alias,
                exclude_unset=exclude_unset,
                exclude_defaults=exclude_defaults,
                exclude_none=exclude_none,
                round_trip=round_trip,
                warnings=warnings,
            )
            .decode()
        )

    @classmethod
    def model_validate(
        cls,
        obj: Any,
        *,
        strict: bool | None = None,
        from_attributes: bool | None = None,
        context: Any | None = None,
    ) -> Self:
        """A value from a dict (or an instance, returned as it is), validated."""
        return _adapter(cls).validate_python(
            obj, strict=strict, from_attributes=from_attributes, context=context
        )

    @classmethod
    def model_validate_json(
        cls,
        json_data: str | bytes | bytearray,
        *,
        strict: bool | None = None,
        context: Any | None = None,
    ) -> Self:
        """A value from JSON text, validated."""
        return _adapter(cls).validate_json(json_data, strict=strict, context=context)

    @classmethod
    def model_json_schema(
        cls,
        by_alias: bool = True,
        ref_template: str = DEFAULT_REF_TEMPLATE,
        schema_generator: type[GenerateJsonSchema] = GenerateJsonSchema,
        mode: JsonSchemaMode = "validation",
    ) -> dict[str, Any]:
        """The JSON schema of the class, as pydantic generates it."""
        return _adapter(cls).json_schema(
            by_alias=by_alias,
            ref_template=ref_template,
            schema_generator=schema_generator,
            mode=mode,
        )


def replaced(value: V, changes: Mapping[str, Any]) -> V:
    """A copy of ``value`` with ``changes`` applied, without validation (the core's copy, and
    ``model_copy``'s): its fields in the same order, the values it keeps shared. A name the
    class has no field of raises a ``TypeError`` saying which, and the field it is closest to
    (a misspelt change would otherwise be kept beside the fields and never read). The fields
    changed count as given (``model_fields_set``), as after pydantic's ``model_copy``."""
    new = _new(cls := value.__class__)
    fields = new.__dict__
    fields.update(value.__dict__)
    fields.update(changes)
    if len(fields) != cls._width:  # one comparison on the core's path, for both rare cases
        _settle(new, changes)
    return new


def _settle(new: Frozen, changes: Mapping[str, Any]) -> None:
    """A copy with more keys than its class has fields: a name that is no field of the class
    (refused), or a value that remembers what it was given (the changed fields added)."""
    cls = type(new)
    fields = new.__dict__
    names = cls.model_fields
    unknown = [name for name in changes if name not in names]
    if unknown:
        wrong = ", ".join(repr(name) for name in unknown)
        close = difflib.get_close_matches(str(unknown[0]), names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(f"{cls.__qualname__} has no field {wrong}{hint}")
    fields[_GIVEN] = fields[_GIVEN].union(changes)


@classmethod  # type: ignore[misc]  # a validator of the class it is set on
def _remember_given(cls: type[V], data: Any, handler: ModelWrapValidatorHandler[V]) -> V:
    """Validates ``data`` and, when it leaves fields out, keeps the names it gave (the
    caller's own: this runs before the class's validators derive any field)."""
    value = handler(data)
    kind = type(data)
    if kind is ArgsKwargs:  # the constructor's keywords (positional ones were refused)
        data = data.kwargs or {}
    elif kind is not dict:  # an instance, returned as it is, keeps its own record
        return value
    fields = value.__dict__
    # A null for a field that cannot be null was validated only because a validator of the
    # class took it for "left out" (the server's create request does): it was not given.
    declared = cls.model_fields
    given = frozenset(
        name
        for name, field in data.items()
        if field is not None or name not in declared or declared[name].default is None
    )
    if len(given) < len(fields):
        fields[_GIVEN] = given
    return value


def _unset(value: Frozen, exclude: IncEx) -> IncEx:
    """``exclude`` with the fields ``value`` was not given (``exclude_unset``)."""
    given = value.__dict__.get(_GIVEN)
    if given is None:
        return exclude
    unset = {name for name in type(value).model_fields if name not in given}
    if exclude is None:
        return unset
    if isinstance(exclude, Mapping):
        merged: dict[Any, Any] = {**dict.fromkeys(unset, True), **exclude}
        return merged
    return {*exclude, *unset}


# --------------------------------------------------------------------------- per class


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}
_FIELDS: dict[type[Any], dict[str, FieldInfo]] = {}


def _adapter(cls: type[V]) -> TypeAdapter[V]:
    """The one ``TypeAdapter`` of a value class, which every pydantic method goes through
    (made on first use: a class may name types defined after it)."""
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


def _fields_of(cls: type[Frozen]) -> dict[str, FieldInfo]:
    found = _FIELDS.get(cls)
    if found is None:
        found = _FIELDS[cls] = _field_infos(cls)
    return found


def _field_infos(cls: type[Frozen]) -> dict[str, FieldInfo]:
    hints = typing.get_type_hints(cls, include_extras=True)
    found: dict[str, FieldInfo] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]  # every subclass is one
        annotation = hints[field.name]
        default: Any = field.default
        if field.default_factory is not dataclasses.MISSING:
            default = Field(default_factory=field.default_factory)
        if default is dataclasses.MISSING:
            found[field.name] = FieldInfo.from_annotation(annotation)
        else:
            found[field.name] = FieldInfo.from_annotated_attribute(annotation, default)
    return found


_FACTORY: Any = object()
"""The default of a generated ``_make``'s parameter whose field has a default factory."""


def _maker(cls: type[V]) -> Callable[..., V]:
    """``cls._make``: a function of the fields as keyword-only parameters, with their defaults,
    that builds the instance's ``__dict__`` in declaration order (as ``dataclasses`` writes an
    ``__init__``; the names are the class's field names, identifiers by construction)."""
    scope: dict[str, Any] = {"_new": _new, "_cls": cls, "_FACTORY": _FACTORY}
    parameters: list[str] = []
    factories: list[str] = []
    for index, field in enumerate(dataclasses.fields(cls)):  # type: ignore[arg-type]
        name = field.name
        default: Any = field.default
        factory: Any = field.default_factory
        if isinstance(default, FieldInfo):  # ``x: T = Field(...)``, as pydantic rewrote it
            factory = default.default_factory
            default = default.default
            if factory is None:
                factory = dataclasses.MISSING
            if default is PydanticUndefined:
                default = dataclasses.MISSING
        if factory is not dataclasses.MISSING:
            scope[f"_f{index}"] = factory
            parameters.append(f"{name}=_FACTORY")
            factories.append(f"    if {name} is _FACTORY:\n        {name} = _f{index}()\n")
        elif default is not dataclasses.MISSING:
            scope[f"_d{index}"] = default
            parameters.append(f"{name}=_d{index}")
        else:
            parameters.append(name)
    names = [field.name for field in dataclasses.fields(cls)]  # type: ignore[arg-type]
    # The fields go in as one dict, in declaration order. Stored one by one, they would keep
    # the dict CPython makes for a new instance (its keys shared with the class's other
    # instances), whose attributes CPython 3.11 reads without its inline cache, about twice
    # as slowly (every reader of the value pays that); a dict copied in is the value's own.
    source = (
        f"def _make({', '.join(['*', *parameters]) if parameters else ''}):\n"
        + "".join(factories)
        + "    value = _new(_cls)\n"
        + f"    value.__dict__.update({{{', '.join(f'{name!r}: {name}' for name in names)}}})\n"
        + "    return value\n"
    )
    exec(source, scope)  # noqa: S102  # our own source, from the class's field names
    made: Callable[..., V] = scope["_make"]
    made.__qualname__ = f"{cls.__qualname__}._make"
    return made


def given_fields(data: Any) -> dict[str, Any] | None:
    """What a ``mode="before"`` model validator was given, as a dict of fields: pydantic passes
    a dict when validating one (``model_validate``, a store, a field of another value) and the
    keyword arguments when the constructor is called. ``None`` for anything else (an instance,
    positional arguments), which field validation then reports."""
    if isinstance(data, dict):
        return data
    if isinstance(data, ArgsKwargs) and not data.args:
        return data.kwargs or {}  # read, never changed: a validator returns a new dict
    return None


def _frozen(value: Frozen, name: str, given: Any) -> ValidationError:
    """What assigning a field of a value raises: pydantic's error for a frozen instance."""
    return ValidationError.from_exception_data(
        type(value).__name__,
        [{"type": "frozen_instance", "loc": (name,), "input": given}],
    )
