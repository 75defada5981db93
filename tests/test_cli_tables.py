"""Every command that prints a table, in a terminal 80, 100 and 120 columns wide: nothing wider
than the terminal, and every column shown whole (a column too many for the width is left out,
never squeezed to nothing: ``segue list`` once showed its model, behaviour, phase and token
columns as empty slivers at 80 columns).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cli_run import finished_demo, invoke
from terminal import spawn

pytestmark = pytest.mark.slow
WIDTHS = (80, 100, 120)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A finished demo whose child was paused once: (db, parent, child)."""
    db = tmp_path_factory.mktemp("tables") / "demo.db"
    parent, child = finished_demo(db)
    paused = invoke("pause", child, "--reason", "nightly stop", "--db", str(db))
    assert paused.exit_code == 0, paused.output
    return db, parent, child


def shown(columns: int, *args: str) -> list[str]:
    """What ``segue ARGS`` shows in a terminal ``columns`` wide, line by line."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "SEGUE_DB")}
    terminal = spawn(
        sys.executable, "-m", "segue", *args, env=env | {"TERM": "xterm"}, cwd="/", columns=columns
    )
    try:
        assert terminal.ended() == 0, terminal.text()
    finally:
        terminal.close()
    lines = terminal.lines()
    too_wide = [line for line in lines if len(line.rstrip()) > columns]
    assert too_wide == [], too_wide
    return lines


def words(lines: list[str]) -> set[str]:
    return {word for line in lines for word in line.split()}


@pytest.mark.parametrize("columns", WIDTHS)
def test_list_fits_and_shows_its_columns_whole(columns: int, demo: tuple[Path, str, str]) -> None:
    db, parent, child = demo
    lines = shown(columns, "list", "--db", str(db))
    found = words(lines)
    assert {"id", "title", "phase", "used"} <= found
    assert {parent[:8], child[:8]} <= {word[:8] for word in found}
    assert {"context_exhausted", "paused"} <= found  # the phases, never cut
    assert any("Tell me more about" in line for line in lines)  # the parent's title
    if columns >= 120:
        assert "created" in found
        assert "model" in found


@pytest.mark.parametrize("columns", WIDTHS)
def test_show_fits_and_shows_its_columns_whole(columns: int, demo: tuple[Path, str, str]) -> None:
    db, parent, _ = demo
    lines = shown(columns, "show", parent[:8], "--db", str(db))
    found = words(lines)
    assert {"seq", "kind", "text", "event", "continuation", "user_message"} <= found
    assert any("llm_requesting -> awaiting_continuation" in line for line in lines)
    assert any("Tell me more about topic 1." in line for line in lines)


@pytest.mark.parametrize("columns", WIDTHS)
def test_status_fits_and_shows_its_snapshots_whole(
    columns: int, demo: tuple[Path, str, str]
) -> None:
    db, _, child = demo
    lines = shown(columns, "status", child[:8], "--db", str(db))
    found = words(lines)
    assert {"version", "why", "tokens"} <= found
    assert any("pause: nightly stop" in line for line in lines)
    assert any(line.startswith("usage: ") and " requests, " in line for line in lines)
