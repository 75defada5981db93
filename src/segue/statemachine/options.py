"""``ConversationOptions``: what a conversation is created with, as one value.

A backend creates conversations with the same settings over and over, and a conversation that
goes on in a new one (``Runtime.start_new_from``) passes its settings on: as one value, httpx's
``Timeout`` and ``Limits`` are passed whole, not field by field. ``Runtime.create_conversation``
takes this value (or its fields as keywords), the server's create request is this value, and the
CLI builds one from its flags. ``initial_state`` turns it into the new conversation, given what
the model's adapter reported of its window: the one resolution all three share, so the same
options make the same conversation however they came (its window, its bound on output, its
smallest window, ``MIN_WINDOW``). ``of`` reads the options back from a config, so that a child
inherits them whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Self

from pydantic import Field, StrictFloat, StrictInt, ValidationError, model_validator

from segue.statemachine._values import Frozen
from segue.statemachine.accounting import estimate_tokens
from segue.statemachine.models import (
    ContextExhaustionBehavior,
    Message,
    ModelSettings,
    Provider,
    SummaryRequest,
    model_info,
    provider_of,
)
from segue.statemachine.state import (
    MAX_PROMPT_CHARS,
    MIN_TOOL_OUTPUT_TOKENS,
    Compaction,
    ContextEdits,
    ConversationConfig,
    ConversationState,
    WindowSource,
    check_compaction,
)

MIN_WINDOW: Final = 1_000
"""The smallest context window a conversation is created with (through ``Runtime``, the server's
API and the CLI alike): below it not even the system prompt and one exchange fit before the
threshold. The core's own model (``new_conversation``) explores smaller ones."""
DEFAULT_OUTPUT_TOKENS: Final = 8_192
"""A conversation's bound on one answer unless it says otherwise: room for a long reply, while a
prompt at the continuation threshold plus this still fits the smallest window."""
_SETTINGS = ("temperature", "thinking_budget", "tool_choice")
"""The options that say how the model is asked: kept together in ``ModelSettings``."""


