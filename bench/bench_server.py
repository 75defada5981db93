"""Server benchmark: many browser tabs streaming a turn at once through ``segue serve``, and
one conversation watched by many tabs that read slowly or not at all.

Run ``python bench/bench_server.py [--clients 100] [--stalled 200] [--quick]``. The server runs
in its own process, as ``segue serve`` does without a key (its listening socket, uvicorn, a
SQLite file, the offline scripted model, its 1,200-character replies streamed in 50 pieces with
``--chunk-delay`` seconds between them, 0 by default: what is measured is the server's own work).

Concurrent turns: each client first creates its conversation, then all clients send one message
at the same moment and read the Server-Sent Events to the end. Reported: p50 and p99 over the
clients of the time from sending to the first text event and to the ``done`` event, the server's
resident memory (VmRSS after the run and its peak VmHWM), and as the reference measured in the
same run, the same concurrent turns through ``Runtime.stream`` in this process (no HTTP, same
model and store kind): the ratio is what HTTP, SSE framing and the JSON views add.

Stalled tabs: one conversation is watched by ``--stalled`` connections that read the response's
head and nothing more (a 4 KiB receive buffer) and by one tab that keeps up, while turns are sent
to it one after another, then as many turns with no stalled tab. Reported: a turn's time with and
without the stalled tabs (p50, p99), the server's memory before and after (each stalled tab may
cost it the relay's bound, ``segue.server.relay.BEHIND``, and the kernel's send buffer), whether
the tab that kept up saw every turn's ``done``, and how many stalled tabs were dropped with a
``reset`` when they read at last. There is no pass/fail target here; the numbers go in the
closing note.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2

from segue.executor.models.offline import OFFLINE_WINDOW
from segue.executor.models.scripted import ScriptedModel
from segue.executor.runtime import Runtime
from segue.executor.stores.sqlite import SqliteStore

SERVER = """
import sys
from pathlib import Path
from segue.server.run import ServerConfig, build_app, run_app
config = ServerConfig(db=Path(sys.argv[1]), port=int(sys.argv[2]), chunk_delay=float(sys.argv[3]))
run_app(build_app(config), host="127.0.0.1", port=config.port)
"""
TURNS_STALLED = 150
"""Turns sent to the stalled tabs' conversation (about 1.2 MB of events a tab: past what the
relay and the kernel hold for one that does not read)."""


@dataclass(frozen=True, slots=True)
class Timing:
    first_text: float
    done: float


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def memory_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in kB (Linux)."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


@contextlib.contextmanager
def served(db: Path, chunk_delay: float) -> Iterator[tuple[str, int]]:
    port = free_port()
    process = subprocess.Popen(  # noqa: S603  # our own interpreter on our own code
        [sys.executable, "-c", SERVER, str(db), str(port), str(chunk_delay)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx2.get(f"{url}/api/info", timeout=2).raise_for_status()
                break
            except httpx2.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the server did not start") from None
                time.sleep(0.05)
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)


async def one_client(client: httpx2.AsyncClient, cid: str, start: asyncio.Event) -> Timing:
    await start.wait()
    began = time.perf_counter()
    first = None
    path = f"/api/conversations/{cid}/messages"
    async with client.stream("POST", path, json={"text": "Tell me about the tides."}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and line == "event: text":
                first = time.perf_counter() - began
            elif line == "event: done":
                break
    ended = time.perf_counter() - began
    if first is None:
        raise SystemExit("a turn streamed no text")
    return Timing(first, ended)


async def over_http(url: str, clients: int) -> list[Timing]:
    limits = httpx2.Limits(max_connections=clients + 5, max_keepalive_connections=clients + 5)
    async with httpx2.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        ids = []
        for _ in range(clients):
            created = await client.post("/api/conversations", json={})
            ids.append(created.json()["id"])
        start = asyncio.Event()
        tasks = [asyncio.ensure_future(one_client(client, cid, start)) for cid in ids]
        await asyncio.sleep(0.1)
        start.set()
        return list(await asyncio.gather(*tasks))


async def in_process(db: Path, clients: int, chunk_delay: float) -> list[Timing]:
    """The reference: the same concurrent turns through ``Runtime.stream``, no HTTP."""
    model = ScriptedModel(window=OFFLINE_WINDOW, reply_chars=1_200, chunk_delay=chunk_delay)
    async with Runtime(store=SqliteStore(db), llm=model) as rt:
        ids = [(await rt.create_conversation(model="claude-sonnet-4-6")).id for _ in range(clients)]
        start = asyncio.Event()

        async def turn(cid: str) -> Timing:
            await start.wait()
            began = time.perf_counter()
            first = None
            async for update in rt.stream(cid, "Tell me about the tides."):
                if first is None and update.kind == "text":
                    first = time.perf_counter() - began
            assert first is not None
            return Timing(first, time.perf_counter() - began)

        tasks = [asyncio.ensure_future(turn(cid)) for cid in ids]
        await asyncio.sleep(0.1)
        start.set()
        return list(await asyncio.gather(*tasks))


def stalled_tab(port: int, cid: str) -> socket.socket:
    """A tab that opens the conversation's events, reads the response's head and no more."""
    tab = socket.socket()
    tab.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    tab.connect(("127.0.0.1", port))
    tab.sendall(f"GET /api/conversations/{cid}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = tab.recv(1)
        if not chunk:
            raise SystemExit("a stalled tab's stream closed before its head")
        head += chunk
    return tab


def dropped(tab: socket.socket) -> bool:
    """Whether the server ended the stalled tab's stream with ``reset`` (read it all now)."""
    tab.settimeout(0.5)
    received = b""
    with contextlib.suppress(OSError):  # the stream stays open: nothing more comes
        while chunk := tab.recv(65536):
            received += chunk
    tab.close()
    return b"event: reset" in received


