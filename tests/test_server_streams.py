"""Event streams under clients that read slowly or not at all, over real sockets: the turn ends
while they are stuck, a client that keeps up sees every update, and a client that fell too far
behind is dropped with a ``reset`` event when it reads again (what it is sent is bounded, not
the whole turn held for it). ``bench/bench_server.py`` runs the same at a larger scale and
prints the server's memory and the turn's time with and without them.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from api import create, send, sse
from segue import Runtime, ScriptedModel, SqliteStore
from segue.server import create_app
from segue.server.relay import BEHIND
from serving import served

pytestmark = pytest.mark.slow
STUCK = 40
"""Clients that open the stream and never read it."""
REPLY = 2 * 1024 * 1024
"""Characters of the turn's reply: its events are several times what a client may fall behind
by and what the kernel holds for a reader that does not read (``run.SEND_BUFFER``)."""
PIECE, PACE = 1_000, 0.004
"""Characters of each delta, and seconds between deltas: about 250 KB a second, which is
faster than any model writes and slower than any client that reads keeps up with (it may
stall a second and still catch up)."""
WINDOW = 10_000_000


def stuck_client(port: int, cid: str) -> socket.socket:
    """A connection that asks for the conversation's events, reads the response's head, and
    then reads nothing (a receive buffer of 4 KiB: the kernel holds little for it either)."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", port))
    request = f"GET /api/conversations/{cid}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    client.sendall(request.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = client.recv(1)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 200"), head
    return client


def rest_of(client: socket.socket) -> bytes:
    """Everything the server still sends, to the end of the stream."""
    client.settimeout(60)
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := client.recv(65536):
            received += chunk
            if b"event: reset" in received and received.endswith(b"\r\n0\r\n\r\n"):
                break  # the last chunk of a chunked body: the stream is over
    return received


class KeepingUp:
    """A client that reads a conversation's events as fast as they come, until a ``done``."""

    def __init__(self, server: str, cid: str) -> None:
        self.received = bytearray()
        self.watching = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(server, cid))
        self.thread.start()
        assert self.watching.wait(60)

    def _read(self, server: str, cid: str) -> None:
        address = f"{server}/api/conversations/{cid}/events"
        with httpx2.stream("GET", address, timeout=120) as response:
            self.watching.set()
            done = -1
            for chunk in response.iter_bytes():
                start = max(0, len(self.received) - 16)
                self.received += chunk
                if done < 0:
                    done = self.received.find(b"event: done", start)
                if done >= 0 and self.received.find(b"\n\n", done) >= 0:
                    return  # the whole done event

    def events(self) -> list[tuple[str, dict[str, Any]]]:
        self.thread.join(120)
        return sse(httpx2.Response(200, content=bytes(self.received)))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    model = ScriptedModel(reply_chars=REPLY, chunk_chars=PIECE, chunk_delay=PACE)
    runtime = Runtime(store=SqliteStore(tmp_path / "streams.db"), llm=model)
    with served(create_app(runtime)) as url:
        yield url


def test_stuck_clients_are_dropped_and_a_client_that_keeps_up_sees_every_update(
    server: str,
) -> None:
    port = int(server.rsplit(":", 1)[1])
    with httpx2.Client(base_url=server, timeout=120) as http:
        cid = create(http, context_window=WINDOW)["id"]
        stuck = [stuck_client(port, cid) for _ in range(STUCK)]
        try:
            keeping_up = KeepingUp(server, cid)
            turn = send(http, cid, "Tell me everything.")  # ends though 40 clients are stuck
            assert turn[-1][0] == "done"
            stored = http.get(f"/api/conversations/{cid}/messages").json()[-1]["text"]
            events = keeping_up.events()
            deltas = "".join(data["text"] for name, data in events if name == "text")
            assert deltas == stored  # every update, in order
            assert events[-1][0] == "done"
            assert "reset" not in [name for name, _ in events]

            whole = len(keeping_up.received)
            for client in stuck:
                late = rest_of(client)
                assert b"event: reset" in late
                assert b"event: done" not in late  # dropped before the end of the turn
                assert len(late) < whole / 2  # not the turn kept for it: a bounded part
        finally:
            for client in stuck:
                client.close()
    assert BEHIND <= REPLY / 4


def test_a_turns_own_stream_read_late_is_reset_and_the_turn_is_stored(server: str) -> None:
    port = int(server.rsplit(":", 1)[1])
    with httpx2.Client(base_url=server, timeout=120) as http:
        cid = create(http, context_window=WINDOW)["id"]
        keeping_up = KeepingUp(server, cid)  # to know when the stuck turn is over
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        body = b'{"text": "Tell me everything."}'
        client.sendall(
            f"POST /api/conversations/{cid}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        try:
            assert http.get("/api/conversations").status_code == 200  # others are answered
            assert keeping_up.events()[-1][0] == "done"  # the turn went on to its end
            late = rest_of(client)
        finally:
            client.close()
        assert b"event: reset" in late
        kinds = [m["kind"] for m in http.get(f"/api/conversations/{cid}/messages").json()]
        assert kinds == ["user", "assistant"]  # the turn was stored whole
