"""The conformance kit: segue's own adapters pass every check against their fake servers, and
an adapter that gets one behaviour wrong is told which, by name."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import traceback
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from segue.executor.errors import LlmCallError
from segue.executor.model_port import (
    BaseLlmModel,
    ContextSupport,
    LlmReply,
    LlmRequest,
    ToolSpec,
)
from segue.statemachine import Message, ToolCall, Usage
from segue.testing.conformance import Check, Harness, run, run_check
from segue.testing.conformance.checks import CHECKS
from segue.testing.conformance.compaction import COMPACTION_CHECKS
from segue.testing.harnesses import HARNESSES, AnthropicHarness, OpenAIHarness

WIRE_CHECKS = {
    "tools_and_results_go_back_paired",
    "the_grace_request_forbids_tools",
    "requests_at_the_limit_offer_no_tool",
    "summaries_can_repeat_the_turn",
    "images_are_sent",
}


@pytest.fixture(params=sorted(HARNESSES))
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    with HARNESSES[request.param]() as started:
        yield started


COMPACTION: Final = {check.__name__ for check in COMPACTION_CHECKS}
NOT_COMPACTING: Final = {
    "openai-chat": "not applicable: the adapter says its provider does not compact gpt-4o",
    "scripted": "not applicable: the harness names no compacting_model its provider compacts",
}
"""What the compaction checks say of the adapters whose provider does not compact."""


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_every_builtin_adapter_passes_every_check(harness: Harness, check: Check) -> None:
    verdict = asyncio.run(run_check(harness, check))
    name = check.__name__
    if name in COMPACTION and harness.name in NOT_COMPACTING:
        assert verdict == NOT_COMPACTING[harness.name]  # the adapter learns it does not
    elif (harness.name, name) == ("openai-responses", "a_failed_compaction_is_never_a_summary"):
        assert verdict.startswith("not applicable: OpenAI's compaction item holds no summary")
    elif harness.wire or name not in WIRE_CHECKS:
        assert verdict == "passed", verdict
    else:  # the offline ScriptedModel sends nothing anywhere
        assert verdict == "not applicable: no wire to read"


def wrapping(harness: type[Any], wrap: Callable[[Any], Any]) -> type[Any]:
    """``harness`` whose adapter is ``wrap(adapter)``: an adapter that gets something wrong."""

    class Wrapped(harness):  # type: ignore[misc]  # a class given as a value
        def model(self, **options: Any) -> Any:
            inner = super().model(**options)

            @contextlib.asynccontextmanager
            async def wrapped() -> Any:
                async with inner as model:
                    yield wrap(model)

            return wrapped()

    return Wrapped


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

    with wrapping(OpenAIHarness, DoubleCounting)("chat") as harness:
        report = asyncio.run(run(harness))
    failed = [name for name, verdict in report.results.items() if verdict.startswith("FAILED")]
    assert failed == ["usage_counts_each_token_once"]
    assert not report.ok
    assert "is not prompt + output" in report.explain()


def test_an_adapter_that_mishandles_the_providers_compaction_is_told_so() -> None:
    """An adapter that says its provider compacts but never asks it to, and reports its
    refusal as a plain failure, fails those two compaction checks, by name."""

    class Forgetful(BaseLlmModel):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def complete(self, request: LlmRequest) -> LlmReply:
            try:
                reply: LlmReply = await self.inner.complete(
                    dataclasses.replace(request, compaction=None)
                )
            except LlmCallError as error:
                raise LlmCallError(error.message, status_code=error.status_code) from None
            return reply

        def context_support(self, model: str) -> ContextSupport:
            support: ContextSupport = self.inner.context_support(model)
            return support

    with wrapping(AnthropicHarness, Forgetful)() as harness:
        report = asyncio.run(run(harness, COMPACTION_CHECKS))
    failed = sorted(n for n, verdict in report.results.items() if verdict.startswith("FAILED"))
    assert failed == ["a_refusal_to_compact_is_said_as_such", "compaction_is_asked_at_the_trigger"]
    assert "set compaction_refused" in report.explain()


_AT_THE_LIMIT: Final = {
    "tool_calls_come_back_whole",
    "requests_at_the_limit_offer_no_tool",
    "summaries_can_repeat_the_turn",
}


def test_an_adapter_that_claims_to_repeat_the_turn_but_forbids_tools_is_told_so() -> None:
    """REQ-SEG-057: an adapter that says it can repeat the turn's request at the limit
    (``PrefixReusing``) but sends the tool-less request instead (``tool_choice`` none, which
    misses the cached history) fails that check, by name, and no other."""

    class Claiming(BaseLlmModel):
        reuses_prefix = True

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def complete(self, request: LlmRequest) -> LlmReply:
            reply: LlmReply = await self.inner.complete(
                dataclasses.replace(request, reuse_prefix=False)
            )
            return reply

    with wrapping(AnthropicHarness, Claiming)() as harness:
        chosen = [c for c in CHECKS if c.__name__ in _AT_THE_LIMIT]
        report = asyncio.run(run(harness, chosen))
    failed = sorted(n for n, verdict in report.results.items() if verdict.startswith("FAILED"))
    assert len(report.results) == len(_AT_THE_LIMIT)
    assert failed == ["summaries_can_repeat_the_turn"]
    assert "the tool choice must be the turn's" in report.explain()


def test_an_adapter_that_does_not_claim_it_is_told_the_check_does_not_apply() -> None:
    """The check applies only to an adapter that says it can (REQ-SEG-057)."""

    class Silent(BaseLlmModel):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def complete(self, request: LlmRequest) -> LlmReply:
            reply: LlmReply = await self.inner.complete(request)
            return reply

    check = next(c for c in CHECKS if c.__name__ == "summaries_can_repeat_the_turn")
    with wrapping(AnthropicHarness, Silent)() as harness:
        verdict = asyncio.run(run_check(harness, check))
    assert verdict == "not applicable: the adapter does not say it can (PrefixReusing)"


GUIDE = Path(__file__).resolve().parents[1] / "docs" / "adapters.md"


def guide_blocks() -> list[str]:
    """The Python blocks of docs/adapters.md: the port, the page of code, the kit's use."""
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL)


