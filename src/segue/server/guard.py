"""What every request passes before a route sees it: pure ASGI middleware, so a streamed
response (Server-Sent Events) goes through untouched.

- ``Shield`` puts the security headers on every response, page and API alike (a page that
  cannot be framed, runs only its own scripts and sends no referrer).
- ``HostCheck`` answers only requests addressed to this machine by a loopback name unless a
  token protects the API: a page on a rebinding hostname (``evil.example`` resolving to
  127.0.0.1) reaches the port, but its requests carry its own ``Host``.
- ``CrossSiteCheck`` refuses a state-changing request from another site: its ``Origin`` must be
  this server's (or absent, as from curl or a program). Its body must also be JSON, which a
  cross-site HTML form cannot send: that is the routes' own requirement (``auth.requires_json``),
  so that a method a path does not take is answered 405.
- ``BodyLimit`` counts a request body's bytes as the app reads them (an import's document may
  be larger than any other body).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any, Final
from urllib.parse import urlsplit

from segue.server.schemas import ErrorBody

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]

CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'none'; object-src 'none'"
)
"""Only the page's own files: no inline script, no framing, no plugin, nowhere else to load
from or post to."""
SECURITY_HEADERS: Final = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
STATE_CHANGING: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES: Final = frozenset({"localhost"})
LARGER_BODIES: Final[Mapping[str, int]] = {"/api/conversations/import": 64 * 1024 * 1024}
"""Paths whose body may pass the app's bound, and by how much: an export of a long
conversation (its whole transcript and event log) easily holds more than any message."""
TEST_CLIENT_NAMES: Final = frozenset({"testserver"})
"""The host Starlette's ``TestClient`` addresses (as FastAPI's docs write tests): a single
label, which no browser page reaches through DNS, so a rebinding page cannot use it."""


async def send_error(
    send: Send, status: int, code: str, message: str, *, close: bool = False
) -> None:
    """Answer with the API's error shape, from middleware (before any route runs); ``close``:
    the connection is closed after it (a body was left unread)."""
    body = ErrorBody(error=code, message=message).model_dump_json(exclude_none=True).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, name: bytes) -> str | None:
    """A request header's value (latin-1, as HTTP sends it), or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def host_name(host: str) -> str:
    """The name in a ``Host`` header's value, without the port: ``[::1]:8000`` -> ``::1``."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback_name(name: str) -> bool:
    """Whether ``name`` can only mean this machine: ``localhost``, 127.0.0.0/8, ``::1``."""
    if name.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Shield:
    """The security headers on every HTTP response (the app's, the errors', the 413)."""

    def __init__(self, app: Asgi) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def shielded(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, shielded)


class HostCheck:
    """Refuse (403) a request whose ``Host`` is not a loopback name (or ``testserver``), unless
    ``open`` (a token guards the API, so any name may reach it), the name is one of ``also``,
    or the path is one of ``exempt`` (the health probes, which say nothing of conversations)."""

    def __init__(
        self,
        app: Asgi,
        *,
        open_to_any: bool,
        also: Iterable[str] = (),
        exempt: Iterable[str] = (),
    ) -> None:
        self.app = app
        self.open_to_any = open_to_any
        self.also = TEST_CLIENT_NAMES | frozenset(name.lower() for name in also)
        self.exempt = frozenset(exempt)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.open_to_any or _app_path(scope) in self.exempt:
            await self.app(scope, receive, send)
            return
        host = header(scope, b"host")
        name = host_name(host).lower() if host else ""
        if not name or not (is_loopback_name(name) or name in self.also):
            message = (
                f"this server answers requests to localhost only, not to {host or 'no host'!r} "
                "(serve with a token to be reached by other names)"
            )
            await send_error(send, 403, "forbidden", message)
            return
        await self.app(scope, receive, send)


def _app_path(scope: Scope) -> str:
    """The request's path within the app (without the prefix it is mounted under)."""
    path, root = str(scope.get("path", "")), str(scope.get("root_path", ""))
    return path[len(root) :] if root and path.startswith(root) else path


class CrossSiteCheck:
    """Refuse a state-changing request from another site (403)."""

    def __init__(self, app: Asgi) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in STATE_CHANGING:
            await self.app(scope, receive, send)
            return
        origin = header(scope, b"origin")
        if origin is not None and not _same_site(origin, scope):
            message = f"a request from {origin!r} cannot change anything here"
            await send_error(send, 403, "forbidden", message)
            return
        await self.app(scope, receive, send)


def _same_site(origin: str, scope: Scope) -> bool:
    """Whether ``origin`` names this server as the request reached it (its ``Host``)."""
    host = header(scope, b"host")
    if not host or origin == "null":
        return False
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    return _with_port(parts.netloc, parts.scheme) == _with_port(host, scope.get("scheme", "http"))


def _with_port(netloc: str, scheme: str) -> str:
    """``netloc`` lowercased with its port written out (``localhost`` -> ``localhost:80``)."""
    netloc = netloc.lower()
    bare = netloc.rsplit("]", 1)[-1] if netloc.startswith("[") else netloc
    if ":" in bare:
        return netloc
    return f"{netloc}:{443 if scheme in ('https', 'wss') else 80}"


class BodyLimit:
    """Count a request body's bytes as the app reads them: past ``limit`` (or the path's own in
    ``larger``) it answers 413 itself, and the app reads a disconnect (whatever the app then
    tries to answer is dropped). A body sent in chunks has no ``Content-Length`` to refuse it
    by; one that has is refused at once."""

    def __init__(self, app: Asgi, *, limit: int, larger: Mapping[str, int] = LARGER_BODIES) -> None:
        self.app = app
        self.limit = limit
        self.larger = larger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.larger.get(_app_path(scope), self.limit)
        length = header(scope, b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await self._too_large(send, limit)
            return
        seen = 0
        refused = False

        async def counted() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    refused = True
                    await self._too_large(send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, counted, guarded)

    async def _too_large(self, send: Send, limit: int) -> None:
        message = f"a request body may hold {limit:,} bytes"
        await send_error(send, 413, "too_large", message, close=True)  # the rest goes unread
