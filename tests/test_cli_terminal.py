"""``segue chat`` in a terminal, driven through a pseudo-terminal as a person drives it: Ctrl-C at
the ``you>`` prompt ends the chat at once (it once waited for Enter, a readline blocking in a
worker thread), a second Ctrl-C ends a chat whose closing hangs (here on a store another
process holds locked), and the turn a Ctrl-C interrupted is finished by the next run, which
prints its reply.
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from segue.testing import FakeAnthropicServer
from segue.testing.anthropic_server import MessageReply
from terminal import CTRL_C, Terminal, spawn

pytestmark = pytest.mark.slow

KEY = "sk-ant-terminal-test-0123456789"


def chat(fake: FakeAnthropicServer, tmp_path: Path) -> Terminal:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "COLUMNS", "SEGUE_DB")}
    env |= {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": fake.url, "TERM": "xterm"}
    db = str(tmp_path / "chat.db")
    return spawn(
        sys.executable,
        "-m",
        "segue",
        "chat",
        "--db",
        db,
        "--context-window",
        "200000",
        env=env,
        cwd=str(tmp_path),
    )


def asked_slowly(terminal: Terminal, fake: FakeAnthropicServer, line: bytes) -> None:
    """Type ``line`` at the prompt and wait until the model has it (it answers slowly)."""
    terminal.read_until("you> ")
    terminal.type(line)
    deadline = time.monotonic() + 60
    while not fake.message_requests():
        assert time.monotonic() < deadline, terminal.text()
        time.sleep(0.05)


@pytest.fixture
def fake() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer(default=MessageReply(text="A slow answer.", delay=60)) as server:
        yield server


def test_ctrl_c_at_the_prompt_ends_the_chat_at_once(
    fake: FakeAnthropicServer, tmp_path: Path
) -> None:
    terminal = chat(fake, tmp_path)
    try:
        terminal.read_until("you> ")
        terminal.type(CTRL_C)
        assert terminal.ended() == 130
    finally:
        terminal.close()
    shown = terminal.text()
    assert "interrupted" in shown
    assert "Traceback" not in shown


def test_a_second_ctrl_c_ends_a_chat_whose_closing_hangs(
    fake: FakeAnthropicServer, tmp_path: Path
) -> None:
    terminal = chat(fake, tmp_path)
    lock = None
    try:
        asked_slowly(terminal, fake, b"Tell me a story.\r")
        lock = sqlite3.connect(tmp_path / "chat.db", timeout=0, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")  # the chat's store cannot write while it stops
        terminal.type(CTRL_C)
        terminal.read_until("Ctrl-C again stops at once")
        terminal.type(CTRL_C)
        assert terminal.ended() == 130
    finally:
        if lock is not None:
            lock.rollback()
            lock.close()
        terminal.close()
    assert "stopped at once" in terminal.text()


def test_the_next_run_finishes_an_interrupted_turn_and_prints_its_reply(tmp_path: Path) -> None:
    reply = MessageReply(text="The answer the interrupted turn was waiting for.")
    with FakeAnthropicServer(default=reply) as fake:
        fake.enqueue(MessageReply(text="An answer nobody waits for.", delay=60))
        first = chat(fake, tmp_path)
        try:
            asked_slowly(first, fake, b"What was the question?\r")
            first.type(CTRL_C)
            assert first.ended() == 130
        finally:
            first.close()
        second = chat(fake, tmp_path)
        try:
            shown = second.read_until("you> ")
            second.type(b"/quit\r")
            assert second.ended() == 0
        finally:
            second.close()
    assert re.search(r"finished the turn interrupted in conversation [0-9a-f]{32}:", shown)
    assert "The answer the interrupted turn was waiting for." in shown
    assert shown.index("finished the turn") < shown.index("you> ")
