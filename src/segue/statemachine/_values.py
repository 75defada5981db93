"""The base of every segue value, and the core's cheap way of building its own.

Pydantic validation is what makes values from the outside trustworthy, and it costs about two
microseconds a model. The core builds a new state, phase and a few effects on every event from
values that are already valid, so it skips validation through ``Frozen._make``: the same object
pydantic would build, assembled directly (about a third of the cost). Nothing outside the core
should call ``_make``; everything that enters from outside goes through the normal constructor.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticUndefined

_set = object.__setattr__


class Frozen(BaseModel):
    """Base of every segue value: immutable, keyword-only, unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    _defaults: ClassVar[dict[str, Any]] = {}
    _all_fields: ClassVar[frozenset[str]] = frozenset()
    _field_names: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        defaults: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            if info.default is not PydanticUndefined:
                defaults[name] = info.default
        cls._defaults = defaults
        cls._all_fields = frozenset(cls.model_fields)
        cls._field_names = tuple(cls.model_fields)

    @classmethod
    def _make(cls, **fields: Any) -> Self:
        """Build an instance from already-valid values, without validation (core use only).

        Fields with a ``default_factory`` must be passed explicitly.
        """
        obj = cls.__new__(cls)
        # Field order, as pydantic builds it: serialisation follows the dict's order.
        defaults = cls._defaults
        values = {
            name: fields[name] if name in fields else defaults[name] for name in cls._field_names
        }
        _set(obj, "__dict__", values)
        _set(obj, "__pydantic_fields_set__", set(cls._all_fields))
        _set(obj, "__pydantic_extra__", None)
        _set(obj, "__pydantic_private__", None)
        return obj

    def _evolve(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied, without validation (core use only)."""
        cls = type(self)
        obj = cls.__new__(cls)
        values = dict(self.__dict__)
        values.update(changes)
        _set(obj, "__dict__", values)
        _set(obj, "__pydantic_fields_set__", set(cls._all_fields))
        _set(obj, "__pydantic_extra__", None)
        _set(obj, "__pydantic_private__", None)
        return obj
