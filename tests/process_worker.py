"""A worker process for ``test_processes``: one ``Runtime`` on a shared store, doing one job.

Run as ``python process_worker.py STORE JOB [ARGS...]``; ``STORE`` is a SQLite path or a
PostgreSQL conninfo (``host=...``). It prints one JSON line: how many model requests it made
and what its sends gave. Jobs:

- ``send CID[,CID...] N DELAY``: send N messages, round-robin over the conversations, with a
  scripted model that takes DELAY seconds per answer (so turns overlap between processes).
- ``recover``: start (which recovers) and stop.
- ``hang CID``: send one message to a model that never answers (a process to kill -9).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from segue import Runtime
from segue.executor.errors import SegueError
from segue.executor.model_port import LlmReply, LlmRequest
from segue.executor.models.scripted import ScriptedModel
from segue.executor.store_port import Store
from segue.executor.stores.postgres import PostgresStore
from segue.executor.stores.sqlite import SqliteStore


class Hanging(ScriptedModel):
    """Says it was asked (a line on stdout), then never answers."""

    async def complete(self, request: LlmRequest) -> LlmReply:
        self.requests.append(request)
        sys.stdout.write(json.dumps({"asked": True, "pid": os.getpid()}) + "\n")
        sys.stdout.flush()
        await asyncio.Event().wait()
        raise AssertionError


def open_store(where: str) -> Store:
    return PostgresStore(where) if where.startswith("host=") else SqliteStore(where)


async def main(where: str, job: str, args: list[str]) -> dict[str, object]:
    if job == "hang":
        model: ScriptedModel = Hanging()
    else:
        model = ScriptedModel(delay=float(args[2]) if job == "send" else 0.0, reply_chars=30)
    async with Runtime(store=open_store(where), llm=model) as rt:
        results: list[str] = []
        if job == "send":
            ids, count = args[0].split(","), int(args[1])
            for n in range(count):
                cid = ids[n % len(ids)]
                try:
                    state = await rt.send(cid, f"message {n} from {os.getpid()}")
                    results.append(state.phase.kind)
                except SegueError as error:
                    results.append(f"{type(error).__name__}: {error}")
        elif job == "hang":
            await rt.send(args[0], "a question nobody will answer")
        return {"calls": len(model.requests), "results": results, "owner": rt.owner}


if __name__ == "__main__":
    where, job, *rest = sys.argv[1:]
    sys.stdout.write(json.dumps(asyncio.run(main(where, job, rest))) + "\n")
