"""The runtime's ports: what an LLM adapter and a store must do, as protocols and plain data.

The executor talks to the world only through these. Adapters translate to and from a provider
(``AnthropicModel``, ``OpenAIModel``, the offline ``ScriptedModel``; ``docs/adapters.md`` for
writing another); stores persist (``MemoryStore``,
``SqliteStore``, ``PostgresStore``). Keeping them small keeps every implementation testable
against the same contract tests.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from segue.statemachine import (
    ContentBlock,
    ContextExhaustionBehavior,
    ConversationState,
    Message,
    ModelSettings,
    ToolCall,
    Usage,
)
from segue.statemachine.checkpoint import SessionSnapshot
from segue.statemachine.effects import Effect
from segue.statemachine.models import DEFAULT_SETTINGS

Purpose = Literal["turn", "continuation", "checkpoint", "compaction"]
"""Why the LLM is asked: a normal turn (with tools), or one of the tool-less summary requests."""


class SegueError(Exception):
    """Base of every exception segue raises for a caller's mistake or an unusable setup."""


class InvalidMessageError(SegueError, ValueError):
    """A message the caller sent cannot be a message: empty, only whitespace, or text that
    cannot be encoded. Nothing was stored and nothing was sent."""


class ConversationExhaustedError(SegueError):
    """A message was sent to a conversation that reached its context limit (it is read-only)."""

    def __init__(self, conversation_id: str, reason: str) -> None:
        super().__init__(
            f"Conversation {conversation_id} is read-only: {reason} "
            f"Call start_new_from({conversation_id!r}) to continue in a new conversation."
        )
        self.conversation_id = conversation_id


class MessageRejectedError(SegueError):
    """The conversation did not accept the message; ``cause`` says why as data: ``too_large``
    (the message alone could never fit), ``busy``, ``paused`` or ``failed``."""

    def __init__(self, conversation_id: str, reason: str, cause: str = "busy") -> None:
        super().__init__(f"Conversation {conversation_id} rejected the message: {reason}")
        self.conversation_id = conversation_id
        self.reason = reason
        self.cause = cause


class ConversationNotFoundError(SegueError, LookupError):
    """No conversation has this id in the store."""


class ConversationExistsError(SegueError):
    """``Store.create`` was given an id the store already holds; the first one is kept."""


class ConcurrentUpdateError(SegueError):
    """Another writer committed to this conversation first (optimistic versioning)."""


class StoreLockedError(SegueError):
    """Another connection held the store's write lock for longer than the store waits
    (``SqliteStore``'s ``busy_timeout``, ``PostgresStore``'s ``lock_timeout``)."""


class StoreUnavailableError(SegueError):
    """The store could not be used (a dropped database session, a server restart, a disk
    error): the driver's own error is the ``__cause__``. Nothing half-written was kept; the
    call may be retried once the store is back."""


class InvalidTextError(SegueError, ValueError):
    """An id, model name or system prompt holds what a store cannot keep (a NUL character),
    refused the same way by every store before anything is written."""


class DuplicateMessageError(SegueError):
    """A message with this idempotency key is already stored in the conversation (the commit
    carrying it again wrote nothing)."""

    def __init__(self, conversation_id: str, key: str) -> None:
        super().__init__(
            f"conversation {conversation_id!r} already holds the message with idempotency key "
            f"{key!r}"
        )
        self.conversation_id = conversation_id
        self.key = key


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
    tool-less purposes ``tools`` is empty and ``instruction`` is the request to append (the
    summary prompt, the checkpoint prompt); the adapter must turn tool blocks into text, name
    ``rejected_tool_calls`` in prose, and drop ``trim_level`` slices of the oldest history.
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


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderCompaction:
    """A compaction the provider made of its own context during a request (REQ-SEG-033)."""

    summary: str
    trigger: Literal["auto", "manual"] = "auto"
    pre_tokens: int | None = None
    """What the provider said its context held before, if it said."""
    post_tokens: int | None = None
    """What the provider estimates its context holds after, if it said."""


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


