"""What the fake provider servers share: a threaded HTTP server on a loopback port that serves
scripted replies in order, records every request (credentials hidden in ``repr``), and stops
cleanly, cutting keep-alive connections and abandoning delayed replies.

``FakeAnthropicServer`` and ``FakeOpenAIServer`` differ only in what they answer (their routes
and wire shapes); the script, the record, the threads and the connections are here.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import signal
import socket
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, ClassVar, Generic, NamedTuple, Self, TypeVar, cast

SECRET_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})
"""Headers whose values a recorded request never shows."""
R = TypeVar("R")


class RecordedRequest(NamedTuple):
    """One request as received: ``(method, path, headers, body)``; header names are lower-cased.

    ``repr`` masks credential headers so that a failing assertion never prints the API key.
    """

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any

    def __repr__(self) -> str:
        shown = {k: ("<redacted>" if k in SECRET_HEADERS else v) for k, v in self.headers.items()}
        return (
            f"RecordedRequest({self.method!r}, {self.path!r}, "
            f"headers={shown!r}, body={self.body!r})"
        )


class ScriptedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a handler stuck in a long delay must never keep the process alive
    fake: ScriptedServer[Any]


class TrackingHandler(BaseHTTPRequestHandler):
    """A handler whose connections the owning server knows (so ``stop`` can cut them), and
    that never logs (stderr noise, and headers must never be echoed)."""

    protocol_version = "HTTP/1.1"  # keep-alive, like the real APIs; the SDKs pool connections

    @property
    def fake(self) -> Any:
        return cast(ScriptedHTTPServer, self.server).fake

    def setup(self) -> None:
        super().setup()
        self.fake._track(self.connection, add=True)

    def finish(self) -> None:
        self.fake._track(self.connection, add=False)
        with contextlib.suppress(OSError):  # the client vanished (e.g. SIGKILL); nothing to flush
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging."""


class ScriptedServer(Generic[R]):
    """Serves ``R`` replies in script order (``default`` when the script is empty, a callable
    being asked with the request's body); every method is safe to call from any thread.
    Subclasses name their ``handler`` and give the ``url`` a client wants."""

    handler: ClassVar[type[TrackingHandler]]
    thread_name: ClassVar[str] = "fake-server"

    def __init__(self, default: R | Callable[[dict[str, Any]], R]) -> None:
        self.default = default
        self._lock = threading.Condition()
        self._script: deque[R | Callable[[dict[str, Any]], R]] = deque()
        self._requests: list[RecordedRequest] = []
        self._connections: set[socket.socket] = set()
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._httpd: ScriptedHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        """Bind an ephemeral loopback port and serve from a daemon thread."""
        if self._httpd is not None:
            raise RuntimeError(f"{type(self).__name__} is already running")
        self._stopping.clear()
        httpd = ScriptedHTTPServer(("127.0.0.1", 0), self.handler)
        httpd.fake = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=self.thread_name,
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, cut open keep-alive connections and abandon delayed replies."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):  # already closed by the peer
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:PORT`` of the running server."""
        if self._httpd is None:
            raise RuntimeError(f"{type(self).__name__} is not running")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def enqueue(self, *replies: R | Callable[[dict[str, Any]], R]) -> None:
        """Append replies to the script; each model request consumes the first."""
        with self._lock:
            self._script.extend(replies)

    @property
    def pending(self) -> int:
        """How many scripted replies are still unused (tests assert it reaches 0)."""
        with self._lock:
            return len(self._script)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> bool:
        """Block until ``count`` requests have arrived, e.g. before killing a client mid-call."""
        with self._lock:
            return self._lock.wait_for(lambda: len(self._requests) >= count, timeout)

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)
            self._lock.notify_all()

    def _next_reply(self, request: dict[str, Any]) -> R:
        with self._lock:
            item = self._script.popleft() if self._script else self.default
        return item(request) if callable(item) else item

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _request_id(self) -> str:
        return f"req_fake_{next(self._ids):06d}"


def serve_until_stopped(
    make: Callable[[str, float], ScriptedServer[Any]],
    argv: Sequence[str] | None,
    description: str | None,
) -> int:
    """A fake server's ``main``: serve default replies (``--text``, ``--delay``) until SIGTERM or
    SIGINT, writing the base URL as the first line on stdout (for tests that need the fake in
    another process than the one holding the client)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--text", default="ok", help="text of every reply")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each reply")
    args = parser.parse_args(argv)
    done = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    with make(args.text, args.delay) as server:
        sys.stdout.write(cast(Any, server).url + "\n")
        sys.stdout.flush()
        while not done.wait(0.2):
            pass
    return 0
