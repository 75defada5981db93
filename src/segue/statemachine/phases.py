"""Phases: where a conversation is. A discriminated union on ``kind``.

A phase holds only what matters while the conversation is in it (the tool calls still running,
the attempt number of a summary request); what outlives a phase lives on ``ConversationState``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictInt

from segue.statemachine._values import Frozen
from segue.statemachine.checkpoint import SessionSnapshot
from segue.statemachine.models import ErrorKind, SummaryRequest, ToolCall, Usage

Attempt = Annotated[StrictInt, Field(ge=1)]
TrimLevel = Annotated[StrictInt, Field(ge=0)]
ExhaustionTrigger = Literal["threshold", "manual", "overflow", "preflight"]
"""Why the exhaustion path started: a response crossed the threshold, the user asked, the
provider refused an overlong prompt, or the projected prompt was already too large."""


class Idle(Frozen):
    """Waiting for the user."""

    kind: Literal["idle"] = "idle"


class LlmRequesting(Frozen):
    """An LLM request is in flight (or, with ``retry_pending``, waiting for its retry timer)."""

    kind: Literal["llm_requesting"] = "llm_requesting"
    attempt: Attempt = 1
    retry_pending: bool = False
    final: bool = False
    """The grace request of a turn that used its ``max_tool_rounds``: no tool it asks for runs."""


class ToolExecuting(Frozen):
    """Tools of the last response are running; ``pending`` are the ids still without a result."""

    kind: Literal["tool_executing"] = "tool_executing"
    tool_calls: tuple[ToolCall, ...]
    pending: tuple[str, ...]


class AwaitingContinuation(Frozen):
    """THRESHOLD_BASED_CONTINUATION: the tool-less summary request is in flight."""

    kind: Literal["awaiting_continuation"] = "awaiting_continuation"
    rejected_tool_calls: tuple[ToolCall, ...] = ()
    trigger: ExhaustionTrigger = "threshold"
    attempt: Attempt = 1
    trim_level: TrimLevel = 0
    retry_pending: bool = False
    trigger_usage: Usage | None = None
    """The usage of the response that crossed the threshold (None: manual, pre-flight, or a
    provider overflow, none of which reports one)."""
    alternate: bool = False
    """The first answer was empty or a refusal: this asks again with another instruction."""
    focus: str | None = None
    """The user's focus for this exhaustion path (a manual trigger's), sent with each ask."""
    shape: SummaryRequest = "tool_less"
    """How this ask is sent: the conversation's ``summary_request``, ``tool_less`` after an
    overflow or after ``REUSE_PREFIX_ASKS`` answers that called a tool (REQ-SEG-055)."""
    tool_answers: TrimLevel = 0
    """Answers to this path's requests that called a tool (never run, REQ-SEG-056)."""


class AwaitingCheckpoint(Frozen):
    """CHECKPOINT_RESTART, or a pause: the agent is writing its ``<checkpoint>``."""

    kind: Literal["awaiting_checkpoint"] = "awaiting_checkpoint"
    purpose: Literal["restart", "pause"] = "restart"
    exhausted: bool = False
    """A pause at the limit (``CHECKPOINT_PAUSE``), not one an orchestrator asked for: a cancel
    does not stop it, and its snapshot says ``trigger="exhaustion"``."""
    rejected_tool_calls: tuple[ToolCall, ...] = ()
    trigger: ExhaustionTrigger = "threshold"
    resume_after: bool = False
    """Whether the new session must ask the LLM at once (the agent was mid-task)."""
    attempt: Attempt = 1
    trim_level: TrimLevel = 0
    retry_pending: bool = False
    focus: str | None = None
    """The user's focus for this exhaustion path (a manual trigger's), sent with each ask."""
    shape: SummaryRequest = "tool_less"
    """How this ask is sent: the conversation's ``summary_request``, ``tool_less`` after an
    overflow or after ``REUSE_PREFIX_ASKS`` answers that called a tool (REQ-SEG-055)."""
    tool_answers: TrimLevel = 0
    """Answers to this path's requests that called a tool (never run, REQ-SEG-056)."""


class Compacting(Frozen):
    """COMPACT_IN_PLACE: the transcript is archived and older history is being summarised."""

    kind: Literal["compacting"] = "compacting"
    rejected_tool_calls: tuple[ToolCall, ...] = ()
    trigger: ExhaustionTrigger = "threshold"
    resume_after: bool = False
    attempt: Attempt = 1
    trim_level: TrimLevel = 0
    retry_pending: bool = False
    alternate: bool = False
    """The first answer was empty or a refusal: this asks again with another instruction."""
    focus: str | None = None
    """The user's focus for this exhaustion path (a manual trigger's), sent with each ask."""
    shape: SummaryRequest = "tool_less"
    """How this ask is sent: the conversation's ``summary_request``, ``tool_less`` after an
    overflow or after ``REUSE_PREFIX_ASKS`` answers that called a tool (REQ-SEG-055)."""
    tool_answers: TrimLevel = 0
    """Answers to this path's requests that called a tool (never run, REQ-SEG-056)."""
    redo: bool = False
    """The latest compaction's summary is made again (REQ-SEG-063), from the generation it
    replaced, not from the current one."""
    summary_prompt: str | None = None
    """A redo's own instruction, in place of the conversation's ``summary_prompt``."""
    summary_model: str | None = None
    """A redo's own model, in place of the conversation's ``summary_model``."""


class ContextExhausted(Frozen):
    """Read-only: the summary is final and a new conversation is the way on. Absorbing."""

    kind: Literal["context_exhausted"] = "context_exhausted"
    summary: str
    trigger_usage: Usage | None = None
    """The usage of the response that crossed the threshold (see ``AwaitingContinuation``)."""
    final_usage: Usage | None = None
    """The usage of the summary request's answer (None when it failed or was cancelled)."""


class Paused(Frozen):
    """Stopped at a turn boundary with a snapshot; ``ResumeRequested`` starts a new session."""

    kind: Literal["paused"] = "paused"
    snapshot: SessionSnapshot


class Failed(Frozen):
    """Ended with an error. Absorbing: nothing but a new conversation goes on from here."""

    kind: Literal["failed"] = "failed"
    error_kind: ErrorKind
    message: str


Phase = Annotated[
    Idle
    | LlmRequesting
    | ToolExecuting
    | AwaitingContinuation
    | AwaitingCheckpoint
    | Compacting
    | ContextExhausted
    | Paused
    | Failed,
    Field(discriminator="kind"),
]
"""Every phase a conversation can be in."""

PhaseKind = Literal[
    "idle",
    "llm_requesting",
    "tool_executing",
    "awaiting_continuation",
    "awaiting_checkpoint",
    "compacting",
    "context_exhausted",
    "paused",
    "failed",
]

PHASE_TYPES: tuple[type[Frozen], ...] = (
    Idle,
    LlmRequesting,
    ToolExecuting,
    AwaitingContinuation,
    AwaitingCheckpoint,
    Compacting,
    ContextExhausted,
    Paused,
    Failed,
)

IDLE = Idle()
"""The one ``Idle`` value; phases without data are shared, never rebuilt."""