async def turns(client: httpx2.AsyncClient, cid: str, count: int) -> list[float]:
    """``count`` turns of ``cid`` one after another: each one's seconds."""
    took = []
    for turn in range(count):
        began = time.perf_counter()
        path = f"/api/conversations/{cid}/messages"
        async with client.stream("POST", path, json={"text": f"Part {turn}."}) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line == "event: done":
                    break
        took.append(time.perf_counter() - began)
    return took


async def watched_dones(url: str, cid: str, opened: asyncio.Event, count: int) -> int:
    """The ``done`` events a tab that keeps up reads, until ``count`` or ``reset``."""
    seen = 0
    async with (
        httpx2.AsyncClient(base_url=url, timeout=300) as client,
        client.stream("GET", f"/api/conversations/{cid}/events") as response,
    ):
        opened.set()
        async for line in response.aiter_lines():
            if line == "event: reset":
                return seen
            if line == "event: done":
                seen += 1
                if seen == count:
                    return seen
    return seen


@dataclass(frozen=True, slots=True)
class Stalled:
    with_tabs: list[float]
    without: list[float]
    kept_up: int
    dropped: int
    memory: tuple[dict[str, int], dict[str, int]]


async def with_stalled_tabs(url: str, pid: int, tabs: int, count: int) -> Stalled:
    port = int(url.rsplit(":", 1)[1])
    async with httpx2.AsyncClient(base_url=url, timeout=300) as client:
        created = await client.post("/api/conversations", json={"context_window": 10_000_000})
        cid = created.json()
        stalled = [stalled_tab(port, cid["id"]) for _ in range(tabs)]
        before = memory_kb(pid)
        opened = asyncio.Event()
        watching = asyncio.ensure_future(watched_dones(url, cid["id"], opened, count))
        await opened.wait()
        with_tabs = await turns(client, cid["id"], count)
        kept_up = await watching
        after = memory_kb(pid)
        gone = sum(dropped(tab) for tab in stalled)
        alone = (
            await client.post("/api/conversations", json={"context_window": 10_000_000})
        ).json()
        without = await turns(client, alone["id"], count)
    return Stalled(with_tabs, without, kept_up, gone, (before, after))