class ConversationOptions(Frozen):
    """How a conversation is to be created: its model and system prompt, what it does at the
    limit, and the bounds it runs within. Every field but ``model`` has a default; invalid
    values raise ``pydantic.ValidationError`` when the value is made, before anything is stored.
    """

    model: Annotated[str, Field(min_length=1)]
    """The model that answers the conversation's turns."""
    behavior: ContextExhaustionBehavior = ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION
    """What happens at the limit."""
    system: str | None = None
    """The system prompt."""
    warning_threshold: Annotated[StrictFloat, Field(gt=0, le=1)] = 0.80
    """The fraction of the window from which the user is warned (and may continue by hand)."""
    continuation_threshold: Annotated[StrictFloat, Field(gt=0, le=1)] = 0.90
    """The fraction of the window at which the behaviour's path at the limit starts."""
    max_continuations: Annotated[StrictInt, Field(ge=0, le=10_000)] = 10
    """Checkpoint restarts or compactions allowed in one conversation: the loop breaker."""
    max_attempts: Annotated[StrictInt, Field(ge=1, le=20)] = 4
    """Attempts per request (LLM, summary, checkpoint, compaction) before giving up."""
    retry_base_delay: Annotated[StrictFloat, Field(ge=0, le=600)] = 1.0
    """Seconds before the first retry of a failed request (doubled for each one after it)."""
    retry_max_delay: Annotated[StrictFloat, Field(ge=0, le=3600)] = 30.0
    """The longest wait before a retry."""
    max_tool_rounds: Annotated[StrictInt, Field(ge=1, le=10_000)] = 50
    """Tool rounds one turn may run; past it the model is asked, without tools, for its answer."""
    context_window: Annotated[StrictInt, Field(gt=0)] | None = None
    """The window in tokens; None: what the provider reports, else segue's table of models.
    A conversation is created with ``MIN_WINDOW`` or more (``initial_state``)."""
    max_output_tokens: Annotated[StrictInt, Field(gt=0)] | None = None
    """The bound on one answer; None: room for a long reply (and a thinking budget)."""
    temperature: Annotated[StrictFloat, Field(ge=0, le=1)] | None = None
    """Sampling temperature, for servers that take one."""
    thinking_budget: Annotated[StrictInt, Field(ge=1024)] | None = None
    """Extended thinking's budget in tokens."""
    tool_choice: dict[str, Any] | None = None
    """As the Messages API takes it (``{"type": "auto" | "any" | "none" | "tool", ...}``)."""
    summary_prompt: Annotated[str, Field(max_length=MAX_PROMPT_CHARS, pattern=r"\S")] | None = None
    """The instruction of the request sent at the limit, in place of segue's (REQ-SEG-040)."""
    summary_model: Annotated[str, Field(min_length=1)] | None = None
    """The model the limit's requests go to (REQ-SEG-045); None: ``model``."""
    max_tool_output_tokens: Annotated[StrictInt, Field(ge=MIN_TOOL_OUTPUT_TOKENS)] | None = None
    """The most one tool result may hold (REQ-SEG-043); None: from the window."""
    max_run_seconds: Annotated[StrictFloat, Field(gt=0)] | None = None
    """``CHECKPOINT_RESTART``: past this many seconds, the limit ends the run (REQ-SEG-044)."""
    window_source: WindowSource | None = None
    """Where ``context_window`` came from, when it was resolved before (a continued
    conversation passes its parent's on); None: ``given`` when ``context_window`` is set."""
    compaction: Compaction = "segue"
    """``COMPACT_IN_PLACE``: who compacts. ``segue`` sends its own summary request;
    ``provider`` has the provider compact within the same call, at the continuation threshold
    (REQ-SEG-048; the model adapter must be able to, or the conversation is refused)."""
    context_edits: ContextEdits = ()
    """The provider's context-editing strategies, as its API documents them
    (``clear_tool_uses_20250919``, ``clear_thinking_20251015``), sent with every turn
    (REQ-SEG-050; refused for an adapter that cannot send them)."""
    summary_request: SummaryRequest = "tool_less"
    """How the limit's requests (continuation summary, checkpoint, compaction summary) are
    sent. ``tool_less``: no tool callable (REQ-BED-020), the turn's tools and system prompt read
    from the provider's cache, the history billed at the plain rate (REQ-SEG-047).
    ``reuse_prefix``: the turn's request repeated exactly, the instruction appended with a cache
    breakpoint, so the whole prefix is read from the cache; a tool the model calls is never run
    and the summary is asked for again (REQ-SEG-055, REQ-SEG-056; the model adapter must say it
    can, or the conversation is refused)."""
    pause_after_turns: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = None
    """Pause at the end of the Nth turn since the conversation was created or last resumed,
    as a pause asked for would be, with the reason "after N turns" (REQ-SEG-052)."""
    pause_after_seconds: (
        Annotated[StrictFloat, Field(gt=0, le=366 * 24 * 3600, allow_inf_nan=False)] | None
    ) = None
    """Pause at the end of the first turn that ends this many seconds or more after the
    conversation was created or last resumed, with the reason "after 30 minutes"
    (REQ-SEG-053). Never mid-turn: a turn running at that moment finishes first."""

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if self.warning_threshold > self.continuation_threshold:
            msg = (
                f"warning_threshold ({self.warning_threshold}) must not exceed "
                f"continuation_threshold ({self.continuation_threshold})"
            )
            raise ValueError(msg)
        self.settings  # noqa: B018  # refuses the combinations the Messages API refuses
        check_compaction(self.compaction, self.behavior)
        if self.summary_request == "reuse_prefix" and self.summary_model is not None:
            msg = (
                'summary_request="reuse_prefix" repeats the turn\'s request, its model included '
                "(another model has no cache of it): leave summary_model out, or "
                'summary_request as "tool_less"'
            )
            raise ValueError(msg)
        return self

    @property
    def settings(self) -> ModelSettings:
        """How the model is asked (temperature, thinking, tool choice), as the core keeps it."""
        return ModelSettings(**{name: getattr(self, name) for name in _SETTINGS})

    @classmethod
    def of(cls, config: ConversationConfig, system: str | None) -> Self:
        """The options ``config`` was made with (what a conversation continued in a new one
        passes on): its window and bound on output as they were resolved."""
        fields: dict[str, Any] = {
            name: getattr(config, name) for name in cls.model_fields if name in _CONFIG_FIELDS
        }
        fields |= {name: getattr(config.settings, name) for name in _SETTINGS}
        return cls(
            **fields,
            system=system,
            context_window=config.context_window,
            max_output_tokens=config.max_output_tokens,
            # Resolved before (a config stored before window_source was kept says nothing):
            # never refused again, whatever the smallest window is now.
            window_source=config.window_source or "given",
        )

    def config(
        self,
        *,
        conversation_id: str,
        parent_id: str | None,
        context_window: int,
        max_output_tokens: int,
        system_tokens: int | None = None,
        window_source: WindowSource | None = None,
    ) -> ConversationConfig:
        """The conversation's fixed config, once the runtime resolved its window and its bound
        on output (what the provider reports, segue's table, the defaults). ``system_tokens``:
        what the system prompt and the tools take (default: the system prompt's estimate)."""
        fields: dict[str, Any] = {
            name: getattr(self, name) for name in _CONFIG_FIELDS if name in type(self).model_fields
        }
        return ConversationConfig(
            **fields,
            id=conversation_id,
            parent_id=parent_id,
            context_window=context_window,
            max_output_tokens=max_output_tokens,
            system_tokens=(
                system_tokens
                if system_tokens is not None
                else estimate_tokens(self.system)
                if self.system
                else 0
            ),
            settings=self.settings,
            window_source=window_source or self.window_source,
        )


