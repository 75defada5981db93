"""Every line the CLI prints fits 80 columns: in a terminal that wide, with ``COLUMNS=80``, and
on a pipe (no terminal, no ``COLUMNS``: 80 too). A sentence wraps at words, an entry of a list
(a reply's first words) is cut with an ellipsis, a table leaves out what it has no room for.
The demo once printed 86-character reply lines, a 119-character header and a 324-character
read-only line; ``chat``'s offline line was 113 and its ``/help`` lines up to 90; ``status``'s
summary about 210.

Left out on purpose: ``segue diagram`` (Mermaid source, read by a program), ``--json`` (JSON),
and an error on stderr, which stays one line as scripts read it (``cli_run.one_error_line``).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from serving import free_port
from terminal import spawn

pytestmark = pytest.mark.slow
COLUMNS = 80
ID = r"[0-9a-f]{32}"
WAYS = ("pipe", "COLUMNS=80", "terminal")


def _environment(way: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "SEGUE_DB")}
    env.pop("ANTHROPIC_API_KEY", None)
    env.pop("OPENAI_API_KEY", None)
    return env | ({"COLUMNS": str(COLUMNS)} if way == "COLUMNS=80" else {})


def segue(way: str, *args: str, cwd: Path, stdin: str = "") -> list[str]:
    """The lines ``segue ARGS`` prints (stdout and stderr) run ``way``, each checked to fit."""
    if way == "terminal":
        shown = spawn(
            sys.executable,
            "-m",
            "segue",
            *args,
            env=_environment(way) | {"TERM": "xterm"},
            cwd=str(cwd),
            columns=COLUMNS,
        )
        try:
            if stdin:
                shown.read_until("Ctrl-C stops")
                shown.type(stdin.replace("\n", "\r").encode())
            assert shown.ended() == 0, shown.text()
        finally:
            shown.close()
        lines = shown.lines()
    else:
        ran = subprocess.run(  # noqa: S603  # this interpreter, no shell
            [sys.executable, "-m", "segue", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=_environment(way),
            cwd=cwd,
            timeout=120,
            check=False,
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
        lines = (ran.stdout + ran.stderr).splitlines()
    too_wide = [line for line in lines if len(line.rstrip()) > COLUMNS]
    assert too_wide == [], "\n".join(lines)
    assert lines
    return lines


def said(lines: list[str]) -> str:
    """What the lines say, however they wrapped it."""
    return " ".join(" ".join(lines).split())


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a threshold demo's store (demo.db) and a checkpoint-pause one's."""
    folder = tmp_path_factory.mktemp("widths")
    segue("pipe", "demo", "--fast", "--db", "demo.db", cwd=folder)
    segue("pipe", "demo", "--fast", "--behavior", "checkpoint_pause", "--db", "p.db", cwd=folder)
    return folder


@pytest.mark.parametrize("way", WAYS)
def test_the_demo_fits(way: str, tmp_path: Path) -> None:
    lines = segue(way, "demo", "--fast", "--db", "demo.db", cwd=tmp_path)
    words = said(lines)
    parent = re.search(rf"\bconversation ({ID}): window 24,000 tokens", words)
    assert parent is not None, words
    assert f"Call start_new_from('{parent[1]}') to continue in a new conversation." in words
    assert re.search(rf"child conversation {ID} \(parent {parent[1]}\), seeded", words)
    replies = [line for line in lines if line.startswith("  assistant: Answer")]
    assert len(replies) >= 19
    assert all(line.endswith("...") for line in replies)  # cut, not wrapped
    assert max(len(line) for line in replies) == COLUMNS  # as much as fits


@pytest.mark.parametrize("behavior", ["checkpoint_restart", "compact_in_place"])
def test_the_other_demos_fit(behavior: str, tmp_path: Path) -> None:
    words = said(segue("pipe", "demo", "--fast", "--behavior", behavior, cwd=tmp_path))
    assert "still going" in words


CHAT = "/help\nHello there.\n/status\n/bogus\n/pause\n/resume\n/new --x\n/continue\n/quit\n"


@pytest.mark.parametrize("way", WAYS)
def test_an_offline_chat_and_its_help_fit(way: str, tmp_path: Path) -> None:
    lines = segue(way, "chat", "--db", "chat.db", cwd=tmp_path, stdin=CHAT)
    words = said(lines)
    assert "offline: ANTHROPIC_API_KEY is not set, so the scripted model answers" in words
    assert (
        "/continue [focus] take the path at the limit now: continue in a new conversation (or "
        "compact, or restart from a checkpoint); the summary keeps the focus above all" in words
    )
    wrapped = lines.index(next(line for line in lines if line.startswith("  /continue")))
    assert lines[wrapped + 1].startswith(" " * 21 + "conversation")  # under its description
    assert words.count("/quit end (also /exit, or end of input)") == 3  # /help, twice more
    assert 'Answer 1 to "Hello there.". This is a detailed' in words
    assert "paused: /resume carries on in a new session from the snapshot" in words
    assert "this conversation is read-only now: type /new to continue" in words


