"""The conformance kit's terms and verdicts (``segue.testing.conformance`` says what the kit
is): what a harness scripts (``Said``, ``Failure``), what it reads back (``Sent``), the
``Harness`` protocol, and a check's verdict. The checks import these terms, and the package's
``run`` imports the checks, so this module is below both (no import is put off to break a
loop).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Self, runtime_checkable

from segue.executor.model_port import LlmModel

# --------------------------------------------------------------------------- neutral terms


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call the fake provider makes; ``input`` as a string is sent as raw arguments
    (``'{"query": "ti'``: not JSON)."""

    name: str
    input: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Compaction:
    """The provider compacted its context before answering (a provider that compacts itself,
    REQ-SEG-048): its ``summary`` (None: the summary failed), what its compaction read and
    wrote (``prompt``, ``output``: reported by a provider that reports it), and whether it
    stopped after it (``pause``: the answer then says nothing else)."""

    summary: str | None = "What happened so far: the tides were charted."
    prompt: int = 150_000
    output: int = 800
    pause: bool = False


@dataclass(frozen=True, slots=True)
class Said:
    """A provider's answer. Usage as the provider counts the prompt: ``prompt`` tokens in all,
    ``cached`` of them read from the cache and ``cache_write`` written to it (None: no usage
    reported at all). ``pieces`` text deltas; ``cut`` ends the stream before its end;
    ``chunk_delay`` seconds between streamed events; ``delay`` before the answer starts."""

    text: str = "ok"
    calls: Sequence[Call] = ()
    prompt: int | None = 10
    cached: int = 0
    cache_write: int = 0
    output: int = 5
    pieces: int = 3
    cut: bool = False
    chunk_delay: float = 0.0
    delay: float = 0.0
    compacted: Compaction | None = None
    """The provider compacted before this answer (``prompt`` and the rest are then the
    answer's own, read from the compacted context)."""


FailureKind = Literal[
    "overflow", "rate_limit", "server", "auth", "mid_stream", "compaction_refused"
]


@dataclass(frozen=True, slots=True)
class Failure:
    """A provider's failure: ``overflow`` (the prompt does not fit), ``rate_limit`` (429 with
    ``retry_after`` seconds if given), ``server`` (5xx), ``auth`` (401, its message quoting
    ``echo``, as a provider echoing the key would), ``mid_stream`` (an error event after the
    stream started), ``compaction_refused`` (the provider cannot compact for this model)."""

    kind: FailureKind
    retry_after: float | None = None
    echo: str = ""


Answer = Said | Failure


@dataclass(frozen=True, slots=True)
class SentTurn:
    """One message the adapter sent: its role (``user``, ``assistant``, ``tool``), text, tool
    calls ``(id, name, input)``, the call a tool result answers, and how many images it holds."""

    role: str
    text: str = ""
    calls: tuple[tuple[str, str, Any], ...] = ()
    result_for: str | None = None
    images: int = 0
    parts: tuple[str, ...] = ()
    """The text as its pieces were sent (text blocks or parts), in order."""


@dataclass(frozen=True, slots=True)
class Sent:
    """What the adapter sent for one request: the tools it declared, whether it forbade calling
    them (``tool_choice`` none), the system prompt, the turns in order, and the raw body."""

    tools: tuple[str, ...]
    tool_choice_none: bool
    system: str | None
    turns: tuple[SentTurn, ...]
    raw: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    """The request's HTTP headers, names lower-cased (empty without a wire)."""
    compaction_trigger: int | None = None
    """The prompt size at which the request asked the provider to compact (None: it did not
    ask)."""

    @property
    def texts(self) -> list[str]:
        """The text pieces of the user and assistant turns, in order (tool results apart)."""
        return [part for turn in self.turns if turn.role != "tool" for part in turn.parts]

    @property
    def text(self) -> str:
        """Every turn's text, joined: for "does it say X anywhere"."""
        return "\n".join(turn.text for turn in self.turns)

    @property
    def callable_tools(self) -> bool:
        """Whether the model could call a tool with this request."""
        return bool(self.tools) and not self.tool_choice_none

    @property
    def tool_blocks(self) -> int:
        """How many tool calls and results the turns hold."""
        return sum(len(t.calls) + (t.result_for is not None) for t in self.turns)


@runtime_checkable
class CompactingHarness(Protocol):
    """A harness whose provider compacts the context itself: ``compacting_model`` names a model
    its adapter says it compacts (``ContextManaging.context_support``), for the compaction
    checks; a harness without it gets them as not applicable."""

    compacting_model: str


class Harness(Protocol):
    """A provider's fake server and the adapter under test (see the module docstring)."""

    name: str
    key: str
    """The credential the adapter is configured with (it must never leak)."""
    wire: bool
    """Whether ``sent`` reads a real request (False for an adapter with no wire)."""

    def __enter__(self) -> Self: ...
    def __exit__(self, *exc_info: object) -> None: ...

    def model(self, **options: Any) -> contextlib.AbstractAsyncContextManager[LlmModel]:
        """A new adapter connected to the fake server (its client closed on exit)."""
        ...

    def script(self, *answers: Answer) -> None:
        """Queue the provider's next answers, in order."""
        ...

    def default(self, answer: Answer | Callable[[], Answer]) -> None:
        """What the provider answers once the script is used up."""
        ...

    def sent(self) -> list[Sent]:
        """What the adapter sent so far, one ``Sent`` per model request, oldest first."""
        ...

    @property
    def pending(self) -> int:
        """Scripted answers not used yet."""
        ...


# --------------------------------------------------------------------------- verdicts


class ConformanceError(AssertionError):
    """An adapter does not do what the port asks; the message says what and how to fix it."""


class NotApplicable(Exception):  # noqa: N818  # a verdict, not an error
    """The harness cannot stage what the check needs (said why)."""


Check = Callable[[Harness], Awaitable[None]]
"""One behaviour checked: raises ``ConformanceError`` saying what is wrong, or
``NotApplicable`` when the harness cannot stage it (``checks`` holds them all)."""


@dataclass(frozen=True, slots=True)
class Report:
    """What ``run`` found: check name -> "passed", "not applicable: why" or the failure."""

    results: dict[str, str]

    @property
    def ok(self) -> bool:
        """No check failed."""
        return all(r == "passed" or r.startswith("not applicable") for r in self.results.values())

    @property
    def not_applicable(self) -> list[str]:
        """The checks the harness could not stage."""
        return [name for name, r in self.results.items() if r.startswith("not applicable")]

    def explain(self) -> str:
        """One line per check."""
        return "\n".join(f"{name}: {result}" for name, result in self.results.items())


async def run_check(harness: Harness, check: Check) -> str:
    """One check's verdict (a fresh script each time)."""
    harness.default(Said())
    try:
        await check(harness)
    except NotApplicable as why:
        return f"not applicable: {why}"
    except ConformanceError as error:
        return f"FAILED: {error}"
    return "passed"


__all__ = [
    "Answer",
    "Call",
    "Check",
    "CompactingHarness",
    "Compaction",
    "ConformanceError",
    "Failure",
    "Harness",
    "NotApplicable",
    "Report",
    "Said",
    "Sent",
    "SentTurn",
    "run_check",
]
