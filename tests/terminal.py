"""A program run in a pseudo-terminal, as a person runs it: the pty is its controlling terminal,
so Ctrl-C typed there is the terminal's SIGINT to it, not a signal the test sends."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass, field

# Started by a small launcher: a new session, the pty made its controlling terminal, then the
# program (Popen's own start_new_session would leave it without one).
_LAUNCHER = (
    "import fcntl, os, sys, termios; os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)
CTRL_C = b"\x03"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
"""Terminal escapes (colours, cursor moves, titles): not part of what a person reads."""


@dataclass
class Terminal:
    process: subprocess.Popen[bytes]
    master: int
    output: bytearray = field(default_factory=bytearray)

    def read_until(self, wanted: str, timeout: float = 60) -> str:
        """Everything shown so far once ``wanted`` has been; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while wanted.encode() not in self.output:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {wanted!r} in {self.text()!r}"
            if not self._read(left):
                assert wanted.encode() in self.output, f"ended without {wanted!r}: {self.text()!r}"
        return self.text()

    def _read(self, timeout: float) -> bool:
        """Read what is there (waiting up to ``timeout``); False once the program is gone."""
        ready, _, _ = select.select([self.master], [], [], min(timeout, 0.5))
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: every end of the terminal closed
            return False
        self.output += chunk
        return bool(chunk)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def ended(self, timeout: float = 60) -> int:
        """The exit status once the program has ended (reading what it shows meanwhile)."""
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            left = deadline - time.monotonic()
            assert left > 0, f"still running after {timeout}s: {self.text()!r}"
            self._read(left)
        while self._read(0.1):
            pass
        return self.process.returncode

    def text(self) -> str:
        return self.output.decode("utf-8", "replace")

    def lines(self) -> list[str]:
        """What was shown, line by line, without colours and cursor codes."""
        return [ANSI.sub("", line) for line in self.text().replace("\r", "").split("\n")]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        os.close(self.master)


def spawn(*args: str, env: dict[str, str], cwd: str, columns: int = 80) -> Terminal:
    """Run ``args`` in a new pseudo-terminal ``columns`` wide (24 lines)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    process = subprocess.Popen(  # noqa: S603  # our own interpreter, our own launcher
        [sys.executable, "-c", _LAUNCHER, *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=cwd,
        close_fds=True,
    )
    os.close(slave)
    return Terminal(process, master)
