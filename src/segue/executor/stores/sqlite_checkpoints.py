"""``SqliteStore``'s checkpoints: the WAL copied into the database beside the writes.

Why not SQLite's own: its automatic checkpoint runs inside the COMMIT that crosses its
threshold, and syncs and copies the WAL: ~10 ms every few hundred steps, which every write
waited for. ``Runner`` turns it off and, after about ``CHECKPOINT_PAGES`` pages of writes, asks
this thread for one.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable


class Checkpoints:
    """A thread that checkpoints the WAL when asked, on a connection of its own, so that writes
    go on meanwhile (on the loop or in the store's thread).

    First a passive checkpoint, which never holds up a writer: it copies what was committed
    when it started, the bulk of the WAL. Then a restarting one for what landed meanwhile: it
    takes the write lock for that short copy (a write coming then goes to the store's thread,
    which waits), so that the next write starts the WAL from its beginning. Without that, under
    a steady stream of writes the WAL would never be caught up at the moment a write begins,
    and would grow for as long as they go on.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._wanted = threading.Event()
        self._stopping = False
        self.thread: threading.Thread | None = None

    def ask(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(
                target=self._serve, name="segue-sqlite-checkpoint", daemon=True
            )
            self.thread.start()
        self._wanted.set()

    def stop(self) -> None:
        self._stopping = True
        self._wanted.set()

    def _serve(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                if self._stopping:
                    return
                with contextlib.suppress(sqlite3.Error):  # a file gone, a locked WAL: next time
                    conn = conn or self._connect()
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    # Busy (another process reading or writing for long): not restarted this
                    # time, the next checkpoint tries again.
                    conn.execute("PRAGMA wal_checkpoint(RESTART)")
        finally:
            if conn is not None:
                conn.close()
