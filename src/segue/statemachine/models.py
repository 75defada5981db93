"""Value types shared by the pure core: usage, tool calls, messages, models, enums.

Everything here is a frozen dataclass that pydantic validates at construction. Values that come
from the outside world (usage reported by a provider, tool calls an LLM asked for, text a user
typed) pass through here once; the core then builds its own values from them without validating
them again (``segue.statemachine._values`` says how, and why).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Final, Literal, Self

from pydantic import Field, StrictInt, model_validator

from segue.statemachine._values import Frozen
from segue.statemachine.content import ContentBlock, ToolInput

TokenCount = Annotated[StrictInt, Field(ge=0)]
"""A number of tokens: an exact, non-negative integer (``True`` or ``"5"`` are refused)."""


class _LenientStrEnum(StrEnum):
    """A str enum that also accepts its member names, in any case.

    Values are stored in lower case (``"compact_in_place"``); people write the constant's name
    (``"COMPACT_IN_PLACE"``) in config files and CLIs just as often.
    """

    @classmethod
    def _missing_(cls, value: object) -> _LenientStrEnum | None:
        if isinstance(value, str):
            wanted = value.strip().lower().replace("-", "_")
            for member in cls:
                if member.value == wanted:
                    return member
        return None


class ContextExhaustionBehavior(_LenientStrEnum):
    """What a conversation does when its context window fills up (``docs/design.md`` section 2)."""

    THRESHOLD_BASED_CONTINUATION = "threshold_based_continuation"
    """Chat UIs: summarise, turn read-only, offer a seeded child conversation."""
    INTENTIONALLY_UNHANDLED = "intentionally_unhandled"
    """Sub-agents: fail fast with ``ErrorKind.CONTEXT_EXHAUSTED``; the parent decides."""
    CHECKPOINT_RESTART = "checkpoint_restart"
    """Autonomous agents: ask for a checkpoint, continue at once in a fresh session."""
    COMPACT_IN_PLACE = "compact_in_place"
    """Long-lived assistants: archive, summarise the old part, keep the recent tail."""
    CHECKPOINT_PAUSE = "checkpoint_pause"
    """Orchestrated agents: write a checkpoint, take a snapshot and pause; an orchestrator
    resumes it later in a fresh session from the compiled resume context."""


SummaryRequest = Literal["tool_less", "reuse_prefix"]
"""How the limit's requests (continuation summary, checkpoint, compaction summary) are sent:
``tool_less``, no tool callable (REQ-BED-020, REQ-SEG-047); ``reuse_prefix``, the turn's
request repeated exactly with the instruction appended, so the provider reads it from its
prompt cache, and any tool call in the answer refused (REQ-SEG-055)."""
REUSE_PREFIX_ASKS: Final = 2
"""How many times a summary is asked for with the turn's prefix (tools callable) before the
tool-less request: the first ask and one more after an answer that called a tool (REQ-SEG-056).
The tool-less request cannot be answered with a call, so the path always ends."""


class ErrorKind(_LenientStrEnum):
    """Why a conversation ended in ``Failed``."""

    CONTEXT_EXHAUSTED = "context_exhausted"
    """The window filled up and the behaviour says to fail (sub-agents)."""
    LLM_ERROR = "llm_error"
    """The provider refused the request for a reason retrying cannot fix."""
    RETRIES_EXHAUSTED = "retries_exhausted"
    """A retryable provider error kept happening until the attempt bound."""
    CONTINUATION_LIMIT = "continuation_limit"
    """Checkpoint-restart or compaction hit its bound on continuations (a loop breaker)."""
    CHECKPOINT_OVERFLOW = "checkpoint_overflow"
    """The checkpoint does not fit in a fresh session: restarting again would loop."""
    COMPACTION_INEFFECTIVE = "compaction_ineffective"
    """After compaction the context is still over the threshold: compacting again would loop."""
    TOOL_ROUNDS_EXHAUSTED = "tool_rounds_exhausted"
    """A sub-agent's turn used its ``max_tool_rounds`` and still asked for tools."""
    RUN_TIME_LIMIT = "run_time_limit"
    """A ``CHECKPOINT_RESTART`` run reached the limit after its ``max_run_seconds``: it stopped
    with its checkpoint recorded instead of restarting (REQ-SEG-044)."""


