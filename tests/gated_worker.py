"""A worker process whose model answers only when the test opens a gate (a line on stdin).

``python gated_worker.py STORE CID``: one ``Runtime`` on the shared store (a SQLite path or a
PostgreSQL conninfo) sends one message to ``CID``; its model prints ``{"asked": true}`` when the
request arrives, then waits for a line on its standard input before it answers. A test holds
the request in flight for exactly as long as it needs (no race against a fixed delay), then
lets it finish. The last line printed is JSON: model calls, the send's outcome, the owner, and
how long the turn took after the gate opened.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from segue import Runtime
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

    async def complete(self, request: LlmRequest) -> LlmReply:
        if self.opened_at is None:  # only the first request waits for the gate
            sys.stdout.write(json.dumps({"asked": True}) + "\n")
            sys.stdout.flush()
            await asyncio.to_thread(sys.stdin.readline)
            self.opened_at = time.monotonic()
        return await super().complete(request)


def open_store(where: str) -> Store:
    return PostgresStore(where) if where.startswith("host=") else SqliteStore(where)


async def main(where: str, cid: str) -> dict[str, object]:
    model = Gated()
    async with Runtime(store=open_store(where), llm=model) as rt:
        state = await rt.send(cid, "a question answered when the test says so")
        finished = time.monotonic()
        after_gate = None if model.opened_at is None else finished - model.opened_at
        return {
            "calls": len(model.requests),
            "phase": state.phase.kind,
            "owner": rt.owner,
            "seconds_after_gate": after_gate,
        }


if __name__ == "__main__":
    where, cid = sys.argv[1:]
    sys.stdout.write(json.dumps(asyncio.run(main(where, cid))) + "\n")
