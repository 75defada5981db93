"""``segue eval-summary`` and ``segue.testing.retention``: what survives the limit, measured.

The runs that prove the measurement go through the real ``anthropic`` client against the fake
Messages API, whose summariser is told what to keep: one that keeps every fact must score 1.0,
one that keeps nothing must lose every fact told (only the fact never stated scores). The
offline run (scripted model, ``PerfectReader``) goes end to end, in Python and in the CLI.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from anthropic import AsyncAnthropic

from cli_run import invoke, plain_output
from segue import ContextExhaustionBehavior, ScriptedModel
from segue.executor.instructions import COMPACTION_INSTRUCTION, CONTINUATION_INSTRUCTION
from segue.executor.model_port import LlmReply, LlmRequest
from segue.executor.models.anthropic import AnthropicModel
from segue.statemachine import CHECKPOINT_PROMPT
from segue.statemachine.options import ConversationOptions
from segue.testing.anthropic_replies import MessageReply, ToolUse
from segue.testing.anthropic_server import FakeAnthropicServer
from segue.testing.retention import (
    FACT_KINDS,
    LOOKUP_TOOL,
    QUESTION_PREFIX,
    Fact,
    PerfectReader,
    RetentionError,
    evaluate,
    model_judge,
    normalised,
    plant_facts,
    report_table,
    says_unknown,
    scored,
)

LIMIT_INSTRUCTIONS = (
    CONTINUATION_INSTRUCTION[:60],
    COMPACTION_INSTRUCTION[:60],
    CHECKPOINT_PROMPT[:60],
)


def _text(content: Any) -> str:
    """The text of a Messages API content (a string, or blocks of text and tool results)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if block.get("type") == "text":
            parts.append(block["text"])
        elif block.get("type") == "tool_result":
            parts.append(_text(block.get("content", "")))
    return "\n".join(parts)


class Summariser:
    """The fake model's answers: a summary that keeps every line telling a fact (``keep``)
    or nothing; questions answered by a perfect reader; the lookup tool called when asked."""

    def __init__(self, facts: list[Fact], *, keep: bool) -> None:
        self.reader = PerfectReader(facts)
        self.subjects = [f.subject for f in facts]
        self.keep = keep
        self.summaries = 0

    def __call__(self, request: dict[str, Any]) -> MessageReply:
        messages = request["messages"]
        texts = [_text(m["content"]) for m in messages]
        last = texts[-1]
        system = request.get("system") or ""
        context = "\n".join([_text(system), *texts[:-1]])
        if any(instruction in last for instruction in LIMIT_INSTRUCTIONS):
            self.summaries += 1
            if not self.keep:
                return MessageReply(text="<checkpoint>\n## Goal\nChat.\n</checkpoint>")
            lines = "\n".join([_text(system), *texts[:-1]]).splitlines()
            told = [line for line in lines if any(s in line for s in self.subjects)]
            kept = list(dict.fromkeys(told))  # each once, in the order told
            return MessageReply(text="<checkpoint>\n" + "\n".join(kept) + "\n</checkpoint>")
        if QUESTION_PREFIX in last:  # a seeded child's first message carries its seed before it
            before, _, asked = last.rpartition(QUESTION_PREFIX)
            return MessageReply(text=self.reader.answer(f"{context}\n{before}", asked))
        record = re.search(r"look up record (R-\d+)", last)
        content = messages[-1]["content"]
        answered = not isinstance(content, str) and content[0].get("type") == "tool_result"
        if record and request.get("tools") and not answered:
            return MessageReply(
                text="Looking.",
                tool_uses=(ToolUse(LOOKUP_TOOL, {"record": record.group(1)}),),
                stop_reason="tool_use",
            )
        return MessageReply(text="Interesting, go on.")


@pytest.fixture
def server() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer() as running:
        yield running


