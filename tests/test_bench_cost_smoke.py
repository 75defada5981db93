"""``bench/bench_cost.py --quick`` runs to the end and prints every line of its report.

LangChain is an optional extra (``.[bench]``), absent in CI: the first test hides it even where
it is installed (``sys.modules["langchain"] = None`` makes every import of it fail as if it were
missing), so segue's runs and the hint to install the extra are checked everywhere. The second
runs both sides where the extra is installed. Bills and timings are never asserted, only the
shape of the report.
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from scripts import run_script

pytestmark = pytest.mark.slow

NUMBER = r"\d[\d,]*(?:\.\d+)?"
VERDICT = r"(?:PASS|FAIL)"
WITHOUT_LANGCHAIN = (
    "import os, runpy, sys; sys.modules['langchain'] = None; "
    "sys.modules['langchain_anthropic'] = None; sys.argv = sys.argv[1:]; "
    "sys.path.insert(0, os.path.dirname(sys.argv[0])); "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)
BEHAVIORS = ("COMPACT_IN_PLACE", "THRESHOLD_BASED_CONTINUATION", "CHECKPOINT_RESTART")
VARIANTS = (" tool_less", " reuse_prefix")


def row(name: str) -> str:
    return (
        rf"^  {name} +bill +{NUMBER}  read +{NUMBER}%  limit reads +{NUMBER}%  "
        rf"summaries +{NUMBER} tokens  calls +{NUMBER} +{NUMBER} ms/turn$"
    )


def segue_lines() -> list[str]:
    lines = [
        r"^One conversation of 45 turns with a tool, window 16,000, trigger at 90%.*every 3rd "
        r"summary request with callable tools answered with a tool call\):$"
    ]
    for behavior in BEHAVIORS:
        for variant in VARIANTS:
            lines.append(row(f"segue {behavior}{variant}"))
            limit = (
                rf"\(target >= 80%\) {VERDICT}"
                if variant == " reuse_prefix"
                else r"\(no target: tool-less\)"
            )
            lines.append(
                rf"^  segue {behavior}{variant}: limit's requests read {NUMBER}% of their "
                rf"input from the cache {limit}; the whole run {NUMBER}% "
                rf"\(target >= 90%\) {VERDICT}$"
            )
    return lines


def check(report: str, lines: list[str]) -> None:
    for line in lines:
        assert re.search(line, report, re.MULTILINE), f"no line matching {line!r} in:\n{report}"


@pytest.mark.slow  # a whole bench run in a process of its own
def test_without_langchain_segue_is_measured_and_the_extra_named() -> None:
    result = run_script(
        "bench/bench_cost.py", "--quick", flags=("-c", WITHOUT_LANGCHAIN), timeout=600
    )
    assert result.returncode == 0, result.stderr
    check(
        result.stdout,
        [
            r"^LangChain is not installed \(.*\): only segue's side is measured\. "
            r"Install it with: pip install -e \"\.\[bench\]\"$",
            *segue_lines(),
        ],
    )
    assert "LangChain (" not in result.stdout


@pytest.mark.skipif(
    importlib.util.find_spec("langchain") is None
    or importlib.util.find_spec("langchain_anthropic") is None,
    reason="LangChain is an optional extra (pip install -e '.[bench]')",
)
def test_with_langchain_both_sides_are_compared() -> None:
    result = run_script("bench/bench_cost.py", "--quick", timeout=600)
    assert result.returncode == 0, result.stderr
    lines = [*segue_lines(), row(r"LangChain \(alike\)"), row(r"LangChain \(its defaults\)")]
    for behavior in BEHAVIORS:
        for variant in VARIANTS:
            lines.append(
                rf"^  bill, segue {behavior}{variant}: {NUMBER}x LangChain's "
                rf"\(target <= [01]\.\d\dx\) {VERDICT}$"
            )
    lines.append(
        rf"^  wall time per turn: LangChain {NUMBER} ms, segue {NUMBER}-{NUMBER} ms: "
        rf"{NUMBER}x-{NUMBER}x \(target >= 5x\) {VERDICT}$"
    )
    check(result.stdout, lines)
