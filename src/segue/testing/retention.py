"""What survives the limit: plant facts in a conversation, carry it through limits, ask for them.

segue decides when a conversation is cut and how; this module measures what the cut loses, with
the user's own settings (provider, model, behaviour, summary prompt and model, the provider's
compaction, pinned messages, the window). It is a recall test, in the spirit of the harnesses
peers ran in-house:

1. **Plant.** Typed facts (``FACT_KINDS``: identifiers, numbers, dates, decisions with their
   reason, constraints, pending tasks, artifacts, a superseded value, a fact only inside a tool
   result, and a fact never stated) are told among filler turns, each at a depth of its own.
2. **Carry.** Filler goes on until the conversation has crossed ``limits`` limits (a
   compaction, a checkpoint, or a continuation into a new conversation), the last fact at
   least one of them.
3. **Ask.** Each fact is asked of a copy of the conversation that goes on (its export imported
   under another id), so every question sees the same context and no question's answer, nor a
   limit a question would cause, changes what the next one sees.
4. **Score.** The expected value, normalised (case, punctuation, thousands separators), must be
   contained in the answer; the later value of a superseded fact must win over the earlier; a
   fact never stated scores when the answer says it does not know; a decision may be judged by
   a model (``judge``) instead.

Offline, the scripted model answers with ``PerfectReader``: it reads the context it is sent and
answers what it finds there, so the figure measures what the context kept (the scripted
summaries keep little: what the tail and pinned messages hold), not a model's reading.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from segue.executor.errors import SegueError
from segue.executor.model_port import LlmModel, LlmRequest
from segue.executor.runtime import Runtime
from segue.executor.stores.memory import MemoryStore
from segue.statemachine import (
    ContextExhaustionBehavior,
    ConversationState,
    ErrorKind,
    Message,
    Usage,
)
from segue.statemachine.options import ConversationOptions
from segue.statemachine.phases import ContextExhausted, Failed, Paused
from segue.testing.facts import (
    FACT_KINDS,
    LOOKUP_TOOL,
    QUESTION_PREFIX,
    Fact,
    FactKind,
    PerfectReader,
    filler,
    lookup_tools,
    normalised,
    plant_facts,
    question_of,
    says_unknown,
    scored,
)

MAX_TURNS: Final = 5_000
"""Filler turns at most before a run gives up waiting for its limits (the window is too big)."""


class RetentionError(SegueError):
    """The measurement cannot be made with these settings (it says why and what to change)."""


@dataclass(frozen=True, slots=True)
class Answered:
    """A fact asked for: where it was planted and what came back."""

    fact: Fact
    answer: str
    kept: bool
    depth: int
    """Turns told after the fact before the questions (how deep in history it was)."""
    limits: int
    """Limits the conversation crossed after the fact was told."""


@dataclass(frozen=True, slots=True)
class RetentionReport:
    """The measurement: recall overall and by kind, the facts lost, the run's tokens."""

    answered: tuple[Answered, ...]
    limits: int
    """Limits crossed after the last fact was told (what the run was asked to carry)."""
    behavior: ContextExhaustionBehavior
    model: str
    turns: int
    tokens: Usage
    offline: bool = False
    not_planted: tuple[str, ...] = ()
    """Facts that could not be planted (a model that never called the lookup tool)."""

    @property
    def facts(self) -> int:
        """Facts asked for."""
        return len(self.answered)

    @property
    def kept(self) -> int:
        """Facts whose answer held the expected value."""
        return sum(a.kept for a in self.answered)

    @property
    def recall(self) -> float:
        """Kept over asked (1.0 when nothing could be asked)."""
        return self.kept / self.facts if self.facts else 1.0

    def by_kind(self) -> dict[str, dict[str, int]]:
        """Facts and kept facts per kind, in ``FACT_KINDS``' order."""
        table: dict[str, dict[str, int]] = {}
        for kind in FACT_KINDS:
            of_kind = [a for a in self.answered if a.fact.kind == kind]
            if of_kind:
                table[kind] = {"facts": len(of_kind), "kept": sum(a.kept for a in of_kind)}
        return table

    def to_json(self) -> dict[str, Any]:
        """The report as ``segue eval-summary --json`` prints it."""
        return {
            "recall": round(self.recall, 4),
            "facts": self.facts,
            "kept": self.kept,
            "limits": self.limits,
            "turns": self.turns,
            "behavior": self.behavior.value,
            "model": self.model,
            "offline": self.offline,
            "by_kind": self.by_kind(),
            "lost": [
                {
                    "id": a.fact.id,
                    "kind": a.fact.kind,
                    "expected": a.fact.expected,
                    "answer": a.answer,
                    "depth": a.depth,
                    "limits": a.limits,
                }
                for a in self.answered
                if not a.kept
            ],
            "not_planted": list(self.not_planted),
            "tokens": {
                "input": self.tokens.input_tokens,
                "output": self.tokens.output_tokens,
                "cache_read": self.tokens.cache_read_input_tokens,
                "cache_write": self.tokens.cache_creation_input_tokens,
            },
        }


