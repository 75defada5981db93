"""The model port: what an LLM adapter is given, what it answers, and what it must do.

The executor talks to a model only through ``LlmModel``. Adapters translate to and from a
provider (``AnthropicModel``, ``OpenAIModel``, the offline ``ScriptedModel``;
``docs/adapters.md`` for writing another) and never decide: everything an adapter needs for one
call is in the ``LlmRequest``, everything the core needs back is in the ``LlmReply`` (or the
``LlmCallError`` it raises). What an adapter may do beyond the four members is declared here
too (``ContentChecker``; ``ContextManaging``, what the provider does to the context on its own
side), with defaults in ``BaseLlmModel``, so the runtime never has to guess what an adapter can
do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, TypeGuard, runtime_checkable

from segue.statemachine import (
    CompactionBlock,
    ContentBlock,
    ContextExhaustionBehavior,
    Message,
    ModelSettings,
    ToolCall,
    Usage,
)
from segue.statemachine.models import DEFAULT_SETTINGS

Purpose = Literal["turn", "continuation", "checkpoint", "compaction"]
"""Why the LLM is asked: a normal turn (with tools), or one of the tool-less summary requests."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionAsk:
    """The provider is asked to compact the request's context itself (a conversation created
    with ``compaction="provider"``, REQ-SEG-048)."""

    trigger_tokens: int
    """Compact once the prompt holds this many tokens: the conversation's continuation
    threshold (raised to the provider's minimum), or on demand the current size."""
    instructions: str | None = None
    """What the summary must hold (the conversation's ``summary_prompt``, a manual focus),
    for a provider that takes instructions; None: the provider's own."""
    pause_after: bool = False
    """Stop after the compaction, before answering: the pinned messages (and the turn that
    was asked) then follow the compaction in the request segue sends next."""


