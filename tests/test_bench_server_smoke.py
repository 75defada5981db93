"""``bench/bench_server.py --quick`` runs to the end and reports every figure.

Timings depend on the machine, so they are never asserted here; the numbers are the bench's to
print (and the closing note's to quote).
"""

from __future__ import annotations

import re

import pytest

from scripts import run_script

REPORT_LINES = (
    r"^10 concurrent SSE clients, one turn each \(scripted model, SQLite\)$",
    r"^Over HTTP \(segue serve\): first text p50 [\d,.]+ ms, p99 [\d,.]+ ms; done p50 [\d,.]+ ms",
    r"^In process \(Runtime.stream, reference\): first text p50 [\d,.]+ ms",
    r"^HTTP / in process: first text p50 [\d.]+x, p99 [\d.]+x; done p50 [\d.]+x, p99 [\d.]+x$",
    r"^Server memory: RSS [\d,.]+ MB idle, [\d,.]+ MB after, peak [\d,.]+ MB$",
    r"^20 stalled tabs on one conversation, \d+ turns sent to it$",
    r"^A turn with them: p50 [\d,.]+ ms, p99 [\d,.]+ ms; without: p50 [\d,.]+ ms",
    r"^While their streams still took updates \(first \d+ turns\): p50 [\d,.]+ ms; once dropped",
    r"^Server memory with the stalled tabs: RSS [\d,.]+ MB before the turns, [\d,.]+ MB after",
    r"^The tab that kept up saw (\d+) of \1 turns' done; 20 of 20 stalled tabs were dropped",
)


@pytest.mark.slow
def test_quick_run_reports_every_figure() -> None:
    result = run_script("bench/bench_server.py", "--quick")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for pattern in REPORT_LINES:
        assert any(re.search(pattern, line) for line in lines), (pattern, result.stdout)