class Usage(Frozen):
    """Token usage of ONE request, as the Anthropic Messages API reports it.

    ``input_tokens`` is only the uncached tail of the prompt; the two cache fields hold the rest.
    A report that counts the whole prompt with its cached part inside (OpenAI's) is mapped to
    these fields by its adapter, each token once.
    """

    input_tokens: TokenCount = 0
    output_tokens: TokenCount = 0
    cache_creation_input_tokens: TokenCount = 0
    cache_read_input_tokens: TokenCount = 0

    @property
    def context_tokens(self) -> int:
        """Occupancy after this response: the whole prompt plus what the model wrote."""
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_creation_input_tokens
            + self.cache_read_input_tokens
        )

    @property
    def prompt_tokens(self) -> int:
        """The whole prompt of this request: the uncached tail plus both cache fields."""
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens

    @property
    def is_known(self) -> bool:
        """False when the prompt fields are all zero: every prompt holds at least one message,
        so such a report (all zeros, or output tokens alone) says nothing about occupancy."""
        return self.prompt_tokens > 0


class ToolCall(Frozen):
    """A tool the model asked to run (an Anthropic ``tool_use`` block)."""

    id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    input: ToolInput = Field(default_factory=dict)


MessageKind = Literal["user", "assistant", "tool_result", "continuation", "checkpoint", "summary"]
"""What a transcript entry is. ``continuation``: the summary that ends a read-only conversation;
``checkpoint``: what an agent wrote before its session restarted; ``summary``: what stands in for
compacted history in a new generation."""


class Message(Frozen):
    """One entry of a conversation's append-only transcript.

    The core decides what is recorded (through ``AppendMessage`` effects); stores only keep it.
    ``session`` and ``generation`` say which fresh start the message belongs to, so an adapter can
    send the current session's messages only.
    """

    kind: MessageKind
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    is_error: bool = False
    usage: Usage | None = None
    session: Annotated[StrictInt, Field(ge=1)] = 1
    generation: Annotated[StrictInt, Field(ge=1)] = 1
    kept_messages: Annotated[StrictInt, Field(ge=0)] = 0
    """For a ``summary`` message: how many messages just before it stay verbatim after it."""
    content: tuple[ContentBlock, ...] = ()
    """When not empty, the message as the provider is sent it, in order: a user message's text,
    images and documents; the thinking, text and tool_use blocks of a reply that thought
    (thinking must go back unchanged); a tool result's text and images. ``text`` stays the plain
    text (what summaries, estimates and people read)."""
    pinned: bool = False
    """A user message the user pinned: never summarised away. Every fresh start (a new session,
    a new generation, a seeded child) still sends it, verbatim (REQ-SEG-042)."""
    copy_of: Annotated[StrictInt, Field(ge=1)] | None = None
    """A copy made by a redone summary or an undone compaction (REQ-SEG-063, REQ-SEG-064): the
    seq of the original it repeats (the first original, through copies of copies). A view
    that holds the copy never repeats the original as a pinned message of an earlier
    generation: nothing is deleted, and nothing is sent twice."""
    summarises: Annotated[StrictInt, Field(ge=1)] | None = None
    """For a ``summary`` made again (REQ-SEG-063): the generation whose view it summarises (the
    one the first summary replaced). None for an ordinary summary, which summarises the
    generation just before its own."""
    carried: Annotated[StrictInt, Field(ge=0)] = 0
    """For a ``summary`` made again: how many of the copies after it are the verbatim tail of
    the generation it summarises (the rest came after the first summary)."""