TextSink = Callable[[str], None]
"""Receives the text of a reply as the model writes it, one delta at a time."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentToolActivity:
    """A tool the provider's own agent started, or finished, while answering (an agent loop
    such as the Claude Agent SDK runs its tools itself): told as it happens, for a UI."""

    id: str
    name: str
    input: dict[str, Any] = field(default_factory=dict)
    finished: bool = False
    is_error: bool = False
    output: str = ""


ToolSink = Callable[[AgentToolActivity], None]
"""Receives the provider's own tool activity as it happens (see ``AgentToolActivity``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """A tool as the LLM sees it: name, description and JSON schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmRequest:
    """Everything an adapter needs for one call; the executor builds it from the store.

    ``messages`` is the view the model must see: the current session and generation only, with
    every ``tool_use`` paired (the core guarantees this outside ``ToolExecuting``). For the
    requests at the limit ``instruction`` is the request to append (the summary prompt, the
    checkpoint prompt) and ``tools`` are the turn's, declared so that the request repeats the
    turn's prefix (which the provider's prompt cache holds) but never callable (REQ-SEG-047), or,
    with ``reuse_prefix``, callable as in the turn (REQ-SEG-055); see ``LlmModel`` for what an
    adapter sends.
    """

    conversation_id: str
    model: str
    purpose: Purpose
    system: str | None
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    instruction: str | None = None
    rejected_tool_calls: Sequence[ToolCall] = ()
    trim_level: int = 0
    max_tokens: int = 4096
    settings: ModelSettings = DEFAULT_SETTINGS
    """The conversation's temperature, extended thinking and tool choice."""
    final: bool = False
    """The grace request of a turn that reached its tool-round limit: tools stay declared (the
    history holds tool blocks) but must not be called; ``instruction`` says to answer now."""
    behavior: ContextExhaustionBehavior = ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION
    """What the conversation does at the limit (an adapter whose provider compacts on its own
    lets it only for ``COMPACT_IN_PLACE``)."""
    context_window: int | None = None
    """The conversation's window in tokens (what its thresholds are fractions of)."""
    stop_at_tokens: int | None = None
    """The conversation's continuation threshold in tokens: an adapter whose one request runs
    several model calls (an agent loop) stops it when a call's occupancy reaches this, and
    answers with ``stop_reason="pause_turn"`` (REQ-SEG-034)."""
    provider_session: str | None = None
    """The provider's own session to resume (``LlmReply.session_ref`` of an earlier answer in
    this session, REQ-SEG-032); None: start one."""
    compaction: CompactionAsk | None = None
    """Ask the provider to compact the context within this call (REQ-SEG-048); None: do not."""
    context_edits: tuple[dict[str, Any], ...] = ()
    """The provider's context-editing strategies to send, as the conversation was created with
    them (REQ-SEG-050)."""
    reuse_prefix: bool = False
    """A request at the limit to send as the turn's request repeated exactly (its tools callable
    with the turn's tool choice, its thinking settings, its breakpoints), ``rejected_tool_calls``
    and ``instruction`` appended as the last user content with a cache breakpoint on it
    (``summary_request="reuse_prefix"``, REQ-SEG-055). Only an adapter that says it can
    (``PrefixReusing``) is given one; the core refuses any call in its answer (REQ-SEG-056)."""
    on_text: TextSink | None = field(default=None, compare=False, repr=False)
    """Someone watches this turn: call it with each piece of the reply's text as the model
    writes it. The pieces of one call join to exactly the ``text`` of the reply it returns (an
    attempt that fails voids what it streamed). None: nobody watches; an adapter that cannot
    stream ignores it, and its reply is shown whole once it is complete."""
    on_tool: ToolSink | None = field(default=None, compare=False, repr=False)
    """Someone watches this turn: call it as the provider's own agent starts and finishes
    tools (an adapter that runs an agent loop, such as the Claude Agent SDK's). None: nobody
    watches, or tell nothing."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderCompaction:
    """A compaction the provider made of its own context during a request (REQ-SEG-033,
    REQ-SEG-048)."""

    summary: str
    trigger: Literal["auto", "manual"] = "auto"
    pre_tokens: int | None = None
    """What the provider said its context held before, if it said."""
    post_tokens: int | None = None
    """What the provider estimates its context holds after, if it said."""
    block: CompactionBlock | None = None
    """The compaction as the provider returned it, to be sent back verbatim (a provider that
    leaves the history to segue); None for one that keeps it in a session of its own."""
    usage: Usage | None = None
    """What the compaction itself cost (Anthropic's ``compaction`` iteration, what OpenAI's
    ``responses.compact`` reports): never the occupancy."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextEdit:
    """An edit the provider applied to the context before answering (REQ-SEG-050)."""

    strategy: str
    """``clear_tool_uses_20250919`` or ``clear_thinking_20251015``."""
    cleared: int
    """How many tool uses, or thinking turns, it cleared."""
    cleared_input_tokens: int
    """How many input tokens it cleared."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmReply:
    """What the model answered. ``usage`` is the per-request usage of THIS call, or None."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None
    stop_reason: str = "end_turn"
    content: tuple[ContentBlock, ...] = ()
    """The reply's blocks in order when it holds more than text and tool calls (thinking, which
    the transcript must keep to send back unchanged); empty otherwise."""
    session_ref: str | None = None
    """The provider's own session this answer belongs to, for a provider that keeps one."""
    compactions: tuple[ProviderCompaction, ...] = ()
    """Compactions the provider made of its own context while answering, in order."""
    response_id: str | None = None
    """The provider's id of this response, if it gave one (for tracing)."""
    response_model: str | None = None
    """The model that answered, as the provider names it (for tracing)."""
    context_edits: tuple[ContextEdit, ...] = ()
    """The edits the provider applied to the context before answering (REQ-SEG-050)."""


