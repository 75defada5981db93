"""What the fake provider servers share: a threaded HTTP server on a loopback port that serves
scripted replies in order, records every request (credentials hidden in ``repr``), and stops
cleanly, cutting keep-alive connections and abandoning delayed replies.

``FakeAnthropicServer`` and ``FakeOpenAIServer`` differ only in what they answer (their routes
and wire shapes); the script, the record, the threads, the connections and the writing of
JSON, raw and SSE answers are here.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import signal
import socket
import sys
import threading
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, ClassVar, Generic, NamedTuple, Protocol, Self, TypeVar, cast

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


class RawAnswer(Protocol):
    """Any HTTP answer a script may ask for verbatim (each fake has its ``RawReply``)."""

    @property
    def status(self) -> int: ...
    @property
    def body(self) -> bytes: ...
    @property
    def content_type(self) -> str: ...


class ScriptedHandler(BaseHTTPRequestHandler):
    """What both fakes do with a request before and after their own routes: read and parse the
    JSON body, record the request, answer a responder that raised with a 500 the SDK does not
    retry (so the test fails once, with the cause in its message), and write JSON, raw or SSE
    answers. A handler's connections are known to the owning server (so ``stop`` can cut them),
    and it never logs (stderr noise, and headers must never be echoed).

    Subclasses give ``_route`` (their API), ``_failure_body`` (their error shape) and
    ``request_id_header`` (the header the real API names its request id in).
    """

    protocol_version = "HTTP/1.1"  # keep-alive, like the real APIs; the SDKs pool connections
    request_id_header: ClassVar[str]

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

    def do_GET(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.fake._record(RecordedRequest(self.command, self.path, headers, body))
        try:
            self._route(self.path.split("?", 1)[0], body)
        except OSError:
            self.close_connection = True  # the client went away mid-reply; expected in crash tests
        except Exception as exc:  # noqa: BLE001  # a broken responder must surface in the test
            self._send_json(500, self._failure_body(exc), {"x-should-retry": "false"})

    def _route(self, path: str, body: Any) -> None:
        """Answer one request to ``path`` (query string removed), ``body`` its parsed JSON."""
        raise NotImplementedError

    def _failure_body(self, exc: Exception) -> object:
        """The API's 500 body naming ``exc``, for a responder or route that raised."""
        raise NotImplementedError

    def _held_back(self, delay: float) -> bool:
        """Wait ``delay`` seconds before a reply; true (and the connection to close) when the
        server stops meanwhile, so the slow reply is abandoned."""
        if delay > 0 and self.fake._stopping.wait(delay):
            self.close_connection = True
            return True
        return False

    def _drop(self) -> None:
        """Close the connection without answering, as a dropped connection does."""
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def _send_json(self, status: int, data: object, extra: Mapping[str, str] | None = None) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.send_header(self.request_id_header, self.fake._request_id())
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _send_raw(self, reply: RawAnswer) -> None:
        self.send_response(reply.status)
        self.send_header("content-type", reply.content_type)
        self.send_header("content-length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)

    def _send_sse(
        self,
        events: Iterable[tuple[str | None, object]],
        chunk_delay: float = 0.0,
        *,
        done: bool = False,
    ) -> None:
        """Stream ``(event name or None, data)`` pairs, then close: with no content-length the
        body ends at EOF. ``done`` ends with ``data: [DONE]`` (as Chat Completions does); a stream
        abandoned because the server stops ends without it."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.send_header(self.request_id_header, self.fake._request_id())
        self.end_headers()
        for name, data in events:
            if chunk_delay > 0 and self.fake._stopping.wait(chunk_delay):
                return
            line = f"event: {name}\n" if name else ""
            self.wfile.write(f"{line}data: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()
        if done:
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()


class ScriptedServer(Generic[R]):
    """Serves ``R`` replies in script order (``default`` when the script is empty, a callable
    being asked with the request's body); every method is safe to call from any thread.
    Subclasses name their ``handler`` and give the ``url`` a client wants."""

    handler: ClassVar[type[ScriptedHandler]]
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

    def post(self, path: str, body: object, headers: Mapping[str, str]) -> str:
        """POST ``body`` as JSON to ``path`` on the running server and return the answer's
        text: the wire as a client receives it, for tests that check it against the
        provider's own types rather than what an SDK tolerates."""
        request = urllib.request.Request(  # noqa: S310  # this fake, on loopback
            f"{self.origin}{path}",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json", **headers},
        )
        with urllib.request.urlopen(request) as answer:  # noqa: S310
            text: str = answer.read().decode()
        return text

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
