"""``bench/bench_workers.py --quick`` runs to the end and reports every figure.

Timings depend on the machine, so they are never asserted here. What is asserted is what the
bench checks in its database and that does not depend on timing: every contention run (8
processes, 4 shared conversations) made one model call per stored reply, lost nothing, stored
nothing twice and left nothing busy.
"""

from __future__ import annotations

import re

import pytest

from scripts import run_script
from segue.testing.postgres import find_server_binaries

FIGURES = r"[\d,]+ transitions/s, CPU [\d.]+ ms/transition, turn p50 [\d.]+ ms p99 [\d.]+ ms"
HONEST = r"1\.00 calls/reply, 0 lost, 0 stored twice, 0 errors, 0 left busy PASS$"


@pytest.mark.slow
def test_quick_run_reports_every_figure() -> None:
    result = run_script("bench/bench_workers.py", "--quick", timeout=600)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    kinds = ["sqlite"] + (["postgres"] if find_server_binaries() is not None else [])
    for kind in kinds:
        section = out[out.index(f"{kind}: workers") :]
        for workers in ("1 worker :", "2 workers:"):
            assert re.search(rf"this checkout\s+{workers}\s+{FIGURES}", section), out
        assert re.search(rf"this checkout\s+contention .*: {HONEST}", section, re.M), out
    if "postgres" in kinds:
        assert re.search(r"^PostgreSQL CPU per transition with 1 and 2 workers", out, re.M)
