"""The conformance kit: segue's own adapters pass every check against their fake servers, and
an adapter that gets one behaviour wrong is told which, by name."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from segue.executor.model_port import LlmReply, LlmRequest
from segue.statemachine import Usage
from segue.testing.conformance import CHECKS, Check, Harness, run, run_check
from segue.testing.harnesses import HARNESSES, OpenAIHarness

WIRE_CHECKS = {
    "tools_and_results_go_back_paired",
    "the_grace_request_forbids_tools",
    "requests_at_the_limit_offer_no_tool",
    "images_are_sent",
}


@pytest.fixture(params=sorted(HARNESSES))
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    with HARNESSES[request.param]() as started:
        yield started


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_every_builtin_adapter_passes_every_check(harness: Harness, check: Check) -> None:
    verdict = asyncio.run(run_check(harness, check))
    if harness.wire or check.__name__ not in WIRE_CHECKS:
        assert verdict == "passed", verdict
    else:  # the offline ScriptedModel sends nothing anywhere
        assert verdict == "not applicable: no wire to read"


def test_the_report_names_what_an_adapter_gets_wrong() -> None:
    """An adapter that adds the cached tokens to a prompt that already holds them (the mistake
    the usage helper exists for) fails the usage check, and only that one, by name."""

    class DoubleCounting:
        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.exact_preflight = False

        async def complete(self, request: LlmRequest) -> LlmReply:
            reply: LlmReply = await self.inner.complete(request)
            usage = reply.usage
            if usage is None:
                return reply
            doubled = Usage(
                input_tokens=usage.prompt_tokens,
                cache_read_input_tokens=usage.cache_read_input_tokens,
                output_tokens=usage.output_tokens,
            )
            return LlmReply(text=reply.text, tool_calls=reply.tool_calls, usage=doubled)

        async def context_window(self, model: str) -> int | None:
            return None

        async def count_tokens(self, request: LlmRequest) -> int | None:
            return None

    class Wrapped(OpenAIHarness):
        def model(self, **options: Any) -> Any:
            import contextlib

            inner = super().model(**options)

            @contextlib.asynccontextmanager
            async def wrapped() -> Any:
                async with inner as model:
                    yield DoubleCounting(model)

            return wrapped()

    with Wrapped("chat") as harness:
        report = asyncio.run(run(harness))
    failed = [name for name, verdict in report.results.items() if verdict != "passed"]
    assert failed == ["usage_counts_each_token_once"]
    assert not report.ok
    assert "is not prompt + output" in report.explain()


def test_the_adapter_guides_examples_are_python() -> None:
    """docs/adapters.md shows code; it must at least be valid Python."""
    import re
    from pathlib import Path

    guide = Path(__file__).resolve().parents[1] / "docs" / "adapters.md"
    blocks = re.findall(r"```python\n(.*?)```", guide.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) == 3
    for block in blocks:
        compile(block, str(guide), "exec")
