"""``bench/bench_generations.py`` and ``bench/bench_listing.py`` run to the end (``--quick``,
SQLite) and print every line of their reports. Only the shape of a report is checked, never a
timing; the rows a compaction reads are counts, so the generations report's first and last
must be close (the test that holds it is ``test_generations``)."""

from __future__ import annotations

import re

import pytest

from scripts import run_script

NUMBER = r"\d[\d,]*(?:\.\d+)?"
VERDICT = r"(?:PASS|FAIL)"


@pytest.mark.slow
def test_bench_generations_reports_time_memory_and_rows() -> None:
    result = run_script("bench/bench_generations.py", "--quick", "--store", "sqlite")
    assert result.stderr == ""
    out = result.stdout
    for line in (
        rf"SqliteStore compacting turn: {NUMBER} ms at the first compactions, {NUMBER} ms at the"
        rf" last: {NUMBER}x \(target <= 1.2x\) {VERDICT}$",
        rf"SqliteStore traced memory from compaction 3 to 12: [+-]{NUMBER} KB \(target < 100 KB\)"
        rf" {VERDICT}$",
        rf"SqliteStore transcript rows read per compaction: {NUMBER} at the first, {NUMBER} at"
        r" the last$",
    ):
        assert re.search(line, out, re.MULTILINE), (line, out)
    first, last = re.findall(r"rows read per compaction: (\d+) at the first, (\d+)", out)[0]
    assert int(last) <= int(first) * 2


@pytest.mark.slow
def test_bench_listing_reports_every_page() -> None:
    result = run_script("bench/bench_listing.py", "--quick", "--store", "sqlite")
    assert result.stderr == ""
    out = result.stdout
    for line in (
        rf"SqliteStore a user's first page of 50: {NUMBER} ms \(target < 20 ms\) {VERDICT}$",
        rf"SqliteStore a user's 11th page of 50: {NUMBER} ms$",
        rf"SqliteStore everyone's first page of 50: {NUMBER} ms$",
        rf"SqliteStore everyone's 11th page of 50: {NUMBER} ms$",
    ):
        assert re.search(line, out, re.MULTILINE), (line, out)
