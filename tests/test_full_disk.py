"""A store whose disk is full: the call fails with ``StoreFullError``, nothing is stored half-way,
nothing is wedged, and the conversation works again once there is room; the model is not called
for a step that cannot be stored, and a reply that was paid for and could not be stored is
committed on the next try, not asked for again.

The disk is a small tmpfs mounted for the test (root only: skipped otherwise, with the reason):
the SQLite file lives on it; PostgreSQL's tables are created in a tablespace on it. A filler
(a file, a table) takes the room, and is removed to give it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Final

import psycopg
import pytest

from segue import PostgresStore, Runtime, ScriptedModel, SqliteStore, Store
from segue.executor.errors import StoreFullError, StoreUnavailableError
from segue.executor.model_port import LlmReply, LlmRequest
from segue.testing.postgres import ThrowawayCluster, find_server_binaries

MODEL: Final = "claude-sonnet-4-5"
WINDOW: Final = 2_000_000


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A 4 MB tmpfs, mounted for the test where the PostgreSQL server's user can reach it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    parent = Path(tempfile.mkdtemp(prefix="segue-full-"))
    parent.chmod(0o755)
    where = parent / "small"
    where.mkdir()
    mounted = subprocess.run(  # noqa: S603  # a fixed command on our own directory
        ["/usr/bin/mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["/usr/bin/umount", "-l", str(where)], check=False)  # noqa: S603
        shutil.rmtree(parent, ignore_errors=True)


class Counting(ScriptedModel):
    """The scripted model, answering ``reply`` and counting what it was asked."""

    def __init__(self, reply: str) -> None:
        super().__init__()
        self.reply = reply
        self.calls = 0

    async def complete(self, request: LlmRequest) -> LlmReply:
        self.calls += 1
        return LlmReply(text=self.reply)


Step = Callable[[], Awaitable[None]]


async def send_until_full(rt: Runtime, conversation_id: str) -> None:
    """Send large messages until the store refuses one (what room the filler left goes)."""
    for _ in range(50):
        await rt.send(conversation_id, secrets.token_hex(100_000))


async def full_then_room(store: Store, fill: Step, some_room: Step, free: Step) -> None:
    """The scenario on ``store``: ``fill()`` takes the room, ``some_room()`` gives back a
    little (a question's worth, not a long reply's), ``free()`` all of it."""
    model = Counting("A short answer.")
    async with Runtime(store=store, llm=model) as rt:
        conv = await rt.create_conversation(model=MODEL, context_window=WINDOW)
        await rt.send(conv.id, "hello")
        before = await rt.conversation(conv.id)
        await fill()
        with pytest.raises(StoreFullError) as full:
            await send_until_full(rt, conv.id)
        assert isinstance(full.value, StoreUnavailableError)
        assert "full" in str(full.value)
        after = await rt.conversation(conv.id)
        # Whatever landed before the disk filled is whole; the refused step left nothing.
        assert after.state.phase.kind == "idle"
        assert len(await rt.messages(conv.id)) == after.last_seq >= before.last_seq
        assert len(await rt.store.transitions(conv.id)) == after.version - 1
        calls = model.calls
        with pytest.raises(StoreFullError):
            await rt.send(conv.id, secrets.token_hex(100_000))  # no room for it either
        assert model.calls == calls  # not asked: the step could not be stored

        # A reply too large for the room left: paid for once, kept, committed once there is
        # room, not asked for again.
        model.reply = secrets.token_hex(500_000)
        await some_room()
        with pytest.raises(StoreFullError):
            await rt.send(conv.id, "a question with a long answer")
        assert model.calls == calls + 1
        assert (await rt.state(conv.id)).phase.kind == "llm_requesting"
        await free()
        await rt.recover()
        assert model.calls == calls + 1  # not paid again
        assert await rt.last_reply(conv.id) == model.reply
        model.reply = "Back."
        state = await rt.send(conv.id, "are you there?")
        assert state.phase.kind == "idle"
        assert await rt.last_reply(conv.id) == "Back."


def test_a_full_disk_fails_sqlite_calls_cleanly_and_room_brings_it_back(small_disk: Path) -> None:
    filler = small_disk / "filler"

    async def fill() -> None:
        with filler.open("wb") as handle, contextlib.suppress(OSError):
            while True:
                handle.write(b"\0" * 65_536)
                handle.flush()

    async def some_room() -> None:
        os.truncate(filler, max(0, filler.stat().st_size - 256 * 1024))

    async def free() -> None:
        filler.unlink(missing_ok=True)

    store = SqliteStore(small_disk / "segue.db")
    asyncio.run(full_then_room(store, fill, some_room, free))


def test_a_full_tablespace_fails_postgres_calls_cleanly_and_room_brings_it_back(
    small_disk: Path,
) -> None:
    if find_server_binaries() is None:
        pytest.skip("PostgreSQL server binaries not found in /usr/lib/postgresql")
    postgres = pwd.getpwnam("postgres")
    os.chown(small_disk, postgres.pw_uid, postgres.pw_gid)
    with ThrowawayCluster() as cluster:
        url = cluster.create_database("fulldisk")
        with psycopg.connect(cluster.conninfo, autocommit=True) as admin:
            admin.execute(f"CREATE TABLESPACE small LOCATION '{small_disk}'")
            admin.execute("ALTER DATABASE fulldisk SET default_tablespace = small")

        def fill_table(conn: psycopg.Connection[tuple[object, ...]], table: str, rows: int) -> None:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (data text)")
            with contextlib.suppress(psycopg.errors.DiskFull):
                for _ in range(rows):
                    conn.execute(
                        f"INSERT INTO {table} SELECT string_agg(md5(random()::text), '')"  # noqa: S608
                        " FROM generate_series(1, 200)"
                    )

        async def fill() -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                fill_table(conn, "spare", 40)  # about 256 kB, for some_room()
                fill_table(conn, "filler", 1_000_000)

        async def some_room() -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("DROP TABLE IF EXISTS spare")

        async def free() -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("DROP TABLE IF EXISTS filler")

        asyncio.run(full_then_room(PostgresStore(url), fill, some_room, free))
