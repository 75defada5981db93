"""Effects: what the core asks the world to do, as immutable data.

``transition()`` returns effects and never performs them (mitmproxy's commands, XState's actions).
The executor persists them in the same transaction as the new state (outbox), then performs them
in order and feeds each result back as an event. Effects carry everything needed to perform them,
so a runtime restarted after a crash can perform what is pending from the store alone.

This module is their one home, inside the core that builds them: ``segue.effects`` is the
public name of the same classes (an application and the executor import them from there). Like
the rest of the core it is pure (no I/O, clock, randomness or logging), and it imports only the
core's leaf modules (``_values``, ``models``, ``checkpoint``), so no import order holds it up.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, StrictInt

from segue.statemachine._values import Frozen
from segue.statemachine.checkpoint import SessionSnapshot
from segue.statemachine.models import ErrorKind, Message, SummaryRequest, ToolCall

Attempt = Annotated[StrictInt, Field(ge=1)]
RequestKind = Literal["llm", "continuation", "checkpoint", "compaction"]


class AppendMessage(Frozen):
    """Record ``message`` in the append-only transcript."""

    kind: Literal["append_message"] = "append_message"
    message: Message


class RequestLlm(Frozen):
    """Send the current session's history (with tools) to the LLM; answer: ``LlmResponse``/
    ``LlmError``."""

    kind: Literal["request_llm"] = "request_llm"
    attempt: Attempt = 1
    final: bool = False
    """The turn used its ``max_tool_rounds``: ask for the answer now; tools must not be called
    (they stay declared, since the history holds tool blocks)."""


class ExecuteTools(Frozen):
    """Run these tools; answer: one ``ToolResult`` per call."""

    kind: Literal["execute_tools"] = "execute_tools"
    tool_calls: tuple[ToolCall, ...]


class RequestContinuation(Frozen):
    """Ask for the continuation summary, rejected tools named: tool-less, or as the turn's
    request repeated (``shape``).

    ``trim_level`` > 0 asks the runtime to drop that many more slices of the oldest history
    (the previous summary request was itself too long).
    """

    kind: Literal["request_continuation"] = "request_continuation"
    rejected_tool_calls: tuple[ToolCall, ...] = ()
    attempt: Attempt = 1
    trim_level: Annotated[StrictInt, Field(ge=0)] = 0
    alternate: bool = False
    """Ask with the other instruction: the first answer was empty or a refusal."""
    focus: str | None = None
    """The user's focus for this exhaustion path (a manual trigger's), added to the
    instruction (REQ-SEG-041)."""
    shape: SummaryRequest = "tool_less"
    """How to send it: ``tool_less`` (no tool callable, REQ-SEG-047) or ``reuse_prefix`` (the
    turn's request repeated exactly, the instruction appended, REQ-SEG-055)."""


class RequestCheckpoint(Frozen):
    """Ask the agent for a ``<checkpoint>`` (tool-less, or the turn's request repeated:
    ``shape``); answer: ``CheckpointResponse``."""

    kind: Literal["request_checkpoint"] = "request_checkpoint"
    purpose: Literal["restart", "pause"] = "restart"
    rejected_tool_calls: tuple[ToolCall, ...] = ()
    attempt: Attempt = 1
    trim_level: Annotated[StrictInt, Field(ge=0)] = 0
    focus: str | None = None
    """The user's focus for this exhaustion path, added to the instruction (REQ-SEG-041)."""
    shape: SummaryRequest = "tool_less"
    """How to send it: ``tool_less`` (no tool callable, REQ-SEG-047) or ``reuse_prefix`` (the
    turn's request repeated exactly, the instruction appended, REQ-SEG-055)."""


class ArchiveTranscript(Frozen):
    """Archive what this compaction is about to summarise (the generation's transcript, from its
    summary on) to a private file before compacting: the archives of a conversation's
    compactions together hold its whole transcript, and each costs what its generation holds,
    whatever came before. Never blocks: a failure is logged and compaction goes on."""

    kind: Literal["archive_transcript"] = "archive_transcript"
    generation: Annotated[StrictInt, Field(ge=1)]


class RequestCompaction(Frozen):
    """Summarise all but the recent tail of the current generation; answer:
    ``CompactionResponse``."""

    kind: Literal["request_compaction"] = "request_compaction"
    rejected_tool_calls: tuple[ToolCall, ...] = ()
    attempt: Attempt = 1
    trim_level: Annotated[StrictInt, Field(ge=0)] = 0
    alternate: bool = False
    """Ask with the other instruction: the first answer was empty or a refusal."""
    focus: str | None = None
    """The user's focus for this exhaustion path (a manual trigger's), added to the
    instruction (REQ-SEG-041)."""
    shape: SummaryRequest = "tool_less"
    """How to send it: ``tool_less`` (no tool callable, REQ-SEG-047) or ``reuse_prefix`` (the
    turn's request repeated exactly, the instruction appended, REQ-SEG-055)."""
    redo: bool = False
    """Summarise again the generation the latest compaction replaced (REQ-SEG-063)."""
    summary_prompt: str | None = None
    """A redo's own instruction, in place of the conversation's ``summary_prompt``."""
    summary_model: str | None = None
    """A redo's own model, in place of the conversation's ``summary_model``."""


class StartSession(Frozen):
    """From now on the LLM sees only messages of ``session`` (plus ``system_context``)."""

    kind: Literal["start_session"] = "start_session"
    session: Annotated[StrictInt, Field(ge=2)]
    reason: Literal["checkpoint_restart", "resume"]
    system_context: str | None = None
    """Appended to the system prompt of the new session (the compiled resume context)."""


class StartGeneration(Frozen):
    """From now on the LLM sees the compaction summary and the verbatim tail only."""

    kind: Literal["start_generation"] = "start_generation"
    generation: Annotated[StrictInt, Field(ge=2)]
    summary: str


class ScheduleRetry(Frozen):
    """After ``delay_seconds``, deliver ``RetryDue(attempt=attempt)``."""

    kind: Literal["schedule_retry"] = "schedule_retry"
    request: RequestKind
    attempt: Attempt
    delay_seconds: Annotated[float, Field(ge=0)]


class CancelRequest(Frozen):
    """Abandon the in-flight request or tools; a late answer will be ignored by the core."""

    kind: Literal["cancel_request"] = "cancel_request"


class NotifyContextWarning(Frozen):
    """Occupancy crossed the warning threshold (once per conversation); the user may continue
    by hand from here."""

    kind: Literal["notify_context_warning"] = "notify_context_warning"
    context_tokens: int
    context_window: int

    @property
    def ratio(self) -> float:
        """Occupancy as a fraction of the window."""
        return self.context_tokens / self.context_window


class NotifyContextExhausted(Frozen):
    """The conversation is now read-only; show ``summary`` and offer a new conversation."""

    kind: Literal["notify_context_exhausted"] = "notify_context_exhausted"
    summary: str


class NotifyFailed(Frozen):
    """The conversation entered ``Failed``."""

    kind: Literal["notify_failed"] = "notify_failed"
    error_kind: ErrorKind
    message: str


class NotifyParent(Frozen):
    """A sub-agent's result for its parent: here, its typed failure (the parent may respawn)."""

    kind: Literal["notify_parent"] = "notify_parent"
    parent_id: str
    error_kind: ErrorKind
    message: str


class NotifyCompactionFailed(Frozen):
    """Compaction gave up: the conversation stays in its generation, usable (the next request
    meets pre-flight again, and may compact again)."""

    kind: Literal["notify_compaction_failed"] = "notify_compaction_failed"
    message: str


class NotifyCompactionFallback(Frozen):
    """The provider could not compact this conversation (REQ-SEG-049): its summary failed, or
    it cannot compact for this model or account. segue compacts the conversation itself from
    here on; the turn goes on, and nothing of the provider's failure is stored as a summary."""

    kind: Literal["notify_compaction_fallback"] = "notify_compaction_fallback"
    reason: str


class NotifyToolRoundLimit(Frozen):
    """The turn ran ``rounds`` tool rounds, its limit: the tools asked for last were not run,
    and the model is asked once more, without tools, for its answer."""

    kind: Literal["notify_tool_round_limit"] = "notify_tool_round_limit"
    rounds: int


class NotifyTruncated(Frozen):
    """The response stopped at ``max_tokens``: its text was kept, its tool calls were not run."""

    kind: Literal["notify_truncated"] = "notify_truncated"
    dropped_tool_calls: tuple[ToolCall, ...] = ()


class ReportAccountingAnomaly(Frozen):
    """A usage report claimed more tokens than the window holds: an accounting error (summed
    usage, say), not exhaustion. The figure was not used."""

    kind: Literal["report_accounting_anomaly"] = "report_accounting_anomaly"
    reported_tokens: int
    context_window: int


RejectionCause = Literal["too_large", "busy", "exhausted", "paused", "failed"]
"""Why a message was not accepted: the message itself (``too_large``), or where the
conversation is."""


class RejectUserMessage(Frozen):
    """The user message was not accepted; ``reason`` says why and what to do instead."""

    kind: Literal["reject_user_message"] = "reject_user_message"
    reason: str
    cause: RejectionCause = "busy"
    """The reason as data, for a caller that answers each differently (an HTTP status)."""


class SaveSnapshot(Frozen):
    """Store this snapshot (the runtime may add git state) and report the pause."""

    kind: Literal["save_snapshot"] = "save_snapshot"
    snapshot: SessionSnapshot


Effect = Annotated[
    AppendMessage
    | RequestLlm
    | ExecuteTools
    | RequestContinuation
    | RequestCheckpoint
    | ArchiveTranscript
    | RequestCompaction
    | StartSession
    | StartGeneration
    | ScheduleRetry
    | CancelRequest
    | NotifyContextWarning
    | NotifyContextExhausted
    | NotifyFailed
    | NotifyParent
    | NotifyCompactionFailed
    | NotifyCompactionFallback
    | NotifyToolRoundLimit
    | NotifyTruncated
    | ReportAccountingAnomaly
    | RejectUserMessage
    | SaveSnapshot,
    Field(discriminator="kind"),
]
"""Every effect the core can ask for."""

ANSWERED_BY_EVENTS: Final = (
    RequestLlm,
    ExecuteTools,
    RequestContinuation,
    RequestCheckpoint,
    RequestCompaction,
    ScheduleRetry,
)
"""Effects whose outcome comes back as an event: the work a ``CancelRequest`` makes stale (its
answer would change nothing), and what a cancel stops while it is in flight."""

__all__ = [
    "ANSWERED_BY_EVENTS",
    "AppendMessage",
    "ArchiveTranscript",
    "CancelRequest",
    "Effect",
    "ExecuteTools",
    "NotifyCompactionFailed",
    "NotifyCompactionFallback",
    "NotifyContextExhausted",
    "NotifyContextWarning",
    "NotifyFailed",
    "NotifyParent",
    "NotifyToolRoundLimit",
    "NotifyTruncated",
    "RejectUserMessage",
    "RejectionCause",
    "ReportAccountingAnomaly",
    "RequestCheckpoint",
    "RequestCompaction",
    "RequestContinuation",
    "RequestKind",
    "RequestLlm",
    "SaveSnapshot",
    "ScheduleRetry",
    "StartGeneration",
    "StartSession",
]
