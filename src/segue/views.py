"""Conversations, messages, snapshots and chains as JSON: the views the REST API serves, its
Server-Sent Events carry and ``segue list/show/status --json`` print (``docs/views.md``).

Thin pydantic views built from the public values (``ConversationState``, ``StoredMessage``,
``SessionSnapshot``, ``Link``), never from internals, so the OpenAPI schema, the CLI's JSON and
the Python API say the same thing. ``View.of(value).model_dump(mode="json")`` is the JSON. A
conversation's state has one shape wherever it is shown: ``ConversationView`` (its ``phase`` the
phase's kind as a string), in a REST answer, in a turn's ``done`` event, in a watch stream's
``done`` and in the CLI's ``--json``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, Field

from segue.executor.bounds import ID_PATTERN
from segue.executor.chains import Link
from segue.executor.store_port import StoredConversation, StoredMessage
from segue.executor.updates import DoneUpdate, Update
from segue.statemachine import ContextExhaustionBehavior, ConversationState, SummaryRequest
from segue.statemachine.checkpoint import SessionSnapshot
from segue.statemachine.state import Compaction, WindowSource

TITLE_WORDS: Final = 8
TITLE_CHARS: Final = 60
"""A title is the first words of the first user message: at most this many, this long."""


def title_of(messages: Iterable[StoredMessage]) -> str | None:
    """A conversation's title: the first words of its first user message (None before it has
    one), on one line, cut at a word with an ellipsis when there is more."""
    for stored in messages:
        if stored.kind != "user":
            continue
        words = stored.text.split()
        if not words:
            continue
        shown = " ".join(words[:TITLE_WORDS])
        if len(shown) > TITLE_CHARS:
            cut = shown[:TITLE_CHARS].rsplit(" ", 1)[0] or shown[:TITLE_CHARS]
            return f"{cut}…"
        return f"{shown}…" if len(words) > TITLE_WORDS else shown
    return None


def shown_title(metadata: Mapping[str, str], first_words: str | None) -> str | None:
    """The title a conversation is shown with: the application's (its metadata's ``title``,
    on one line) when it set one, else ``first_words`` (``title_of`` its messages)."""
    given = " ".join(metadata.get("title", "").split())
    return given or first_words


class ConversationView(BaseModel):
    """A conversation as a client sees it."""

    id: str
    phase: str
    """The phase's kind: ``idle``, ``llm_requesting``, ``context_exhausted``, ``paused``..."""
    context_tokens: int | None
    context_window: int
    projected_tokens: int
    """What the next prompt is expected to hold: ``context_tokens`` plus what was added since."""
    warning_tokens: int
    continuation_tokens: int
    behavior: ContextExhaustionBehavior
    model: str
    parent_id: str | None
    child_id: str | None
    session: int
    generation: int
    created_at: float | None = None
    summary: str | None = None
    """The continuation summary of an exhausted conversation."""
    error_kind: str | None = None
    error_message: str | None = None
    paused_reason: str | None = None
    pause_requested: bool = False
    """A pause was asked for while a turn runs: it is taken at the turn's next boundary."""
    pinned_tokens: int = 0
    """Tokens the pinned messages hold (never summarised away; at most a quarter of the
    window)."""
    summary_prompt: str | None = None
    """The instruction of the limit's request in place of segue's (None: segue's)."""
    summary_model: str | None = None
    """The model the limit's requests go to (None: ``model``)."""
    summary_request: SummaryRequest = "tool_less"
    """How the limit's requests are sent: ``tool_less``, or ``reuse_prefix`` (the turn's
    request repeated, read from the provider's cache; REQ-SEG-055)."""
    max_tool_output_tokens: int
    """The most one tool result may hold in this conversation (the default when not set)."""
    max_run_seconds: float | None = None
    """``checkpoint_restart``: how long a run may go on before the limit ends it."""
    title: str | None = None
    """The metadata's ``title`` when the application set one, else the first words of the
    first user message (None before there is either)."""
    metadata: dict[str, str] = Field(default_factory=dict)
    """The application's labels (``{"user": "u-17", "title": "Tides"}``): what it finds the
    conversation by (``GET /api/conversations?metadata.user=u-17``)."""
    context_window_source: WindowSource | None = None
    """Where ``context_window`` came from: ``given`` (by the application), ``server`` (the
    provider's server reported it), ``table`` (segue's table of models) or ``assumed`` (nobody
    knew the model: its provider's smallest window); None for a conversation made before segue
    kept it."""
    compaction: Compaction = "segue"
    """``compact_in_place``: who compacts, segue's summary request or the provider itself."""
    compaction_fallback: bool = False
    """The provider could not compact this conversation: segue compacts it from now on."""
    continuations: int = 0
    """Checkpoint restarts and compactions so far (bounded by ``max_continuations``)."""
    max_continuations: int = 10
    max_attempts: int = 4
    """Attempts per request before the conversation fails."""
    max_tool_rounds: int = 50
    """Tool rounds one turn may run."""
    retry_base_delay: float = 1.0
    """Seconds before the first retry of a failed request (doubled each time after)."""
    retry_max_delay: float = 30.0
    pause_after_turns: int | None = None
    """The conversation pauses at the end of this many turns since it started or was last
    resumed (None: no such trigger)."""
    pause_after_seconds: float | None = None
    """... or at the end of the first turn this long after it started or was last resumed."""
    turns_since_resume: int = 0
    """Turns answered since the conversation started or was last resumed."""

    @classmethod
    def of(
        cls,
        state: ConversationState,
        stored: StoredConversation | None = None,
        *,
        title: str | None = None,
    ) -> ConversationView:
        """The view of ``state`` (``stored`` adds the child, the creation time and the
        metadata, whose ``title`` wins; ``title`` is ``title_of`` its messages)."""
        phase: Any = state.phase
        config = state.config
        metadata = dict(stored.metadata) if stored is not None else {}
        return cls(
            id=state.id,
            title=shown_title(metadata, title),
            metadata=metadata,
            context_window_source=config.window_source,
            compaction=config.compaction,
            compaction_fallback=state.compaction_fallback,
            phase=phase.kind,
            context_tokens=state.context_tokens,
            context_window=state.context_window,
            projected_tokens=state.projected_tokens,
            warning_tokens=config.warning_tokens,
            continuation_tokens=config.continuation_tokens,
            behavior=state.behavior,
            model=state.model,
            parent_id=state.parent_id,
            child_id=stored.child_id if stored is not None else None,
            session=state.session,
            generation=state.generation,
            created_at=stored.created_at if stored is not None else None,
            summary=getattr(phase, "summary", None),
            error_kind=getattr(getattr(phase, "error_kind", None), "value", None),
            error_message=getattr(phase, "message", None),
            paused_reason=phase.snapshot.reason if phase.kind == "paused" else None,
            pause_requested=state.pause_requested,
            pinned_tokens=state.pinned_tokens,
            summary_prompt=config.summary_prompt,
            summary_model=config.summary_model,
            summary_request=config.summary_request,
            max_tool_output_tokens=config.tool_output_cap,
            max_run_seconds=config.max_run_seconds,
            continuations=state.continuations,
            max_continuations=config.max_continuations,
            max_attempts=config.max_attempts,
            max_tool_rounds=config.max_tool_rounds,
            retry_base_delay=config.retry_base_delay,
            retry_max_delay=config.retry_max_delay,
            pause_after_turns=config.pause_after_turns,
            pause_after_seconds=config.pause_after_seconds,
            turns_since_resume=state.turns_since_resume,
        )


