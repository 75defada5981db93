"""``bench/bench_transition.py --quick`` runs to the end and prints every part of its report.

Only the shape of the report is checked, never a timing: timed assertions fail on a busy machine
for reasons unrelated to the code. The state-size line is checked because it is not a timing:
the deep size of a state is deterministic, and it must not grow with the number of turns.
"""

from __future__ import annotations

import re

import pytest

from scripts import run_script

NUMBER = r"\d[\d,]*(?:\.\d+)?"
VERDICT = r"(?:PASS|FAIL)"


@pytest.fixture(scope="module")
def report() -> str:
    result = run_script("bench/bench_transition.py", "--quick", flags=("-W", "error"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "line",
    [
        rf"segue transition\(\)\s+{NUMBER}\s+{NUMBER}$",
        rf"transitions \S+\s+{NUMBER}\s+{NUMBER}$",
        rf"python-statemachine \S+\s+{NUMBER}\s+{NUMBER}$",
        rf"transitions / segue\s+{NUMBER}x\s+target >= 2x\s+{VERDICT}$",
        rf"python-statemachine / segue\s+{NUMBER}x\s+target >= 20x\s+{VERDICT}$",
        rf"values only \(segue's floor\)\s+{NUMBER}\s+{NUMBER}$",
        rf"transitions / values only\s+{NUMBER}x\s+the most any transition\(\)",
        rf"values only / segue\s+{NUMBER}%\s+of segue's time",
        rf"segue turns 10-110\s+{NUMBER} us/event$",
        rf"segue turns 10,000-10,100\s+{NUMBER} us/event$",
        rf"late / early\s+{NUMBER}x\s+target <= 1.5x\s+{VERDICT}$",
        r"^2\. Tool-heavy turn = 9 events",
        rf"segue tool-heavy turns 10-110\s+{NUMBER} us/event$",
        rf"segue tool-heavy turns 10,000-10,100\s+{NUMBER} us/event$",
        rf"state after turn 10\s+{NUMBER} bytes$",
        rf"state after turn 10,000\s+{NUMBER} bytes$",
        r"growth\s+0 bytes\s+PASS$",
        rf"tracemalloc over 1,000 more turns: {NUMBER} bytes kept",
    ],
)
def test_report_has_line(report: str, line: str) -> None:
    assert re.search(line, report, re.MULTILINE), f"no line matching {line!r} in:\n{report}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "line",
    [
        rf"transitions / segue\s+{NUMBER}x\s+target >= 2x\s+{VERDICT}$",
        rf"python-statemachine / segue\s+{NUMBER}x\s+target >= 20x\s+{VERDICT}$",
        rf"late / early\s+{NUMBER}x\s+target <= 1.5x\s+{VERDICT}$",
    ],
)
def test_both_workloads_are_judged(report: str, line: str) -> None:
    """The plain and the tool-heavy workload each get every verdict."""
    assert len(re.findall(line, report, re.MULTILINE)) == 2, report
