"""Settings for the whole suite.

Hypothesis times each example (200 ms by default) and checks that generating data is not too
slow; on a busy machine (CI runs beside other work) either fails a correct test by chance.
What a property test proves does not depend on how fast an example ran, so neither applies
here. Tests that want a bound of their own still set it with ``@settings``.

Two hypothesis profiles: ``segue`` (hypothesis' own example counts) under CI (``CI`` true, as
``.ci/run`` sets), and ``dev`` elsewhere, which draws fewer examples for the property tests that
leave the count to the profile, so a developer's loop answers sooner. Tests that name their own
count (the searches for planted bugs) keep it in both. ``--hypothesis-profile=segue`` runs the
full counts outside CI.

The suite runs under pytest-xdist (``-n``, ``--dist loadgroup`` in pyproject.toml). Each worker
is a process of its own, so what a test sets in the process (logging, OpenTelemetry providers,
the working directory) stays in its worker as it stayed in the one process before; what costs a
process or a server is kept to one worker by ``xdist_group`` (see
``pytest_collection_modifyitems`` below).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

# The real-model tier's llama-server: defined here once, so that the session starts one
# whichever modules ask for it (imported into each module, each would start its own).
from real_model_server import in_ci, llama  # noqa: F401

settings.register_profile("segue", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", parent=settings.get_profile("segue"), max_examples=30)
settings.load_profile("segue" if in_ci() else "dev")


def _module_scoped(item: pytest.Item) -> bool:
    """Whether the test asks for a fixture built once per module (a browser, a server, a
    PostgreSQL cluster, a built site, a bench's report)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(definitions[-1].scope == "module" for definitions in info.name2fixturedefs.values())


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group what must share a worker under ``--dist loadgroup``.

    The real-model tier goes to one worker: one llama-server for the session (two would share
    the cores and each answer slower than one alone). A module with a module-scoped fixture goes
    to one worker as a whole, so the fixture is built once, as in a serial run (split between
    workers, each would build its own), and so is what its tests cache in the module (the
    explorations of tests/test_exploration.py, which one of its tests reads back). Runs first, so
    that xdist reads the groups when it names the tests.
    """
    if not config.pluginmanager.hasplugin("xdist"):
        return
    shared = {item.nodeid.split("::", 1)[0] for item in items if _module_scoped(item)}
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        module = item.nodeid.split("::", 1)[0]
        if item.get_closest_marker("real_model") is not None:
            item.add_marker(pytest.mark.xdist_group("real_model"))
        elif module in shared:
            item.add_marker(pytest.mark.xdist_group(module))
