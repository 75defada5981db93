"""The CLI's orchestration and inspection commands, and ``chat``'s slash commands, run for real
on SQLite files: ``pause``/``resume``/``status``, read-only ``list``/``show`` with id prefixes
and ``--json``, escaping of what a model wrote, ``serve`` refusing what it must refuse, and a
chat against the real ``anthropic`` client pointed at the local fake API.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from cli_run import ID, chat, finished_demo, invoke, one_error_line, plain_output, stored_ids
from segue import Runtime, ScriptedModel, SqliteStore
from segue.testing.anthropic_server import FakeAnthropicServer, MessageReply, Usage
from serving import free_port

KEY = "sk-ant-test-cli-commands-0123456789"


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    plain_output(monkeypatch, "ANTHROPIC_API_KEY")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A finished threshold demo: (db, the exhausted parent, its live child)."""
    db = tmp_path_factory.mktemp("demo") / "segue.db"
    return (db, *finished_demo(db))


@pytest.fixture
def copy_of_demo(demo_db: tuple[Path, str, str], tmp_path: Path) -> tuple[Path, str, str]:
    db, parent, child = demo_db
    copy = tmp_path / "copy.db"
    with sqlite3.connect(db) as source, sqlite3.connect(copy) as target:
        source.backup(target)
    return copy, parent, child


# --------------------------------------------------------------------------- inspection


def test_list_and_show_never_write_to_what_they_inspect(
    demo_db: tuple[Path, str, str], tmp_path: Path
) -> None:
    db, parent, _ = demo_db
    before = digest(db)
    assert invoke("list", "--db", str(db)).exit_code == 0
    assert invoke("show", parent, "--db", str(db)).exit_code == 0
    assert invoke("status", parent, "--db", str(db)).exit_code == 0
    assert digest(db) == before

    other = tmp_path / "someone_elses.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    foreign = digest(other)
    empty = tmp_path / "empty.db"
    empty.touch()
    for path in (other, empty):
        # pause and resume write to their store, but never to a file that is not one
        for command in (["list"], ["pause", "abc", "--offline"], ["resume", "abc", "--offline"]):
            result = invoke(*command, "--db", str(path))
            assert result.exit_code == 1, result.output
            assert one_error_line(result) == f"error: {path} is not a segue store"
    assert digest(other) == foreign
    assert empty.stat().st_size == 0
    with sqlite3.connect(other) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master")]
    assert tables == ["notes"]


