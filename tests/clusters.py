"""One throwaway PostgreSQL cluster per test module that asks for it (``from clusters import
cluster``), skipped where the server binaries are not installed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from segue.testing.postgres import ThrowawayCluster, find_server_binaries


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayCluster]:
    if find_server_binaries() is None:
        pytest.skip("PostgreSQL server binaries not found in /usr/lib/postgresql")
    with ThrowawayCluster() as running:
        yield running
