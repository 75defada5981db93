"""``bench/bench_soak.py --quick`` runs to the end, and what it checks in its database holds.

Memory and timings depend on the machine and are never asserted here. What is asserted does not
depend on timing: with the victim worker killed with SIGKILL while it works, no planned message
is lost or stored twice, no conversation is left busy and no work pending, and every stored
reply cost one model call.
"""

from __future__ import annotations

import re

import pytest

from scripts import run_script


@pytest.mark.slow
def test_quick_soak_loses_nothing_and_pays_once() -> None:
    result = run_script("bench/bench_soak.py", "--quick", timeout=600)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"soak: [\d,]+ persisted steps, [1-9]\d* kills of the victim", out), out
    assert "lost 0, stored twice 0, conversations left busy 0, work left pending 0" in out, out
    assert re.search(r"model calls per stored reply 1\.00\d", out), out
    assert re.search(r"compactions [1-9]", out), out
    assert "a worker failed" not in out, out
