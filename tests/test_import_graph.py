"""The import graph has no circle and no upward arrow: ``pytest`` fails on a new one.

The contracts are in pyproject.toml (``[tool.importlinter]``): the layers (the pure core at the
bottom, then the executor, the views, the server, the CLI, the public face on top), no circle
between the modules of any package, and no module reaching into another package's private
module. A circle broken by an import put inside a function is still a circle to the graph,
which reads every import, so the ones this test once found had to be taken apart for real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def lint_imports(config: Path, *, path: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's check of ``config``, over the packages found on ``path`` first."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), *sys.path])}
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        f"sys.exit(lint_imports(config_filename={str(config)!r}, no_cache=True, no_logo=True))"
    )
    return subprocess.run(  # noqa: S603  # this interpreter, a fixed program
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )


def test_segue_keeps_its_import_contracts() -> None:
    ran = lint_imports(ROOT / "pyproject.toml", path=ROOT / "src")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "3 kept, 0 broken" in ran.stdout, ran.stdout


def _package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


@pytest.mark.parametrize(
    ("files", "broken"),
    [
        pytest.param(  # the core imports the executor (a circle with it, too)
            {"core/machine.py": "from toy.executor import run\n"},
            "layers",
            id="upward",
        ),
        pytest.param(  # two modules of the executor, one importing the other in a function
            {
                "executor/a.py": "def f():\n    from toy.executor import b\n",
                "executor/b.py": "from toy.executor import a\n",
            },
            "no circle",
            id="circle",
        ),
        pytest.param(  # the server reaches into the stores' private helpers
            {
                "executor/stores/_shared.py": "",
                "server/app.py": "import toy.executor.stores._shared\n",
            },
            "private module",
            id="private",
        ),
    ],
)
def test_the_contracts_catch_what_they_forbid(
    tmp_path: Path, files: dict[str, str], broken: str
) -> None:
    """The same kinds of contract, on a toy package that breaks one: the check fails, naming
    it (so the check above could fail too)."""
    base = {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/machine.py": "",
        "executor/__init__.py": "",
        "executor/run.py": "from toy.core import machine\n",
        "executor/stores/__init__.py": "",
        "server/__init__.py": "",
        "server/app.py": "from toy.executor import run\n",
    }
    _package(tmp_path / "toy", {**base, **files})
    config = tmp_path / "contracts.toml"
    config.write_text(
        textwrap.dedent(
            """
            [tool.importlinter]
            root_package = "toy"

            [[tool.importlinter.contracts]]
            name = "layers"
            type = "layers"
            containers = ["toy"]
            layers = ["server", "executor", "core"]

            [[tool.importlinter.contracts]]
            name = "no circle"
            type = "acyclic_siblings"
            ancestors = ["toy"]

            [[tool.importlinter.contracts]]
            name = "private module"
            type = "private_modules"
            """
        ),
        encoding="utf-8",
    )
    ran = lint_imports(config, path=tmp_path)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert f"{broken} BROKEN" in ran.stdout, ran.stdout
