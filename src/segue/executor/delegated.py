"""A facade's method that one of its parts carries out: ``Runtime.state`` is ``Conversations.state``
called on the ``Conversations`` the runtime holds.

A method passed on this way has one signature and one docstring, the part's: ``help()``, an
editor and mypy see them on the facade as they are written on the part, and a change to the part
is the facade's at once (nothing to keep in step by hand, as a copied signature would need).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")


class delegated(Generic[P, R]):  # noqa: N801  # used as a decorator-like name, as ``property`` is
    """``name = delegated("_part", Part.name)`` in a class body: ``facade.name(...)`` calls
    ``facade._part.name(...)``."""

    __wrapped__: Callable[Concatenate[Any, P], R]
    """The part's method: ``inspect.signature`` and ``help()`` follow it."""

    def __init__(self, part: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self._part = part
        self._name = method.__name__
        self.__doc__ = method.__doc__
        self.__wrapped__ = method

    @overload
    def __get__(self, facade: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(self, facade: object, owner: type[Any]) -> Callable[P, R]: ...

    def __get__(self, facade: object | None, owner: type[Any]) -> Self | Callable[P, R]:
        if facade is None:
            return self
        method: Callable[P, R] = getattr(getattr(facade, self._part), self._name)
        return method

    def __call__(self, facade: object, /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Called on the class, as a function is (``Runtime.state(rt, id)``)."""
        method: Callable[P, R] = getattr(getattr(facade, self._part), self._name)
        return method(*args, **kwargs)


__all__ = ["delegated"]
