"""The ``segue`` command line, run for real: the demo on a real SQLite file, the inspector on
what the demo wrote, and ``chat`` through the real ``anthropic`` client to the local fake API.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import segue
from cli_run import ID, chat, finished_demo, invoke, one_error_line, plain_output, stored_ids
from segue.statemachine import ContextExhaustionBehavior
from segue.statemachine.spec import load_rows, mermaid
from segue.testing.anthropic_server import ErrorReply, FakeAnthropicServer, MessageReply, Usage

KEY = "sk-ant-test-cli-0123456789"


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    plain_output(monkeypatch)


def percentages(output: str) -> list[float]:
    return [float(p) for p in re.findall(r"(\d+\.\d)%", output)]


# --------------------------------------------------------------------------- demo


@pytest.mark.slow
def test_installed_demo_tells_the_whole_story(tmp_path: Path) -> None:
    segue = shutil.which("segue")
    assert segue is not None, "the console script is not installed (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "COLUMNS")}
    env["TMPDIR"] = str(tmp_path)  # the demo's fresh temp dir lands here
    result = subprocess.run(  # noqa: S603  # the installed console script, no shell
        [segue, "demo"], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    out = result.stdout
    assert result.returncode == 0, result.stderr
    warning = out.index("WARNING: context")
    assert warning < out.index("asking for a continuation summary")
    assert re.search(r"^  WARNING: context \d+% full", out, re.MULTILINE)  # a line of its own
    assert max(percentages(out)) >= 90.0
    assert "continuation summary" in out
    parent = re.search(rf"^conversation ({ID}):", out, re.MULTILINE)
    assert parent is not None
    words = " ".join(out.split())  # the lines wrap at 80 columns
    assert f"read-only: send() refused: Conversation {parent[1]} is read-only" in words
    assert re.search(rf"child conversation {ID} \(parent {parent[1]}\)", words)
    assert "assistant: Answer" in out
    assert "the demo's store was temporary and is gone" in out
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind


EXPECTED = {
    ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION: (
        "context exhausted: the conversation is now read-only",
        "read-only: send() refused",
        "child conversation",
    ),
    ContextExhaustionBehavior.INTENTIONALLY_UNHANDLED: (
        "failed: context_exhausted",
        "typed failure: Failed(error_kind=CONTEXT_EXHAUSTED)",
        "send() refused: Conversation",
    ),
    ContextExhaustionBehavior.CHECKPOINT_RESTART: (
        "new session 2 (checkpoint_restart)",
        "<checkpoint>",
        "session 1 -> 2",
    ),
    ContextExhaustionBehavior.COMPACT_IN_PLACE: (
        "archiving the transcript (generation 1)",
        "new generation 2 starts from a summary",
        "generation 1 -> 2",
    ),
    ContextExhaustionBehavior.CHECKPOINT_PAUSE: (
        "asking for a checkpoint before pausing",
        "paused at the limit: snapshot v1 (trigger exhaustion",
        "an orchestrator resumes it: session 2",
    ),
}


@pytest.mark.parametrize("behavior", list(ContextExhaustionBehavior))
def test_demo_shows_each_behaviour(
    behavior: ContextExhaustionBehavior, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Room for the database's path on one line, however deep the temporary folder (a pytest-xdist
    # worker's is one level deeper, and at 80 columns the line wrapped).
    monkeypatch.setenv("COLUMNS", "300")
    db = tmp_path / "demo.db"
    result = invoke("demo", "--fast", "--behavior", behavior.value, "--db", str(db))
    assert result.exit_code == 0, result.output
    out = result.stdout
    positions = [out.index("WARNING: context"), *(out.index(text) for text in EXPECTED[behavior])]
    assert positions == sorted(positions), out  # warned first, then the story in order
    assert f"segue demo: {behavior.name}" in out
    assert max(percentages(out)) >= 90.0
    assert f"database: {db}" in out
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM conversations").fetchone()[0] >= 1
    archives = list((tmp_path / "demo-archives").glob("*.jsonl"))
    assert bool(archives) == (behavior is ContextExhaustionBehavior.COMPACT_IN_PLACE)


def test_demo_behaviour_names_are_checked() -> None:
    result = invoke("demo", "--fast", "--behavior", "forget_everything")
    assert result.exit_code == 2
    assert "forget_everything" in result.output


# --------------------------------------------------------------------------- list / show


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A finished threshold demo: (db, parent id, child id)."""
    db = tmp_path_factory.mktemp("demo") / "segue.db"
    return (db, *finished_demo(db))


