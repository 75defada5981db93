"""A name that needs an optional dependency which is not installed says which extra to
install (``pip install "segue[openai]"``), as the CLI does, rather than a bare
``ModuleNotFoundError``; it is still one, and a ``SegueError``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Run in a fresh interpreter: the dependency is made missing there (a None in sys.modules is
# how Python marks a module that cannot be imported), never in the test session's.
PROBE = """
import sys
for missing in sys.argv[2].split(","):
    sys.modules[missing] = None
import importlib
from segue import SegueError
try:
    exec(sys.argv[1])
except ModuleNotFoundError as error:
    print(type(error).__name__, isinstance(error, SegueError), error, sep="|")
"""


def loaded(code: str, *missing: str) -> list[str]:
    done = subprocess.run(  # noqa: S603  # our own interpreter and probe
        [sys.executable, "-c", PROBE, code, ",".join(missing)],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ.copy(),
    )
    assert done.stderr == ""
    return done.stdout.strip().split("|")


@pytest.mark.parametrize(
    ("code", "missing", "extra"),
    [
        ("import segue; segue.OpenAIModel", ["openai"], "openai"),
        ("from segue import PostgresStore", ["psycopg", "psycopg_pool"], "postgres"),
        ("import segue.server", ["fastapi"], "server"),
    ],
)
def test_a_missing_extra_is_named(code: str, missing: list[str], extra: str) -> None:
    kind, is_segue_error, message = loaded(code, *missing)
    assert (kind, is_segue_error) == ("MissingExtraError", "True")
    assert f'pip install "segue[{extra}]"' in message


def test_names_without_extras_still_load() -> None:
    assert loaded("import segue; segue.SqliteStore; segue.Runtime", "openai") == [""]
