"""The base of every segue value.

Every value is a frozen pydantic model built through pydantic's public API only: a new value
through its constructor (validated), a changed one through ``model_copy(update=...)``. What the
core builds must survive pydantic's minor releases unchanged, and stored states must read back
on the next release, so nothing here touches pydantic's private slots or shadows its
attributes.

Why the constructor, even for values built from values that are already valid: on pydantic 2.13
it is also the fastest public way. ``model_construct`` fills each missing default through a
Python-level path that costs about a microsecond a field (a ``Message`` given 4 of its 11 fields
takes ~9 us), while validation in pydantic-core builds the same small value in ~0.5-1.4 us. A
copy of a large value (the 17 fields of a ``ConversationState``) is cheaper with ``model_copy``
(~1.5 us against ~2.3 us to validate it again). ``docs/design.md`` section 4 has the budget.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Base of every segue value: immutable, keyword-only, unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def _make(cls, **fields: Any) -> Self:
        """An instance from values that are already valid: the constructor, under the name the
        executor still calls (its calls are moving to the constructor; this goes then).

        It validates, so a value that is not valid raises ``pydantic.ValidationError``.
        """
        return cls(**fields)
