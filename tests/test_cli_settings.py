"""What ``segue chat`` and ``segue pause`` are told reaches the conversation: the bounds of a new
conversation (``--max-attempts``...), and the git state of the repository a pause records
(``--repo``, else the directory it runs in); bounds out of range are refused in the CLI's own
words, never pydantic's.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from cli_run import invoke, plain_output
from repos import dirty_repository, needs_git
from segue import SqliteStore

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    plain_output(monkeypatch, "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "SEGUE_DATABASE_URL")


def test_the_bounds_of_a_new_conversation_are_the_chats(tmp_path: Path) -> None:
    db = tmp_path / "bounds.db"
    bounds = ["--max-attempts", "2", "--max-continuations", "1", "--max-tool-rounds", "7"]
    delays = ["--retry-base-delay", "0.5", "--retry-max-delay", "4"]
    chatted = invoke("chat", "--db", str(db), *bounds, *delays, stdin="Hello.\n")
    assert chatted.exit_code == 0, chatted.output
    shown = json.loads(invoke("list", "--db", str(db), "--json").stdout)[0]
    assert (shown["max_attempts"], shown["max_continuations"], shown["max_tool_rounds"]) == (
        2,
        1,
        7,
    )
    assert (shown["retry_base_delay"], shown["retry_max_delay"]) == (0.5, 4.0)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-attempts", "0"),
        ("--max-attempts", "21"),
        ("--context-window", "5"),
        ("--retry-max-delay", "-1"),
    ],
)
def test_a_bound_out_of_range_is_refused_in_the_clis_words(
    option: str, value: str, tmp_path: Path
) -> None:
    refused = invoke("chat", "--db", str(tmp_path / "no.db"), option, value, stdin="Hello.\n")
    assert refused.exit_code == 2
    said = refused.output
    assert option in said
    assert "Input should be" not in said  # pydantic's wording
    assert "out of range" in said or "is not" in said
    assert not (tmp_path / "no.db").exists()


@needs_git
@pytest.mark.parametrize("where", ["repo", "cwd"])
def test_a_pause_records_the_git_state_of_the_repository(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "git.db"
    chatted = invoke("chat", "--db", str(db), "--model", "segue-demo", stdin="Start.\n")
    assert chatted.exit_code == 0, chatted.output
    cid = json.loads(invoke("list", "--db", str(db), "--json").stdout)[0]["id"]
    repo = tmp_path / "project"
    branch, head = dirty_repository(repo)
    if where == "cwd":
        monkeypatch.chdir(repo)
        paused = invoke("pause", cid, "--db", str(db))
    else:
        paused = invoke("pause", cid, "--db", str(db), "--repo", str(repo))
    assert paused.exit_code == 0, paused.output

    async def context() -> object:
        store = SqliteStore(db, read_only=True)
        try:
            return (await store.snapshots(cid))[-1].context
        finally:
            await store.close()

    expected = {"git": {"branch": branch, "head": head, "dirty": ["notes.txt"]}}
    assert asyncio.run(context()) == expected
