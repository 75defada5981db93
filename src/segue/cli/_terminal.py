"""The chat's terminal: stdin's lines read without holding the process up, and Ctrl-C that
ends the chat at once (a second one even while it closes)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

import typer
from rich.console import Console


class StdinLines:
    """Stdin's lines for the event loop, each read when asked for by a daemon thread.

    Not ``asyncio.to_thread``: its worker is joined when the loop and the interpreter shut
    down, so a Ctrl-C at the prompt waited for Enter while that worker sat in ``readline``. A
    daemon thread is left behind instead, and the process ends at once. It reads the file
    descriptor itself (``os.read``), never ``sys.stdin``'s buffer, whose lock a daemon thread
    must not hold while the interpreter shuts down."""

    def __init__(self, out: Console) -> None:
        self._out = out
        self._loop = asyncio.get_running_loop()
        self._lines: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self._wanted = threading.Semaphore(0)
        try:
            self._fd: int | None = sys.stdin.fileno()
        except (AttributeError, OSError, ValueError):  # no descriptor (a test's stdin)
            self._fd = None
        thread = threading.Thread(target=self._read, name="segue-chat-stdin", daemon=True)
        thread.start()

    def _raw_lines(self) -> Iterator[bytes]:
        """Stdin's lines as bytes, each with its newline (the last one may have none)."""
        if self._fd is None:
            yield from iter(sys.stdin.buffer.readline, b"")
            return
        pending = b""
        while chunk := os.read(self._fd, 65536):
            pending += chunk
            while (end := pending.find(b"\n")) >= 0:
                yield pending[: end + 1]
                pending = pending[end + 1 :]
        if pending:
            yield pending

    def _read(self) -> None:
        raw_lines = self._raw_lines()
        while True:
            self._wanted.acquire()
            raw = next(raw_lines, b"")
            line: str | bytes | None
            try:
                line = raw.decode("utf-8") if raw else None
            except UnicodeDecodeError:
                line = raw
            try:
                self._loop.call_soon_threadsafe(self._lines.put_nowait, line)
            except RuntimeError:  # the chat is over and its loop closed
                return
            if line is None:
                return

    async def next(self) -> str | bytes | None:
        """The next line (None at the end of input), as text, or bytes if it is not UTF-8."""
        if sys.stdin.isatty():
            self._out.print("you> ", end="")
        self._wanted.release()
        return await self._lines.get()


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C ends the chat at once, from the prompt or mid-turn (what the turn left pending is
    finished by the next run, as after any stop); a second Ctrl-C while it closes (the store
    waiting on a lock, say) ends the process there and then."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    interrupts = 0

    def on_interrupt() -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1:
            os.write(2, b"\nstopped at once\n")
            os._exit(130)
        typer.echo("\nstopping (Ctrl-C again stops at once)", err=True)
        if task is not None:
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, on_interrupt)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
        yield
        return
    try:
        yield
    except asyncio.CancelledError:
        if interrupts:
            raise KeyboardInterrupt from None  # ``run`` says "interrupted", exit 130
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)


__all__ = ["StdinLines", "interruptible"]