# -- the run -----------------------------------------------------------------------------------

Judge = Callable[[Fact, str], Coroutine[Any, Any, bool]]
"""Decides whether an answer keeps a ``decision`` fact (its choice and reason): ``model_judge``
asks a model; without one, the choice must be contained in the answer."""


def model_judge(llm: LlmModel, model: str) -> Judge:
    """A judge that asks ``model`` whether an answer states a decision and its reason."""

    async def judge(fact: Fact, answer: str) -> bool:
        asked = (
            f"A decision was: {fact.subject} {fact.expected}, because {fact.reason}.\n"
            f"An answer said: {answer}\n"
            "Does the answer state the same decision and a compatible reason? Reply yes or no."
        )
        request = LlmRequest(
            conversation_id="judge",
            model=model,
            purpose="turn",
            system=None,
            messages=(Message(kind="user", text=asked),),
            max_tokens=16,
        )
        reply = await llm.complete(request)
        return normalised(reply.text).strip().startswith("yes")

    return judge


@dataclass
class _Run:
    """A run's moving parts: the conversation that goes on and what it crossed."""

    rt: Runtime
    conversation_id: str
    ids: list[str] = field(default_factory=list)
    limits: int = 0
    turns: int = 0
    told_at: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Fact id -> (turns, limits) when it was told."""
    continuations: int = 0
    """The conversation that goes on's compactions and checkpoints, as last seen."""
    filler_words: int = 60
    """Words in a filler turn: fewer in a small window, so that a compaction's verbatim tail
    of recent turns still fits under the threshold."""

    def aside(self, rng: random.Random) -> str:
        """The next filler turn."""
        return filler(rng, self.turns, words=self.filler_words)

    async def say(self, text: str, *, pinned: bool = False) -> ConversationState:
        """Send ``text`` to the conversation that goes on, following it across a limit."""
        state = await self.rt.send(self.conversation_id, text, pinned=pinned)
        self.turns += 1
        return await self._carried(state)

    async def _carried(self, state: ConversationState) -> ConversationState:
        phase = state.phase
        self.limits += max(0, state.continuations - self.continuations)
        self.continuations = state.continuations
        if isinstance(phase, Paused):  # checkpoint_pause: a limit, then the user resumes
            self.limits += 1
            state = await self.rt.resume(self.conversation_id)
        elif isinstance(phase, ContextExhausted | Failed):
            if isinstance(phase, Failed) and phase.error_kind is not ErrorKind.CONTEXT_EXHAUSTED:
                msg = f"the conversation failed before its limits: {phase.message}"
                raise RetentionError(msg)
            self.limits += 1  # a continuation, or a sub-agent's replacement seeded alike
            state = await self.rt.start_new_from(self.conversation_id, seed_with_summary=True)
            self.conversation_id = state.id
            self.ids.append(state.id)
        self.continuations = state.continuations
        return state