def test_a_unique_prefix_names_a_conversation_and_an_ambiguous_one_is_refused(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ids.db"

    async def make() -> None:
        async with Runtime(store=SqliteStore(db), llm=ScriptedModel()) as rt:
            for cid in ("abc111", "abc222", "xyz999"):
                await rt.create_conversation(model="m", conversation_id=cid)

    asyncio.run(make())
    shown = invoke("show", "xy", "--db", str(db))
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.startswith("xyz999: (no message yet)\nm,")
    ambiguous = invoke("show", "abc", "--db", str(db))
    assert ambiguous.exit_code == 2
    assert "'abc' is the start of 2 conversations (abc111, abc222)" in one_error_line(ambiguous)
    missing = invoke("status", "q", "--db", str(db))
    assert one_error_line(missing) == "error: no conversation 'q' in this store"


def test_json_output_is_the_apis_views(demo_db: tuple[Path, str, str]) -> None:
    db, parent, child = demo_db
    listed = json.loads(invoke("list", "--db", str(db), "--json").stdout)
    assert [c["id"] for c in listed] == [child, parent]  # newest first
    assert listed[1]["child_id"] == child
    assert listed[1]["phase"] == "context_exhausted"
    shown = json.loads(invoke("show", parent[:10], "--db", str(db), "--json").stdout)
    assert shown["conversation"]["id"] == parent
    assert shown["messages"][0]["kind"] == "user"
    assert shown["transitions"][0]["event"] == "user_message"
    status = json.loads(invoke("status", child, "--db", str(db), "--json").stdout)
    assert [link["label"] for link in status["lineage"]] == ["root", "2"]
    assert status["usage"]["requests"] >= 1


def test_what_a_model_wrote_is_printed_escaped(tmp_path: Path) -> None:
    db = tmp_path / "escapes.db"
    hostile = "title \x1b]0;pwned\x07 and \x1b[2J cleared, \u202egnp.exe"

    async def make() -> str:
        async with Runtime(store=SqliteStore(db), llm=ScriptedModel(reply_chars=0)) as rt:
            conv = await rt.create_conversation(model="m")
            await rt.send(conv.id, hostile)
            return conv.id

    cid = asyncio.run(make())
    for command in ("show", "status"):
        result = invoke(command, cid, "--db", str(db), "--full")
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.stdout
        assert "\u202e" not in result.stdout
    shown = invoke("show", cid, "--db", str(db), "--full").stdout
    assert "\\x1b]0;pwned\\x07" in shown
    assert "\\u202egnp.exe" in shown


# --------------------------------------------------------------------------- pause, resume, status


def test_pause_status_and_resume_from_the_command_line(
    copy_of_demo: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, parent, child = copy_of_demo
    monkeypatch.setenv("COLUMNS", "160")  # room for every column of the snapshots' table
    paused = invoke("pause", child[:8], "--reason", "nightly stop", "--db", str(db))
    assert paused.exit_code == 0, paused.output
    assert f"paused {child}: snapshot v1 saved" in paused.stdout
    assert "asking for a checkpoint before pausing" in paused.stdout
    assert "threshold" not in paused.stdout  # an idle conversation far from its limit
    again = invoke("pause", child, "--db", str(db))
    assert again.exit_code == 1
    assert one_error_line(again) == f"error: conversation {child} is already paused"

    status = invoke("status", child, "--db", str(db))
    assert status.exit_code == 0, status.output
    out = status.stdout
    assert "paused: nightly stop" in out
    assert "continuations: 0 of at most 10; session 1" in out
    snapshot = r" 1\s+pause: nightly stop\s+[\d,]+ / [\d,]+\s+20\d\d-\d\d-\d\d [\d:]+\s+1\s+"
    assert re.search(snapshot + r"\d+ (s|min \d+ s)", out)  # how long it ran
    assert f"parent {parent}; child -" in out
    assert f"chain: root {parent[:8]} -> 2 {child[:8]}*" in out

    resumed = invoke("resume", child, "--db", str(db))
    assert resumed.exit_code == 0, resumed.output
    assert f"resumed {child} in session 2" in resumed.stdout
    assert "assistant: Answer" in resumed.stdout
    not_paused = invoke("resume", parent, "--db", str(db))
    assert not_paused.exit_code == 1
    assert "is context_exhausted, not paused" in one_error_line(not_paused)
    parent_status = invoke("status", parent, "--db", str(db)).stdout
    assert f"child {child}" in parent_status
    assert "summary: Continuation summary" in parent_status


def test_a_conversation_mid_turn_is_left_to_the_process_running_it(tmp_path: Path) -> None:
    db = tmp_path / "busy.db"

    async def leave_a_turn_in_flight() -> str:
        rt = Runtime(store=SqliteStore(db), llm=ScriptedModel(delay=60))
        conv = await rt.create_conversation(model="segue-demo")
        sending = asyncio.ensure_future(rt.send(conv.id, "A question."))
        for _ in range(1_000):  # the turn's first commit, then its request in flight
            if (await rt.state(conv.id)).phase.kind == "llm_requesting":
                break
            await asyncio.sleep(0.01)
        await rt.close()  # the request stays in the outbox, as after a crash
        sending.cancel()
        return conv.id

    cid = asyncio.run(leave_a_turn_in_flight())
    before = digest(db)
    for command in ("pause", "resume"):
        result = invoke(command, cid, "--db", str(db))
        assert result.exit_code == 1
        line = one_error_line(result)
        assert "llm_requesting with work in flight" in line
    assert digest(db) == before


def test_pausing_a_claude_conversation_needs_the_key_and_uses_the_given_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "claude.db"

    async def make() -> str:
        async with Runtime(store=SqliteStore(db), llm=ScriptedModel()) as rt:
            conv = await rt.create_conversation(model="claude-sonnet-4-6", context_window=50_000)
            await rt.send(conv.id, "Hello.")
            return conv.id

    cid = asyncio.run(make())
    no_key = invoke("pause", cid, "--db", str(db))
    assert no_key.exit_code == 2
    assert one_error_line(no_key).startswith("error: ANTHROPIC_API_KEY is not set")
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    checkpoint = MessageReply(text="Checkpoint: said hello.", usage=Usage(800, 20))
    with FakeAnthropicServer(default=checkpoint) as fake:
        paused = invoke(
            "pause", cid, "--db", str(db), "--base-url", fake.url, "--header", "X-Gateway:g-7"
        )
        sent = fake.message_requests()
    assert paused.exit_code == 0, paused.output
    assert "checkpoint: Checkpoint: said hello." in paused.stdout
    assert len(sent) == 1
    assert sent[0].headers["x-gateway"] == "g-7"
    bad = invoke("pause", cid, "--db", str(db), "--header", "no-colon")
    assert bad.exit_code == 2
    assert "--header takes NAME:VALUE" in one_error_line(bad)


# --------------------------------------------------------------------------- chat


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropicServer]:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    reply = MessageReply(text="Hello from the fake API.", usage=Usage(input_tokens=1_000))
    with FakeAnthropicServer(default=reply) as server:
        yield server


def test_slash_commands_are_never_sent_and_an_empty_chat_stores_nothing(
    fake: FakeAnthropicServer, tmp_path: Path
) -> None:
    db = tmp_path / "chat.db"
    result = chat(fake, db, "/help\n/frobnicate now\n/status\n/quit\nnever read\n")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "unknown command /frobnicate (nothing was sent)" in out
    assert out.count("/new [--no-seed]") == 2  # /help, and the help after the unknown one
    assert "no conversation yet: your next message starts one" in out
    assert fake.message_requests() == []
    assert stored_ids(db) == []


def test_a_double_slash_sends_a_slash_and_bad_utf8_is_refused(
    fake: FakeAnthropicServer, tmp_path: Path
) -> None:
    db = tmp_path / "chat.db"
    result = chat(fake, db, b"\xff\xfe not text\n//etc/hosts is a file\n")
    assert result.exit_code == 0, result.output
    assert "error: that line is not valid UTF-8; nothing was sent" in result.stderr
    assert "Traceback" not in result.output
    sent = fake.message_requests()
    assert len(sent) == 1
    assert "/etc/hosts is a file" in json.dumps(sent[0].body["messages"])


def test_chat_commands_pause_resume_continue_and_new(
    fake: FakeAnthropicServer, tmp_path: Path
) -> None:
    db = tmp_path / "chat.db"
    script = "\n".join(
        [
            "first question",
            "/pause lunch",
            "are you there?",  # refused while paused, with a hint
            "/resume",
            "/status",
            "/continue",  # summarise now: read-only, the summary is shown
            "/new --no-seed",  # its child, without the summary
            "in the child",
            "/new",  # a live conversation: a fresh one, not its child
            "/quit",
        ]
    )
    result = chat(fake, db, script + "\n", "--context-window", "50000")
    out = result.stdout
    assert result.exit_code == 0, result.output
    assert "paused: /resume carries on in a new session from the snapshot" in out
    assert "not sent: This conversation is paused" in result.stderr
    assert "type /resume to carry on in a new session" in result.stderr
    assert re.search(r"\d+ / 50,000", out)  # the window given, never asked for
    assert all(r.path.startswith("/v1/messages") for r in fake.requests)
    assert "snapshots" in out
    assert "this conversation is read-only now" in out
    first = re.search(rf"^conversation ({ID}) ", out, re.MULTILINE)
    assert first is not None
    words = " ".join(out.split())  # the lines wrap at 80 columns
    child = re.search(rf"continuing in conversation ({ID}) \(parent {first[1]}\)", words)
    assert child is not None
    assert "a new conversation starts with your next message" in out
    assert sorted(stored_ids(db)) == sorted([first[1], child[1]])  # the fresh one never used
    messages = json.loads(invoke("show", child[1], "--db", str(db), "--json").stdout)["messages"]
    assert [m["kind"] for m in messages] == ["user", "assistant"]  # not seeded


def test_new_from_an_exhausted_conversation_is_its_seeded_child(
    fake: FakeAnthropicServer, tmp_path: Path
) -> None:
    db = tmp_path / "chat.db"
    fake.enqueue(
        MessageReply(text="A long answer.", usage=Usage(input_tokens=185_000)),
        MessageReply(text="Summary: we filled the window.", usage=Usage(185_000, 30)),
    )
    result = chat(fake, db, "fill it up\n/new\nhello child\n")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Summary: we filled the window." in out  # shown when it is exhausted
    child = re.search(rf"continuing in conversation ({ID})", out)
    assert child is not None
    messages = json.loads(invoke("show", child[1], "--db", str(db), "--json").stdout)["messages"]
    assert [m["kind"] for m in messages][:1] == ["summary"]


# --------------------------------------------------------------------------- serve


def test_serve_refuses_a_public_bind_without_a_token_and_a_taken_port(tmp_path: Path) -> None:
    public = invoke("serve", "--db", str(tmp_path / "s.db"), "--host", "0.0.0.0")  # noqa: S104
    assert public.exit_code == 2
    assert "give a token (--token or SEGUE_TOKEN)" in one_error_line(public)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        busy = invoke("serve", "--db", str(tmp_path / "s.db"), "--port", port)
    assert busy.exit_code == 1
    assert "the port is in use" in one_error_line(busy)


def test_serve_refuses_a_store_it_cannot_use_before_it_says_it_serves(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("my notes, not a database\n", encoding="utf-8")
    other = tmp_path / "other.db"
    with contextlib.closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
        conn.commit()
    before = digest(other)
    for db, said in [(text, "is not a SQLite database"), (other, "another program's")]:
        refused = invoke("serve", "--db", str(db), "--port", "1")
        assert refused.exit_code == 2, refused.output
        assert said in one_error_line(refused)
        assert "segue serve:" not in refused.stdout  # never announced
    assert digest(other) == before  # no segue table added to it
    assert text.read_text(encoding="utf-8") == "my notes, not a database\n"
    empty = invoke("serve", "--db", str(tmp_path / "e.db"), "--token", "")
    assert empty.exit_code == 2
    assert "the token is empty" in one_error_line(empty)


def _serving(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], str, dict[str, Any]]:
    """``segue serve`` started offline on a free port; the process, its URL and its info."""
    segue = shutil.which("segue")
    assert segue is not None, "the console script is not installed (pip install -e .)"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    server = subprocess.Popen(  # noqa: S603  # the installed console script, no shell
        [segue, "serve", "--db", str(tmp_path / "served.db"), "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            token = args[args.index("--token") + 1] if "--token" in args else None
            auth = {"authorization": f"Bearer {token}"} if token else {}
            info: dict[str, Any] = httpx2.get(f"{base}/api/info", headers=auth, timeout=2).json()
            return server, base, info
        except httpx2.TransportError:
            assert server.poll() is None, server.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)


@pytest.mark.slow
def test_segue_serve_stops_on_ctrl_c_with_a_page_open(tmp_path: Path) -> None:
    """A shown page holds an event stream open forever; Ctrl-C ends it cleanly (the stream's
    body ends, as a page then reconnects) and stops the server, with nothing in its log: not
    a stream cancelled at the end of the grace period with a traceback."""
    server, base, _ = _serving(tmp_path)
    try:
        cid = httpx2.post(f"{base}/api/conversations", json={}, timeout=5).json()["id"]
        opened = threading.Event()
        ended: list[str] = []

        def page() -> None:
            try:
                with httpx2.stream(
                    "GET", f"{base}/api/conversations/{cid}/events", timeout=60
                ) as response:
                    opened.set()
                    for _ in response.iter_lines():
                        pass
                ended.append("cleanly")
            except httpx2.TransportError as error:
                ended.append(f"cut: {error!r}")

        watcher = threading.Thread(target=page, daemon=True)
        watcher.start()
        assert opened.wait(10)
        time.sleep(0.3)
        started = time.monotonic()
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=20)
        assert time.monotonic() - started < 10
        watcher.join(10)
        assert ended == ["cleanly"]
        assert err == "", err
        assert server.returncode == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()


@pytest.mark.slow
def test_segue_serve_runs_the_page_and_the_api(tmp_path: Path) -> None:
    server, base, info = _serving(tmp_path)
    port = base.rsplit(":", 1)[1]
    try:
        assert info["offline"] is True
        page = httpx2.get(f"{base}/", timeout=5)
        assert page.status_code == 200
        assert 'role="meter"' in page.text
    finally:
        server.terminate()
        out, err = server.communicate(timeout=20)
    assert f"segue serve: http://127.0.0.1:{port}/ answered by the offline" in out
    assert "Traceback" not in err


@pytest.mark.slow
def test_segue_serve_with_a_token_and_a_small_window(tmp_path: Path) -> None:
    """The start line is the address to open (the page takes the token from it), and new
    conversations get the window asked for, so the limit comes in a few messages."""
    server, base, info = _serving(tmp_path, "--token", "t/k n", "--context-window", "3000")
    try:
        assert info["context_window"] == 3_000
    finally:
        server.terminate()
        out, err = server.communicate(timeout=20)
    assert f"segue serve: {base}/#token=t%2Fk%20n answered by" in out
    assert "Traceback" not in err