class ModelSettings(Frozen):
    """How a conversation's model is asked, beyond the model's name; fixed per conversation.

    The combinations the Messages API refuses are refused here, when the conversation is
    created, rather than on every request: thinking with a temperature, and thinking with a
    tool choice that forces a tool.
    """

    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    """Sampling temperature, for servers that take one: Anthropic's own API (version 2026-10-21,
    which the SDK 2.x sends) refuses sampling parameters and answers 400."""
    thinking_budget: Annotated[StrictInt, Field(ge=1024)] | None = None
    """Extended thinking's ``budget_tokens``; None: the model does not think unless it does by
    default (its thinking blocks are kept and sent back either way)."""
    tool_choice: dict[str, Any] | None = None
    """As the Messages API takes it: ``{"type": "auto" | "any" | "none"}`` or ``{"type": "tool",
    "name": ...}``, optionally with ``disable_parallel_tool_use``."""

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        choice = self.tool_choice
        if choice is not None:
            kind = choice.get("type")
            if kind not in ("auto", "any", "none", "tool"):
                msg = f"tool_choice type must be auto, any, none or tool, not {kind!r}"
                raise ValueError(msg)
            if kind == "tool" and not isinstance(choice.get("name"), str):
                raise ValueError('tool_choice {"type": "tool"} needs the tool\'s "name"')
        if self.thinking_budget is not None:
            if self.temperature is not None:
                raise ValueError("extended thinking cannot be combined with a temperature")
            if choice is not None and choice.get("type") in ("any", "tool"):
                raise ValueError("extended thinking cannot be combined with a forced tool choice")
        return self


DEFAULT_SETTINGS: Final = ModelSettings()


class ModelInfo(Frozen):
    """What segue needs to know about a model: how much fits in, how much may come out."""

    name: str
    context_window: Annotated[StrictInt, Field(gt=0)]
    max_output_tokens: Annotated[StrictInt, Field(gt=0)]
    known: bool = True
    """False when the name matched no entry and the smallest known window was assumed."""


Provider = Literal["anthropic", "openai"]

# Longest prefix wins. Figures from each provider's model pages (the input window: for the gpt-5
# family, 400,000 tokens in all of which 128,000 are reserved for output, so 272,000 of input);
# the runtime prefers what the provider's API reports when it answers
# (`client.models.retrieve(id)`).
_MODEL_TABLE: tuple[tuple[Provider, str, int, int], ...] = (
    ("anthropic", "claude-3-haiku", 200_000, 4_096),
    ("anthropic", "claude-3-opus", 200_000, 4_096),
    ("anthropic", "claude-3-5-haiku", 200_000, 8_192),
    ("anthropic", "claude-3-5-sonnet", 200_000, 8_192),
    ("anthropic", "claude-3-7-sonnet", 200_000, 64_000),
    ("anthropic", "claude-sonnet-4", 200_000, 64_000),
    ("anthropic", "claude-opus-4", 200_000, 32_000),
    ("anthropic", "claude-opus-4-1", 200_000, 32_000),
    ("anthropic", "claude-haiku-4-5", 200_000, 64_000),
    ("anthropic", "claude-sonnet-4-5", 200_000, 64_000),
    ("anthropic", "claude-opus-4-5", 200_000, 64_000),
    ("anthropic", "claude-sonnet-4-6", 1_000_000, 64_000),
    ("anthropic", "claude-opus-4-6", 1_000_000, 128_000),
    ("anthropic", "claude-opus-4-7", 1_000_000, 128_000),
    ("openai", "gpt-4o", 128_000, 16_384),
    ("openai", "gpt-4o-mini", 128_000, 16_384),
    ("openai", "chatgpt-4o", 128_000, 16_384),
    ("openai", "gpt-4-turbo", 128_000, 4_096),
    ("openai", "gpt-4.5-preview", 128_000, 16_384),
    ("openai", "gpt-4.1", 1_047_576, 32_768),
    ("openai", "gpt-4.1-mini", 1_047_576, 32_768),
    ("openai", "gpt-4.1-nano", 1_047_576, 32_768),
    ("openai", "o1", 200_000, 100_000),
    ("openai", "o1-pro", 200_000, 100_000),
    ("openai", "o1-mini", 128_000, 65_536),
    ("openai", "o3", 200_000, 100_000),
    ("openai", "o3-pro", 200_000, 100_000),
    ("openai", "o3-mini", 200_000, 100_000),
    ("openai", "o4-mini", 200_000, 100_000),
    ("openai", "codex-mini", 200_000, 100_000),
    ("openai", "gpt-5", 272_000, 128_000),
    ("openai", "gpt-5-mini", 272_000, 128_000),
    ("openai", "gpt-5-nano", 272_000, 128_000),
    ("openai", "gpt-5-chat", 128_000, 16_384),
    ("openai", "gpt-5.1", 272_000, 128_000),
    ("openai", "gpt-5.2", 272_000, 128_000),
)
_LEGACY_TABLE: tuple[tuple[Provider, str, int, int], ...] = (
    ("openai", "gpt-4", 8_192, 8_192),
    ("openai", "gpt-4-32k", 32_768, 8_192),
    ("openai", "gpt-3.5-turbo", 16_385, 4_096),
)
"""Retired models, known by name but left out of each provider's smallest window: an unknown
OpenAI model today is far likelier to be a new one than an old one."""
_SMALLEST_OF: Final[dict[Provider, int]] = {
    provider: min(w for p, _, w, _ in _MODEL_TABLE if p == provider)
    for provider in ("anthropic", "openai")
}
_SMALLEST_WINDOW = _SMALLEST_OF["anthropic"]
"""A name of no known provider: the smallest window segue has always assumed (REQ-BED-022)."""
_UNKNOWN_MAX_OUTPUT = 8_192
# claude-opus-5, claude-sonnet-5-1, claude-haiku-6 ...: generation 5 and later have 1M windows.
_LATER_GENERATION = re.compile(r"^claude-(?:opus|sonnet|haiku)-(\d+)(?:-\d+)?$")
_DATE_SUFFIX = re.compile(r"(?:-\d{8}|-\d{4}-\d{2}-\d{2}|-latest|@\d{8})$")
_OPENAI_NAME = re.compile(r"^(?:gpt-|chatgpt-|o\d+(?:-|$)|codex-)")


