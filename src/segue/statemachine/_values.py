"""The base of every segue value, and the core's cheap way of building its own.

Pydantic validation is what makes values from the outside trustworthy, and it costs about two
microseconds a model. The core builds a new state, phase and a few effects on every event from
values that are already valid, so it skips validation through ``Frozen._make``: the same object
pydantic would build, assembled directly (about a third of the cost). Nothing outside the core
should call ``_make``; everything that enters from outside goes through the normal constructor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Self, TypeVar, cast

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticUndefined

_set = object.__setattr__
_new = object.__new__
# The two slots every value has, set through their own descriptors: ``object.__setattr__``
# would first look the name up on the class (about 35 ns of a 500 ns value, twice per value).
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_T = TypeVar("_T", bound="Frozen")
_PYDANTIC_SLOTS: dict[str, Any] = {
    name: BaseModel.__dict__[name] for name in ("__pydantic_extra__", "__pydantic_private__")
}
"""Pydantic's own descriptors of the two slots ``Frozen`` serves by properties."""


_FIELDS_SETS: dict[type, set[str]] = {}
"""Each value class's ``_fields_set``, by class: reading a class attribute goes through
pydantic's metaclass ``__getattr__`` hook (about 50 ns), a dict lookup by type does not."""


class Frozen(BaseModel):
    """Base of every segue value: immutable, keyword-only, unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    _template: ClassVar[dict[str, Any]] = {}
    """Every field with its default (``None`` where it has none), in pydantic's field order."""
    _fields_set: ClassVar[set[str]] = set()
    """The ``__pydantic_fields_set__`` of every core-built instance: all fields. Shared, which is
    safe for frozen models: pydantic only adds to it on assignment, and copies it on copy."""
    _required: ClassVar[frozenset[str]] = frozenset()
    """Fields without a plain default: ``_make`` must be given them."""
    _own_slots: ClassVar[bool] = False
    """True for a subclass that uses pydantic's extra or private slots (see below)."""
    _build: ClassVar[Callable[..., Any]]
    """``builder(cls)``, made once per class."""

    # Pydantic gives every model two slots besides ``__dict__`` and the fields set: extra fields
    # (always None here: extra="forbid") and private attributes (segue declares none). Served by
    # these properties, a value the core builds needs two slot writes instead of four, about a
    # fifth of its cost. Pydantic still writes None to them when it validates or copies; the
    # setters take that and refuse anything else, so nothing can be silently lost. A subclass
    # that declares private attributes or allows extra fields gets pydantic's slots back.

    @property
    def __pydantic_extra__(self) -> dict[str, Any] | None:
        return None

    @__pydantic_extra__.setter
    def __pydantic_extra__(self, value: dict[str, Any] | None) -> None:
        if value:
            msg = f"{type(self).__name__} refuses extra fields: {sorted(value)}"
            raise TypeError(msg)

    @property
    def __pydantic_private__(self) -> dict[str, Any] | None:
        return None

    @__pydantic_private__.setter
    def __pydantic_private__(self, value: dict[str, Any] | None) -> None:
        if value:
            msg = f"{type(self).__name__} has no private attributes: {sorted(value)}"
            raise TypeError(msg)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._template = {
            name: None if info.default is PydanticUndefined else info.default
            for name, info in cls.model_fields.items()
        }
        cls._fields_set = _FIELDS_SETS[cls] = set(cls.model_fields)
        cls._required = frozenset(
            name for name, info in cls.model_fields.items() if info.default is PydanticUndefined
        )
        cls._own_slots = bool(cls.__private_attributes__) or cls.model_config.get("extra") not in (
            None,
            "forbid",
        )
        if cls._own_slots:
            for name, slot in _PYDANTIC_SLOTS.items():
                setattr(cls, name, slot)
            # Decided here, once, so the common ``_replace`` carries no check (checking there
            # measured ~150 ns on every event).
            cls._replace = _replace_keeping_slots  # type: ignore[method-assign]
        cls._build = builder(cls)

    @property
    def model_fields_set(self) -> set[str]:
        """The fields set explicitly, as a copy: values the core builds share one set, which
        must never change through one of them."""
        return set(self.__pydantic_fields_set__)

    @classmethod
    def _make(cls, **fields: Any) -> Self:
        """Build an instance from already-valid values, without validation (core use only).

        Required fields and fields with a ``default_factory`` must be passed explicitly (a
        missing one raises ``TypeError``). Hot paths use ``builder(cls)`` instead, which saves the
        class lookups and this check; tests round-trip every value they build.
        """
        missing = cls._required.difference(fields)
        if missing:
            msg = f"{cls.__name__}._make() needs the fields {sorted(missing)}"
            raise TypeError(msg)
        return cast(Self, cls._build(**fields))

    def _evolve(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied, without validation (core use only)."""
        return self._replace(changes)

    def _replace(self, changes: dict[str, Any]) -> Self:
        """``_evolve`` with the changes in a dict, for hot paths that collect them as they go."""
        cls = type(self)
        obj = _new(cls)
        _set_dict(obj, self.__dict__ | changes)
        _set_fields(obj, _FIELDS_SETS[cls])  # not ``cls._fields_set``: see ``_FIELDS_SETS``
        return obj


def _replace_keeping_slots(self: _T, changes: dict[str, Any]) -> _T:
    """``Frozen._replace`` for a subclass that uses pydantic's extra and private slots. Both
    dicts are copied, as pydantic's own copy does: private attributes stay mutable on a frozen
    model, and a change through the copy must not show in the original."""
    obj = Frozen._replace(self, changes)
    extra, private = self.__pydantic_extra__, self.__pydantic_private__
    _set(obj, "__pydantic_extra__", None if extra is None else dict(extra))
    _set(obj, "__pydantic_private__", None if private is None else dict(private))
    return obj


def builder(cls: type[_T]) -> Callable[..., _T]:
    """A function that builds ``cls`` from keyword fields the way ``Frozen._make`` does.

    Pydantic's metaclass makes every class attribute lookup cost about 50 ns, a fifth of
    building a value, so the class's template and fields set are bound here once. The template
    is copied and updated, which keeps pydantic's field order (serialisation follows it).
    """
    template = cls._template
    fields_set = cls._fields_set

    def build(**fields: Any) -> _T:
        obj = _new(cls)
        _set_dict(obj, template | fields)
        _set_fields(obj, fields_set)
        return obj

    def build_with_slots(**fields: Any) -> _T:
        obj = build(**fields)
        _set(obj, "__pydantic_extra__", None)
        _set(obj, "__pydantic_private__", None)
        return obj

    chosen = build_with_slots if cls._own_slots else build
    chosen.__qualname__ = chosen.__name__ = f"build_{cls.__name__}"
    return chosen
