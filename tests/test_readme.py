"""The README's examples run as written (a README that lies is worse than none)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    return subprocess.run(  # noqa: S603  # our own interpreter on our own file
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )


def test_embedding_example_runs_to_a_seeded_child(tmp_path: Path) -> None:
    embedding = next(
        block for block in _python_blocks() if "Runtime(" in block and "main()" in block
    )
    result = _run(embedding, tmp_path)
    assert result.returncode == 0, result.stderr
    # A library is quiet: the example's own two lines, and nothing on stderr.
    assert result.stderr == ""
    assert "transition" not in result.stdout, result.stdout
    assert "exhausted after" in result.stdout
    assert "summary: Continuation summary" in result.stdout
    assert re.search(r"continued in \w+ \(parent \w+\)", result.stdout)


def test_core_example_prints_what_it_claims(tmp_path: Path) -> None:
    core = next(block for block in _python_blocks() if "transition(state" in block)
    result = _run(core, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "awaiting_continuation"


def test_quickstart_commands_are_the_ones_ci_runs() -> None:
    text = README.read_text(encoding="utf-8")
    commands = re.search(r"```bash\n(.*?)```", text, re.DOTALL)
    assert commands is not None
    first, second = commands.group(1).strip().splitlines()[:2]
    assert first == 'pip install -e ".[dev]" && segue demo'
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert second in ci