_CONFIG_FIELDS = frozenset(ConversationConfig.model_fields) - {
    "id",
    "parent_id",
    "context_window",
    "max_output_tokens",
    "warning_tokens",
    "continuation_tokens",
    "system_tokens",
    "settings",
    "window_source",
}
"""The options the config keeps as they are (the rest it derives or resolves)."""


@dataclass(frozen=True, slots=True)
class Window:
    """A model's input window in tokens, and where the figure came from (``WindowSource``)."""

    tokens: int
    source: WindowSource


def window_in_table(model: str, provider: Provider | None = None) -> Window:
    """The window segue's table gives ``model`` (``table``); for a model it does not know, the
    smallest window of the provider its name says, else of ``provider`` (the adapter's), else
    the smallest segue has always assumed (``assumed``, REQ-BED-022)."""
    info = model_info(model)
    if info.known:
        return Window(info.context_window, "table")
    owner = provider_of(model) or provider
    tokens = info.context_window if owner is None else model_info(_UNKNOWN_OF[owner]).context_window
    return Window(tokens, "assumed")


_UNKNOWN_OF: Final[dict[Provider, str]] = {"anthropic": "claude-", "openai": "gpt-"}
"""A name the table knows to be its provider's and no model's: ``model_info`` answers it with the
provider's smallest window, the guess for any model of that provider the table lacks."""


def check_window(tokens: int) -> None:
    """Refuse a window given below ``MIN_WINDOW``, in the words every way of creating a
    conversation says it (a ``ValueError``: the server answers it as a 422, the CLI as a usage
    error)."""
    if tokens < MIN_WINDOW:
        msg = (
            f"a context window of {tokens:,} tokens is out of range: give {MIN_WINDOW:,} or more "
            "(below it not even the system prompt and one exchange fit before the threshold)"
        )
        raise ValueError(msg)


def resolved_window(options: ConversationOptions, reported: Window | None = None) -> Window:
    """The window a conversation made with ``options`` gets: ``context_window`` when given
    (``given``, or where a continued conversation's parent had it from), else what the model's
    adapter ``reported``, else segue's table (``window_in_table``)."""
    if options.context_window:
        return Window(options.context_window, options.window_source or "given")
    return reported if reported is not None else window_in_table(options.model)


def output_bound(options: ConversationOptions) -> int:
    """What one answer may hold: ``max_output_tokens`` as given, else ``DEFAULT_OUTPUT_TOKENS``
    (with room for the thinking budget), within the model's limit."""
    if options.max_output_tokens is not None:
        return options.max_output_tokens
    wanted = DEFAULT_OUTPUT_TOKENS
    if options.thinking_budget is not None:
        wanted = max(wanted, options.thinking_budget + DEFAULT_OUTPUT_TOKENS)
    return min(model_info(options.model).max_output_tokens, wanted)


