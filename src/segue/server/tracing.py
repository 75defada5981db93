"""A caller's trace, continued: the turn a request starts is a child of the caller's span.

When a request carries W3C trace context (``traceparent``, ``tracestate``) and OpenTelemetry is
installed, the request is handled in that context, so the ``segue.turn`` span of the message it
sends (and the model calls and tools under it) belong to the caller's trace. Without
OpenTelemetry the middleware is not installed at all.
"""

from __future__ import annotations

import importlib.util
from typing import Any


def tracing_installed() -> bool:
    """Whether OpenTelemetry's API is installed (the ``otel`` extra)."""
    try:
        return importlib.util.find_spec("opentelemetry") is not None
    except ImportError:
        return False


class ContinueTrace:
    """ASGI middleware: an HTTP request with ``traceparent`` runs in the context it names."""

    def __init__(self, app: Any) -> None:
        from opentelemetry import context, propagate  # noqa: PLC0415  # only with the extra

        self.app = app
        self._context = context
        self._propagate = propagate

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name in (b"traceparent", b"tracestate")
        }
        if "traceparent" not in headers:
            await self.app(scope, receive, send)
            return
        token = self._context.attach(self._propagate.extract(headers))
        try:
            await self.app(scope, receive, send)
        finally:
            self._context.detach(token)
