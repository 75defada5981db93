"""The examples run as a user runs them, and say what the README says they show."""

from __future__ import annotations

from scripts import run_script


def test_the_subagent_example_recovers_from_a_typed_failure() -> None:
    result = run_script("examples/subagents.py", timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # the library is quiet
    lines = result.stdout.splitlines()
    assert lines[0] == "The coordinator started 6 sub-agents:"
    first, *narrower = lines[1:7]
    assert "pages 1-900" in first
    assert "failed with context_exhausted" in first
    assert all("answered" in line for line in narrower)
    assert "The coordinator is idle; its answer:" in lines
    assert "- Pages 801-900: safety warnings on p.801, p.898." in lines
