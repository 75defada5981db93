"""The real-model tier's server: llama.cpp's ``llama-server`` serving SmolLM2-135M-Instruct for
the whole session (``tests/conftest.py`` offers it to every module, so one is started).

Under CI (``CI`` set to true) a missing server or model fails the tier, saying how to get them
(``.ci/run`` gets both); elsewhere the tier is skipped with the same words. Only the standard
library and ``segue.testing.llama_server`` are imported: every test session loads this module.
``SEGUE_LLAMA_THREADS`` sets the server's threads (2 by default; on a machine whose cores are
busy with other work, 1 avoids the threads waiting on each other).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from segue.testing.llama_server import LlamaServer, missing


def in_ci() -> bool:
    """Whether the suite runs under CI, where the tier must never be skipped."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def llama() -> Iterator[LlamaServer]:
    """llama-server with a 2048-token context and one slot, for the whole session."""
    reason = missing()
    if reason is not None:
        if in_ci():
            pytest.fail(f"the real-model tier cannot run: {reason}", pytrace=False)
        pytest.skip(f"no real model here: {reason}")
    threads = int(os.environ.get("SEGUE_LLAMA_THREADS", "2"))
    with LlamaServer(context=2048, threads=threads) as server:
        yield server
