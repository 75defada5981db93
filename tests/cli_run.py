"""``segue``'s command line run in-process, as the CLI tests read it: typer's runner over the
app, output as a CI log gets it, the one-line errors the CLI promises, and a finished demo to
inspect, and ``chat`` against the fake Anthropic API."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from segue.cli import app
from segue.testing.anthropic_server import FakeAnthropicServer
from segue.testing.openai_server import FakeOpenAIServer

ID = r"[0-9a-f]{32}"
"""A conversation id as the CLI prints it."""
_STYLING = ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE", "SEGUE_DB", "ANTHROPIC_BASE_URL")
runner = CliRunner()


def plain_output(monkeypatch: pytest.MonkeyPatch, *also: str) -> None:
    """Output as a CI log gets it: no colour forced, no width imposed, no database or server
    chosen by the environment; ``also`` names more variables to unset (a key, a base URL)."""
    for name in (*_STYLING, *also):
        monkeypatch.delenv(name, raising=False)


def invoke(*args: str, stdin: str | bytes | None = None) -> Result:
    return runner.invoke(app, list(args), input=stdin)


def chat(
    fake: FakeAnthropicServer | FakeOpenAIServer, db: Path, stdin: str | bytes, *args: str
) -> Result:
    """``segue chat`` against a fake provider API (Anthropic's unless ``args`` name another
    ``--provider``), on ``db``, typing ``stdin``."""
    return invoke("chat", "--base-url", fake.url, "--db", str(db), *args, stdin=stdin)


def stored_ids(db: Path) -> list[str]:
    """The ids of the conversations a SQLite store holds (none when there is no file)."""
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM conversations")]


def one_error_line(result: Result) -> str:
    """The CLI's error, which must be one line on stderr and never a traceback."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def finished_demo(db: Path) -> tuple[str, str]:
    """Run the threshold demo into ``db``: (the exhausted parent's id, its live child's)."""
    result = invoke("demo", "--fast", "--db", str(db))
    assert result.exit_code == 0, result.output
    parent = re.search(rf"^conversation ({ID}):", result.stdout, re.MULTILINE)
    child = re.search(rf"child conversation ({ID})", result.stdout)
    assert parent is not None
    assert child is not None
    return parent[1], child[1]