class LlmModel(Protocol):
    """An LLM adapter: one provider behind four members (``docs/adapters.md`` walks through
    writing one; ``segue.testing.conformance`` checks one against a fake of its provider).

    What ``complete`` must do depends on ``request.purpose``:

    - ``turn``: send the history with its tool calls and results (each call answered once,
      ``history.paired``) and ``request.tools`` as callable tools; with ``request.final`` (the
      grace request at ``max_tool_rounds``) keep the tools declared but not callable (the
      provider's "none" tool choice) and send ``request.instruction`` last.
    - ``continuation``, ``checkpoint``, ``compaction`` (the requests at the limit): offer no
      callable tool (REQ-BED-020). An adapter whose provider caches prompts sends the turn's
      prefix unchanged, ``request.tools`` declared with the provider's "none" tool choice,
      then ``rejected_tool_calls`` and ``instruction`` (REQ-SEG-047, ``anthropic_payload``);
      any adapter may instead send the history as text without tools (``history.text_turns``:
      tool blocks as prose, ``rejected_tool_calls`` named, ``instruction`` last), and must
      when ``trim_level`` asks it to drop the oldest history. With ``request.reuse_prefix``
      (only for an adapter that is ``PrefixReusing``) it sends the turn's request exactly, as
      for a turn, with ``rejected_tool_calls`` and ``instruction`` appended last (and a cache
      breakpoint on them where the provider takes one), and returns any tool call the model
      makes in ``tool_calls``: the core refuses it (REQ-SEG-055, REQ-SEG-056).

    The reply's ``usage`` is this one call's, in the four fields whose sum is the occupancy
    after it (``replies.usage_from_prompt`` maps a report whose prompt holds its cached part),
    or None when the provider said nothing. Failures are ``LlmCallError`` and nothing else:
    ``context_overflow`` when the prompt does not fit, ``retryable`` (with ``retry_after``)
    when another attempt may succeed, ``fatal`` when nothing will; never with the API key in
    the message or in any exception chained below it. A stream that did not end properly is an
    error, never a reply. Cancellation is let through as ``asyncio.CancelledError``.

    A request someone watches carries ``on_text`` (and ``on_tool``): an adapter that streams
    calls it with each piece of reply text as it arrives (see ``LlmRequest.on_text``).

    An adapter whose API cannot take some content blocks (a PDF on OpenAI's Chat Completions)
    is also a ``ContentChecker``: ``Runtime.send`` and ``stream`` ask it before anything is
    stored or sent. ``BaseLlmModel`` gives every optional member a default.
    """

    @property
    def exact_preflight(self) -> bool:
        """Whether ``count_tokens`` answers: the runtime counts before each message it records
        only then (each count costs a request to the provider)."""
        ...

    async def complete(self, request: LlmRequest) -> LlmReply:
        """Perform one call; raise ``LlmCallError`` on failure (never another exception)."""
        ...

    async def context_window(self, model: str) -> int | None:
        """The model's input window if the provider says so, else None (static table used)."""
        ...

    async def count_tokens(self, request: LlmRequest) -> int | None:
        """Exact prompt tokens of ``request``, or None to let pre-flight use its estimate (always
        None unless ``exact_preflight``; also on any failure to count)."""
        ...


class StreamingLlmModel(LlmModel, Protocol):
    """An adapter that streams: it calls ``request.on_text`` with each delta of the reply's
    text as the model writes it, and the deltas of one call join to exactly the ``text`` of the
    reply it returns (an attempt that fails voids what it streamed). The same members as
    ``LlmModel``: the promise is in how ``complete`` behaves."""


_CAPABLE: dict[tuple[type[Any], object], bool] = {}


def capable(part: object, capability: object) -> bool:
    """Whether ``part`` (an adapter, a store) has the optional ``capability`` its port declares
    (a ``runtime_checkable`` protocol), decided once per class: a protocol's ``isinstance``
    walks the protocol's members each time (about 10 µs on Python 3.11), and the runtime asks
    on every message and every model call. The ports' ``checks_content`` and the like narrow
    the type for their callers."""
    key = (type(part), capability)
    known = _CAPABLE.get(key)
    if known is None:
        known = _CAPABLE[key] = isinstance(part, capability)  # type: ignore[arg-type]
    return known


@runtime_checkable
class NamedProvider(Protocol):
    """An adapter that says which provider it talks to, as OpenTelemetry's GenAI conventions
    name it (``anthropic``, ``openai``, ``aws.bedrock``, ``gcp.vertex_ai``...): traces and
    metrics carry it as ``gen_ai.provider.name``."""

    @property
    def provider_name(self) -> str:
        """The provider's name."""
        ...


@runtime_checkable
class PrefixReusing(Protocol):
    """An adapter that can send the limit's requests as the turn's request repeated
    (``LlmRequest.reuse_prefix``, REQ-SEG-055): a conversation created with
    ``summary_request="reuse_prefix"`` is refused for any other. ``segue.testing.conformance``
    checks the claim."""

    @property
    def reuses_prefix(self) -> bool:
        """Whether it can (an adapter may say False for a provider that caches nothing)."""
        ...


