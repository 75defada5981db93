"""How much memory an import holds, against its document's size (issue target: a 50 MB
document peaks under 3x). A document of ``--mb`` megabytes (a long conversation: user
questions and long answers, with their event log) goes through the REST route, as a server
receives it in 64 KB chunks, into a SQLite file; Python's allocations are traced from the
first chunk to the stored conversation (the document's source is not counted: a socket holds
none of it). Then the same import in a process of its own, read from a file: its resident
memory's growth (the peak less what it held with the document read), which counts SQLite's
cache and the allocator's slack too.

    python bench/bench_import.py --mb 50
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from segue import Runtime, ScriptedModel, SqliteStore
from segue.server import create_app

CHUNK = 64 * 1024


async def _base(db: Path) -> dict[str, Any]:
    async with Runtime(store=SqliteStore(db), llm=ScriptedModel(reply_chars=2_000)) as rt:
        conv = await rt.create_conversation(model="claude-sonnet-4-5")
        await rt.send(conv.id, "Tell me about the tides. " * 20)
        return await rt.export_conversation(conv.id)


def document(megabytes: float, db: Path) -> bytes:
    """A sound export of about ``megabytes`` MB: the one turn of a real export repeated, its
    counts, seqs and version made to agree."""
    base = asyncio.run(_base(db))
    messages, lines = base["messages"], base["transitions"]
    turn = len(json.dumps(messages)) + len(json.dumps(lines))
    turns = max(1, int(megabytes * 1_000_000 / turn))
    doc = dict(base)
    doc["messages"] = [dict(m, text=f"{i}: {m['text']}") for i in range(turns) for m in messages]
    doc["transitions"] = [
        dict(line, seq=len(lines) * i + n) for i in range(turns) for n, line in enumerate(lines, 1)
    ]
    conversation = dict(base["conversation"])
    conversation["version"] = len(doc["transitions"]) + 1
    conversation["state"] = dict(conversation["state"], message_count=len(doc["messages"]))
    doc["conversation"] = conversation
    return json.dumps(doc).encode()


async def _post(app: Any, body: bytes) -> int:
    """``body`` POSTed to the import route through the ASGI interface, 64 KB at a time."""
    view = memoryview(body)
    place = 0
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal place
        chunk = bytes(view[place : place + CHUNK])
        place += CHUNK
        return {"type": "http.request", "body": chunk, "more_body": place < len(body)}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/conversations/import",
        "raw_path": b"/api/conversations/import",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"localhost"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("localhost", 80),
    }
    await app(scope, receive, send)
    return status


async def _lifespan_and_post(app: Any, body: bytes) -> tuple[int, int, float]:
    async with app.router.lifespan_context(app):
        gc.collect()
        tracemalloc.start()
        tracemalloc.reset_peak()
        started = time.perf_counter()
        status = await _post(app, body)
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return status, peak, seconds


def measure(megabytes: float) -> tuple[int, int, int, float]:
    """(status, document bytes, peak traced bytes, seconds) of one import."""
    with tempfile.TemporaryDirectory() as folder:
        body = document(megabytes, Path(folder) / "source.db")
        app = create_app(
            Runtime(store=SqliteStore(Path(folder) / "target.db"), llm=ScriptedModel())
        )
        status, peak, seconds = asyncio.run(_lifespan_and_post(app, body))
    return status, len(body), peak, seconds


def _resident() -> int:
    """This process's resident bytes now."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def _child(path: str) -> None:
    """In a process of its own: import the document at ``path``; print the growth of the
    resident peak over what the process held with the document read."""
    body = Path(path).read_bytes()
    runtime = Runtime(store=SqliteStore(Path(path).with_suffix(".db")), llm=ScriptedModel())
    app = create_app(runtime)

    async def run() -> int:
        async with app.router.lifespan_context(app):
            gc.collect()
            before = _resident()
            highest = [before]
            done = threading.Event()

            def watch() -> None:  # the resident size sampled every 2 ms
                while not done.wait(0.002):
                    highest[0] = max(highest[0], _resident())

            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                assert await _post(app, body) == 201
            finally:
                done.set()
                watcher.join()
            return max(highest[0], _resident()) - before

    print(asyncio.run(run()))


def resident_growth(megabytes: float) -> tuple[int, int]:
    """(document bytes, growth of the resident peak) of one import in a fresh process."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "document.json"
        path.write_bytes(document(megabytes, Path(folder) / "source.db"))
        run = [sys.executable, __file__, "--child", str(path)]
        done = subprocess.run(run, check=True, capture_output=True, text=True)  # noqa: S603
        grown = int(done.stdout)
        return path.stat().st_size, grown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0, help="the document's size in MB")
    parser.add_argument("--quick", action="store_true", help="a 10 MB document")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.quick:
        arguments.mb = 10.0
    if arguments.child:
        _child(arguments.child)
        return
    status, length, peak, seconds = measure(arguments.mb)
    print(f"document          {length / 1e6:8.1f} MB")
    print(f"status            {status:8d}")
    print(f"peak (traced)     {peak / 1e6:8.1f} MB")
    print(f"peak / document   {peak / length:8.2f}x")
    print(f"time              {seconds:8.2f} s")
    length, grown = resident_growth(arguments.mb)
    print(f"resident growth   {grown / 1e6:8.1f} MB")
    print(f"growth / document {grown / length:8.2f}x")


if __name__ == "__main__":
    main()
