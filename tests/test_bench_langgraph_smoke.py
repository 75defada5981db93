"""``bench/bench_langgraph.py --quick`` runs to the end and prints every line of its report.

LangGraph is an optional extra (``.[bench]``), absent in CI: the first test hides it from the
benchmark even where it is installed (the script runs with ``sys.modules["langgraph"] = None``,
which makes every import of it fail as if it were missing), so segue's side and the hint to
install the extra are checked everywhere. The second runs both sides where the extra is
installed. Timings are never asserted, only the shape of the report.
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from scripts import run_script
from segue.testing.postgres import find_server_binaries

pytestmark = pytest.mark.slow

NUMBER = r"\d[\d,]*(?:\.\d+)?"
VERDICT = r"(?:PASS|FAIL)"
WITHOUT_LANGGRAPH = (
    "import os, runpy, sys; sys.modules['langgraph'] = None; sys.argv = sys.argv[1:]; "
    "sys.path.insert(0, os.path.dirname(sys.argv[0])); "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)
POSTGRES = find_server_binaries() is not None


def segue_lines() -> list[str]:
    lines = [
        r"^SQLite, one conversation \(turns 3-8, 2 rounds\):$",
        rf"^  round 1: segue {NUMBER} us",
        r"^SQLite, 10 conversations at once \(2 turns each, 2 rounds\):$",
        rf"^  median \(steps/s\): segue {NUMBER} steps/s",
        rf"^  SQLite segue: {NUMBER} us per step at turns 10-13, {NUMBER} us at turn 60: "
        rf"{NUMBER}x \(target <= 1.2x\) {VERDICT}$",
    ]
    if POSTGRES:
        lines += [
            r"^PostgreSQL, one conversation \(turns 3-8, 2 rounds\):$",
            r"^PostgreSQL, worker processes x 4 conversations each, 4 connections each, "
            r"0.5 s per run:$",
            rf"^  1 worker : segue {NUMBER} steps/s",
            rf"^  2 workers: segue {NUMBER} steps/s",
            rf"^    CPU per step \(workers \+ server\): segue {NUMBER} ms \({NUMBER} \+ {NUMBER}\)",
            rf"^  PostgreSQL segue: {NUMBER} us per step at turns 10-13, {NUMBER} us at turn 60: "
            rf"{NUMBER}x \(target <= 1.2x\) {VERDICT}$",
        ]
    return lines


def check(report: str, lines: list[str]) -> None:
    for line in lines:
        assert re.search(line, report, re.MULTILINE), f"no line matching {line!r} in:\n{report}"


@pytest.mark.slow  # a whole bench run in a process of its own
def test_without_langgraph_segue_is_measured_and_the_extra_named() -> None:
    result = run_script(
        "bench/bench_langgraph.py", "--quick", flags=("-c", WITHOUT_LANGGRAPH), timeout=600
    )
    assert result.returncode == 0, result.stderr
    report = result.stdout
    check(
        report,
        [
            r"^LangGraph is not installed \(.*\): only segue's side is measured\. "
            r"Install it with: pip install -e \"\.\[bench\]\"$",
            *segue_lines(),
        ],
    )
    assert "LangGraph " not in report.split("only segue's side is measured", 1)[1]


def _bench_extra_missing() -> bool:
    """Whether any module the bench needs for LangGraph's side is missing (as the bench's own
    ``sides.langgraph_missing`` asks: langgraph alone, without its checkpointers, measures
    nothing)."""
    needed = ("langgraph", "langgraph.checkpoint.sqlite", "langgraph.checkpoint.postgres")
    try:
        return any(importlib.util.find_spec(name) is None for name in needed)
    except ImportError:  # a parent package that is not there
        return True


@pytest.mark.skipif(
    _bench_extra_missing(),
    reason="LangGraph and its checkpointers are an optional extra (pip install -e '.[bench]')",
)
def test_with_langgraph_both_sides_are_compared() -> None:
    result = run_script("bench/bench_langgraph.py", "--quick", timeout=600)
    assert result.returncode == 0, result.stderr
    ratio = rf"LangGraph {NUMBER} (?:us|steps/s): {NUMBER}x"
    lines = [
        r"^LangGraph: langgraph \S+, langgraph-checkpoint-sqlite \S+, "
        r"langgraph-checkpoint-postgres \S+$",
        *segue_lines(),
        rf"^  round 2: segue {NUMBER} us, {ratio}$",
        rf"^  median \(us per persisted step\): segue {NUMBER} us, {ratio} "
        rf"\(target >= 10x\) {VERDICT}$",
        rf"^  lowest round: {NUMBER}x \(target >= 7x\) {VERDICT}$",
        rf"^  median \(steps/s\): segue {NUMBER} steps/s, {ratio} \(target >= 15x\) {VERDICT}$",
    ]
    if POSTGRES:
        lines += [
            rf"^  median \(us per persisted step\): segue {NUMBER} us, {ratio} "
            rf"\(target >= 6x\) {VERDICT}$",
            rf"^  2 workers: segue {NUMBER} steps/s, {ratio} \(target >= 4x\) {VERDICT}$",
            rf"^    CPU per step \(workers \+ server\): segue {NUMBER} ms \(.*\), "
            rf"LangGraph {NUMBER} ms \(.*\): {NUMBER}x$",
        ]
    check(result.stdout, lines)