class ToolCallView(BaseModel):
    """A tool call an assistant message made, as ``MessageView.tool_calls`` lists it."""

    id: str
    """The call's id, which its ``tool_result`` message answers."""
    name: str
    """The tool called."""
    input: dict[str, Any]
    """What the model passed it."""


class MessageView(BaseModel):
    """One transcript entry."""

    seq: int
    kind: str
    text: str
    session: int
    generation: int
    tool_calls: list[ToolCallView] = Field(default_factory=list)
    tool_call_id: str | None = None
    is_error: bool = False
    attachments: int = 0
    """Images and documents it carries (sent to the model, not repeated here)."""
    pinned: bool = False
    """A user message pinned when sent: every fresh start carries it verbatim."""

    @classmethod
    def of(cls, stored: StoredMessage) -> MessageView:
        message = stored.message
        return cls(
            seq=stored.seq,
            kind=message.kind,
            text=message.text,
            session=message.session,
            generation=message.generation,
            tool_calls=[
                ToolCallView(id=call.id, name=call.name, input=call.input)
                for call in message.tool_calls
            ],
            tool_call_id=message.tool_call_id,
            is_error=message.is_error,
            attachments=sum(1 for b in message.content if b.type in ("image", "document")),
            pinned=message.pinned,
        )


class SnapshotView(BaseModel):
    """A pause's snapshot: when, why, which session, how full, what it did."""

    version: int
    session: int
    trigger: Literal["pause", "exhaustion"]
    reason: str
    created_at: float | None
    context_tokens: int | None
    context_window: int
    llm_calls: int
    tool_calls: int
    checkpoint: str
    decisions: list[str]
    errors: list[str]
    session_seconds: float | None = None
    """How long the paused session ran (None when unknown)."""

    @classmethod
    def of(cls, snapshot: SessionSnapshot) -> SnapshotView:
        return cls(
            version=snapshot.version,
            session=snapshot.session,
            trigger=snapshot.trigger,
            reason=snapshot.reason,
            created_at=snapshot.created_at,
            context_tokens=snapshot.context_tokens,
            context_window=snapshot.context_window,
            llm_calls=snapshot.llm_calls,
            tool_calls=snapshot.tool_calls,
            checkpoint=snapshot.checkpoint,
            decisions=list(snapshot.decisions),
            errors=list(snapshot.errors),
            session_seconds=snapshot.session_seconds,
        )