async def evaluate(
    llm: LlmModel,
    options: ConversationOptions,
    *,
    facts: int | Sequence[Fact] = 24,
    limits: int = 3,
    seed: int = 0,
    pinned: Sequence[str] = (),
    judge: Judge | None = None,
    offline: bool = False,
    max_turns: int = MAX_TURNS,
) -> RetentionReport:
    """Plant ``facts`` (a count, or facts of your own) in a conversation made with
    ``options``, carry it through ``limits`` limits (1 to 30) after the last fact was told,
    ask for each fact and score. Facts told early cross the limits the planting itself took
    too (each answer says how many; a small window makes more of them).

    The run keeps its conversations in a store of its own (``MemoryStore``), so nothing a
    user stored is touched; ``pinned`` messages are told first and pinned, as a user's own.
    ``offline`` only marks the report (the scripted model with ``PerfectReader``). A run whose
    limits have not come after ``max_turns`` filler turns stops with ``RetentionError``."""
    if isinstance(limits, bool) or not 1 <= limits <= 30:
        raise ValueError(f"limits is from 1 to 30, not {limits!r}")
    plan = plant_facts(facts, seed=seed) if isinstance(facts, int) else list(facts)
    rng = random.Random(seed + 1)  # noqa: S311  # test data
    async with Runtime(store=MemoryStore(), llm=llm, tools=lookup_tools(plan)) as rt:
        first = await rt.create_conversation(options)
        words = max(10, min(60, first.config.context_window // 100))
        run = _Run(rt, first.id, ids=[first.id], filler_words=words)
        for text in pinned:
            await run.say(text, pinned=True)
        missing = await _plant(run, plan, rng)
        await _carry(run, rng, limits=limits, turns=max_turns)
        answered = await _ask(run, [f for f in plan if f.id not in missing], judge)
        tokens = await _tokens(rt, run.ids)
    return RetentionReport(
        answered=tuple(answered),
        limits=limits,
        behavior=options.behavior,
        model=options.model,
        turns=run.turns,
        tokens=tokens,
        offline=offline,
        not_planted=tuple(sorted(missing)),
    )


async def _plant(run: _Run, plan: Sequence[Fact], rng: random.Random) -> set[str]:
    """Tell each fact after two filler turns (a superseded fact's update one fact later); the
    ids of the facts that could not be told (a lookup the model never made)."""
    missing: set[str] = set()
    updates: list[Fact] = []
    for fact in plan:
        for _ in range(2):
            await run.say(run.aside(rng))
        for due in updates:
            await run.say(due.update or "")
            run.told_at[due.id] = (run.turns, run.limits)
        updates = []
        if not fact.statement:  # never stated, or told by the caller (pinned, the system prompt)
            run.told_at[fact.id] = (run.turns, run.limits)
            continue
        await run.say(fact.statement)
        run.told_at[fact.id] = (run.turns, run.limits)
        if fact.update:
            updates.append(fact)
        if fact.tool_output and not await _looked_up(run, fact):
            await run.say(fact.statement)  # once more: a limit may have come between
            run.told_at[fact.id] = (run.turns, run.limits)
            if not await _looked_up(run, fact):
                missing.add(fact.id)
    for due in updates:
        await run.say(run.aside(rng))
        await run.say(due.update or "")
        run.told_at[due.id] = (run.turns, run.limits)
    return missing


async def _looked_up(run: _Run, fact: Fact) -> bool:
    """Whether the lookup of ``fact`` ran (its output is in the conversation)."""
    for cid in reversed(run.ids):
        for message in reversed(await run.rt.messages(cid)):
            if message.kind == "tool_result" and fact.expected in message.text:
                return True
            if message.kind == "user" and message.text == fact.statement:
                return False
    return False


async def _carry(run: _Run, rng: random.Random, *, limits: int, turns: int) -> None:
    """Filler until the conversation crossed ``limits`` limits after the last fact was told
    (those told earlier crossed the limits planting took too: each answer reports its own)."""
    last_told = max((limits_then for _, limits_then in run.told_at.values()), default=0)
    for _ in range(turns):
        if run.limits - last_told >= limits:
            return
        await run.say(run.aside(rng))
    msg = (
        f"the conversation crossed {run.limits - last_told} of {limits} limits in "
        f"{run.turns} turns: give it a smaller context window"
    )
    raise RetentionError(msg)


async def _ask(run: _Run, plan: Sequence[Fact], judge: Judge | None) -> list[Answered]:
    """Ask each fact of a copy of the conversation that goes on; score the answers."""
    rt = run.rt
    document = await rt.export_conversation(run.conversation_id)
    answered = []
    for fact in plan:
        probe = f"{run.conversation_id}.{fact.id}"
        await rt.import_conversation(document, conversation_id=probe)
        run.ids.append(probe)
        await rt.send(probe, question_of(fact))
        answer = await rt.last_reply(probe) or ""
        if fact.kind == "decision" and judge is not None:
            kept = await judge(fact, answer)
        else:
            kept = scored(fact, answer)
        told_turns, told_limits = run.told_at[fact.id]
        answered.append(
            Answered(
                fact=fact,
                answer=answer,
                kept=kept,
                depth=run.turns - told_turns,
                limits=run.limits - told_limits,
            )
        )
    return answered


async def _tokens(rt: Runtime, ids: Iterable[str]) -> Usage:
    """What every conversation of the run cost (the chain and the questions' copies)."""
    totals = [0, 0, 0, 0]
    for cid in ids:
        report = await rt.usage(cid)
        for usage in report.by_purpose_and_session.values():
            totals[0] += usage.input_tokens
            totals[1] += usage.output_tokens
            totals[2] += usage.cache_read_input_tokens
            totals[3] += usage.cache_creation_input_tokens
    return Usage(
        input_tokens=totals[0],
        output_tokens=totals[1],
        cache_read_input_tokens=totals[2],
        cache_creation_input_tokens=totals[3],
    )


def report_table(report: RetentionReport) -> list[str]:
    """The report as lines of at most 80 characters (the CLI's default output)."""
    lines = [
        f"recall {report.recall:.0%}: {report.kept} of {report.facts} facts kept through "
        f"{report.limits} limits",
        f"{report.behavior.value}, {report.model}, {report.turns} turns",
        "",
        f"{'kind':<14}{'kept':>6}{'facts':>7}",
    ]
    lines += [
        f"{kind:<14}{row['kept']:>6}{row['facts']:>7}" for kind, row in report.by_kind().items()
    ]
    lost = [a for a in report.answered if not a.kept]
    if lost:
        lines += ["", "lost:"]
        for a in lost:
            said = " ".join(a.answer.split()) or "(nothing)"
            entry = f"  {a.fact.id} {a.fact.kind}: expected {a.fact.expected!r}, got {said!r}"
            lines.append(entry if len(entry) <= 80 else entry[:79] + "\u2026")
    t = report.tokens
    lines += [
        "",
        f"tokens: {t.input_tokens:,} in, {t.output_tokens:,} out, "
        f"{t.cache_read_input_tokens:,} cache read, {t.cache_creation_input_tokens:,} written",
    ]
    if report.not_planted:
        lines.append(f"not planted (the lookup never ran): {', '.join(report.not_planted)}")
    if report.offline:
        lines += [
            "offline: the scripted model reads its context perfectly and summarises little,",
            "so this figure measures only what the tail and pinned messages keep",
        ]
    return lines


def dumps(report: RetentionReport) -> str:
    """The report as JSON text."""
    return json.dumps(report.to_json(), indent=2)


__all__ = [
    "FACT_KINDS",
    "LOOKUP_TOOL",
    "MAX_TURNS",
    "QUESTION_PREFIX",
    "Answered",
    "Fact",
    "FactKind",
    "Judge",
    "PerfectReader",
    "RetentionError",
    "RetentionReport",
    "dumps",
    "evaluate",
    "filler",
    "lookup_tools",
    "model_judge",
    "normalised",
    "plant_facts",
    "question_of",
    "report_table",
    "says_unknown",
    "scored",
]
