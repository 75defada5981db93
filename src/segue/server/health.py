"""What load balancers and orchestrators ask: is the process alive (``/healthz``), and can it
serve (``/readyz``: the store answers and the startup recovery is done).

Both answer without the token (a probe has none) and whatever name the request is addressed to
(a probe addresses the pod's IP), touch no conversation, and say nothing more than the state
and, when not ready, why in a few words (an error's type, never its text, which may name a
database host or a path).
"""

from __future__ import annotations

import asyncio
from typing import Any, Final, Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel

from segue.executor.errors import ConversationNotFoundError
from segue.executor.runtime import Runtime
from segue.server.lifecycle import Startup

PROBE_TIMEOUT: Final = 5.0
"""Seconds the store has to answer ``/readyz``'s read before the server is reported not ready."""
PROBE_ID: Final = "segue-readiness-probe"
"""The id ``/readyz`` reads: the store answers for it (found or not) without touching any
conversation's rows."""
PATHS: Final = frozenset({"/healthz", "/readyz"})
"""The probes' paths: open to any host name (``guard.HostCheck``) and to no token."""


class Health(BaseModel):
    """A probe's answer."""

    status: Literal["ok", "unavailable"]
    reason: str | None = None
    """Why the server cannot serve yet (``unavailable`` only)."""


def router(runtime: Runtime, startup: Startup) -> APIRouter:
    """``/healthz`` and ``/readyz`` over ``runtime``, whose startup work ``startup`` runs."""
    routes = APIRouter(tags=["health"])
    unavailable: dict[int | str, dict[str, Any]] = {
        503: {"model": Health, "description": "Not ready, with the reason."}
    }

    @routes.get("/healthz")
    async def alive() -> Health:
        """The process is alive and answers (nothing else is checked)."""
        return Health(status="ok")

    @routes.get("/readyz", responses=unavailable)
    async def ready(response: Response) -> Health:
        """The store answers and the startup recovery is done; else 503 with the reason."""
        reason = startup.problem if not startup.recovered else await _store_silent(runtime)
        if not startup.recovered and reason is None:
            reason = "the startup recovery is under way"
        if reason is None:
            return Health(status="ok")
        response.status_code = 503
        return Health(status="unavailable", reason=reason)

    return routes


async def _store_silent(runtime: Runtime) -> str | None:
    """Why the store does not answer a read, or None when it does."""
    try:
        await asyncio.wait_for(runtime.store.load(PROBE_ID), PROBE_TIMEOUT)
    except ConversationNotFoundError:
        return None
    except TimeoutError:
        return f"the store did not answer within {PROBE_TIMEOUT:g} s"
    except Exception as error:  # noqa: BLE001  # any failure is the answer: not ready
        return f"the store cannot be reached ({type(error).__name__})"
    return None


__all__ = ["PATHS", "Health", "router"]
