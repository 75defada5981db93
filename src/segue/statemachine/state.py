"""``ConversationState``: everything the core knows about one conversation, and how to make one."""

from __future__ import annotations

from decimal import Decimal
from math import ceil
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, Field, StrictInt, model_validator

from segue.statemachine._values import Frozen, given_fields
from segue.statemachine.context_edits import checked_edits
from segue.statemachine.models import (
    DEFAULT_SETTINGS,
    ContextExhaustionBehavior,
    ModelSettings,
    SummaryRequest,
)
from segue.statemachine.phases import IDLE, Phase

Ratio = Annotated[float, Field(gt=0, le=1)]
Count = Annotated[StrictInt, Field(ge=0)]
Compaction = Literal["segue", "provider"]
"""Who compacts a ``COMPACT_IN_PLACE`` conversation: segue's own summary request, or the
provider within the same call (REQ-SEG-048)."""
ContextEdits = Annotated[tuple[dict[str, Any], ...], AfterValidator(checked_edits)]
"""The provider's context-editing strategies a conversation asks for (REQ-SEG-050)."""


PauseTurns = Annotated[StrictInt, Field(ge=1, le=1_000_000)]
"""A count of turns after which a conversation pauses (REQ-SEG-052)."""
PauseSeconds = Annotated[float, Field(gt=0, le=366 * 24 * 3600, allow_inf_nan=False)]
"""Seconds after which a conversation pauses at its next turn's end (REQ-SEG-053): at most a
year (anything longer is no bound)."""


WindowSource = Literal["given", "server", "table", "assumed"]
"""Where a conversation's window came from: ``given`` by the application, reported by the
``server`` that runs the model, segue's ``table`` of models, or ``assumed`` (a model nobody
described: its provider's smallest window)."""

MAX_PROMPT_CHARS = 20_000
"""Longest custom instruction or focus taken: an instruction, not a document."""
MIN_TOOL_OUTPUT_TOKENS = 256
"""The smallest cap on a tool's output: room for a head, a tail and the note between them."""
TOOL_OUTPUT_CAP = 25_000
"""The default cap on one tool result in a large window (what Claude Code allows a tool)."""


