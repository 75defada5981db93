"""Listing a user's conversations among many: a page's time, on SQLite and PostgreSQL.

Run ``python bench/bench_listing.py [--quick] [--store sqlite|postgres|both]``. The store is
filled with ``TOTAL`` conversations (10,000 with ``--quick``) through ``Store.create``, one in a
hundred labelled ``{"user": "u-17"}`` and the others spread over other users, then asked for:

- a user's first page of 50 (``list_page(metadata={"user": "u-17"})``), and the page after 10
  pages of theirs (a cursor deep into their list);
- everyone's first page of 50, and one 10 pages in.

Each is the median of ``REPEATS`` calls. Target: a user's first page under 20 ms. Prints
PASS/FAIL per target and exits 1 if it is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from segue import PostgresStore, SqliteStore, Store, new_conversation
from segue.testing.postgres import ThrowawayCluster

TOTAL = 100_000
USERS = 100
TARGET_MS = 20.0
REPEATS = 21
CHUNK = 500


async def fill(store: Store, total: int) -> None:
    """``total`` conversations, created ``CHUNK`` at a time (SQLite writes those of one turn of
    the loop in one transaction; PostgreSQL spreads them over its pool)."""
    for first in range(0, total, CHUNK):
        await asyncio.gather(
            *(
                store.create(
                    new_conversation(model="claude-sonnet-4-5", conversation_id=f"c{n}"),
                    system=None,
                    at=float(n),
                    metadata={"user": f"u-{n % USERS}", "title": f"Conversation {n}"},
                )
                for n in range(first, min(first + CHUNK, total))
            )
        )


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    """The median of ``REPEATS`` calls, in milliseconds."""
    took = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        await call()
        took.append((time.perf_counter() - started) * 1e3)
    return statistics.median(took)


async def deep(store: Store, metadata: Mapping[str, str] | None) -> str | None:
    """The cursor 10 pages of 50 in."""
    cursor = None
    for _ in range(10):
        cursor = (await store.list_page(metadata=metadata, limit=50, cursor=cursor)).next_cursor
    return cursor


@asynccontextmanager
async def stores(which: str, tmp: Path) -> AsyncIterator[list[tuple[str, Callable[[], Store]]]]:
    made: list[tuple[str, Callable[[], Store]]] = []
    if which in ("sqlite", "both"):
        made.append(("SqliteStore", lambda: SqliteStore(tmp / "listing.db")))
    if which in ("postgres", "both"):
        with ThrowawayCluster() as cluster:
            url = cluster.create_database("listing")
            made.append(("PostgresStore", lambda: PostgresStore(url)))
            yield made
        return
    yield made


async def measure(name: str, store: Store, total: int) -> bool:
    """Fill ``store``, print its pages' times; whether the target was met."""
    user = {"user": "u-17"}
    started = time.perf_counter()
    await fill(store, total)
    print(f"{name}: filled in {time.perf_counter() - started:,.1f} s")
    first = await timed(lambda: store.list_page(metadata=user, limit=50))
    ok = first < TARGET_MS
    print(
        f"{name} a user's first page of 50: {first:,.2f} ms "
        f"(target < {TARGET_MS:g} ms) {'PASS' if ok else 'FAIL'}"
    )
    cursor = await deep(store, user)
    later = await timed(lambda: store.list_page(metadata=user, limit=50, cursor=cursor))
    print(f"{name} a user's 11th page of 50: {later:,.2f} ms")
    everyone = await timed(lambda: store.list_page(limit=50))
    print(f"{name} everyone's first page of 50: {everyone:,.2f} ms")
    cursor = await deep(store, None)
    later = await timed(lambda: store.list_page(limit=50, cursor=cursor))
    print(f"{name} everyone's 11th page of 50: {later:,.2f} ms")
    return ok


async def main(quick: bool, which: str) -> int:
    total = TOTAL // 10 if quick else TOTAL
    failures = 0
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    print(f"load average {load:.2f} on {cpus} CPUs; {total:,} conversations, {USERS} users")
    with tempfile.TemporaryDirectory() as tmp:
        async with stores(which, Path(tmp)) as made:
            for name, make in made:
                store = make()
                try:
                    failures += not await measure(name, store, total)
                finally:
                    await store.close()
    return 1 if failures else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the conversations")
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    arguments = parser.parse_args()
    sys.exit(asyncio.run(main(arguments.quick, arguments.store)))
