"""The facts ``segue.testing.retention`` plants, how an answer is scored, and the reader
that answers offline.

A fact is told once (a superseded one twice, its later value winning), in words whose
``subject`` the value follows, so that a reader who misses nothing (``PerfectReader``) can find
it again in whatever context it is sent. Values are drawn from a seed: a run is repeatable.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from segue.executor.model_port import LlmReply, LlmRequest
from segue.executor.tools import ToolRegistry
from segue.statemachine import ToolCall

FactKind = Literal[
    "identifier",
    "number",
    "date",
    "decision",
    "constraint",
    "pending_task",
    "artifact",
    "superseded",
    "tool_only",
    "abstention",
]
FACT_KINDS: Final[tuple[FactKind, ...]] = (
    "identifier",
    "number",
    "date",
    "decision",
    "constraint",
    "pending_task",
    "artifact",
    "superseded",
    "tool_only",
    "abstention",
)
"""The kinds of fact planted, in the order a run cycles through them."""

LOOKUP_TOOL: Final = "lookup_record"
"""The tool whose results hold the ``tool_only`` facts."""

QUESTION_PREFIX: Final = "Question about our conversation:"
"""How every question starts (``PerfectReader`` and test servers recognise one by it)."""

_QUESTION_RULES: Final = (
    "Answer from our conversation only, in a few words. If it was never said, answer: I don't know."
)
_ABSTENTIONS: Final = (
    "don t know",
    "do not know",
    "dont know",
    "not know",
    "no information",
    "not mentioned",
    "never mentioned",
    "wasn t mentioned",
    "was not mentioned",
    "never said",
    "not said",
    "never stated",
    "not stated",
    "not provided",
    "unknown",
    "not sure",
    "no record",
    "cannot find",
    "can t find",
    "no idea",
)


@dataclass(frozen=True, slots=True)
class Fact:
    """One planted fact: what is told (``statement``, or a tool's output for ``tool_only``),
    the question that asks for it, and the value a kept fact's answer contains."""

    id: str
    kind: FactKind
    statement: str
    """The user's message that plants it (for ``tool_only``, the request to look it up);
    empty: the run never tells it (``abstention``, or a fact the caller tells itself: pinned, in
    the system prompt)."""
    question: str
    expected: str
    subject: str
    """The words the value follows wherever it is told (what ``PerfectReader`` looks for)."""
    stale: str | None = None
    """``superseded``: the earlier value, told first and replaced by ``expected`` later."""
    update: str | None = None
    """``superseded``: the message that replaces the earlier value."""
    tool_output: str | None = None
    """``tool_only``: what the lookup tool answers (the only place the value is told)."""
    record: str | None = None
    """``tool_only``: the record the tool is asked for."""
    reason: str | None = None
    """``decision``: the reason given with it (what a judge checks beside the choice)."""


# -- the facts ---------------------------------------------------------------------------------

_NAMES: Final = (
    "Orchid", "Basalt", "Juniper", "Quartz", "Heron", "Cobalt", "Tamarind", "Lynx", "Saffron",
    "Marlin", "Willow", "Ember", "Falcon", "Indigo", "Garnet", "Otter", "Cypress", "Pebble",
)  # fmt: skip
_PEOPLE: Final = (
    "Ilse Varga", "Tomas Quell", "Amara Osei", "Rurik Hale", "Noor Zahedi", "Pia Lindqvist",
    "Dario Mbeki", "Kenji Arato", "Sela Moreau", "Oskar Venn", "Yara Castell", "Lev Orlin",
)  # fmt: skip
_MONTHS: Final = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
_TOPICS: Final = (
    "tidal energy", "medieval bookbinding", "alpine botany", "urban beekeeping", "glass making",
    "river navigation", "sourdough baking", "weather balloons", "coral reefs", "typesetting",
    "violin varnish", "desert irrigation", "lighthouse optics", "moss gardens", "canal locks",
)  # fmt: skip
_WORDS: Final = [
    "careful",
    "study",
    "shows",
    "that",
    "the",
    "practice",
    "grew",
    "slowly",
    "over",
    "many",
    "years",
    "while",
    "people",
    "adapted",
    "tools",
    "methods",
    "and",
    "habits",
    "to",
    "local",
    "conditions",
    "and",
    "shared",
    "what",
    "worked",
    "with",
    "neighbours",
    "who",
    "in",
    "turn",
    "refined",
    "each",
    "step",
    "until",
    "the",
    "craft",
    "settled",
    "into",
    "a",
    "steady",
    "tradition",
    "that",
    "still",
    "changes",
    "a",
    "little",
    "with",
    "every",
    "generation",
    "of",
    "practitioners",
    "and",
    "learners",
]


def _code(rng: random.Random) -> str:
    letters = "".join(rng.choices(string.ascii_uppercase, k=2))
    return f"{letters}-{rng.randint(1000, 9999)}"


def plant_facts(count: int, *, seed: int = 0) -> list[Fact]:
    """``count`` facts cycling through ``FACT_KINDS``, their values drawn from ``seed``."""
    if count < 1:
        raise ValueError("count must be at least 1")
    rng = random.Random(seed)  # noqa: S311  # test data, not secrets
    facts = []
    for index in range(count):
        kind = FACT_KINDS[index % len(FACT_KINDS)]
        facts.append(_fact(kind, index + 1, rng))
    return facts


def _fact(kind: FactKind, number: int, rng: random.Random) -> Fact:
    fid = f"f{number:02d}"
    name = f"{rng.choice(_NAMES)}-{number}"
    if kind == "identifier":
        value = _code(rng)
        subject = f"the access code for the {name} vault is"
        return Fact(
            fid, kind, f"Please remember: {subject} {value}.",
            f"What is the access code for the {name} vault?", value, subject,
        )  # fmt: skip
    if kind == "number":
        value = f"{rng.randint(11, 99)},{rng.randint(100, 999)}"
        subject = f"the yearly budget of project {name} in euros is"
        return Fact(
            fid, kind, f"For the record, {subject} {value}.",
            f"What is the yearly budget of project {name} in euros?", value, subject,
        )  # fmt: skip
    if kind == "date":
        value = f"{rng.choice(_MONTHS)} {rng.randint(1, 28)}, {rng.randint(2027, 2031)}"
        subject = f"the launch of product {name} is planned for"
        return Fact(
            fid, kind, f"Note that {subject} {value}.",
            f"When is the launch of product {name} planned?", value, subject,
        )  # fmt: skip
    if kind == "decision":
        value = rng.choice(("PostgreSQL", "SQLite", "Redis", "Kafka", "RabbitMQ", "DuckDB"))
        reason = rng.choice(
            ("it survives a crash", "the team knows it", "it needs no server", "it is cheaper")
        )
        subject = f"for the {name} service we decided to use"
        return Fact(
            fid, kind, f"Decision: {subject} {value}, because {reason}.",
            f"What did we decide to use for the {name} service, and why?", value, subject,
            reason=reason,
        )  # fmt: skip
    if kind == "constraint":
        value = rng.choice(("force-push", "delete backups", "deploy on Fridays", "log passwords"))
        subject = f"a hard rule for repository {name}: never"
        return Fact(
            fid, kind, f"Remember {subject} {value}.",
            f"What must we never do in repository {name}?", value, subject,
        )  # fmt: skip
    if kind == "pending_task":
        value = f"re-index the {rng.choice(_NAMES).lower()} archive"
        subject = f"the task still pending for team {name} is to"
        return Fact(
            fid, kind, f"Still to do: {subject} {value}.",
            f"What task is still pending for team {name}?", value, subject,
        )  # fmt: skip
    if kind == "artifact":
        value = f"/srv/reports/{name.lower()}-{rng.randint(100, 999)}.csv"
        subject = f"the {name} report is saved at"
        return Fact(
            fid, kind, f"FYI {subject} {value}",
            f"Where is the {name} report saved?", value, subject,
        )  # fmt: skip
    if kind == "superseded":
        old, new = rng.sample(("B12", "C7", "D4", "E19", "F2", "G31", "H8", "K15"), 2)
        subject = f"the {name} review meets in room"
        return Fact(
            fid, kind, f"Heads up: {subject} {old}.",
            f"In which room does the {name} review meet now?", new, subject,
            stale=old, update=f"Update, this replaces what I said before: {subject} {new}.",
        )  # fmt: skip
    if kind == "tool_only":
        record = f"R-{rng.randint(10000, 99999)}"
        value = rng.choice(_PEOPLE)
        subject = f"record {record} is owned by"
        return Fact(
            fid, kind, f"Please look up record {record} with the {LOOKUP_TOOL} tool.",
            f"Who owns record {record}?", value, subject,
            tool_output=f"{record}: {subject} {value}.", record=record,
        )  # fmt: skip
    subject = f"the auditor of the {name} account is"
    return Fact(fid, kind, "", f"Who is the auditor of the {name} account?", "", subject)


def filler(rng: random.Random, turn: int, *, words: int = 60) -> str:
    """A user turn about something else, ``words`` words long: what fills the window."""
    topic = rng.choice(_TOPICS)
    body = " ".join(rng.choice(_WORDS) for _ in range(words))
    return f"Let us talk about {topic} for a moment (aside {turn}). {body}. What do you think?"


def question_of(fact: Fact) -> str:
    """The message that asks for ``fact``."""
    return f"{QUESTION_PREFIX} {fact.question} {_QUESTION_RULES}"


# -- scoring -----------------------------------------------------------------------------------


def normalised(text: str) -> str:
    """Lower case, thousands separators dropped, punctuation as spaces, one space between
    words, padded with a space each side (so containment is by whole words)."""
    text = re.sub(r"(?<=\d)[,\u202f_](?=\d{3}\b)", "", text.lower())
    words = re.sub(r"[^0-9a-z]+", " ", text).split()
    return f" {' '.join(words)} "


def says_unknown(answer: str) -> bool:
    """The answer says it does not know (what a fact never stated should get)."""
    said = normalised(answer)
    return any(f" {phrase} " in said for phrase in _ABSTENTIONS)


def scored(fact: Fact, answer: str) -> bool:
    """Whether ``answer`` keeps ``fact`` (see the module docstring)."""
    if fact.kind == "abstention":
        return says_unknown(answer)
    said = normalised(answer)
    if normalised(fact.expected) not in said:
        return False
    return fact.stale is None or normalised(fact.stale) not in said


# -- the offline reader ------------------------------------------------------------------------


class PerfectReader:
    """Answers a question from the context it is sent, as a model that misses nothing would:
    the latest value told after the fact's subject, else "I don't know". With ``ScriptedModel``
    (``ScriptedModel(default=reader)``) a run measures what the context kept; it also calls
    the lookup tool when asked to, and leaves every other request to the scripted model."""

    def __init__(self, facts: Iterable[Fact]) -> None:
        self._by_question = {f.question: f for f in facts}

    def answer(self, context: str, question: str) -> str:
        """What the context says of the fact ``question`` asks for."""
        fact = next((f for q, f in self._by_question.items() if q in question), None)
        if fact is None or fact.kind == "abstention":
            return "I don't know."
        found = re.findall(re.escape(fact.subject) + r" (\S+(?: \d+,)?(?: \d{4})?)", context)
        if not found:
            return "I don't know."
        value = str(found[-1]).rstrip(".")
        if fact.kind in ("constraint", "pending_task", "tool_only"):
            tail = context[context.rfind(fact.subject) + len(fact.subject) :]
            value = tail.split(".")[0].split("\n")[0].strip()
        return value

    def __call__(self, request: LlmRequest) -> LlmReply | None:
        """A reply for a question or a lookup request; None: the scripted model's own."""
        if request.purpose != "turn" or not request.messages:
            return None
        last = request.messages[-1]
        if last.kind == "user" and QUESTION_PREFIX in last.text:
            before, _, asked = last.text.rpartition(QUESTION_PREFIX)
            context = "\n".join([request.system or "", *(m.text for m in request.messages[:-1])])
            return LlmReply(text=self.answer(f"{context}\n{before}", asked))
        record = re.search(rf"look up record (R-\d+) with the {LOOKUP_TOOL} tool", last.text)
        if last.kind == "user" and record and request.tools:
            call = ToolCall(
                id=f"toolu_{record.group(1)}", name=LOOKUP_TOOL, input={"record": record.group(1)}
            )
            return LlmReply(text="Looking it up.", tool_calls=(call,), stop_reason="tool_use")
        if last.kind == "tool_result":
            return LlmReply(text="Noted.")
        return None


def lookup_tools(facts: Sequence[Fact]) -> ToolRegistry:
    """The lookup tool the ``tool_only`` facts are told through."""
    outputs = {f.record: f.tool_output for f in facts if f.record and f.tool_output}
    tools = ToolRegistry()

    @tools.tool(
        name=LOOKUP_TOOL,
        description="Look up a record by its id (such as R-12345) and return who owns it.",
    )
    async def lookup(tool_input: dict[str, object]) -> str:
        record = str(tool_input.get("record", "")).strip()
        return outputs.get(record, f"{record}: no such record.")

    return tools