def options_with(
    options: ConversationOptions | None, fields: dict[str, Any]
) -> ConversationOptions:
    """``options`` with ``fields`` set over them (or the options of ``fields`` alone), as every
    way of creating a conversation takes them; invalid values raise
    ``pydantic.ValidationError``."""
    if options is None:
        return ConversationOptions(**fields)
    if fields:
        return ConversationOptions.model_validate(options.model_dump() | fields)
    return options


def initial_state(
    options: ConversationOptions,
    *,
    conversation_id: str,
    parent_id: str | None = None,
    reported: Window | None = None,
    seed: Sequence[Message] = (),
    system_tokens: int | None = None,
    started_at: float | None = None,
) -> ConversationState:
    """The new, idle conversation ``options`` make: the one resolution of options into a state
    that ``Runtime.create_conversation`` (and through it the server's API and the CLI) and
    ``new_conversation`` share, so that the same options make the same conversation whichever
    way they came.

    ``reported``: the model's window as its adapter says it (left out: segue's table); a given
    ``context_window`` goes first (``resolved_window``), and one given below ``MIN_WINDOW`` is
    refused (``pydantic.ValidationError``, in ``check_window``'s words). The bound on output is
    ``output_bound``'s. ``seed``: the messages it starts with (what a continued conversation
    carries over), counted into pre-flight with the system prompt (``system_tokens``; default:
    the system prompt's estimate). ``started_at``: the Unix time it was created, by the
    caller's clock, which ``pause_after_seconds`` measures from.
    """
    if options.context_window is not None and options.window_source is None:
        try:
            check_window(options.context_window)
        except ValueError as error:
            raise _refused("context_window", options.context_window, error) from None
    return _state(
        options,
        conversation_id=conversation_id,
        parent_id=parent_id,
        reported=reported,
        seed=seed,
        system_tokens=system_tokens,
        started_at=started_at,
    )


def _refused(field: str, given: object, error: ValueError) -> ValidationError:
    """``error`` as pydantic says a refused field: what the options' own checks raise."""
    return ValidationError.from_exception_data(
        ConversationOptions.__name__,
        [{"type": "value_error", "loc": (field,), "input": given, "ctx": {"error": error}}],
    )


def _state(
    options: ConversationOptions,
    *,
    conversation_id: str,
    parent_id: str | None,
    reported: Window | None,
    seed: Sequence[Message],
    system_tokens: int | None,
    started_at: float | None,
) -> ConversationState:
    window = resolved_window(options, reported)
    config = options.config(
        conversation_id=conversation_id,
        parent_id=parent_id,
        context_window=window.tokens,
        max_output_tokens=output_bound(options),
        system_tokens=system_tokens,
        window_source=window.source,
    )
    return ConversationState(
        config=config,
        pending_tokens=config.system_tokens + sum(estimate_tokens(m.text) for m in seed),
        pinned_tokens=sum(estimate_tokens(m.text) for m in seed if m.pinned),
        active_since=started_at,  # what pause_after_seconds measures from (REQ-SEG-053)
    )


def new_conversation(
    options: ConversationOptions | None = None,
    /,
    *,
    conversation_id: str | None = None,
    parent_id: str | None = None,
    system_tokens: int | None = None,
    started_at: float | None = None,
    **fields: Any,
) -> ConversationState:
    """A new, idle conversation made with ``options``, or with its fields as keywords
    (``new_conversation(model="claude-sonnet-4-5", behavior=...)``).

    The core has no randomness, so without ``conversation_id`` the id is derived from the
    parent (``<parent>.child``) or is ``"conversation"``; runtimes always pass a fresh one. It
    is ``initial_state`` with the window and the bound on output from segue's table (the
    runtime asks the model's adapter first), except that a window of any size is taken: the
    core's own tests and model check explore windows below ``MIN_WINDOW``. ``system_tokens``
    seeds pre-flight with what the system prompt and the tools take (default: the options'
    system prompt, estimated). ``started_at``: the Unix time it was created, by the caller's
    clock, which ``pause_after_seconds`` measures from (the core has none; left out, the first
    answer that carries a time starts it). Invalid values raise ``pydantic.ValidationError``.
    """
    options = options_with(options, fields)
    return _state(
        options,
        conversation_id=conversation_id
        if conversation_id is not None
        else (f"{parent_id}.child" if parent_id else "conversation"),
        parent_id=parent_id,
        reported=None,
        seed=(),
        system_tokens=system_tokens,
        started_at=started_at,
    )
