"""How the core and its effects import: from a fresh interpreter, each way in, and purely.

Why: the effect classes once lived in ``segue.effects`` above the core, which the core's
machine imported while ``segue.effects`` imported the core's leaf modules: a cycle waiting for
the wrong first import. Their home is now ``segue.statemachine.effects`` and ``segue.effects``
names the same classes; each entry point is still imported first in its own interpreter (this
one has imported everything already). And the core's promise (no I/O, clock, randomness or logging)
holds for the effects too, so their modules import nothing that could break it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

import segue.effects
import segue.statemachine
import segue.statemachine.effects
from segue.statemachine import _paths, _summaries, _turns

SOURCE: Final = Path(segue.statemachine.__file__).parent.parent
IMPURE: Final = frozenset(
    {
        "asyncio",
        "datetime",
        "io",
        "logging",
        "os",
        "pathlib",
        "random",
        "secrets",
        "socket",
        "subprocess",
        "threading",
        "time",
        "uuid",
    }
)
"""Modules that do I/O, read a clock, draw random numbers or log."""


@pytest.mark.parametrize(
    "first",
    [
        "import segue",
        "import segue.effects",
        "import segue.statemachine",
        "from segue.effects import AppendMessage",
        "import segue.core",
        "from segue.statemachine.effects import AppendMessage",
        "from segue.statemachine.machine import transition",
    ],
)
def test_each_entry_point_imports_first(first: str) -> None:
    code = (
        f"{first}\n"
        "import segue, segue.effects, segue.statemachine\n"
        "assert segue.AppendMessage is segue.effects.AppendMessage\n"
        "assert segue.statemachine.transition is segue.transition\n"
    )
    done = subprocess.run(  # noqa: S603  # our own interpreter on our own code
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_the_effects_are_a_module_the_core_builds_from() -> None:
    assert not hasattr(segue.effects, "__path__")  # a module, not a package of re-exports
    for module in (_paths, _turns, _summaries):
        for name in ("Effect", "ExecuteTools", "RequestContinuation", "RequestCheckpoint"):
            if hasattr(module, name):
                assert getattr(module, name) is getattr(segue.effects, name), (module, name)
    assert segue.effects.AppendMessage.__module__ == "segue.statemachine.effects"
    assert set(segue.effects.__all__) == set(segue.statemachine.effects.__all__)


def _imported(path: Path) -> set[str]:
    """The top-level modules ``path`` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


PURE: Final = [
    SOURCE / "effects.py",
    SOURCE / "core.py",
    SOURCE / "errors.py",
    *(
        path
        for path in sorted((SOURCE / "statemachine").glob("*.py"))
        # spec.py reads the packaged table when asked (its one documented exception).
        if path.name != "spec.py"
    ),
]


@pytest.mark.parametrize("path", PURE, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_the_core_and_its_effects_import_nothing_impure(path: Path) -> None:
    assert not _imported(path) & IMPURE, sorted(_imported(path) & IMPURE)
