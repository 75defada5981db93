"""Names a package exports but imports only when first used (PEP 562 ``__getattr__``).

``segue`` keeps the runtime (anthropic, sqlite, asyncio machinery) off the pure core's import
path, and ``segue.testing`` keeps hypothesis off the fake server's: both export such names. A
name whose module needs an optional dependency that is not installed raises
``MissingExtraError`` naming the extra that brings it (``pip install "segue[openai]"``), not a
bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, Final

from segue.errors import MissingExtraError

EXTRAS: Final = {
    "openai": "openai",
    "tiktoken": "openai",
    "psycopg": "postgres",
    "psycopg_pool": "postgres",
    "claude_agent_sdk": "agent-sdk",
    "fastapi": "server",
    "starlette": "server",
    "uvicorn": "server",
    "hypothesis": "dev",
    "opentelemetry": "otel",
    "prometheus_client": "metrics",
}
"""The extra that installs each optional dependency (its top-level package)."""


def missing_extra(what: str, error: ModuleNotFoundError) -> ModuleNotFoundError:
    """``error`` (a module not found while loading ``what``) as a ``MissingExtraError`` naming
    the extra that brings the module, or ``error`` itself when no extra does (a broken
    install is not a missing extra)."""
    package = (error.name or "").split(".", 1)[0]
    extra = EXTRAS.get(package)
    if extra is None:
        return error
    message = f'{what} needs the {extra} extra: pip install "segue[{extra}]" (no {package} here)'
    return MissingExtraError(message, name=error.name)


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
        try:
            value = getattr(importlib.import_module(module), name)
        except ModuleNotFoundError as error:
            raise missing_extra(f"{package}.{name}", error) from error
        namespace[name] = value
        return value

    return lookup


__all__ = ["EXTRAS", "MissingExtraError", "lazy_getattr", "missing_extra"]
