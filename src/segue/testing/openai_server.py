"""A local fake of OpenAI's Chat Completions and Responses APIs for tests.

As ``anthropic_server`` is for Anthropic: the unmodified ``openai`` client pointed at it
(``AsyncOpenAI(api_key="test", base_url=server.url)``) goes through its whole path, real HTTP
and real server-sent events, with no network and no API key. The same scripted reply is served
in the shape of whichever API was called: ``POST /v1/chat/completions`` (chunks, tool-call
arguments split in fragments by index, the usage chunk only when the request asked for it with
``stream_options.include_usage``, ``[DONE]``) or ``POST /v1/responses`` (typed events, function
calls as output items, usage in ``response.completed``).

What a test can script: text in pieces, tool calls (with arguments that are not JSON, too),
usage with cached and cache-write tokens or none at all, a ``finish_reason``, errors with
OpenAI's bodies (``context_length_exceeded``, 401, 429 with ``Retry-After``, 5xx), an error
event in a stream that had started, a stream cut before its end, a dropped connection, a
Responses stream that ends ``failed`` or ``incomplete`` (the replies and their wire shapes are
in ``openai_replies``, importable from here too). Every request is recorded; ``repr`` of a
recorded request hides the credential. Only the standard library is used
(``python -m segue.testing.openai_server`` prints its base URL and serves default replies).
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
import uuid
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, Literal, NamedTuple, Self, cast
from urllib.parse import unquote

from segue.testing.openai_replies import (
    DEFAULT_MODELS,
    Disconnect,
    ErrorReply,
    RawReply,
    Reply,
    Responder,
    Scripted,
    ToolCall,
    Usage,
    chat_chunks,
    chat_completion,
    context_length_exceeded,
    invalid_api_key,
    output_items,
    rate_limited,
    response_events,
    response_object,
    server_error,
)

_SECRET_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})


class RecordedRequest(NamedTuple):
    """One request as received: ``(method, path, headers, body)``, header names lower-cased;
    ``repr`` hides credentials, so a failing assertion never prints the API key."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any

    def __repr__(self) -> str:
        shown = {k: ("<redacted>" if k in _SECRET_HEADERS else v) for k, v in self.headers.items()}
        return (
            f"RecordedRequest({self.method!r}, {self.path!r}, "
            f"headers={shown!r}, body={self.body!r})"
        )


# --------------------------------------------------------------------------- HTTP


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a handler stuck in a long delay must never keep the process alive
    fake: FakeOpenAIServer


Api = Literal["chat", "responses"]
_APIS: dict[str, Api] = {"/v1/chat/completions": "chat", "/v1/responses": "responses"}


class _Handler(BaseHTTPRequestHandler):
    """Routes one connection's requests to the owning ``FakeOpenAIServer``."""

    protocol_version = "HTTP/1.1"  # keep-alive, like the real API; the client pools connections

    @property
    def fake(self) -> FakeOpenAIServer:
        return cast(_HTTPServer, self.server).fake

    def setup(self) -> None:
        super().setup()
        self.fake._track(self.connection, add=True)

    def finish(self) -> None:
        self.fake._track(self.connection, add=False)
        with contextlib.suppress(OSError):  # the client vanished; nothing to flush
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging: stderr noise, and headers must never be echoed."""

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
        path = self.path.split("?", 1)[0]
        self.fake._record(RecordedRequest(self.command, self.path, headers, body))
        try:
            self._route(path, body)
        except OSError:
            self.close_connection = True  # the client went away mid-reply
        except Exception as exc:  # noqa: BLE001  # a broken responder must surface in the test
            failure = ErrorReply(500, f"fake server error: {exc!r}", "server_error")
            self._send_json(500, {"error": failure.error()}, {"x-should-retry": "false"})

    def _route(self, path: str, body: Any) -> None:
        fake = self.fake
        api = _APIS.get(path)
        if self.command == "POST" and api is not None:
            wanted = {"chat": "messages", "responses": "input"}[api]
            if not isinstance(body, dict) or not {"model", wanted} <= body.keys():
                self._send_error(ErrorReply(400, f"model and {wanted} are required"))
                return
            self._answer(api, body, fake._next_reply(body))
        elif self.command == "GET" and path.startswith("/v1/models/"):
            model_id = unquote(path.removeprefix("/v1/models/"))
            spec = fake.models.get(model_id)
            if spec is None:
                message = f"The model '{model_id}' does not exist"
                self._send_error(ErrorReply(404, message, code="model_not_found"))
                return
            self._send_json(200, {"id": model_id, "object": "model", "created": 0, **spec})
        else:
            self._send_error(ErrorReply(404, f"Not found: {path}", code="not_found"))

    def _answer(self, api: Api, request: dict[str, Any], reply: Scripted) -> None:
        if reply.delay > 0 and self.fake._stopping.wait(reply.delay):
            self.close_connection = True  # the server is stopping; abandon the slow reply
            return
        if isinstance(reply, Disconnect):
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if isinstance(reply, RawReply):
            self._send_raw(reply)
            return
        stream = request.get("stream") is True
        if isinstance(reply, ErrorReply) and not (reply.mid_stream and stream):
            self._send_error(reply)
            return
        model = str(request["model"])
        if api == "chat":
            reply_id = f"chatcmpl-fake{uuid.uuid4().hex[:20]}"
            options = request.get("stream_options")
            with_usage = isinstance(options, dict) and options.get("include_usage") is True
            if isinstance(reply, ErrorReply):
                chunks = chat_chunks(Reply(), reply_id, model, with_usage=False, error=reply)
                self._send_sse((None, c) for c in chunks)
            elif stream:
                chunks = chat_chunks(reply, reply_id, reply.model or model, with_usage=with_usage)
                done = reply.cut_after is None
                self._send_sse(((None, c) for c in chunks), reply.chunk_delay, done=done)
            else:
                self._send_json(200, chat_completion(reply, reply_id, reply.model or model))
            return
        reply_id = f"resp_fake{uuid.uuid4().hex[:20]}"
        if isinstance(reply, ErrorReply):
            events = response_events(Reply(), reply_id, model, reply)
            self._send_sse((e["type"], e) for e in events)
        elif stream:
            events = response_events(reply, reply_id, reply.model or model)
            self._send_sse(((e["type"], e) for e in events), reply.chunk_delay)
        else:
            items = output_items(reply, reply_id)
            status = "incomplete" if reply.finish == "length" else "completed"
            self._send_json(
                200, response_object(reply, reply_id, reply.model or model, status, items)
            )

    def _send_error(self, error: ErrorReply) -> None:
        self._send_json(error.status, {"error": error.error()}, error.headers)

    def _send_json(self, status: int, data: object, extra: Mapping[str, str] | None = None) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.send_header("x-request-id", self.fake._request_id())
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _send_raw(self, reply: RawReply) -> None:
        self.send_response(reply.status)
        self.send_header("content-type", reply.content_type)
        self.send_header("content-length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)

    def _send_sse(
        self,
        events: Iterator[tuple[str | None, dict[str, Any]]],
        chunk_delay: float = 0.0,
        *,
        done: bool = False,
    ) -> None:
        """Stream events, then close: with no content-length the body ends at EOF. Chat
        Completions ends with ``data: [DONE]`` (``done``); a cut stream ends without it."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.send_header("x-request-id", self.fake._request_id())
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


