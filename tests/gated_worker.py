"""A worker process whose model answers only when the test opens a gate (a line on stdin).

``python gated_worker.py STORE CID [send|stream]``: one ``Runtime`` on the shared store (a
SQLite path or a PostgreSQL conninfo) sends one message to ``CID`` (``stream``: streams it); its
model prints ``{"asked": true}`` when the request arrives, then waits for a line on its standard
input before it answers. A test holds the request in flight for exactly as long as it needs (no
race against a fixed delay), then lets it finish. The last line printed is JSON: model calls,
the send's outcome, the owner, how long the turn took after the gate opened, and the wall-clock
times at which the held call was cancelled (if it was) and the send returned (a test compares
them with its own); for ``stream``, the kinds of the updates too. It is printed as the send
returns, while the gate may still be shut (the process ends once its input closes).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from segue import DoneUpdate, Runtime
from segue.executor.model_port import LlmReply, LlmRequest
from segue.executor.models.scripted import ScriptedModel
from segue.executor.store_port import Store
from segue.executor.stores.postgres import PostgresStore
from segue.executor.stores.sqlite import SqliteStore


class Gated(ScriptedModel):
    """Says it was asked, then answers once a line arrives on stdin (later requests at once)."""

    def __init__(self) -> None:
        super().__init__(reply_chars=30)
        self.opened_at: float | None = None
        self.cancelled_at: float | None = None
        self.held = False

    async def complete(self, request: LlmRequest) -> LlmReply:
        if not self.held:  # only the first request waits for the gate
            self.held = True
            sys.stdout.write(json.dumps({"asked": True}) + "\n")
            sys.stdout.flush()
            try:
                await asyncio.to_thread(sys.stdin.readline)
            except asyncio.CancelledError:
                self.cancelled_at = time.time()
                raise
            self.opened_at = time.monotonic()
        return await super().complete(request)


def open_store(where: str) -> Store:
    return PostgresStore(where) if where.startswith("host=") else SqliteStore(where)


async def main(where: str, cid: str, how: str) -> None:
    model = Gated()
    text = "a question answered when the test says so"
    kinds: list[str] = []
    async with Runtime(store=open_store(where), llm=model) as rt:
        if how == "stream":
            async for update in rt.stream(cid, text):
                kinds.append(update.kind)
                if isinstance(update, DoneUpdate):
                    state = update.state
        else:
            state = await rt.send(cid, text)
        returned_at = time.time()
        finished = time.monotonic()
        after_gate = None if model.opened_at is None else finished - model.opened_at
        result = {
            "calls": len(model.requests),
            "phase": state.phase.kind,
            "owner": rt.owner,
            "seconds_after_gate": after_gate,
            "cancelled_at": model.cancelled_at,
            "returned_at": returned_at,
            "updates": kinds,
        }
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    where, cid, *how = sys.argv[1:]
    asyncio.run(main(where, cid, how[0] if how else "send"))
