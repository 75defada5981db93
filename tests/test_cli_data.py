"""``segue list``'s pages, ``delete``, ``export``, ``import`` and ``purge`` in a terminal 80
columns wide, as a person runs them (the questions answered at the keyboard), and the window
``segue chat`` and ``segue status`` say a conversation has, with where it came from. Errors are
one line in the CLI's words; nothing is deleted without a yes, nor while a turn runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_run import invoke
from gated import Worker
from segue import Runtime, ScriptedModel, SqliteStore
from segue.testing import FakeAnthropicServer
from segue.testing.anthropic_server import MessageReply, ToolUse
from segue.testing.openai_server import FakeOpenAIServer
from terminal import Terminal, spawn

pytestmark = pytest.mark.slow
COLUMNS = 80
KEY = "sk-ant-cli-data-test-0123456789"


def terminal(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Terminal:
    """``segue ARGS`` in a pseudo-terminal 80 columns wide."""
    base = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "SEGUE_DB")}
    base.pop("ANTHROPIC_API_KEY", None)
    environment = base | {"TERM": "xterm"} | (env or {})
    return spawn(sys.executable, "-m", "segue", *args, env=environment, cwd=str(cwd))


def ran(
    *args: str, cwd: Path, keys: bytes | None = None, ask: str | None = None
) -> tuple[int, str]:
    """Run ``segue ARGS`` to its end (typing ``keys`` once ``ask`` is shown): its exit
    status and what it showed (its words, however the lines wrapped them), every line within
    80 columns but an error's (one line, as scripts read it; the terminal wraps it)."""
    shown = terminal(*args, cwd=cwd)
    try:
        if ask is not None:
            shown.read_until(ask)
        if keys is not None:
            shown.type(keys)
        status = shown.ended()
    finally:
        shown.close()
    lines = shown.lines()
    too_wide = [line for line in lines if len(line.rstrip()) > COLUMNS]
    errors = ("error: ", "Error: ")  # segue's, and a usage error's as typer words it
    assert [line for line in too_wide if not line.startswith(errors)] == [], lines
    assert "Traceback" not in shown.text()
    return status, " ".join(" ".join(lines).split())


def labelled_store(db: Path) -> dict[str, str]:
    """Six conversations, two users', each titled by its metadata, one with a message; their
    ids by title."""

    async def make() -> dict[str, str]:
        async with Runtime(store=SqliteStore(db), llm=ScriptedModel()) as rt:
            ids = {}
            for number in range(6):
                user = "u-17" if number % 2 == 0 else "u-2"
                metadata = {"user": user, "title": f"Tides part {number}"}
                state = await rt.create_conversation(model="claude-sonnet-4-6", metadata=metadata)
                ids[metadata["title"]] = state.id
            await rt.send(ids["Tides part 0"], "What makes the tide turn?")
            return ids

    return asyncio.run(make())


def stored_ids(db: Path) -> list[str]:
    async def read() -> list[str]:
        store = SqliteStore(db)
        try:
            return [c.state.id for c in await store.list_conversations()]
        finally:
            await store.close()

    return asyncio.run(read())


# --------------------------------------------------------------------------- list


def test_list_pages_through_one_users_conversations(tmp_path: Path) -> None:
    db = str(tmp_path / "data.db")
    labelled_store(tmp_path / "data.db")
    asked = ("list", "--db", db, "--limit", "2", "--metadata", "user=u-17")
    status, first = ran(*asked, cwd=tmp_path)
    assert status == 0, first
    assert "Tides part 4" in first
    assert "Tides part 2" in first
    assert "part 0" not in first
    assert "part 1" not in first  # another user's
    hint = re.search(r"more: segue list --cursor (\S+)", first)
    assert hint is not None, first
    status, second = ran(*asked, "--cursor", hint[1], cwd=tmp_path)
    assert status == 0, second
    assert "Tides part 0" in second
    assert "Tides part 4" not in second
    assert "more:" not in second  # the last page

    status, wrong = ran("list", "--db", db, "--cursor", "made-up", cwd=tmp_path)
    assert status == 2
    assert "error: --cursor 'made-up' is not one `segue list` printed here" in wrong
    status, nobody = ran("list", "--db", db, "--metadata", "user=u-99", cwd=tmp_path)
    assert (status, "no conversation labelled user=u-99" in nobody) == (0, True)
    status, bad = ran("list", "--db", db, "--metadata", "user", cwd=tmp_path)
    assert (status, "error: --metadata takes KEY=VALUE, not 'user'" in bad) == (2, True)


# --------------------------------------------------------------------------- delete


