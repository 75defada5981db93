"""``segue serve`` as a separate process, as a user starts it: the installed console script on a
free port, its URL once it answers, and a stop that ends it however it went."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx2

STARTS_WITHIN = 60.0
"""Seconds a server may take to answer its first request (a loaded machine, a new database)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def segue_serve(
    *args: str, env: dict[str, str] | None = None, said: list[str] | None = None
) -> Iterator[str]:
    """``segue serve ARGS --port P`` until the block ends; yields its base URL once
    ``/api/info`` answers. The process is stopped with Ctrl-C's signal, killed if it lingers;
    what it printed on stdout is then added to ``said``."""
    segue = shutil.which("segue")
    assert segue is not None, "the console script is not installed (pip install -e .)"
    port = free_port()
    environment = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    server = subprocess.Popen(  # noqa: S603  # the installed console script, no shell
        [segue, "serve", *args, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**environment, **(env or {})},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTS_WITHIN
        while True:
            try:
                httpx2.get(f"{base}/api/info", timeout=2).raise_for_status()
                break
            except httpx2.TransportError:
                assert server.poll() is None, server.communicate()
                assert time.monotonic() < deadline, "segue serve did not start"
                time.sleep(0.1)
        yield base
    finally:
        server.terminate()
        try:
            out, err = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            out, err = server.communicate()
        if said is not None:
            said.append(out)
        assert "Traceback" not in err, err


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    """``app`` served in this process as ``segue serve`` serves it (its listening socket, whose
    connections' send buffers are bounded), until the block ends; yields its base URL."""
    import uvicorn

    from segue.server.ending import streams_end
    from segue.server.run import listening_socket

    listener = listening_socket("127.0.0.1", 0)
    config = uvicorn.Config(app, log_level="warning", loop="asyncio", http="h11")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTS_WITHIN
    while not server.started:
        assert thread.is_alive(), "the server did not start"
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        end = streams_end(app)
        if end is not None:
            end()
        server.should_exit = True
        thread.join(timeout=30)
        listener.close()