def reuses_prefix(llm: object) -> bool:
    """Whether ``llm`` can repeat the turn's request at the limit (``PrefixReusing``)."""
    return capable(llm, PrefixReusing) and bool(llm.reuses_prefix)  # type: ignore[attr-defined]


@runtime_checkable
class ContentChecker(Protocol):
    """An adapter that can tell, before a message is stored, that its API cannot take some of
    the message's content blocks."""

    def check_content(self, blocks: Sequence[ContentBlock]) -> None:
        """Raise ``ValueError`` saying why the API cannot take ``blocks``; return if it can.
        ``Runtime.send`` raises ``InvalidMessageError`` with that reason, and nothing is
        stored or sent. Without the check, such content fails the turn (``LlmCallError``,
        ``fatal``) once the message is in the transcript."""
        ...


def checks_content(llm: object) -> TypeGuard[ContentChecker]:
    """Whether the adapter is a ``ContentChecker`` (asked before a message is stored)."""
    return capable(llm, ContentChecker)


def names_provider(llm: object) -> TypeGuard[NamedProvider]:
    """Whether the adapter names its provider (``NamedProvider``)."""
    return capable(llm, NamedProvider)


@runtime_checkable
class KnowsModels(Protocol):
    """An adapter that can say a model is one its provider serves (its server reported the
    model's window): metrics then label the model by its name rather than as ``other``."""

    def knows_model(self, model: str) -> bool:
        """Whether the provider is known to serve ``model`` (never asks it: only what the
        adapter already learned)."""
        ...


def knows_models(llm: object) -> TypeGuard[KnowsModels]:
    """Whether the adapter can say which models its provider serves (``KnowsModels``)."""
    return capable(llm, KnowsModels)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextSupport:
    """What a provider does to the context on its own side, for one model (REQ-SEG-048,
    REQ-SEG-050): what the runtime checks a conversation's options against when it is
    created, and words the requests with."""

    compaction: bool = False
    """It compacts within a call when asked (``LlmRequest.compaction``)."""
    min_trigger: int = 1
    """The smallest trigger it takes, in tokens (a conversation's threshold below it is raised,
    with a warning)."""
    instructions: bool = False
    """It takes instructions for its summary (the ``summary_prompt``, a manual focus)."""
    on_demand: bool = False
    """It can be asked to compact now (``ContextManaging.compact_now``)."""
    edits: frozenset[str] = frozenset()
    """The context-editing strategies it applies (``LlmRequest.context_edits``)."""


NO_CONTEXT_SUPPORT: Final = ContextSupport()
"""A provider that does nothing to the context on its own side."""


@runtime_checkable
class ContextManaging(Protocol):
    """An adapter that can say what its provider does to the context on its own side (a
    compaction within the call, context editing), and ask it to compact on demand."""

    def context_support(self, model: str) -> ContextSupport:
        """What the provider does for ``model`` (``NO_CONTEXT_SUPPORT``: nothing)."""
        ...

    async def compact_now(self, request: LlmRequest) -> LlmReply | None:
        """Have the provider compact ``request``'s context now (``request.compaction``): a
        reply whose ``compactions`` hold it, or None when the provider cannot be asked for
        this request (segue's own compaction then). ``LlmCallError`` on failure, with
        ``compaction_refused`` when the provider cannot compact at all."""
        ...


class BaseLlmModel:
    """Defaults for every member of the port but ``complete``: an adapter subclasses it and
    writes only what its provider does (counting prompts, reporting windows, what it does to
    the context: a ``ContextManaging``). One that can check content before it is stored
    writes ``check_content`` too, which makes it a ``ContentChecker``."""

    exact_preflight: bool = False
    """No counting: pre-flight uses segue's estimate."""

    async def context_window(self, model: str) -> int | None:
        """Nothing said: segue's table of models decides the window."""
        return None

    async def count_tokens(self, request: LlmRequest) -> int | None:
        """Nothing counted: pre-flight uses segue's estimate."""
        return None

    def context_support(self, model: str) -> ContextSupport:
        """Nothing done on the provider's side: segue compacts, no context edits."""
        return NO_CONTEXT_SUPPORT

    async def compact_now(self, request: LlmRequest) -> LlmReply | None:
        """The provider cannot be asked: segue compacts on its own."""
        return None
