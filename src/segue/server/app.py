"""The reference server: segue's ``Runtime`` over HTTP, and the page that uses it.

A thin adapter (routes translate HTTP to ``Runtime`` calls and ``Runtime.stream`` updates to
Server-Sent Events, nothing more): every rule about conversations lives in the library. Each
group of routes is a router of its own, included here behind the token: ``conversations``
(create, list, read), ``streams`` (a turn's updates, a conversation's events), ``control``
(continue, cancel, pause, resume), ``lineage`` (snapshots, the chain, the child) and ``data``
(metadata, deletion, export, import, retention). Errors are
one JSON shape (``errors``); what every request passes first (the host, the origin, the body's
type and size, the security headers) is ``guard``; the page is ``pages``; the runtime's start
and stop with the app's is ``lifecycle``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from fastapi import Depends, FastAPI

from segue._version import __version__
from segue.executor.models.scripted import ScriptedModel
from segue.executor.runtime import Runtime
from segue.server import control, conversations, data, errors, health, lineage, pages, streams
from segue.server.auth import bearer, requires_json
from segue.server.ending import StreamsEnd
from segue.server.errors import ApiError
from segue.server.guard import BodyLimit, CrossSiteCheck, HostCheck, Shield
from segue.server.lifecycle import StartOnFirstRequest, Startup
from segue.server.metrics import Metrics
from segue.server.metrics import router as metrics_router
from segue.server.pausing import Pauses
from segue.server.schemas import Info
from segue.server.tracing import ContinueTrace, tracing_installed
from segue.statemachine import ContextExhaustionBehavior

MAX_BODY: Final = 8 * 1024 * 1024
"""Bytes a request body may hold: far more than any message a window can take."""
DEFAULT_MODEL: Final = "claude-sonnet-4-6"
"""The model of a conversation created without one, unless ``info`` says otherwise."""


def default_info(runtime: Runtime) -> Info:
    """What a server over ``runtime`` says about itself when the application did not say."""
    return Info(
        version=__version__,
        offline=isinstance(runtime.llm, ScriptedModel),
        model=DEFAULT_MODEL,
        behavior=ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION,
    )


def create_app(
    runtime: Runtime,
    *,
    info: Info | None = None,
    token: str | None = None,
    allowed_hosts: Iterable[str] = (),
    metrics: Metrics | None = None,
) -> FastAPI:
    """The API and the page over ``runtime``.

    ``info``: what ``/api/info`` says and what a new conversation gets when the request leaves
    it out (default: ``default_info(runtime)``). ``token``: required as ``Authorization:
    Bearer`` on every API route and on ``/openapi.json`` (an empty one is refused: it would let
    anyone in). Without a token only requests to a loopback name (``localhost``, 127.0.0.1,
    ``[::1]``), to ``testserver`` (Starlette's ``TestClient``, a name no browser reaches through
    DNS) or to one of ``allowed_hosts`` are answered. ``/healthz`` and ``/readyz`` answer
    without the token, to any name (probes have neither).

    The runtime is entered (``recover()``) when the app starts and closed when it stops (and
    opened again if the app starts again: one app, many ``TestClient``s). Mounted
    in another app (``parent.mount("/segue", app)``), whose lifespan does not run this one's,
    include it in the parent's (``FastAPI(lifespan=app.router.lifespan_context)``); left out,
    the recovery starts with the first request instead, and the runtime is the application's to
    close. While the app serves, work another process left orphaned is taken over every lease.

    ``metrics`` (``server.metrics.prometheus()``, whose meter provider the runtime must use):
    ``/metrics`` in Prometheus' text format, behind the token. With OpenTelemetry installed, a
    request's ``traceparent`` is continued: the turn it starts is part of the caller's trace.
    """
    if token is not None and not token.strip():
        msg = "token is empty: give a real one, or None for a server only this machine reaches"
        raise ValueError(msg)
    shown = info or default_info(runtime)
    start = Startup(runtime)
    pauses = Pauses(runtime)
    end = StreamsEnd()
    app = FastAPI(
        title="segue",
        version=shown.version,
        description="Conversations that carry on across the context-window limit.",
        lifespan=start.lifespan(pauses, end),
        openapi_url=None,  # served below, behind the token
        docs_url=None,  # FastAPI's docs pages load their scripts from a CDN; this works offline
        redoc_url=None,
    )
    app.state.streams_end = end  # called by the server that runs the app as it stops
    errors.install(app)
    pages.install(app)
    app.include_router(health.router(runtime, start))  # probes carry no token
    _routes(app, runtime, shown, pauses, end, guard=Depends(bearer(token)), metrics=metrics)
    _middleware(app, start, token=token, allowed_hosts=allowed_hosts)
    return app


def _routes(
    app: FastAPI,
    runtime: Runtime,
    shown: Info,
    pauses: Pauses,
    end: StreamsEnd,
    *,
    guard: Any,
    metrics: Metrics | None,
) -> None:
    """The API's routes, each behind ``guard`` (the token), and the schema behind it too."""
    checks = [guard, Depends(requires_json)]
    views = conversations.StateViews(runtime)
    app.include_router(conversations.router(runtime, views, shown), dependencies=checks)
    app.include_router(streams.router(runtime, views, end), dependencies=checks)
    app.include_router(control.router(runtime, views, pauses), dependencies=checks)
    app.include_router(lineage.router(runtime, views), dependencies=checks)
    app.include_router(data.router(runtime, views), dependencies=checks)
    if metrics is not None:
        app.include_router(metrics_router(metrics), dependencies=[guard])

    @app.get("/openapi.json", include_in_schema=False, dependencies=[guard])
    async def schema() -> dict[str, Any]:
        return app.openapi()


def _middleware(
    app: FastAPI, start: Startup, *, token: str | None, allowed_hosts: Iterable[str]
) -> None:
    """What every request passes before a route sees it (``guard``), and the startup work of an
    app no lifespan started."""
    # Outermost last: the headers on everything, then the host, the origin, the body's size,
    # then the caller's trace the route runs in.
    if tracing_installed():
        app.add_middleware(ContinueTrace)
    app.add_middleware(BodyLimit, limit=MAX_BODY)
    app.add_middleware(CrossSiteCheck)
    app.add_middleware(
        HostCheck, open_to_any=token is not None, also=allowed_hosts, exempt=health.PATHS
    )
    app.add_middleware(StartOnFirstRequest, startup=start)
    app.add_middleware(Shield)


__all__ = ["DEFAULT_MODEL", "ApiError", "create_app", "default_info"]
