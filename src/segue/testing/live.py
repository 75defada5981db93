"""Run an ASGI application (the reference server, or a backend built on segue) on a free
loopback port in a background thread, for tests over real HTTP.

    with live_server(create_app(runtime, info=info)) as url:
        httpx2.get(f"{url}/api/conversations")

The server runs in its own thread with its own event loop, as it would in production, so the
test talks to it only over the socket. Requires uvicorn (the ``server`` extra).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def live_server(app: Any, *, startup_timeout: float = 30.0) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 at a free port until the block ends; yields its base URL."""
    import uvicorn  # noqa: PLC0415  # the server extra's dependency, only when used

    from segue.server.ending import streams_end  # noqa: PLC0415  # the server extra's too

    # The standard asyncio loop and h11 whatever else is installed: uvicorn[standard] brings
    # uvloop, whose loop run in a thread other than the main one fails to close cleanly.
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="on",
        loop="asyncio",
        http="h11",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="segue-live-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            msg = "the server did not start"
            raise RuntimeError(msg)
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        end = streams_end(app)
        if end is not None:  # a page left open: its watch stream ends, as under segue serve
            end()
        server.should_exit = True
        thread.join(timeout=30)