def test_list_shows_parent_and_child(
    demo_db: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, parent, child = demo_db
    monkeypatch.setenv("SEGUE_DB", str(db))  # the default --db
    monkeypatch.setenv("COLUMNS", "300")  # room for every column
    result = invoke("list")
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if re.search(ID, line)}
    assert set(rows) == {parent, child}
    assert re.search(r"Tell me more about topic 1\.\s+context_exhausted\s+9\d% of", rows[parent])
    assert re.search(rf"{child}\s*$", rows[parent])  # the parent's child column
    assert re.search(rf"{parent}\s+-\s*$", rows[child])  # the child's parent column
    assert "of 24,000" in rows[child]
    assert re.search(r"20\d\d-\d\d-\d\d \d\d:\d\d", rows[child])  # when it was created
    assert "threshold_based_continuation" in rows[child]


def test_show_prints_messages_and_transition_log(
    demo_db: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, parent, _ = demo_db
    monkeypatch.setenv("COLUMNS", "160")  # room for every column (80 leaves the effects out)
    result = invoke("show", parent, "--db", str(db))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"{parent}: Tell me more about topic 1." in out  # its title
    assert "segue-demo, threshold_based_continuation, context_exhausted" in out
    assert re.search(r" 1\s+user\s+1/1\s+Tell me more about topic 1\.", out)
    assert "-> lookup(" in out  # the assistant's tool call
    assert re.search(r" continuation\s+1/1\s+Continuation summary:", out)
    assert re.search(r" user_message\s+idle -> llm_requesting\s", out)
    assert re.search(r"llm_requesting -> awaiting_continuation\s+[\d,]+\s+\S", out)
    assert "notify_context_warning" in out
    assert "awaiting_continuation -> context_exhausted" in out


def test_show_unknown_id_is_one_line(demo_db: tuple[Path, str, str]) -> None:
    db, _, _ = demo_db
    result = invoke("show", "nope", "--db", str(db))
    assert result.exit_code == 2
    assert one_error_line(result) == "error: no conversation 'nope' in this store"


def test_inspecting_a_missing_db_does_not_create_it(tmp_path: Path) -> None:
    db = tmp_path / "missing.db"
    result = invoke("list", "--db", str(db))
    assert result.exit_code == 2
    line = one_error_line(result)
    assert line.startswith(f"error: no database at {db}")
    assert f"segue demo --db {db}" in line  # a demo that keeps what it makes
    assert not db.exists()


@pytest.mark.slow
def test_a_locked_store_is_one_line(demo_db: tuple[Path, str, str]) -> None:
    db, _, _ = demo_db
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's writer, for longer than busy_timeout
    try:
        reading = invoke("list", "--db", str(db))
        writing = invoke("demo", "--fast", "--db", str(db))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert reading.exit_code == 0, reading.output  # WAL: a writer does not block readers
    assert writing.exit_code == 1
    assert one_error_line(writing).startswith("error: database is locked")


def test_diagram_is_mermaid() -> None:
    result = invoke("diagram")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("stateDiagram-v2\n")
    assert result.stdout.rstrip("\n") == mermaid(load_rows()).rstrip("\n")
    assert "awaiting_continuation --> context_exhausted" in result.stdout


# --------------------------------------------------------------------------- chat


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_chat_without_a_key_is_offline_and_says_so(
    provider: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plain_output(monkeypatch, "ANTHROPIC_API_KEY", "OPENAI_API_KEY")
    db = tmp_path / "chat.db"
    result = invoke("chat", "--provider", provider, "--db", str(db), stdin="hello\nagain\n")
    assert result.exit_code == 0, result.output
    variable = "ANTHROPIC_API_KEY" if provider == "anthropic" else "OPENAI_API_KEY"
    assert f"offline: {variable} is not set, so the scripted model answers" in result.stdout
    assert result.stdout.count("Answer ") == 2  # the scripted model's replies
    assert len(stored_ids(db)) == 1


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropicServer]:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    reply = MessageReply(text="Hello from the fake API.", usage=Usage(input_tokens=1_000))
    with FakeAnthropicServer(default=reply) as fake:
        yield fake


def test_chat_prints_each_reply_and_the_meter(server: FakeAnthropicServer, tmp_path: Path) -> None:
    result = chat(server, tmp_path / "chat.db", "hello there\nand again\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("Hello from the fake API.") == 2
    assert len(re.findall(r"1,005 / 200,000\s+0\.5%\s+idle", result.stdout)) == 2
    sent = [r.body["messages"] for r in server.message_requests()]
    assert len(sent) == 2
    assert "hello there" in str(sent[0])
    assert "and again" in str(sent[1])
    for request in server.message_requests():  # the key from the environment was used
        assert any(KEY in value for value in request.headers.values())


def test_chat_with_an_unknown_model_is_a_setup_error(
    server: FakeAnthropicServer, tmp_path: Path
) -> None:
    result = chat(server, tmp_path / "chat.db", "hello\n", "--model", "claude-nonesuch-9")
    assert result.exit_code == 2
    assert one_error_line(result).startswith("error: unknown model 'claude-nonesuch-9'")
    assert server.message_requests() == []


def test_chat_reports_a_model_failure_mid_conversation(
    server: FakeAnthropicServer, tmp_path: Path
) -> None:
    server.enqueue(ErrorReply(404, "not_found_error", "model: claude-sonnet-4-6"))
    result = chat(server, tmp_path / "chat.db", "hello\nnever sent\n")
    assert result.exit_code == 1
    assert "unknown model 'claude-sonnet-4-6'" in one_error_line(result)
    assert len(server.message_requests()) == 1


def test_chat_on_an_exhausted_conversation_hints_at_new(
    server: FakeAnthropicServer, tmp_path: Path
) -> None:
    server.enqueue(MessageReply(text="A long answer.", usage=Usage(input_tokens=185_000)))
    db = tmp_path / "chat.db"
    result = chat(server, db, "fill it up\nstill there?\n")
    assert result.exit_code == 1
    assert "this conversation is read-only now" in result.stdout
    error = one_error_line(result)
    assert re.match(rf"error: conversation {ID} is read-only .*: type /new to continue", error)
    assert "start_new_from" not in error  # the chat's own words, not the library's
    assert len(server.message_requests()) == 2  # the turn and the continuation summary

    parent = re.search(rf"conversation ({ID})", error)
    assert parent is not None
    resumed = chat(server, db, "/new\nhello child\n", "--conversation", parent[1])
    assert resumed.exit_code == 0, resumed.output
    words = " ".join(resumed.stdout.split())  # the line wraps at 80 columns
    assert re.search(rf"continuing in conversation {ID} \(parent {parent[1]}\)", words)
    assert "Hello from the fake API." in resumed.stdout


# --------------------------------------------------------------------------- logging, version


def test_version_is_printed() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"segue {segue.__version__}"


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["demo"],
        ["list"],
        ["show"],
        ["status"],
        ["chat"],
        ["pause"],
        ["resume"],
        ["diagram"],
        ["serve"],
    ],
)
def test_help_shows_no_type_after_a_plain_flag(command: list[str]) -> None:
    """``--version <bool>`` and ``--help <bool>`` were typer 0.29's rich help; flags take no
    value, so their help shows none."""
    result = invoke(*command, "--help")
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.stdout
    assert re.search(r"^  --help\s+Show this message and exit\.$", result.stdout, re.MULTILINE)


