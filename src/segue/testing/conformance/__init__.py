"""A conformance kit for ``LlmModel`` adapters: every behaviour the port asks of an adapter,
checked against a fake of the provider's server.

An adapter is tested through a ``Harness``: it starts the fake server, builds the adapter
pointed at it, scripts the provider's answers in neutral terms (``Said``: text, tool calls,
usage as the provider counts it; ``Failure``: overflow, rate limit, server error, bad key) and
reads back what the adapter sent, in neutral terms too (``Sent``). The same checks then run on
any provider::

    from segue.testing.conformance import run

    async def test_my_adapter() -> None:
        with MyHarness() as harness:  # your provider's fake server and your adapter
            report = await run(harness)
        assert report.ok, report.explain()

``AnthropicHarness``, ``OpenAIHarness`` (Chat Completions or Responses) and ``ScriptedHarness``
in ``segue.testing.harnesses`` are the built-in ones (segue's own adapters pass). An adapter
whose provider compacts the context itself (``compaction="provider"``) is also checked for it
when its harness names a model it compacts (``CompactingHarness``); the report says which
compaction checks did not apply and why, so an adapter learns whether it supports it. A check a
harness cannot stage (the offline ``ScriptedModel`` has no wire to inspect) is reported as not
applicable, by name, never silently passed. The end-to-end tests of the runtime use the same
harnesses, so each runs on every provider.

The kit's terms and verdicts are ``segue.testing.conformance.terms`` (all importable from
here); the checks, one function per behaviour, are ``segue.testing.conformance.checks``
(``CHECKS``, all of them, in the order ``run`` runs them).
"""

from __future__ import annotations

from collections.abc import Sequence

from segue.testing.conformance.checks import CHECKS
from segue.testing.conformance.terms import *  # noqa: F403  # the kit's terms, named here
from segue.testing.conformance.terms import Check, Harness, Report, run_check
from segue.testing.conformance.terms import __all__ as _terms


async def run(harness: Harness, checks: Sequence[Check] | None = None) -> Report:
    """Run ``checks`` (None: every one, ``checks.CHECKS``) on the adapter of a started
    ``harness``."""
    if checks is None:
        checks = CHECKS
    return Report({check.__name__: await run_check(harness, check) for check in checks})


__all__ = [*_terms, "run"]  # noqa: PLE0604  # the terms' names and the runner