def test_delete_asks_first_and_deletes_only_on_yes(tmp_path: Path) -> None:
    db = tmp_path / "data.db"
    ids = labelled_store(db)
    cid = ids["Tides part 0"]
    question = "Its messages cannot be read again. [y/N]:"
    status, said = ran("delete", cid[:8], "--db", str(db), cwd=tmp_path, keys=b"n\r", ask=question)
    assert status == 1
    assert "'Tides part 0'" in said
    assert "nothing was deleted" in said
    assert cid in stored_ids(db)
    status, said = ran("delete", cid[:8], "--db", str(db), cwd=tmp_path, keys=b"y\r", ask=question)
    assert status == 0, said
    assert f"deleted 1 conversation: {cid}" in said
    assert cid not in stored_ids(db)
    other = ids["Tides part 1"]
    status, said = ran("delete", other, "--db", str(db), "--yes", cwd=tmp_path)
    assert (status, f"deleted 1 conversation: {other}" in said) == (0, True)
    status, said = ran("delete", other, "--db", str(db), "--yes", cwd=tmp_path)
    assert (status, f"error: no conversation '{other}' in this store" in said) == (2, True)


def test_delete_refuses_a_conversation_whose_turn_another_process_runs(tmp_path: Path) -> None:
    db = tmp_path / "data.db"
    cid = labelled_store(db)["Tides part 2"]
    worker = Worker(db, cid)  # its turn holds its request until opened
    try:
        status, said = ran("delete", cid, "--db", str(db), "--yes", cwd=tmp_path)
        assert status == 1
        assert f"error: conversation {cid} is answering a turn" in said
        assert "nothing was deleted" in said
        assert cid in stored_ids(db)
        assert worker.open()["phase"] == "idle"  # the turn went on whole
    finally:
        worker.stop()
    status, said = ran("delete", cid, "--db", str(db), "--yes", cwd=tmp_path)
    assert status == 0, said


# --------------------------------------------------------------------------- export, import


def test_an_export_goes_to_a_private_file_and_imports_under_another_id(tmp_path: Path) -> None:
    db = tmp_path / "data.db"
    cid = labelled_store(db)["Tides part 0"]
    out = tmp_path / "tides.json"
    status, said = ran("export", cid[:8], "--db", str(db), "-o", str(out), cwd=tmp_path)
    assert status == 0, said
    assert f"exported conversation {cid} (2 messages) to" in said
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    document: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    assert document["conversation"]["metadata"]["title"] == "Tides part 0"
    status, said = ran("export", cid, "--db", str(db), "-o", str(out), cwd=tmp_path)
    assert (status, "exists: choose another file, or pass --force" in said) == (2, True)

    elsewhere = str(tmp_path / "elsewhere.db")
    status, said = ran("import", str(out), "--db", elsewhere, cwd=tmp_path)
    assert status == 0, said
    assert f"imported conversation {cid} ('Tides part 0'), idle, into" in said
    status, said = ran("import", str(out), "--db", elsewhere, cwd=tmp_path)
    assert status == 1
    assert f"error: conversation {cid} is already in" in said
    assert "--id NEW" in said
    status, said = ran("import", str(out), "--db", elsewhere, "--id", "tides-copy", cwd=tmp_path)
    assert (status, "imported conversation tides-copy" in said) == (0, True)
    status, said = ran("import", str(out), "--db", elsewhere, "--id", "../x", cwd=tmp_path)
    assert (status, "error: --id '../x' is not an id" in said) == (2, True)
    assert sorted(stored_ids(Path(elsewhere))) == sorted([cid, "tides-copy"])

    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**document, "version": 99}), encoding="utf-8")
    status, said = ran("import", str(broken), "--db", elsewhere, cwd=tmp_path)
    assert (status, "is not a segue export: export format version 99" in said) == (2, True)


def test_an_export_to_stdout_is_the_document_itself(tmp_path: Path) -> None:
    db = tmp_path / "data.db"
    cid = labelled_store(db)["Tides part 0"]
    result = invoke("export", cid, "--db", str(db))  # in process: stdout holds only it
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert (document["format"], document["conversation"]["id"]) == ("segue.conversation", cid)
    assert document["messages"][0]["text"] == "What makes the tide turn?"


# --------------------------------------------------------------------------- purge


def test_purge_asks_first_and_deletes_only_what_is_labelled(tmp_path: Path) -> None:
    db = tmp_path / "data.db"
    ids = labelled_store(db)
    status, said = ran("purge", "--older-than", "30d", "--db", str(db), cwd=tmp_path)
    assert status == 0, said
    assert "nothing to purge: no conversation went unwritten for 30 days" in said
    asked = ("purge", "--older-than", "0s", "--metadata", "user=u-2", "--db", str(db))
    question = "Their messages cannot be read again. [y/N]:"
    status, said = ran(*asked, cwd=tmp_path, keys=b"\r", ask=question)  # no by default
    assert "delete 3 conversations labelled user=u-2 nobody wrote to for 0 seconds?" in said
    assert (status, len(stored_ids(db))) == (1, 6)
    status, said = ran(*asked, "--yes", cwd=tmp_path)
    assert (status, "deleted 3 conversations" in said) == (0, True)
    kept = {ids[f"Tides part {n}"] for n in (0, 2, 4)}
    assert set(stored_ids(db)) == kept
    status, said = ran("purge", "--older-than", "a month", "--db", str(db), cwd=tmp_path)
    assert status == 2
    assert "'a month' is not a duration" in said


