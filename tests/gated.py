"""A scripted model whose first answer waits until the test opens a gate, in this process.

A test that needs a turn in flight (to pause it, to watch another tab show it busy) holds it for
exactly as long as it needs, with no race against a fixed delay, then lets it finish. (For a
model in another process, see ``gated_worker.py``.)
"""

from __future__ import annotations

import asyncio
import threading

from segue import ScriptedModel
from segue.executor.ports import LlmReply, LlmRequest, TextSink

HOLD_AT_MOST = 120.0
"""Seconds the gate holds the request if the test never opens it (a failing test ends)."""


class Gated(ScriptedModel):
    """Sets ``asked`` when its first request arrives, answers it once ``gate`` is set (later
    requests at once)."""

    def __init__(self, *, window: int = 50_000, reply_chars: int = 40) -> None:
        super().__init__(window=window, reply_chars=reply_chars)
        self.gate = threading.Event()
        self.asked = threading.Event()

    async def complete(self, request: LlmRequest, *, on_text: TextSink | None = None) -> LlmReply:
        if not self.asked.is_set():
            self.asked.set()
            await asyncio.to_thread(self.gate.wait, HOLD_AT_MOST)
        return await super().complete(request, on_text=on_text)
