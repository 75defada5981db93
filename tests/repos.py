"""A git repository for a test: committed, then changed, so that a snapshot's git state has a
branch, a HEAD and a dirty file to record."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="git is not installed")


def dirty_repository(root: Path) -> tuple[str, str]:
    """A repository at ``root`` on branch ``work``, one commit, ``notes.txt`` changed since:
    (the branch, the HEAD commit)."""
    assert GIT is not None
    root.mkdir(parents=True, exist_ok=True)

    def git(*args: str) -> str:
        done = subprocess.run(  # noqa: S603  # git with fixed arguments in a test repository
            [GIT, "-C", str(root), "-c", "user.email=t@example.com", "-c", "user.name=T", *args],
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout.strip()

    git("init", "-q", "-b", "work")
    (root / "notes.txt").write_text("one", encoding="utf-8")
    git("add", "notes.txt")
    git("commit", "-q", "-m", "one")
    (root / "notes.txt").write_text("two", encoding="utf-8")
    return "work", git("rev-parse", "HEAD")
