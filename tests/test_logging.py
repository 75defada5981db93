"""segue is quiet unless the application asks: its events go through stdlib ``logging``.

Each test runs a real turn in a fresh interpreter, so no logging set up by pytest or by another
test can hide a print.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

TURN = """
import asyncio
from segue import MemoryStore, Runtime, ScriptedModel, LlmCallError

async def main() -> None:
    failing = LlmCallError("overloaded", retryable=True, status_code=529)
    model = ScriptedModel([failing], window=20_000)
    async with Runtime(store=MemoryStore(), llm=model, sleep=lambda s: asyncio.sleep(0)) as rt:
        c = await rt.create_conversation(model="claude-sonnet-4-5", system="secret-system")
        await rt.send(c.id, "hello there")
    print("done")

asyncio.run(main())
"""


def _run(prelude: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "turn.py"
    script.write_text(textwrap.dedent(prelude) + TURN, encoding="utf-8")
    return subprocess.run(  # noqa: S603  # our own interpreter on our own file
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )


def test_without_logging_setup_a_turn_prints_nothing(tmp_path: Path) -> None:
    # The turn logs a warning (the retried request): Python's last-resort handler would print it.
    result = _run("", tmp_path)
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("done\n", "")


def test_basic_config_shows_segue_events_with_their_fields(tmp_path: Path) -> None:
    prelude = """
        import logging
        logging.basicConfig(
            level=logging.INFO, format="%(name)s|%(levelname)s|%(message)s|%(to_phase)s"
        )
        logging.getLogger("asyncio").setLevel(logging.WARNING)
        for handler in logging.getLogger().handlers:
            handler.addFilter(lambda record: record.getMessage() == "transition")
    """
    result = _run(prelude, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines, "no segue event reached the application's handler"
    assert lines[0] == "segue.runtime|INFO|transition|llm_requesting"
    assert lines[-1] == "segue.runtime|INFO|transition|idle"
    assert "secret-system" not in result.stderr
    assert "hello there" not in result.stderr


def test_the_application_silences_segue_like_any_library(tmp_path: Path) -> None:
    prelude = """
        import logging
        logging.basicConfig(level=logging.DEBUG)
        logging.getLogger("segue").setLevel(logging.ERROR)
        logging.getLogger("asyncio").setLevel(logging.ERROR)
    """
    result = _run(prelude, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_warnings_reach_a_configured_root_handler(tmp_path: Path) -> None:
    prelude = """
        import logging
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s %(retryable)s")
    """
    result = _run(prelude, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "WARNING llm_error True" in result.stderr.splitlines()