async def _measure(
    server: FakeAnthropicServer, behavior: ContextExhaustionBehavior, *, keep: bool, limits: int
) -> Any:
    facts = plant_facts(20, seed=7)
    summariser = Summariser(facts, keep=keep)
    server.default = summariser
    client = AsyncAnthropic(api_key="test", base_url=server.url, max_retries=0)
    try:
        options = ConversationOptions(
            model="claude-sonnet-4-6", behavior=behavior, context_window=4_000
        )
        report = await evaluate(AnthropicModel(client=client), options, facts=facts, limits=limits)
    finally:
        await client.close()
    assert summariser.summaries >= limits
    return report


BEHAVIORS = [
    ContextExhaustionBehavior.COMPACT_IN_PLACE,
    ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION,
    ContextExhaustionBehavior.CHECKPOINT_RESTART,
]


@pytest.mark.parametrize("behavior", BEHAVIORS, ids=lambda b: b.value)
def test_a_summariser_that_keeps_every_fact_scores_one(
    server: FakeAnthropicServer, behavior: ContextExhaustionBehavior
) -> None:
    report = asyncio.run(_measure(server, behavior, keep=True, limits=3))
    assert report.limits == 3
    assert report.facts == 20
    assert report.not_planted == ()
    assert report.recall == 1.0, report.to_json()["lost"]
    assert all(a.limits >= 3 for a in report.answered)
    assert {a.fact.kind for a in report.answered} == set(FACT_KINDS)
    assert report.tokens.input_tokens + report.tokens.cache_read_input_tokens > 0


@pytest.mark.parametrize("behavior", BEHAVIORS, ids=lambda b: b.value)
def test_a_summariser_that_keeps_nothing_keeps_only_what_was_never_said(
    server: FakeAnthropicServer, behavior: ContextExhaustionBehavior
) -> None:
    report = asyncio.run(_measure(server, behavior, keep=False, limits=2))
    kept = {a.fact.kind for a in report.answered if a.kept}
    assert kept == {"abstention"}
    lost = report.to_json()["lost"]
    assert len(lost) == report.facts - report.by_kind()["abstention"]["facts"]
    assert all(entry["depth"] > 0 and entry["limits"] >= 2 for entry in lost)


def test_the_superseded_value_must_win_and_numbers_lose_their_separators() -> None:
    facts = {f.kind: f for f in plant_facts(10, seed=1)}
    superseded = facts["superseded"]
    assert superseded.stale is not None
    assert scored(superseded, f"Room {superseded.expected}.")
    assert not scored(superseded, f"It was {superseded.stale}, now {superseded.expected}.")
    assert not scored(superseded, f"Room {superseded.stale}.")
    number = facts["number"]
    assert scored(number, f"About {number.expected.replace(',', '')} euros")
    assert scored(number, f"{number.expected} EUR")
    assert not scored(number, "a lot of money")
    assert normalised("Re-Index THE Orchid archive!") == " re index the orchid archive "


def test_a_fact_never_stated_scores_when_the_answer_says_it_does_not_know() -> None:
    never = next(f for f in plant_facts(10) if f.kind == "abstention")
    assert scored(never, "I don't know.")
    assert scored(never, "That was never mentioned in our conversation.")
    assert not scored(never, "Ilse Varga audits it.")
    assert not says_unknown("I know: it is Lev Orlin.")


def test_a_judge_decides_a_decision() -> None:
    decision = next(f for f in plant_facts(10) if f.kind == "decision")

    def answers(request: LlmRequest) -> LlmReply:
        asked = request.messages[-1].text
        return LlmReply(text="Yes." if "because" in asked and "cheap" in asked else "No.")

    judge = model_judge(ScriptedModel(default=answers), "judge-model")
    assert asyncio.run(judge(decision, "We took it because it is cheap.")) is True
    assert asyncio.run(judge(decision, "No idea.")) is False


