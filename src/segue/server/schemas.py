"""What the REST API takes and gives: thin views of segue's own values.

The views are built from the public values (``ConversationState``, ``StoredMessage``,
``SessionSnapshot``, the updates), never from internals, so the OpenAPI schema and the Python API
say the same thing. Requests are validated here (unknown fields refused, empty text refused
before it reaches the runtime), so a client's mistake is a 422 with the field named.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from segue.executor.ports import StoredConversation, StoredMessage
from segue.statemachine import ContextExhaustionBehavior, ConversationState
from segue.statemachine.checkpoint import SessionSnapshot


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateConversation(_Request):
    """A new conversation; every field may be left out (the server's defaults apply)."""

    model: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    behavior: ContextExhaustionBehavior | None = None
    system: Annotated[str, Field(max_length=100_000)] | None = None
    warning_threshold: Annotated[float, Field(gt=0, le=1)] = 0.80
    continuation_threshold: Annotated[float, Field(gt=0, le=1)] = 0.90
    context_window: Annotated[int, Field(gt=0, le=10_000_000)] | None = None


class SendMessage(_Request):
    """One user message."""

    text: Annotated[str, Field(min_length=1)]


class Pause(_Request):
    """Why the conversation pauses (shown in its snapshot)."""

    reason: Annotated[str, Field(max_length=2_000)] = ""
    timeout: Annotated[float, Field(gt=0, le=3_600)] | None = None
    """Wait at most this many seconds for the turn to end, then cancel it and pause."""


class Resume(_Request):
    """The first message of the resumed session (a standard one when left out)."""

    prompt: Annotated[str, Field(max_length=100_000)] | None = None


class StartChild(_Request):
    """Continue an exhausted conversation in its one child."""

    seed_with_summary: bool = True
    auto_continue: bool = False


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

    @classmethod
    def of(
        cls, state: ConversationState, stored: StoredConversation | None = None
    ) -> ConversationView:
        """The view of ``state`` (``stored`` adds the child and the creation time)."""
        phase: Any = state.phase
        config = state.config
        return cls(
            id=state.id,
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
        )


class ToolCallView(BaseModel):
    id: str
    name: str
    input: dict[str, Any]


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
        )


class LinkView(BaseModel):
    """One conversation of a continuation chain, root first."""

    id: str
    label: str
    position: int
    phase: str
    summary: str | None


class ErrorBody(BaseModel):
    """Every error: a stable code for programs, a message for people."""

    error: str
    message: str


class Info(BaseModel):
    """What this server runs."""

    version: str
    offline: bool
    """True when no API key was given: the offline scripted model answers."""
    model: str
    behavior: ContextExhaustionBehavior
