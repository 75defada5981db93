"""A throwaway PostgreSQL cluster for tests and benchmarks of code that uses ``PostgresStore``.

Why a real server and not a mock: what ``PostgresStore`` promises (row locks between processes,
one statement per step, a restart that costs a retried call) is what PostgreSQL does, and only a
real server shows it. ``ThrowawayCluster`` runs ``initdb`` and ``pg_ctl`` from the server
binaries (Debian's ``postgresql`` package puts them in ``/usr/lib/postgresql/<version>/bin``)
in a fresh temporary directory, on a free port on 127.0.0.1, and removes everything on
``stop()``::

    with ThrowawayCluster() as cluster:
        store = PostgresStore(cluster.create_database("chat"))

Run as root (a CI container), the server runs as the ``postgres`` user, which it requires.
``fsync`` is off: a throwaway cluster's data need not survive a power cut, and tests run faster.
A cluster whose owner died without stopping it (a test run killed by ``timeout``) is stopped
and removed by the next ``ThrowawayCluster`` that starts.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Final, Self

__all__ = ["ThrowawayCluster", "find_server_binaries"]

_PREFIX: Final = "segue-pg-"
_OWNER: Final = "owner.pid"
_NAME: Final = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def find_server_binaries() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding ``initdb`` and ``pg_ctl``."""
    versions = sorted(
        (path for path in Path("/usr/lib/postgresql").glob("*/bin") if path.parent.name.isdigit()),
        key=lambda path: int(path.parent.name),
        reverse=True,
    )
    for path in versions:
        if (path / "initdb").exists() and (path / "pg_ctl").exists():
            return path
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


class ThrowawayCluster:
    """A PostgreSQL server of its own, started by ``start()`` (or ``with``), gone after
    ``stop()``. ``conninfo`` names its maintenance database; ``create_database`` makes more."""

    def __init__(self, binaries: Path | None = None) -> None:
        found = binaries or find_server_binaries()
        if found is None:
            msg = "PostgreSQL server binaries (initdb, pg_ctl) not found in /usr/lib/postgresql"
            raise FileNotFoundError(msg)
        self.binaries = found
        self.base: Path | None = None
        self.port = 0

    @property
    def conninfo(self) -> str:
        """The libpq conninfo of the ``postgres`` database (superuser ``postgres``, no password)."""
        if self.base is None:
            msg = "the cluster is not running"
            raise RuntimeError(msg)
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _tool(self, tool: str, *args: str, check: bool = True) -> None:
        """Run a server tool; as ``postgres`` when we are root (the server refuses root)."""
        command = [str(self.binaries / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        # A server started by pg_ctl writes to the log file named here, never to our pipes
        # (a pipe it inherited would never close, and reading it would wait forever).
        subprocess.run(command, check=check, capture_output=True)  # noqa: S603  # fixed binary

    def start(self) -> Self:
        """initdb in a new temporary directory, then start the server and wait for it."""
        _reap_orphans(self)
        base = Path(tempfile.mkdtemp(prefix=_PREFIX))
        (base / _OWNER).write_text(str(os.getpid()))
        if os.geteuid() == 0:
            import pwd  # noqa: PLC0415  # POSIX only, and only needed as root

            server = pwd.getpwnam("postgres")
            os.chown(base, server.pw_uid, server.pw_gid)
        self.base, self.port = base, _free_port()
        try:
            self._tool("initdb", "-D", str(base / "data"), "-U", "postgres", "--auth=trust", "-N")
            self._pg_ctl("start")
        except BaseException:
            self.stop()
            raise
        return self

    def _pg_ctl(self, action: str, *args: str) -> None:
        assert self.base is not None  # noqa: S101  # callers check
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.base} -c fsync=off"
            " -c max_connections=200"
        )
        data, log = self.base / "data", self.base / "server.log"
        self._tool("pg_ctl", "-D", str(data), "-l", str(log), "-o", options, *args, "-w", action)

    def restart(self) -> None:
        """Stop the server (fast shutdown: sessions are cut) and start it again."""
        self._pg_ctl("restart", "-m", "fast")

    def create_database(self, name: str) -> str:
        """Create database ``name`` (lower-case letters, digits, ``_``); its conninfo."""
        if not _NAME.match(name):
            msg = f"a database name here is lower-case letters, digits and _, not {name!r}"
            raise ValueError(msg)
        import psycopg  # noqa: PLC0415  # an optional dependency, needed only here

        with psycopg.connect(self.conninfo, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return self.conninfo.replace("dbname=postgres", f"dbname={name}")

    def stop(self) -> None:
        """Stop the server and remove its directory (a no-op if it is not running)."""
        base, self.base = self.base, None
        if base is None:
            return
        self._tool("pg_ctl", "-D", str(base / "data"), "-m", "fast", "stop", check=False)
        shutil.rmtree(base, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _reap_orphans(cluster: ThrowawayCluster) -> None:
    """Stop clusters of earlier runs killed before they could stop them (``timeout`` sends
    SIGTERM, which skips ``finally``). Only directories naming a dead owner are touched: a
    cluster serving a run still going on is left alone."""
    for base in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        try:
            owner = int((base / _OWNER).read_text())
        except (OSError, ValueError):
            continue
        if not _alive(owner):
            cluster._tool(
                "pg_ctl", "-D", str(base / "data"), "-m", "immediate", "stop", check=False
            )
            shutil.rmtree(base, ignore_errors=True)