def test_offline_the_scripted_model_runs_end_to_end() -> None:
    facts = plant_facts(24, seed=0)
    options = ConversationOptions(
        model="claude-sonnet-4-6",
        behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE,
        context_window=4_000,
    )
    report = asyncio.run(
        evaluate(ScriptedModel(default=PerfectReader(facts)), options, facts=facts, offline=True)
    )
    assert report.facts == 24
    assert report.limits == 3
    lines = report_table(report)
    assert "measures only what the tail and pinned messages keep" in " ".join(lines)
    assert all(len(line) <= 80 for line in lines)


def test_a_pinned_fact_survives_every_limit() -> None:
    facts = plant_facts(4, seed=3)
    pinned_code = "the access code for the pinned vault is PN-4242"
    extra = Fact(
        "p01", "identifier", "", "What is the access code for the pinned vault?", "PN-4242",
        "the access code for the pinned vault is",
    )  # fmt: skip
    plan = [*facts, extra]
    options = ConversationOptions(
        model="claude-sonnet-4-6",
        behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE,
        context_window=3_000,
    )
    report = asyncio.run(
        evaluate(
            ScriptedModel(default=PerfectReader(plan)),
            options,
            facts=plan,
            limits=2,
            pinned=[f"Always remember: {pinned_code}."],
        )
    )
    by_id = {a.fact.id: a for a in report.answered}
    assert by_id["p01"].kept
    assert not by_id["f01"].kept


def test_a_window_too_big_for_the_limits_is_refused_saying_what_to_change() -> None:
    options = ConversationOptions(model="claude-sonnet-4-6", context_window=200_000)
    facts = plant_facts(2)
    with pytest.raises(RetentionError, match="smaller context window"):
        asyncio.run(
            evaluate(
                ScriptedModel(default=PerfectReader(facts)),
                options,
                facts=facts,
                limits=1,
                max_turns=20,
            )
        )


def test_limits_are_bounded() -> None:
    options = ConversationOptions(model="claude-sonnet-4-6")
    with pytest.raises(ValueError, match="1 to 30"):
        asyncio.run(evaluate(ScriptedModel(), options, limits=31))


def test_the_cli_prints_the_documented_json_and_gates_on_recall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain_output(monkeypatch, "ANTHROPIC_API_KEY")
    result = invoke(
        "eval-summary", "--json", "--facts", "12", "--limits", "2", "--context-window", "3000"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    expected_keys = {"recall", "facts", "kept", "limits", "behavior", "model", "by_kind", "lost"}
    assert expected_keys | {"tokens"} <= set(report)
    assert report["facts"] == 12
    assert report["limits"] == 2
    assert report["behavior"] == "compact_in_place"
    assert set(report["tokens"]) == {"input", "output", "cache_read", "cache_write"}
    assert {"id", "kind", "expected", "answer", "depth"} <= set(report["lost"][0])
    assert report["kept"] == round(report["recall"] * report["facts"])


def test_the_cli_exits_1_below_min_recall_and_fits_80_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain_output(monkeypatch, "ANTHROPIC_API_KEY")
    monkeypatch.setenv("COLUMNS", "80")
    gated = invoke("eval-summary", "--facts", "12", "--limits", "1", "--min-recall", "0.9")
    assert gated.exit_code == 1, gated.output
    assert "below --min-recall 0.9" in gated.stdout
    assert "offline" in gated.stdout
    assert all(len(line) <= 80 for line in gated.stdout.splitlines())
    passed = invoke("eval-summary", "--facts", "12", "--limits", "1", "--min-recall", "0")
    assert passed.exit_code == 0, passed.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--limits", "31"), "31"),
        (("--min-recall", "1.5"), "1.5"),
        (("--behavior", "sideways"), "sideways"),
        (("--context-window", "10"), "10"),
    ],
)
def test_the_cli_refuses_bad_options_in_its_own_words(
    monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], said: str
) -> None:
    plain_output(monkeypatch, "ANTHROPIC_API_KEY")
    result = invoke("eval-summary", *args)
    assert result.exit_code == 2
    assert said in result.output
    assert "Traceback" not in result.output