def report(label: str, timings: list[Timing]) -> tuple[float, float, float, float]:
    firsts = [t.first_text * 1000 for t in timings]
    dones = [t.done * 1000 for t in timings]
    figures = (
        percentile(firsts, 0.5),
        percentile(firsts, 0.99),
        percentile(dones, 0.5),
        percentile(dones, 0.99),
    )
    print(
        f"{label}: first text p50 {figures[0]:,.1f} ms, p99 {figures[1]:,.1f} ms; "
        f"done p50 {figures[2]:,.1f} ms, p99 {figures[3]:,.1f} ms "
        f"(mean done {statistics.fmean(dones):,.1f} ms)"
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--stalled", type=int, default=200)
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    parser.add_argument("--quick", action="store_true", help="10 clients, 20 stalled: a smoke run")
    args = parser.parse_args()
    clients = 10 if args.quick else args.clients
    tabs = 20 if args.quick else args.stalled
    with tempfile.TemporaryDirectory(prefix="segue-bench-server-") as scratch:
        with served(Path(scratch) / "served.db", args.chunk_delay) as (url, pid):
            before = memory_kb(pid)
            http = asyncio.run(over_http(url, clients))
            after = memory_kb(pid)
        with served(Path(scratch) / "stalled.db", args.chunk_delay) as (url, pid):
            stalled = asyncio.run(with_stalled_tabs(url, pid, tabs, TURNS_STALLED))
        reference = asyncio.run(in_process(Path(scratch) / "local.db", clients, args.chunk_delay))
    print(f"{clients} concurrent SSE clients, one turn each (scripted model, SQLite)")
    served_figures = report("Over HTTP (segue serve)", http)
    local_figures = report("In process (Runtime.stream, reference)", reference)
    ratios = [
        h / r if r else float("inf") for h, r in zip(served_figures, local_figures, strict=True)
    ]
    print(
        f"HTTP / in process: first text p50 {ratios[0]:.2f}x, p99 {ratios[1]:.2f}x; "
        f"done p50 {ratios[2]:.2f}x, p99 {ratios[3]:.2f}x"
    )
    print(
        f"Server memory: RSS {before['VmRSS'] / 1024:,.1f} MB idle, "
        f"{after['VmRSS'] / 1024:,.1f} MB after, peak {after['VmHWM'] / 1024:,.1f} MB"
    )
    report_stalled(tabs, stalled)


def report_stalled(tabs: int, stalled: Stalled) -> None:
    def ms(values: list[float], fraction: float) -> float:
        return percentile(values, fraction) * 1000

    print(f"{tabs} stalled tabs on one conversation, {TURNS_STALLED} turns sent to it")
    third = len(stalled.with_tabs) // 3
    print(
        f"A turn with them: p50 {ms(stalled.with_tabs, 0.5):,.1f} ms, "
        f"p99 {ms(stalled.with_tabs, 0.99):,.1f} ms; without: "
        f"p50 {ms(stalled.without, 0.5):,.1f} ms, p99 {ms(stalled.without, 0.99):,.1f} ms"
    )
    print(
        f"While their streams still took updates (first {third} turns): "
        f"p50 {ms(stalled.with_tabs[:third], 0.5):,.1f} ms; once dropped (last {third}): "
        f"p50 {ms(stalled.with_tabs[-third:], 0.5):,.1f} ms"
    )
    before, after = stalled.memory
    print(
        f"Server memory with the stalled tabs: RSS {before['VmRSS'] / 1024:,.1f} MB before the "
        f"turns, {after['VmRSS'] / 1024:,.1f} MB after, peak {after['VmHWM'] / 1024:,.1f} MB"
    )
    print(
        f"The tab that kept up saw {stalled.kept_up} of {TURNS_STALLED} turns' done; "
        f"{stalled.dropped} of {tabs} stalled tabs were dropped with reset"
    )


if __name__ == "__main__":
    main()