class LlmCallError(SegueError):
    """An LLM call failed. Adapters raise it; the executor turns it into an event.

    ``retryable``: another attempt may succeed (408/409/429/5xx/529, connection errors).
    ``context_overflow``: the provider said the prompt does not fit the window.
    ``fatal``: a setup problem no retry or trim can fix (401/403, unknown model).
    ``retry_after``: seconds the provider asked to wait before the next attempt, if it said.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        context_overflow: bool = False,
        fatal: bool = False,
        status_code: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.context_overflow = context_overflow
        self.fatal = fatal
        self.status_code = status_code
        self.retry_after = retry_after


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


class LlmModel(Protocol):
    """An LLM adapter: one provider behind four members (``docs/adapters.md`` walks through
    writing one; ``segue.testing.conformance`` checks one against a fake of its provider).

    What ``complete`` must do depends on ``request.purpose``:

    - ``turn``: send the history with its tool calls and results (each call answered once,
      ``helpers.paired``) and ``request.tools`` as callable tools; with ``request.final`` (the
      grace request at ``max_tool_rounds``) keep the tools declared but not callable (the
      provider's "none" tool choice) and send ``request.instruction`` last.
    - ``continuation``, ``checkpoint``, ``compaction`` (the requests at the limit): offer no
      callable tool; send the history as text (``helpers.text_turns``: tool blocks as prose,
      ``rejected_tool_calls`` named, ``trim_level`` honoured, ``instruction`` last).

    The reply's ``usage`` is this one call's, in the four fields whose sum is the occupancy
    after it (``helpers.usage_from_prompt`` maps a report whose prompt holds its cached part),
    or None when the provider said nothing. Failures are ``LlmCallError`` and nothing else:
    ``context_overflow`` when the prompt does not fit, ``retryable`` (with ``retry_after``)
    when another attempt may succeed, ``fatal`` when nothing will; never with the API key in
    the message or in any exception chained below it. A stream that did not end properly is an
    error, never a reply. Cancellation is let through as ``asyncio.CancelledError``.

    ``complete`` may also take a keyword ``on_text`` (see ``StreamingLlmModel``): the runtime
    passes it when someone watches the turn, and the adapter calls it with each piece of reply
    text as it arrives. An adapter without it still works: its reply is shown whole once it is
    complete.

    An adapter may also have ``check_content(blocks)``, for a user message's content blocks
    its API cannot take (a PDF on OpenAI's Chat Completions): it raises ``ValueError`` saying
    why. ``Runtime.send`` and ``stream`` call it, when the adapter has it, before anything is
    stored or sent, and raise ``InvalidMessageError`` with that reason. Without it, such
    content is refused by ``complete`` (``LlmCallError``, ``fatal``) once the turn is sent.
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
    """An adapter that streams: ``on_text`` gets each delta of the reply's text as the model
    writes it, and the deltas of one call join to exactly the ``text`` of the reply it returns
    (an attempt that fails voids what it streamed)."""

    async def complete(self, request: LlmRequest, *, on_text: TextSink | None = None) -> LlmReply:
        """Perform one call, streaming its text to ``on_text``; ``LlmCallError`` on failure."""
        ...


_TAKES: dict[tuple[type[Any], str], bool] = {}


def takes(model: object, keyword: str) -> bool:
    """Whether ``model.complete`` takes the keyword argument ``keyword`` (decided once per
    adapter class and keyword)."""
    key = (type(model), keyword)
    known = _TAKES.get(key)
    if known is None:
        try:
            parameters = inspect.signature(model.complete).parameters  # type: ignore[attr-defined]
        except (AttributeError, TypeError, ValueError):
            parameters = {}  # type: ignore[assignment]
        known = _TAKES[key] = keyword in parameters or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
        )
    return known


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredMessage:
    """A transcript entry as stored: the core's ``Message`` plus its position."""

    seq: int
    """1-based position in the conversation's transcript (append-only, never reused)."""
    message: Message

    @property
    def kind(self) -> str:
        """``user``, ``assistant``, ``tool_result``, ``continuation``, ``checkpoint``..."""
        return self.message.kind

    @property
    def text(self) -> str:
        """The message text."""
        return self.message.text


@dataclass(frozen=True, slots=True, kw_only=True)
class TransitionRecord:
    """One line of a conversation's event log."""

    seq: int
    event_kind: str
    event_json: str
    from_phase: str
    to_phase: str
    context_tokens: int | None
    reason: str
    effect_kinds: tuple[str, ...]
    at: float
    """Unix time of the commit (the executor's clock, never the core's)."""
    session: int | None = None
    """The session the event happened in (before any new session it started); None in logs
    written before segue kept it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingEffect:
    """An effect committed to the outbox and not yet performed, and who has claimed it."""

    id: int
    """Unique within the conversation, increasing in commit order."""
    effect: Effect
    owner: str | None = None
    """The runtime that claimed it (only the claimer performs it), None while unclaimed."""
    lease_until: float | None = None
    """Unix time the claim lasts until unless renewed; past it, anyone may take the work over."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredConversation:
    """A conversation as loaded: state, version for optimistic concurrency, what is pending."""

    state: ConversationState
    version: int
    system: str | None
    pending: tuple[PendingEffect, ...] = ()
    child_id: str | None = None
    created_at: float = 0.0
    last_seq: int = 0
    """Seq of the transcript's last message when this was read (0: none), from the same read as
    ``state``. Seqs are never reused, so a reader holding messages up to ``last_seq`` holds the
    whole transcript that goes with ``state``; the runtime's view cache relies on it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Commit:
    """One atomic step: the new state, the event that caused it, and what it asks for.

    A store applies it in ONE transaction: check ``expected_version``; write ``state`` with
    version + 1; append a ``TransitionRecord``; append every message of an ``AppendMessage``
    effect to the transcript (appending IS performing those effects, so they can be neither lost
    nor doubled); put every other effect in the outbox; delete ``completes`` (ids of outbox
    effects this step finished) from the outbox.
    """

    conversation_id: str
    expected_version: int
    state: ConversationState
    event_kind: str
    event_json: str
    from_phase: str
    reason: str
    effects: tuple[Effect, ...]
    completes: tuple[int, ...] = ()
    at: float = 0.0
    owner: str | None = None
    """Claims every effect this commit queues for ``owner`` until ``lease_until``: the runtime
    that committed a request performs it, without a second round trip to claim it."""
    lease_until: float | None = None
    idempotency_key: str | None = None
    """Recorded with the commit; a second commit with the same key for the conversation writes
    nothing and raises ``DuplicateMessageError``."""
    session: int | None = None
    """The session the event happened in (the state's before the event), for the log."""


class Store(Protocol):
    """Persistence of conversations. Every method is atomic on its own.

    Behaviours every store shares (the contract tests in ``tests/test_stores.py`` check them):

    - **Transcript seqs** are 1, 2, 3... per conversation in append order, seed messages first,
      with no gaps and never reused; ``StoredConversation.last_seq`` is the last one.
    - **Outbox ids** are unique within a conversation and increase in commit order; an id is
      never handed out again, even after its effect was completed.
    - **Versions** start at 1 and grow by one per commit; ``complete``, ``link_child`` and
      snapshots do not change them.
    - **Snapshots** are never overwritten: saving the same snapshot again is a no-op (a runtime
      finishing its outbox after a crash does that), a different one under a used version
      raises ``SegueError``.
    - **Claims**: an outbox effect is performed by the runtime that claimed it (``claim``, or
      ``Commit.owner`` for what a commit queues); a claim lasts until its lease ends.
    - Every call about an unknown id raises ``ConversationNotFoundError``; a lock held elsewhere
      for too long raises ``StoreLockedError``; a store that cannot be reached raises
      ``StoreUnavailableError``; an id, model or system prompt with a NUL raises
      ``InvalidTextError`` before anything is written.
    """

    async def create(
        self,
        state: ConversationState,
        *,
        system: str | None,
        messages: Sequence[Message] = (),
        at: float = 0.0,
    ) -> StoredConversation:
        """Insert a new conversation (version 1) with optional seed messages (seqs 1..n); raise
        ``ConversationExistsError`` if the id exists."""
        ...

    async def load(self, conversation_id: str) -> StoredConversation:
        """The current state, version, ``last_seq`` and pending outbox, read together;
        ``ConversationNotFoundError`` if none."""
        ...

    async def commit(self, commit: Commit) -> StoredConversation:
        """Apply ``commit`` atomically (see ``Commit``); ``ConcurrentUpdateError`` if the
        version moved. Returns the conversation as it now is (as ``load`` would return it), so
        a writer never needs to load again after committing."""
        ...

    async def complete(self, conversation_id: str, effect_ids: Sequence[int]) -> None:
        """Remove performed effects that produced no event (notifications, archives); ids no
        longer pending are ignored (completing twice after a crash is harmless)."""
        ...

    async def claim(
        self,
        conversation_id: str,
        effect_id: int,
        *,
        owner: str,
        lease_until: float,
        now: float,
        take_from: str | None = None,
    ) -> PendingEffect | None:
        """Claim a pending effect for ``owner`` until ``lease_until``, atomically, if nobody
        holds it, its lease ended before ``now``, ``owner`` holds it already, or it is held by
        ``take_from`` (an owner the caller knows is dead). Returns the effect as it now is (its
        ``owner`` says who holds it: the caller, or whoever kept it), None if it is no longer
        pending."""
        ...

    async def renew(
        self, conversation_id: str, effect_ids: Sequence[int], *, owner: str, lease_until: float
    ) -> bool:
        """Extend ``owner``'s claims; False if any of them is no longer ``owner``'s."""
        ...

    async def release(self, conversation_id: str, effect_ids: Sequence[int], *, owner: str) -> None:
        """Give up ``owner``'s claims (the next drive may take the work at once)."""
        ...

    async def messages(self, conversation_id: str, *, after_seq: int = 0) -> list[StoredMessage]:
        """The transcript in order, from ``after_seq`` + 1 (a reader that has the first
        ``after_seq`` messages fetches only what is new)."""
        ...

    async def transitions(self, conversation_id: str) -> list[TransitionRecord]:
        """The event log in order."""
        ...

    async def list_conversations(self) -> list[StoredConversation]:
        """All conversations, oldest first (without their pending effects)."""
        ...

    async def with_pending(self) -> list[str]:
        """Ids of conversations with a non-empty outbox (to finish after a crash)."""
        ...

    async def link_child(self, parent_id: str, child_id: str) -> str:
        """Record ``child_id`` as THE child of ``parent_id`` unless one exists; return the
        child that is recorded (the existing one wins, so asking twice gives one child)."""
        ...

    async def save_snapshot(self, snapshot: SessionSnapshot) -> None:
        """Store a pause snapshot (versions are per conversation, never overwritten)."""
        ...

    async def snapshots(self, conversation_id: str) -> list[SessionSnapshot]:
        """The conversation's snapshots, oldest first."""
        ...

    async def close(self) -> None:
        """Release connections and files."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolOutcome:
    """What running one tool produced."""

    output: str
    is_error: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