class FakeOpenAIServer:
    """The fake API on ``127.0.0.1`` at an ephemeral port; see the module docstring.

    ``default`` answers when the script is empty; ``models`` maps model ids to the extra fields
    ``GET /v1/models/{id}`` reports (others get 404). All methods are safe from any thread.
    """

    def __init__(
        self,
        *,
        default: Scripted | Responder | None = None,
        models: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.default: Scripted | Responder = Reply() if default is None else default
        self.models: dict[str, Mapping[str, Any]] = dict(
            DEFAULT_MODELS if models is None else models
        )
        self._lock = threading.Condition()
        self._script: deque[Scripted | Responder] = deque()
        self._requests: list[RecordedRequest] = []
        self._connections: set[socket.socket] = set()
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        """Bind an ephemeral loopback port and serve from a daemon thread."""
        if self._httpd is not None:
            raise RuntimeError("FakeOpenAIServer is already running")
        self._stopping.clear()
        httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        httpd.fake = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-openai",
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
    def url(self) -> str:
        """Base URL for the client, with the ``/v1`` it expects: ``http://127.0.0.1:PORT/v1``."""
        if self._httpd is None:
            raise RuntimeError("FakeOpenAIServer is not running")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def enqueue(self, *replies: Scripted | Responder) -> None:
        """Append replies to the script; each chat or responses request consumes the first."""
        with self._lock:
            self._script.extend(replies)

    @property
    def pending(self) -> int:
        """How many scripted replies are still unused."""
        with self._lock:
            return len(self._script)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def model_requests(self) -> list[RecordedRequest]:
        """Only the requests that ask the model (chat completions and responses)."""
        paths = ("/v1/chat/completions", "/v1/responses")
        return [r for r in self.requests if r.method == "POST" and r.path.split("?", 1)[0] in paths]

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> bool:
        """Block until ``count`` requests have arrived."""
        with self._lock:
            return self._lock.wait_for(lambda: len(self._requests) >= count, timeout)

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)
            self._lock.notify_all()

    def _next_reply(self, request: dict[str, Any]) -> Scripted:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Serve default replies until SIGTERM/SIGINT, writing the base URL as the first stdout line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--text", default="ok", help="text of every reply")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each reply")
    args = parser.parse_args(argv)
    done = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    with FakeOpenAIServer(default=Reply(text=args.text, delay=args.delay)) as server:
        sys.stdout.write(server.url + "\n")
        sys.stdout.flush()
        while not done.wait(0.2):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [  # the scripted replies are importable from here, beside the server they script
    "DEFAULT_MODELS",
    "Disconnect",
    "ErrorReply",
    "FakeOpenAIServer",
    "RawReply",
    "RecordedRequest",
    "Reply",
    "Responder",
    "Scripted",
    "ToolCall",
    "Usage",
    "context_length_exceeded",
    "invalid_api_key",
    "main",
    "rate_limited",
    "server_error",
]