def test_the_adapter_guides_examples_are_python() -> None:
    """docs/adapters.md shows code; it must at least be valid Python (the page of code also
    runs, below)."""
    blocks = guide_blocks()
    assert len(blocks) == 3
    for block in blocks:
        compile(block, str(GUIDE), "exec")


class AcmeError(Exception):
    """What the guide's Acme client raises when its API refuses."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class Acme:
    """The client the guide describes, answering from a script: each answer is the events of
    one ``chat`` call, or the exception it raises."""

    Error = AcmeError
    api_key = "acme-DO-NOT-LEAK-0123456789"

    def __init__(self, *answers: list[dict[str, Any]] | Exception) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[list[Any], list[Any], str | None]] = []

    async def chat(
        self, messages: list[Any], *, tools: list[Any], tool_choice: str | None
    ) -> AsyncIterator[dict[str, Any]]:
        self.sent.append((messages, tools, tool_choice))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        for event in answer:
            yield event


def guide_adapter(client: Acme) -> Any:
    """The guide's ``AcmeModel``, defined by running the page's code as it stands, over
    ``client``."""
    namespace: dict[str, Any] = {}
    exec(compile(guide_blocks()[1], str(GUIDE), "exec"), namespace)  # noqa: S102  # our own page
    return namespace["AcmeModel"](client)


LS = ToolCall(id="t1", name="bash", input={"cmd": "ls"})
ACME_TURN = LlmRequest(
    conversation_id="c",
    model="acme-1",
    purpose="turn",
    system=None,
    messages=(
        Message(kind="user", text="What is here?"),
        Message(kind="assistant", text="Let me look.", tool_calls=(LS,)),
        Message(kind="tool_result", text="README.md", tool_call_id="t1"),
    ),
    tools=(ToolSpec(name="bash", description="Run it.", input_schema={"type": "object"}),),
)
ACME_DONE = {"type": "done", "usage": {"prompt": 100, "cached": 60, "completion": 7}}


def test_the_guides_adapter_streams_a_turn_with_its_tool_calls() -> None:
    """Text passed to ``on_text`` as it comes and joined, usage counted once, a tool call
    joined from its pieces; the history sent paired, the tools callable."""
    client = Acme(
        [
            {"type": "text", "text": "Rea"},
            {"type": "text", "text": "ding."},
            {"type": "tool_call", "index": 0, "id": "t2", "name": "bash", "arguments": '{"cmd"'},
            {"type": "tool_call", "index": 0, "arguments": ': "cat README.md"}'},
            ACME_DONE,
        ]
    )
    deltas: list[str] = []
    turn = dataclasses.replace(ACME_TURN, on_text=deltas.append)
    reply: LlmReply = asyncio.run(guide_adapter(client).complete(turn))
    assert deltas == ["Rea", "ding."]
    assert reply.text == "Reading."
    assert reply.tool_calls == (ToolCall(id="t2", name="bash", input={"cmd": "cat README.md"}),)
    assert reply.usage == Usage(input_tokens=40, cache_read_input_tokens=60, output_tokens=7)
    messages, tools, choice = client.sent[0]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert (tools, choice) == ([{"name": "bash", "schema": {"type": "object"}}], "auto")


def test_the_guides_adapter_sends_a_request_at_the_limit_as_text_without_tools() -> None:
    client = Acme([{"type": "text", "text": "A summary."}, ACME_DONE])
    summary = dataclasses.replace(ACME_TURN, purpose="continuation", instruction="Summarise.")
    reply: LlmReply = asyncio.run(guide_adapter(client).complete(summary))
    assert reply.text == "A summary."
    messages, tools, choice = client.sent[0]
    assert (tools, choice) == ([], None)
    assert messages[-1]["text"].endswith("Summarise.")


@pytest.mark.parametrize(
    ("answer", "flag"),
    [
        ([{"type": "text", "text": "Cut"}], "retryable"),  # no "done": cut off
        (AcmeError(401, f"bad key {Acme.api_key}"), "fatal"),
        (AcmeError(429, "slow down", {"retry-after": "3"}), "retryable"),
        (ConnectionError("refused"), "retryable"),
    ],
)
def test_the_guides_adapter_says_what_can_help_and_never_the_key(
    answer: list[dict[str, Any]] | Exception, flag: str
) -> None:
    model = guide_adapter(Acme(answer))
    with pytest.raises(LlmCallError) as info:
        asyncio.run(model.complete(ACME_TURN))
    assert getattr(info.value, flag)
    assert Acme.api_key not in "".join(traceback.format_exception(info.value))
    if isinstance(answer, AcmeError) and answer.status == 401:
        assert "ACME_API_KEY" in info.value.message
    if isinstance(answer, AcmeError) and answer.status == 429:
        assert info.value.retry_after == 3
