"""The server's life as applications and orchestrators see it: ``TestClient`` as FastAPI's docs
write tests (its ``testserver`` host, one app under many clients, each starting and stopping the
runtime), the health probes (``/healthz``, ``/readyz`` before and after the store answers), and
``resume`` of a conversation that is not paused refused the same way by the runtime and the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from pathlib import Path

import httpx2
import pytest
from fastapi.testclient import TestClient

import clusters
from api import sse
from segue import MemoryStore, NotPausedError, Runtime, ScriptedModel, SqliteStore
from segue.executor.stores.postgres import PostgresStore
from segue.server import create_app
from segue.testing import live_server
from segue.testing.postgres import ThrowawayCluster

pytestmark = pytest.mark.slow
cluster = clusters.cluster  # one throwaway cluster for the module
READY_WITHIN = 60.0
"""Seconds a server may take to see a store that came up (its retries back off to 10 s)."""
TOKEN = "a-token-for-the-test"  # noqa: S105  # not a secret: a test's own server


def offline(store: MemoryStore | SqliteStore | PostgresStore) -> Runtime:
    return Runtime(store=store, llm=ScriptedModel(window=24_000))


# --------------------------------------------------------------------------- TestClient


def test_a_test_client_as_fastapis_docs_write_it_is_answered(tmp_path: Path) -> None:
    client = TestClient(create_app(offline(SqliteStore(tmp_path / "docs.db"))))
    assert client.get("/api/info").status_code == 200
    created = client.post("/api/conversations", json={})
    assert created.status_code == 201, created.text
    sent = client.post(f"/api/conversations/{created.json()['id']}/messages", json={"text": "Hi"})
    assert sent.status_code == 200
    assert sse(sent)[-1][1]["state"]["phase"] == "idle"


def test_one_app_serves_one_test_client_after_another(tmp_path: Path) -> None:
    """Each ``with TestClient(app)`` starts the app (the runtime recovers) and stops it (the
    runtime closes its store): the next one opens it again and finds what the last one left."""
    app = create_app(offline(SqliteStore(tmp_path / "many.db")))
    made: list[str] = []
    for turn in range(3):
        with TestClient(app) as client:
            assert client.get("/readyz").json() == {"status": "ok", "reason": None}
            listed = [c["id"] for c in client.get("/api/conversations").json()]
            assert sorted(listed) == sorted(made)
            cid = client.post("/api/conversations", json={}).json()["id"]
            events = sse(client.post(f"/api/conversations/{cid}/messages", json={"text": "Hi"}))
            assert events[-1][0] == "done", turn
            made.append(cid)


def test_a_rebinding_name_is_still_refused_beside_testserver(tmp_path: Path) -> None:
    client = TestClient(create_app(offline(MemoryStore())), base_url="http://evil.example")
    assert client.get("/api/info").status_code == 403


# --------------------------------------------------------------------------- health


def test_the_probes_answer_without_the_token_and_from_any_name(tmp_path: Path) -> None:
    app = create_app(offline(SqliteStore(tmp_path / "probes.db")), token=TOKEN)
    with TestClient(app, base_url="http://10.1.2.3:8000") as client:
        assert client.get("/healthz").json() == {"status": "ok", "reason": None}
        assert client.get("/readyz").json() == {"status": "ok", "reason": None}
        assert client.get("/api/conversations").status_code == 401  # the rest keeps its token
    plain = create_app(offline(MemoryStore()))  # no token: the API answers loopback names only
    with TestClient(plain, base_url="http://10.1.2.3:8000") as client:
        assert client.get("/readyz").status_code == 200
        assert client.get("/api/info").status_code == 403


class Gate:
    """A TCP port that refuses connections until ``open()``, then forwards each one to
    ``target``: a database that becomes reachable while the server runs."""

    def __init__(self, target: int) -> None:
        self.target = target
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self.listener: socket.socket | None = None
        self.threads: list[threading.Thread] = []
        self.sockets: list[socket.socket] = []
        self.closed = False
        self.lock = threading.Lock()  # a connection accepted while close() runs is closed too

    def open(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port))
        self.listener = listener
        self._start(self._accept)

    def _start(self, work: object, *args: object) -> None:
        thread = threading.Thread(target=work, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self.threads.append(thread)

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self.lock:
                if self.closed:  # close() has run: nothing would ever close these
                    client.close()
                    upstream.close()
                    return
                self.sockets += [client, upstream]
                self._start(self._pipe, client, upstream)
                self._start(self._pipe, upstream, client)

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with self.lock:
            self.closed = True
        if self.listener is not None:
            self.listener.close()
        for opened in self.sockets:
            with contextlib.suppress(OSError):
                opened.shutdown(socket.SHUT_RDWR)
            opened.close()
        for thread in self.threads:
            thread.join(timeout=30)


def test_readyz_is_503_until_the_store_answers_then_200(cluster: ThrowawayCluster) -> None:
    gate = Gate(cluster.port)
    conninfo = f"host=127.0.0.1 port={gate.port} user=postgres dbname=postgres"
    app = create_app(offline(PostgresStore(conninfo, timeout=1.0)))
    try:
        with live_server(app) as url:  # it starts, though its database does not answer
            assert httpx2.get(f"{url}/healthz").status_code == 200
            waiting = httpx2.get(f"{url}/readyz")
            assert waiting.status_code == 503
            assert waiting.json()["status"] == "unavailable"
            assert "store" in waiting.json()["reason"]
            assert str(gate.port) not in waiting.text  # the type of the error, never its text
            gate.open()
            deadline = time.monotonic() + READY_WITHIN
            while (answer := httpx2.get(f"{url}/readyz")).status_code != 200:
                assert time.monotonic() < deadline, answer.text
                time.sleep(0.1)
            assert answer.json() == {"status": "ok", "reason": None}
            assert httpx2.get(f"{url}/api/conversations").json() == []  # the probe made nothing
    finally:
        gate.close()


# --------------------------------------------------------------------------- resume


def test_resume_of_a_conversation_not_paused_is_refused_by_the_runtime_and_the_api() -> None:
    runtime = offline(MemoryStore())

    async def refused() -> str:
        cid = (await runtime.create_conversation(model="claude-sonnet-4-6")).id
        with pytest.raises(NotPausedError, match="is idle, not paused") as raised:
            await runtime.resume(cid)
        assert (await runtime.state(cid)).phase.kind == "idle"
        return str(raised.value)

    said = asyncio.run(refused())
    with TestClient(create_app(runtime)) as client:
        cid = client.get("/api/conversations").json()[0]["id"]
        answer = client.post(f"/api/conversations/{cid}/resume", json={})
        assert answer.status_code == 409
        assert answer.json() == {"error": "not_paused", "message": said}
