"""``bench/bench_telemetry.py --quick`` runs to the end and reports every configuration.

Timings depend on the machine and are never asserted here; what is asserted is that each of the
five runtimes ran and was reported, with the two targets judged.
"""

from __future__ import annotations

import re

import pytest

from scripts import run_script


@pytest.mark.slow
def test_quick_run_reports_every_configuration() -> None:
    result = run_script("bench/bench_telemetry.py", "--quick", timeout=600)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for name in ("without the extra", "API, no-op providers", "SDK tracing", "SDK metrics"):
        assert re.search(rf"^  {re.escape(name)}\s+[\d.]+ us of CPU/step", out, re.M), out
    assert re.search(r"API, no-op providers .*target <= 1\.01x: (met|missed)", out), out
    assert re.search(r"SDK tracing .*target <= 1\.10x: (met|missed)", out), out
