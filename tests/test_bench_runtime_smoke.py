"""``bench/bench_runtime.py --quick`` runs to the end and reports every target.

Timings depend on the machine, so they are never asserted here: a missed target is the bench's
verdict to print (and the full run's exit status); ``--quick`` exits 0 whenever it completes.
"""

from __future__ import annotations

import re

import pytest

from scripts import run_script

REPORT_LINES = (
    r"^Runtime overhead \(MemoryStore, instant model\): [\d,.]+ us/event \(target <= 100\) "
    r"(PASS|FAIL)$",
    r"^Streaming support on send\(\) \(MemoryStore\): [\d,.]+ us/event, [\d,.]+ without it: "
    r"[\d.]+x \(target <= 1.10x\) (PASS|FAIL)$",
    r"^Time to first text delta \(MemoryStore, instant model\): [\d,.]+ ms \(target < 2 ms\) "
    r"(PASS|FAIL)$",
    r"^Adapter streaming \(openai-chat against anthropic\): [\d,.]+ us/delta, [\d,.]+ "
    r"us/delta: [\d.]+x \(target <= 1.10x\) (PASS|FAIL)$",
    r"^Adapter streaming \(openai-responses against anthropic\): [\d,.]+ us/delta, [\d,.]+ "
    r"us/delta: [\d.]+x \(target <= 1.10x\) (PASS|FAIL)$",
    r"^Runtime throughput \(SqliteStore\): [\d,]+ committed transitions/s "
    r"\(target >= 3,000\) (PASS|FAIL)$",
    r"^Runtime growth \(MemoryStore\): [\d,.]+ us/event at ~10 messages, [\d,.]+ us/event at "
    r"[\d,]+ messages: [\d.]+x \(target <= 1.5x\) (PASS|FAIL)$",
    r"^Runtime growth \(SqliteStore\): .* \(target <= 1.5x\) (PASS|FAIL)$",
    r"^Idle conversations \(MemoryStore\): [\d,.]+ MB for 10,000 .* \(target <= 100 MB\) "
    r"(PASS|FAIL)$",
    r"^Idle conversations \(SqliteStore\): [\d,.]+ MB for 10,000 .* \(target <= 100 MB\) "
    r"(PASS|FAIL)$",
)


@pytest.mark.slow  # a whole bench run in a process of its own
def test_quick_run_reports_every_target() -> None:
    result = run_script("bench/bench_runtime.py", "--quick")
    report = result.stdout
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    for pattern in REPORT_LINES:
        assert re.search(pattern, report, re.MULTILINE), f"{pattern!r} not in:\n{report}"
    assert len(re.findall(r"\b(PASS|FAIL)$", report, re.MULTILINE)) == len(REPORT_LINES)
    assert re.search(r"^A streamed turn .*: [\d.]+x$", report, re.MULTILINE), report
    concurrent = r"^Runtime throughput, 100 conversations at once .*: [\d,]+ committed"
    assert re.search(concurrent, report, re.MULTILINE), report