def default_tool_output_cap(window: int) -> int:
    """The default cap on one tool result: 25,000 tokens, or an eighth of a smaller window (a
    1,000,000-character result must not fill a 32k window alone), never below the minimum."""
    return max(MIN_TOOL_OUTPUT_TOKENS, min(TOOL_OUTPUT_CAP, window // 8))


def threshold_tokens(ratio: float, window: int) -> int:
    """The smallest token count at or above ``ratio`` of ``window``, computed exactly.

    ``tokens >= ratio * window`` on floats can be off by one ulp; on integers the threshold is
    ``ceil(ratio * window)`` with the ratio read as the decimal the user wrote (0.9 of 200,000 is
    exactly 180,000).
    """
    return ceil(Decimal(repr(ratio)) * window)


def check_compaction(compaction: object, behavior: object) -> None:
    """Refuse the provider's compaction for a conversation that does not compact in place: it
    is what ``COMPACT_IN_PLACE`` does at the limit, done by the provider (REQ-SEG-048)."""
    if compaction != "provider":
        return
    if behavior is None:
        behavior = ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION
    if not isinstance(behavior, str):
        return  # field validation says what is wrong with the behaviour
    try:
        chosen = ContextExhaustionBehavior(behavior)
    except ValueError:
        return
    if chosen is not ContextExhaustionBehavior.COMPACT_IN_PLACE:
        msg = (
            'compaction="provider" is how a compact_in_place conversation compacts; this one is '
            f'{chosen.value}: create it with behavior="compact_in_place", or leave compaction '
            'as "segue"'
        )
        raise ValueError(msg)


class ConversationConfig(Frozen):
    """What is fixed for the life of a conversation: identity, model, policy, bounds."""

    id: Annotated[str, Field(min_length=1, max_length=200)]
    parent_id: str | None = None
    model: Annotated[str, Field(min_length=1)]
    context_window: Annotated[StrictInt, Field(gt=0)]
    max_output_tokens: Annotated[StrictInt, Field(gt=0)]
    behavior: ContextExhaustionBehavior = ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION
    warning_threshold: Ratio = 0.80
    continuation_threshold: Ratio = 0.90
    warning_tokens: Count = 0
    """Derived: ``threshold_tokens(warning_threshold, context_window)``."""
    continuation_tokens: Count = 0
    """Derived: ``threshold_tokens(continuation_threshold, context_window)``."""
    max_attempts: Annotated[StrictInt, Field(ge=1, le=20)] = 4
    """Attempts per request (LLM, summary, checkpoint, compaction) before giving up."""
    retry_base_delay: Annotated[float, Field(ge=0, le=600)] = 1.0
    retry_max_delay: Annotated[float, Field(ge=0, le=3600)] = 30.0
    max_continuations: Annotated[StrictInt, Field(ge=0, le=10_000)] = 10
    """Checkpoint restarts or compactions allowed in one conversation: the loop breaker."""
    max_tool_rounds: Annotated[StrictInt, Field(ge=1, le=10_000)] = 50
    """Tool rounds one turn may run (a user message, or a fresh session's first prompt, starts a
    turn): past it the model is asked once more, without tools, for its answer."""
    system_tokens: Count = 0
    """Estimated tokens of the system prompt and tool definitions: part of every fresh start."""
    settings: ModelSettings = DEFAULT_SETTINGS
    """Temperature, extended thinking and tool choice: how the model is asked (the core does
    not read them; they live here so they are fixed, persisted and validated with the rest)."""
    summary_prompt: Annotated[str, Field(max_length=MAX_PROMPT_CHARS, pattern=r"\S")] | None = None
    """The instruction of the request the behaviour sends at the limit (the continuation
    summary, the checkpoint, the compaction summary) in place of segue's (REQ-SEG-040)."""
    summary_model: Annotated[str, Field(min_length=1)] | None = None
    """The model the limit's requests go to; ordinary turns go to ``model`` (REQ-SEG-045)."""
    max_tool_output_tokens: Annotated[StrictInt, Field(ge=MIN_TOOL_OUTPUT_TOKENS)] | None = None
    """The most one tool result may hold; a longer one is recorded with its head and tail and a
    note of what was cut (REQ-SEG-043). Left out (None), it is set from the window on
    validation: ``default_tool_output_cap(context_window)``."""
    max_run_seconds: Annotated[float, Field(gt=0)] | None = None
    """``CHECKPOINT_RESTART``: past this many seconds since the conversation was created, the
    limit ends the run instead of restarting it (REQ-SEG-044). None: no bound."""
    window_source: WindowSource | None = None
    """Where ``context_window`` came from (the core does not read it; it is shown where the user
    looks, so that an assumed window is not taken for a known one). None: a conversation made
    before segue kept it."""
    compaction: Compaction = "segue"
    """``provider``: the provider compacts the conversation within its own calls, at the
    continuation threshold (``COMPACT_IN_PLACE`` only; REQ-SEG-048)."""
    context_edits: ContextEdits = ()
    """The provider's context-editing strategies sent with every turn (REQ-SEG-050)."""
    summary_request: SummaryRequest = "tool_less"
    """How the limit's requests are sent: ``tool_less`` (REQ-BED-020, REQ-SEG-047) or
    ``reuse_prefix``, the turn's request repeated with the instruction appended (REQ-SEG-055)."""
    pause_after_turns: PauseTurns | None = None
    """Pause at the end of the turn that makes this many since the conversation was created
    or last resumed (REQ-SEG-052). None: no count pauses it."""
    pause_after_seconds: PauseSeconds | None = None
    """Pause at the end of the first turn that ends this many seconds or more after the
    conversation was created or last resumed (REQ-SEG-053). None: no time pauses it."""

    @property
    def tool_output_cap(self) -> int:
        """The most tokens one tool result may hold in this conversation."""
        cap = self.max_tool_output_tokens
        return default_tool_output_cap(self.context_window) if cap is None else cap

    @property
    def pinned_budget(self) -> int:
        """The most tokens pinned messages may hold together: a quarter of the window, so that
        every fresh start still has room for its seed and for work (REQ-SEG-042)."""
        return self.context_window // 4

    @model_validator(mode="before")
    @classmethod
    def _derive_thresholds(cls, given: Any) -> Any:
        data = given_fields(given)
        if data is None:
            return given
        window = data.get("context_window")
        warning = data.get("warning_threshold", 0.80)
        continuation = data.get("continuation_threshold", 0.90)
        numbers = (int, float)
        if not (
            isinstance(window, int)
            and isinstance(warning, numbers)
            and isinstance(continuation, numbers)
            and 0 < warning <= 1
            and 0 < continuation <= 1
            and window > 0
        ):
            return given  # field validation reports what is wrong
        settings = data.get("settings")
        budget = getattr(settings, "thinking_budget", None)
        if isinstance(settings, dict):
            budget = settings.get("thinking_budget")
        output = data.get("max_output_tokens")
        if isinstance(budget, int) and isinstance(output, int) and budget >= output:
            msg = (
                f"the thinking budget ({budget}) must be below max_output_tokens ({output}): "
                "the thinking is part of the output"
            )
            raise ValueError(msg)
        if warning > continuation:
            msg = (
                f"warning_threshold ({warning}) must not exceed "
                f"continuation_threshold ({continuation})"
            )
            raise ValueError(msg)
        check_compaction(data.get("compaction", "segue"), data.get("behavior"))
        derived = {
            "warning_tokens": threshold_tokens(float(warning), window),
            "continuation_tokens": threshold_tokens(float(continuation), window),
        }
        if data.get("max_tool_output_tokens") is None:  # the default, kept with the config
            data = {**data, "max_tool_output_tokens": default_tool_output_cap(window)}
        for name, value in derived.items():
            if name in data and data[name] != value:
                msg = f"{name} is derived from the thresholds and the window; got {data[name]}"
                raise ValueError(msg)
        return {**data, **derived}


class ConversationState(Frozen):
    """One conversation as the core sees it. Every change goes through ``transition()``."""

    config: ConversationConfig
    phase: Phase = IDLE
    context_tokens: Count | None = None
    """Occupancy measured by the latest response with usage; ``None`` until one arrives (and
    again after a fresh session or generation)."""
    pending_tokens: Count = 0
    """Estimated (or counted) tokens appended since ``context_tokens`` was measured."""
    warned: bool = False
    session: Annotated[StrictInt, Field(ge=1)] = 1
    generation: Annotated[StrictInt, Field(ge=1)] = 1
    continuations: Count = 0
    snapshots: Count = 0
    message_count: Count = 0
    tool_rounds: Count = 0
    """Tool rounds run since the turn began (bounded by ``max_tool_rounds``)."""
    resume_context: str | None = None
    """The compiled resume context of a resumed session: part of its system prompt."""
    provider_session: str | None = None
    """The provider's own session the current session continues (a Claude Agent SDK session
    id), from the latest response that named one; ``None`` in a new session (REQ-SEG-032)."""
    pause_requested: bool = False
    pause_reason: str = ""
    pinned_tokens: Count = 0
    """Tokens of the pinned messages (REQ-SEG-042): part of every fresh start's projection."""
    compaction_fallback: bool = False
    """The provider could not compact this conversation once (REQ-SEG-049): segue compacts it
    itself from then on, whatever its ``compaction`` says."""
    turns_since_resume: Count = 0
    """Turns answered since the conversation was created or last resumed: what
    ``pause_after_turns`` counts (REQ-SEG-052). A resume starts it again from 0."""
    active_since: float | None = None
    """Unix time the conversation was created or last resumed, by the runtime's clock (the core
    has none: it comes as data, from the runtime at creation and from ``ResumeRequested.at``):
    what ``pause_after_seconds`` measures from (REQ-SEG-053). None: not known yet; the first
    answer that carries a time (``LlmResponse.at``) starts it."""

    @property
    def id(self) -> str:
        """The conversation id."""
        return self.config.id

    @property
    def parent_id(self) -> str | None:
        """The conversation this one continues (or the parent of a sub-agent)."""
        return self.config.parent_id

    @property
    def model(self) -> str:
        """The model this conversation talks to."""
        return self.config.model

    @property
    def behavior(self) -> ContextExhaustionBehavior:
        """What happens at the threshold."""
        return self.config.behavior

    @property
    def context_window(self) -> int:
        """Tokens the model can hold."""
        return self.config.context_window

    @property
    def projected_tokens(self) -> int:
        """What the next request's prompt is expected to hold: pre-flight's figure."""
        return (self.context_tokens or 0) + self.pending_tokens

    @property
    def occupancy(self) -> float | None:
        """Measured occupancy as a fraction of the window, ``None`` when unknown."""
        if self.context_tokens is None:
            return None
        return self.context_tokens / self.config.context_window

    def with_phase(self, phase: Phase) -> Self:
        """A copy in another phase, for tests and tools that need a state in a given phase."""
        return self.model_copy(update={"phase": phase})
