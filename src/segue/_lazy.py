"""Names a package exports but imports only when first used (PEP 562 ``__getattr__``).

``segue`` keeps the runtime (anthropic, sqlite, asyncio machinery) off the pure core's import
path, and ``segue.testing`` keeps hypothesis off the fake server's: both export such names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(
    package: str, modules: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``name`` from ``modules[name]`` on first use and
    keeps it in ``namespace`` (the package's globals), so later lookups cost nothing."""

    def lookup(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            msg = f"module {package!r} has no attribute {name!r}"
            raise AttributeError(msg)
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return lookup
