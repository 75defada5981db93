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
_T = TypeVar("_T", bound="Frozen")


class Frozen(BaseModel):
    """Base of every segue value: immutable, keyword-only, unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    _template: ClassVar[dict[str, Any]] = {}
    """Every field with its default (``None`` where it has none), in pydantic's field order."""
    _fields_set: ClassVar[set[str]] = set()
    """The ``__pydantic_fields_set__`` of every core-built instance: all fields. Shared, which is
    safe for frozen models: pydantic only adds to it on assignment, and copies it on copy."""
    _build: ClassVar[Callable[..., Any]]
    """``builder(cls)``, made once per class."""

    # Pydantic gives every model two slots besides ``__dict__`` and the fields set: extra fields
    # (always None here: extra="forbid") and private attributes (segue declares none). Served by
    # these properties, a value the core builds needs two slot writes instead of four, about a
    # fifth of its cost. Pydantic still writes None to them when it validates or copies; the
    # setters take that and refuse anything else, so nothing can be silently lost.

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
        cls._fields_set = set(cls.model_fields)
        cls._build = builder(cls)

    @classmethod
    def _make(cls, **fields: Any) -> Self:
        """Build an instance from already-valid values, without validation (core use only).

        Required fields and fields with a ``default_factory`` must be passed explicitly. Hot
        paths use ``builder(cls)`` instead, which saves the class lookups of each call.
        """
        return cast(Self, cls._build(**fields))

    def _evolve(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied, without validation (core use only)."""
        return self._replace(changes)

    def _replace(self, changes: dict[str, Any]) -> Self:
        """``_evolve`` with the changes in a dict, for hot paths that collect them as they go."""
        cls = type(self)
        obj = _new(cls)
        _set(obj, "__dict__", self.__dict__ | changes)
        _set(obj, "__pydantic_fields_set__", cls._fields_set)
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
        _set(obj, "__dict__", template | fields)
        _set(obj, "__pydantic_fields_set__", fields_set)
        return obj

    build.__qualname__ = build.__name__ = f"build_{cls.__name__}"
    return build