class DoneView(BaseModel):
    """A turn's last update as JSON: ``DoneUpdate`` with its state as ``ConversationView``.

    ``DoneUpdate.model_dump_json()`` writes the state as the core keeps it (``phase`` an
    object, ``{"kind": "idle", ...}``); a stream sent to a client sends this instead, so that a
    state has one shape wherever a client reads it (``docs/views.md``)."""

    kind: Literal["done"] = "done"
    state: ConversationView
    reply: str | None
    """The text of the turn's final assistant reply, or None when it wrote none."""

    @classmethod
    def of(
        cls,
        update: DoneUpdate,
        stored: StoredConversation | None = None,
        *,
        title: str | None = None,
    ) -> DoneView:
        """The view of ``update`` (``stored`` and ``title`` as for ``ConversationView``)."""
        state = ConversationView.of(update.state, stored, title=title)
        return cls(state=state, reply=update.reply)


def update_json(
    update: Update, stored: StoredConversation | None = None, *, title: str | None = None
) -> str:
    """Any update of ``Runtime.stream`` or ``Runtime.watch`` as the JSON a client is sent, the
    data of the server's Server-Sent Events: ``done`` as ``DoneView`` (its state a
    ``ConversationView``, as every REST answer shows a state), every other update as its own
    fields, ``kind`` first. ``stored`` and ``title`` fill the ``done`` state's stored fields
    and title, as for ``ConversationView.of``; without them those are left empty."""
    if isinstance(update, DoneUpdate):
        return DoneView.of(update, stored, title=title).model_dump_json()
    return update.model_dump_json()


class LinkView(BaseModel):
    """One conversation of a continuation chain, root first."""

    id: str
    label: str
    position: int
    phase: str
    summary: str | None

    @classmethod
    def of(cls, link: Link) -> LinkView:
        return cls(
            id=link.id,
            label=link.label,
            position=link.position,
            phase=link.state.phase.kind,
            summary=link.summary,
        )


__all__ = [
    "ID_PATTERN",
    "ConversationView",
    "DoneView",
    "LinkView",
    "MessageView",
    "SnapshotView",
    "ToolCallView",
    "shown_title",
    "title_of",
    "update_json",
]
