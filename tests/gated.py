"""A scripted model whose first answer waits until the test opens a gate, in this process.

A test that needs a turn in flight (to pause it, to watch another tab show it busy) holds it for
exactly as long as it needs, with no race against a fixed delay, then lets it finish. (For a
model in another process, see ``gated_worker.py``, which ``Worker`` starts.)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from segue import ScriptedModel
from segue.executor.model_port import LlmReply, LlmRequest, TextSink

HOLD_AT_MOST = 120.0
"""Seconds the gate holds the request if the test never opens it (a failing test ends)."""


class Gated(ScriptedModel):
    """Sets ``asked`` when its first request arrives, answers it once ``gate`` is set (later
    requests at once)."""

    def __init__(self, *, window: int = 50_000, reply_chars: int = 40) -> None:
        super().__init__(window=window, reply_chars=reply_chars)
        self.gate = threading.Event()
        self.asked = threading.Event()

    async def complete(self, request: LlmRequest) -> LlmReply:
        if not self.asked.is_set():
            self.asked.set()
            await asyncio.to_thread(self.gate.wait, HOLD_AT_MOST)
        return await super().complete(request)


class HeldMidway(ScriptedModel):
    """Streams the first half of its first reply, then writes the rest a character every
    ``HELD_DELTA`` seconds (a model writing slowly, for longer than a page waits) until
    ``gate`` is set, and what is left at once: a reply being written for as long as the test
    needs (``halfway`` says it is)."""

    HELD_DELTA = 0.005

    def __init__(self, *, reply_chars: int = 18_000, chunk_delay: float = 0.002) -> None:
        super().__init__(reply_chars=reply_chars, chunk_delay=chunk_delay)
        self.gate = threading.Event()
        self.halfway = threading.Event()

    async def _stream(self, text: str, on_text: TextSink) -> None:
        if self.halfway.is_set():
            await super()._stream(text, on_text)
            return
        half = len(text) // 2
        await super()._stream(text[:half], on_text)
        self.halfway.set()
        rest = text[half:]
        while len(rest) > 1 and not self.gate.is_set():
            await asyncio.sleep(self.HELD_DELTA)
            on_text(rest[0])
            rest = rest[1:]
        await asyncio.to_thread(self.gate.wait, HOLD_AT_MOST)
        on_text(rest)


class Worker:
    """``gated_worker.py``: a process sending one message to the conversation, its model's
    answer held until ``open()``."""

    def __init__(self, db: Path, cid: str) -> None:
        script = Path(__file__).with_name("gated_worker.py")
        self.process = subprocess.Popen(  # noqa: S603  # our own worker, no shell
            [sys.executable, str(script), str(db), cid],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert json.loads(self.process.stdout.readline() or "{}") == {"asked": True}

    def open(self) -> dict[str, Any]:
        """Let the model answer; the worker's outcome once its send returned."""
        out, err = self.process.communicate("answer now\n", timeout=120)
        assert self.process.returncode == 0, err
        result: dict[str, Any] = json.loads(out.splitlines()[-1])
        return result

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()