def provider_of(model: str) -> Provider | None:
    """Whose model ``model`` is by its name (``claude-...``: Anthropic; ``gpt-...``, ``o3``,
    ``chatgpt-...``: OpenAI), None when the name says nothing (a local or proxied model)."""
    name = _base_name(model)
    if name.startswith("claude-"):
        return "anthropic"
    if _OPENAI_NAME.match(name):
        return "openai"
    return None


def _base_name(model: str) -> str:
    name = model.strip().lower()
    if name.startswith("ft:"):  # a fine-tune: ft:gpt-4o-mini-2024-07-18:org::id
        name = name[3:].split(":", 1)[0]
    return _DATE_SUFFIX.sub("", name)


def model_info(model: str) -> ModelInfo:
    """Context window and output limit of ``model``, from the static table.

    Date suffixes (``-20250929``, ``-2024-08-06``), ``-latest`` and a fine-tune's ``ft:`` wrapping
    are ignored. An unknown model gets the smallest known window of its provider (REQ-BED-022):
    guessing too small costs an early continuation, guessing too large costs a crash at the
    provider. A name of no known provider gets 200,000 tokens.
    """
    name = _base_name(model)
    best: tuple[Provider, str, int, int] | None = None
    for entry in (*_MODEL_TABLE, *_LEGACY_TABLE):
        prefix = entry[1]
        if (name == prefix or name.startswith(prefix + "-")) and (
            best is None or len(prefix) > len(best[1])
        ):
            best = entry
    if best is not None and name == best[1]:
        return ModelInfo(name=model, context_window=best[2], max_output_tokens=best[3])
    later = _LATER_GENERATION.match(name)
    if later is not None and int(later.group(1)) >= 5:
        return ModelInfo(name=model, context_window=1_000_000, max_output_tokens=128_000)
    if best is not None:
        return ModelInfo(name=model, context_window=best[2], max_output_tokens=best[3])
    provider = provider_of(model)
    return ModelInfo(
        name=model,
        context_window=_SMALLEST_OF[provider] if provider is not None else _SMALLEST_WINDOW,
        max_output_tokens=_UNKNOWN_MAX_OUTPUT,
        known=False,
    )


def table_name(model: str) -> str | None:
    """The name of the table's entry ``model`` is one of (``claude-sonnet-4-6`` for
    ``claude-sonnet-4-6-20260101``, ``gpt-4o-mini`` for ``ft:gpt-4o-mini-2024-07-18:org::id``),
    a later generation's base name (``claude-opus-5``), or None for a model the table does not
    know. Few names answer for many: what a metric may label a model with without a series per
    name a client makes up."""
    name = _base_name(model)
    best = max(
        (
            e[1]
            for e in (*_MODEL_TABLE, *_LEGACY_TABLE)
            if name == e[1] or name.startswith(e[1] + "-")
        ),
        key=len,
        default=None,
    )
    if best is not None:
        return best
    return name if _LATER_GENERATION.match(name) is not None else None
