"""Many processes, one database: each model request is performed once, by the process that
claimed it, and every message a caller was told is stored is stored exactly once and answered.

Real worker processes (a script written to ``tmp_path``) send to the same few conversations on
one SQLite file, through the real ``anthropic`` client to one ``FakeAnthropicServer`` in the test
process, which counts the model calls. A reply is held back a little so that the workers'
requests overlap: a process that finds the conversation busy must wait or be refused, never
perform the other's request again.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from segue import ScriptedModel, SqliteStore
from segue.executor.runtime import Runtime
from segue.testing.anthropic_server import FakeAnthropicServer, MessageReply

pytestmark = pytest.mark.slow

MODEL = "claude-sonnet-4-6"
MARK = "RESULT "

WORKER = f"""
import asyncio
import json
import sys

import anthropic

from segue import AnthropicModel, MessageRejectedError, Runtime, SegueError, SqliteStore


async def main(path: str, url: str, worker: str, sends: int, *ids: str) -> None:
    outcomes = []
    async with anthropic.AsyncAnthropic(api_key="test", base_url=url, max_retries=0) as client:
        async with Runtime(store=SqliteStore(path), llm=AnthropicModel(client)) as rt:
            for index in range(sends):
                conversation_id = ids[(index + int(worker)) % len(ids)]
                text = f"worker {{worker}} message {{index}}"
                for _ in range(400):
                    try:
                        await rt.send(conversation_id, text)
                    except MessageRejectedError as error:
                        if "busy" not in str(error):
                            outcomes.append([conversation_id, text, "refused: " + str(error)])
                            break
                        await asyncio.sleep(0.01)  # another process is answering: try again
                        continue
                    except SegueError as error:
                        outcomes.append([conversation_id, text, type(error).__name__])
                        break
                    outcomes.append([conversation_id, text, "sent"])
                    break
    print("{MARK}" + json.dumps(outcomes), flush=True)


asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), *sys.argv[5:]))
"""


def run_workers(
    tmp_path: Path, db: Path, url: str, ids: list[str], *, workers: int, sends: int
) -> list[list[str]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER, encoding="utf-8")
    children = [
        subprocess.Popen(  # noqa: S603  # our own interpreter on our own script
            [sys.executable, str(script), str(db), url, str(n), str(sends), *ids],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(workers)
    ]
    outcomes: list[list[str]] = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        line = next(line for line in out.splitlines() if line.startswith(MARK))
        outcomes += json.loads(line.removeprefix(MARK))
    return outcomes


@pytest.mark.parametrize("workers", [3, 8])
def test_every_stored_message_is_answered_by_exactly_one_model_call(
    tmp_path: Path, workers: int
) -> None:
    db = tmp_path / "shared.db"
    sends = 4

    async def create() -> list[str]:
        async with Runtime(store=SqliteStore(db), llm=ScriptedModel()) as rt:
            return [
                (await rt.create_conversation(model=MODEL, context_window=200_000)).id
                for _ in range(4)
            ]

    ids = asyncio.run(create())
    with FakeAnthropicServer(default=MessageReply(text="Answered.", delay=0.05)) as server:
        outcomes = run_workers(tmp_path, db, server.url, ids, workers=workers, sends=sends)
        calls = len(server.message_requests())

    async def read() -> dict[str, Any]:
        async with Runtime(store=SqliteStore(db), llm=ScriptedModel()) as rt:
            return {
                cid: (await rt.state(cid), await rt.messages(cid), await rt.conversation(cid))
                for cid in ids
            }

    stored = asyncio.run(read())
    sent = [(cid, text) for cid, text, result in outcomes if result == "sent"]
    assert len(outcomes) == workers * sends
    assert [o for o in outcomes if o[2] != "sent"] == []  # nobody told "failed" for a stored one
    replies = 0
    for cid, (state, messages, conversation) in stored.items():
        users = [m.text for m in messages if m.kind == "user"]
        assert Counter(users) == Counter(text for c, text in sent if c == cid)  # once each
        kinds = [m.kind for m in messages]
        assert kinds == ["user", "assistant"] * len(users)  # each answered, in turn
        assert state.phase.kind == "idle"
        assert conversation.pending == ()  # nothing wedged
        replies += kinds.count("assistant")
    assert calls == replies, f"{calls} model calls for {replies} stored replies"