# --------------------------------------------------------------------------- the window


def chat_first_line(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """``segue chat ARGS``'s first line, the chat ended at once."""
    shown = terminal("chat", "--db", str(tmp_path / "chat.db"), *args, cwd=tmp_path, env=env)
    try:
        shown.read_until("you> ")
        shown.type(b"/quit\r")
        assert shown.ended() == 0, shown.text()
    finally:
        shown.close()
    return next(line for line in shown.lines() if line.strip())


def test_chat_and_status_say_the_window_and_where_it_came_from(tmp_path: Path) -> None:
    assert chat_first_line(tmp_path) == "window 24,000 tokens, the offline scripted model's"
    given = chat_first_line(tmp_path, "--context-window", "50000")
    assert given == "window 50,000 tokens, given (--context-window, or by the application)"
    with FakeAnthropicServer(default=MessageReply(text="Noted.")) as fake:
        env = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": fake.url}
        served = chat_first_line(tmp_path, "--model", "claude-sonnet-4-6", env=env)
    assert served == "window 200,000 tokens, reported by the model's server"
    with FakeOpenAIServer() as local:  # a compatible server that describes no model
        env = {"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": local.url}
        asked = ("--provider", "openai", "--model", "house-model")
        unknown = chat_first_line(tmp_path, *asked, env=env)
    assert unknown == "window 128,000 tokens, assumed: pass --context-window N if it is another"

    db = tmp_path / "data.db"
    cid = labelled_store(db)["Tides part 0"]
    status, said = ran("status", cid[:8], "--db", str(db), cwd=tmp_path)
    assert status == 0, said
    assert "window 1,000,000 tokens, from segue's table of models" in said


# --------------------------------------------------------------------------- the provider


def chatted(tmp_path: Path, fake: FakeAnthropicServer, line: bytes, *args: str) -> str:
    """What ``segue chat ARGS`` against ``fake`` shows for one message."""
    env = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": fake.url}
    db = str(tmp_path / "provider.db")
    shown = terminal("chat", "--db", db, *args, cwd=tmp_path, env=env)
    try:
        shown.read_until("you> ")
        shown.type(line)
        shown.read_until("you> ", timeout=120)  # the turn is over
        shown.type(b"/quit\r")
        assert shown.ended() == 0, shown.text()
    finally:
        shown.close()
    return " ".join(" ".join(shown.lines()).split())


def test_chat_says_when_the_provider_cannot_compact_and_what_it_cleared(tmp_path: Path) -> None:
    with FakeAnthropicServer(default=MessageReply(text="Noted.")) as fake:
        fake.refuse_compaction = True
        compacting = ("--behavior", "compact_in_place", "--compaction", "provider")
        said = chatted(tmp_path, fake, b"Hello?\r", *compacting)
    assert "the provider could not compact; segue compacts instead" in said
    assert "Noted." in said  # the turn went on

    edits = tmp_path / "edits.json"
    clear = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 1_000},
        "keep": {"type": "tool_uses", "value": 1},
    }
    edits.write_text(json.dumps([clear]), encoding="utf-8")
    with FakeAnthropicServer(default=MessageReply(text="Summed up.")) as fake:
        fake.enqueue(
            *(MessageReply(text="", tool_uses=(ToolUse("lookup", {"q": q}),)) for q in "abc")
        )
        long_question = b"Look a, b and c up, then sum up. " + b"word " * 1_500 + b"\r"
        said = chatted(tmp_path, fake, long_question, "--context-edits", f"@{edits}")
    assert re.search(
        r"the provider cleared old tool results \(\d+\) from the context: [\d,]+ tokens", said
    ), said
    assert "Summed up." in said


def test_chat_refuses_what_the_offline_model_cannot_do_before_anything_is_stored(
    tmp_path: Path,
) -> None:
    db = tmp_path / "offline.db"
    compacting = ("--behavior", "compact_in_place", "--compaction", "provider")
    status, said = ran("chat", "--db", str(db), *compacting, cwd=tmp_path)
    assert status == 2
    assert "error: --compaction provider: claude-sonnet-4-6's provider cannot compact it" in said
    status, said = ran("chat", "--db", str(db), "--compaction", "provider", cwd=tmp_path)
    assert status == 2
    assert "--behavior compact_in_place" in said  # the core's check, in the CLI's flags
    status, said = ran("chat", "--db", str(db), "--context-edits", "[{", cwd=tmp_path)
    assert (status, "error: --context-edits is not JSON" in said) == (2, True)
    assert not db.exists() or stored_ids(db) == []