def test_python_dash_m_segue_is_the_command(tmp_path: Path) -> None:
    result = subprocess.run(  # this interpreter, segue's own module
        [sys.executable, "-m", "segue", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"segue {segue.__version__}"
    usage = subprocess.run(
        [sys.executable, "-m", "segue", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert usage.stdout.startswith("Usage: python -m segue ")


def test_verbose_turns_segues_events_on_and_they_stay_off_without_it(tmp_path: Path) -> None:
    quiet = invoke("demo", "--fast", "--db", str(tmp_path / "quiet.db"))
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr == ""
    loud = invoke("-v", "demo", "--fast", "--db", str(tmp_path / "loud.db"))
    assert loud.exit_code == 0, loud.output
    events = [line for line in loud.stderr.splitlines() if "transition" in line]
    assert events
    assert "to_phase=llm_requesting" in events[0]
    assert "[debug" not in loud.stderr
    debug = invoke("-vv", "demo", "--fast", "--db", str(tmp_path / "debug.db"))
    assert debug.exit_code == 0
    assert logging.getLogger("segue").handlers[-1].__class__ is logging.NullHandler  # put back


def test_the_demo_streams_each_reply(tmp_path: Path) -> None:
    result = invoke("demo", "--fast", "--db", str(tmp_path / "s.db"))
    assert result.exit_code == 0, result.output
    first = r'^  assistant: Answer 1 to "Tell me more about topic 1\."'
    assert re.search(first, result.stdout, re.MULTILINE)
    assert re.search(r"^  tool: lookup\(", result.stdout, re.MULTILINE)
    said = [line for line in result.stdout.splitlines() if "WARNING: context" in line]
    assert said == [line for line in said if line.startswith("  WARNING: context")]