@pytest.mark.parametrize("way", WAYS)
def test_inspecting_fits(way: str, demos: Path) -> None:
    listed = segue(way, "list", "--db", "demo.db", cwd=demos)
    row = next(line for line in listed if "context_exhausted" in line)
    parent = row.split()[0][:8]
    status = said(segue(way, "status", parent, "--full", "--db", "demo.db", cwd=demos))
    assert "summary: Continuation summary: 56 messages. Recent requests:" in status
    assert "chain: " in status
    shown = said(segue(way, "show", parent, "--db", "demo.db", cwd=demos))
    assert "llm_requesting -> awaiting_continuation" in shown


def test_pausing_resuming_and_the_data_commands_fit(demos: Path) -> None:
    listed = said(segue("pipe", "list", "--db", "p.db", cwd=demos))
    cid = re.search(r"\b([0-9a-f]{8})[0-9a-f]*\s", listed)
    assert cid is not None, listed
    short = cid[1]
    for way in ("pipe", "COLUMNS=80"):
        paused = said(
            segue(way, "pause", short, "--reason", "nightly stop", "--db", "p.db", cwd=demos)
        )
        assert "checkpoint: ## Goal" in paused
        resumed = said(segue(way, "resume", short, "--db", "p.db", cwd=demos))
        assert f"resumed {short}" in resumed
    exported = said(segue("pipe", "export", short, "-o", "x.json", "--db", "p.db", cwd=demos))
    assert "to x.json" in exported
    imported = said(segue("pipe", "import", "x.json", "--db", "copy.db", cwd=demos))
    assert "imported conversation" in imported
    deleted = said(segue("pipe", "delete", short, "--yes", "--db", "copy.db", cwd=demos))
    assert deleted.startswith("deleted 1 conversation: ")
    purged = said(segue("pipe", "purge", "--older-than", "1d", "--yes", "--db", "p.db", cwd=demos))
    assert "nothing to purge" in purged


def test_every_commands_help_fits(tmp_path: Path) -> None:
    commands = said(segue("pipe", "--help", cwd=tmp_path))
    names = re.findall(
        r"\b(demo|list|show|status|chat|pause|resume|delete|export|import|purge|"
        r"diagram|serve)\b",
        commands,
    )
    assert len(set(names)) == 13
    for name in sorted(set(names)):
        segue("pipe", name, "--help", cwd=tmp_path)


def _served(host: str, tmp_path: Path) -> tuple[list[str], int]:
    """``segue serve --host HOST`` offline with a token, until it answers on loopback: the
    lines it printed, and its port."""
    port = free_port()
    loopback = "[::1]" if ":" in host else "127.0.0.1"
    args = ["serve", "--host", host, "--port", str(port), "--token", "tok/1", "--db", "s.db"]
    server = subprocess.Popen(  # noqa: S603  # this interpreter, no shell
        [sys.executable, "-m", "segue", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment("pipe"),
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                info: dict[str, Any] = httpx2.get(
                    f"http://{loopback}:{port}/api/info",
                    headers={"authorization": "Bearer tok/1"},
                    timeout=2,
                ).json()
                break
            except httpx2.TransportError:
                assert server.poll() is None, server.communicate()
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert info["offline"] is True
    finally:
        server.terminate()
        out, err = server.communicate(timeout=20)
    lines = (out + err).splitlines()
    assert [line for line in out.splitlines() if len(line) > COLUMNS] == [], out
    return lines, port


def test_serve_on_every_ipv4_interface_prints_an_address_a_browser_opens(tmp_path: Path) -> None:
    lines, port = _served("0.0.0.0", tmp_path)  # noqa: S104  # what the test is about
    words = said(lines)
    assert f"segue serve: http://127.0.0.1:{port}/#token=tok%2F1 answered by the offline" in words
    assert f"from another machine: http://{socket.gethostname()}:{port}/#token=tok%2F1" in words
    assert "0.0.0.0" not in words  # noqa: S104  # no address: words that must not be shown


def _ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6(), reason="this machine has no IPv6 loopback")
def test_serve_on_every_ipv6_interface_prints_an_address_a_browser_opens(tmp_path: Path) -> None:
    lines, port = _served("::", tmp_path)
    words = said(lines)
    assert f"segue serve: http://[::1]:{port}/#token=tok%2F1 answered by the offline" in words
    assert f"from another machine: http://{socket.gethostname()}:{port}/#token=tok%2F1" in words
    assert "http://[::]" not in words
