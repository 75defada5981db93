"""Running the project's own scripts (benchmarks, examples) the way a user runs them: this
interpreter, a fresh process, output captured for the test to read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_script(
    relative: str, *args: str, timeout: float = 300, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``python [flags] <ROOT/relative> args...``, never raising for its exit status."""
    return subprocess.run(  # noqa: S603  # our own interpreter on our own script
        [sys.executable, *flags, str(ROOT / relative), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
