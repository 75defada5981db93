"""Events: everything that can happen to a conversation, as validated, immutable data.

Events are the boundary of the core. They come from a user, an LLM, a tool or a timer, so they are
validated on construction (negative token counts, unknown fields and wrong types raise
``pydantic.ValidationError``). Errors of the world arrive here as events, never as state edits.
Every event has a ``kind`` literal so ``Event`` is a discriminated union.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt, model_validator

from segue.statemachine._values import Frozen, given_fields
from segue.statemachine.checkpoint import SessionSnapshot
from segue.statemachine.content import CompactionBlock, ContentBlock, ToolResultBlock, UserBlock
from segue.statemachine.models import Message, TokenCount, ToolCall, Usage

NonEmptyText = Annotated[str, Field(min_length=1)]
RetryAfter = Annotated[float, Field(ge=0, le=3600)]
AttemptNumber = Annotated[StrictInt, Field(ge=1)]
Seconds = Annotated[float, Field(ge=0)]
Timestamp = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A Unix time, as the runtime's clock gives it (the core has none)."""
Focus = Annotated[str, Field(min_length=1, max_length=20_000, pattern=r"\S")]
"""A focus for the limit's request: some text that is not only whitespace."""


class UserMessage(Frozen):
    """The user (or an orchestrator) says something: text, and optionally images and documents.

    With ``content``, the blocks are the whole message (text blocks included) and ``text`` is
    derived from them: their text blocks joined by newlines, or, for a message of attachments
    only, a short description of them (``"[image]"``) that summaries and people can read. A
    ``text`` given with ``content`` must be that same text.
    """

    kind: Literal["user_message"] = "user_message"
    text: NonEmptyText
    content: tuple[UserBlock, ...] = ()
    token_count: TokenCount | None = None
    """Exact tokens of this message (from ``count_tokens``); an estimate is used when absent."""
    pinned: bool = False
    """Keep this message through every fresh start, verbatim (REQ-SEG-042)."""

    @model_validator(mode="before")
    @classmethod
    def _text_of_content(cls, given: Any) -> Any:
        data = given_fields(given)
        if data is None or not data.get("content"):
            return given
        derived = content_text(data["content"])
        text = data.get("text")
        if text in (None, ""):
            return {**data, "text": derived}
        if text != derived:
            msg = "text must be what the content says (its text blocks joined), or be left out"
            raise ValueError(msg)
        return given


class ProviderCompacted(Frozen):
    """The provider compacted its own context while the request was in flight: from here on it
    holds ``summary`` instead of the older history. A Claude Agent SDK session keeps that
    history itself (REQ-SEG-033); a Messages or Responses API conversation created with
    ``compaction="provider"`` gets back a ``block`` that stands in for it (REQ-SEG-048).
    Reported with the response it precedes (``LlmResponse.compactions``, or alone just before
    it); outside ``LlmRequesting`` it is stale."""

    kind: Literal["provider_compacted"] = "provider_compacted"
    summary: str
    trigger: Literal["auto", "manual"] = "auto"
    """``auto``: the provider decided; ``manual``: segue asked it to (a compaction request)."""
    pre_tokens: TokenCount | None = None
    """What the provider said its context held before compacting, if it said."""
    post_tokens: TokenCount | None = None
    """What the context holds after compacting: the provider's figure, or the runtime's
    estimate of what the next request sends (None: the summary's estimate is used)."""
    block: CompactionBlock | None = None
    """The compaction as the provider returned it, to be sent back verbatim: segue holds the
    history, so it archives what came before and counts a continuation. None: the provider
    keeps the history in a session of its own. A block that ``failed`` holds no summary: the
    conversation falls back to segue's own compaction (REQ-SEG-049)."""
    usage: Usage | None = None
    """What the compaction itself cost (Anthropic's ``compaction`` iteration): reported under
    its own purpose, never read as occupancy."""
    kept_messages: TokenCount = 0
    """How many of the messages just before it stay verbatim after it: the turn that was
    asked when segue had the provider pause after its compaction (to carry the pinned
    messages after the block, REQ-SEG-048)."""


class LlmResponse(Frozen):
    """A completed LLM response to the conversation's request."""

    kind: Literal["llm_response"] = "llm_response"
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None
    """Per-request usage of THIS response; ``None`` or no prompt tokens means unknown."""
    stop_reason: str = "end_turn"
    content: tuple[ContentBlock, ...] = ()
    """The response's blocks in order, when they hold more than its text and tool calls (its
    thinking, which must be sent back unchanged); empty otherwise."""
    session_ref: NonEmptyText | None = None
    """The provider's own session this response belongs to (a Claude Agent SDK session id), for
    a provider that keeps the conversation's history itself: kept in the state so the next
    request resumes it (REQ-SEG-032). ``None``: the provider keeps no session."""
    compactions: tuple[ProviderCompacted, ...] = ()
    """The compactions the provider made of its context in this same call, before answering
    (REQ-SEG-033, REQ-SEG-048): taken first, in order, in the one step that takes the answer,
    so that no crash can record one without the other."""
    at: Timestamp | None = None
    """Unix time the runtime took the response, by its clock: a response that ends a turn
    this long after the conversation was created or last resumed may pause it
    (``pause_after_seconds``, REQ-SEG-053). None: not measured (no time trigger fires)."""


class LlmError(Frozen):
    """The LLM request failed. ``context_overflow``: the provider said the prompt is too long."""

    kind: Literal["llm_error"] = "llm_error"
    message: str
    retryable: bool = False
    context_overflow: bool = False
    retry_after: RetryAfter | None = None
    """Seconds the provider asked to wait before the next attempt; the retry waits at least that."""
    compaction_refused: bool = False
    """The provider cannot compact this conversation (its model or account cannot, or it
    answered what the adapter does not expect of a compaction): a conversation that asked it
    to falls back to segue's own compaction and asks again (REQ-SEG-049)."""


class ToolResult(Frozen):
    """One tool finished (or failed: ``is_error``)."""

    kind: Literal["tool_result"] = "tool_result"
    tool_call_id: NonEmptyText
    output: str
    is_error: bool = False
    token_count: TokenCount | None = None
    """Exact tokens of the output, when the runtime counted them."""
    content: tuple[ToolResultBlock, ...] = ()
    """The result's text and images in order, when it holds images; empty for plain text."""


class ContinuationResponse(Frozen):
    """The summary requested by ``RequestContinuation`` arrived."""

    kind: Literal["continuation_response"] = "continuation_response"
    summary: str
    usage: Usage | None = None
    stop_reason: str = "end_turn"
    """``"refusal"`` (or an empty summary) makes the core use ``FALLBACK_SUMMARY``."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls the answer made (a request that repeated the turn's prefix left its tools
    callable, REQ-SEG-056): never run; the summary is asked for again."""


class ContinuationFailed(Frozen):
    """The summary request failed."""

    kind: Literal["continuation_failed"] = "continuation_failed"
    error: str
    retryable: bool = False
    context_overflow: bool = False
    """The summary request itself was too long: retry with more of the oldest history trimmed."""
    retry_after: RetryAfter | None = None
    """Seconds the provider asked to wait before the next attempt; the retry waits at least that."""


class CheckpointResponse(Frozen):
    """The agent answered ``RequestCheckpoint`` (the text may or may not hold a checkpoint)."""

    kind: Literal["checkpoint_response"] = "checkpoint_response"
    text: str
    usage: Usage | None = None
    elapsed_seconds: Seconds | None = None
    """Seconds since the conversation was created, by the runtime's clock when the answer
    arrived: what ``max_run_seconds`` is compared with (REQ-SEG-044). None: not measured."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls the answer made (a request that repeated the turn's prefix left its tools
    callable, REQ-SEG-056): never run; the summary is asked for again."""


class CheckpointFailed(Frozen):
    """The checkpoint request failed."""

    kind: Literal["checkpoint_failed"] = "checkpoint_failed"
    error: str
    retryable: bool = False
    context_overflow: bool = False
    retry_after: RetryAfter | None = None
    """Seconds the provider asked to wait before the next attempt; the retry waits at least that."""
    elapsed_seconds: Seconds | None = None
    """As ``CheckpointResponse.elapsed_seconds``: a restart without a checkpoint is still one."""


class CompactionResponse(Frozen):
    """The summary of older history arrived; ``retained_tokens`` is what the new generation holds.

    ``retained_tokens`` counts system prompt + summary + the verbatim tail, measured or estimated
    by the runtime: the core refuses to continue if it is still over the threshold.
    """

    kind: Literal["compaction_response"] = "compaction_response"
    summary: str
    retained_tokens: TokenCount
    kept_messages: TokenCount = 0
    """How many of the most recent messages stay verbatim after the summary."""
    usage: Usage | None = None
    stop_reason: str = "end_turn"
    """``"refusal"`` (or an empty summary) makes the core ask once more, then use a fallback."""
    block: CompactionBlock | None = None
    """The provider compacted on demand (a manual trigger of a conversation whose provider
    compacts, REQ-SEG-048): its block, sent back verbatim from the new generation on."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls the answer made (a request that repeated the turn's prefix left its tools
    callable, REQ-SEG-056): never run; the summary is asked for again."""
    summarises: AttemptNumber | None = None
    """A summary made again (REQ-SEG-063): the generation it summarises, the one the latest
    compaction replaced (the runtime read it from the transcript)."""
    copies: tuple[Message, ...] = ()
    """A summary made again: the messages that follow it in its new generation, copied (the
    first summary's verbatim tail, then what came after the first summary)."""
    carried: TokenCount = 0
    """A summary made again: how many of ``copies`` are the verbatim tail."""


class CompactionFailed(Frozen):
    """The compaction summary request failed."""

    kind: Literal["compaction_failed"] = "compaction_failed"
    error: str
    retryable: bool = False
    context_overflow: bool = False
    retry_after: RetryAfter | None = None
    """Seconds the provider asked to wait before the next attempt; the retry waits at least that."""
    compaction_refused: bool = False
    """The provider, asked to compact on demand, cannot (or its summary failed): the
    conversation falls back to segue's own compaction, which is asked at once (REQ-SEG-049)."""


class RetryDue(Frozen):
    """The delay of a ``ScheduleRetry`` has passed. A timer for an older attempt is stale."""

    kind: Literal["retry_due"] = "retry_due"
    attempt: AttemptNumber


class UserCancel(Frozen):
    """Stop what is in flight."""

    kind: Literal["user_cancel"] = "user_cancel"


class ManualContinuation(Frozen):
    """The user asks to continue in a new conversation now (REQ-BED-023); only from Idle."""

    kind: Literal["manual_continuation"] = "manual_continuation"
    focus: Focus | None = None
    """What the summary (checkpoint, compaction) should keep above all: it goes with every
    request of this exhaustion path (REQ-SEG-041), as Claude Code's ``/compact <focus>``."""


class SummaryRedoRequested(Frozen):
    """The user asks for the latest compaction's summary again (REQ-SEG-063), from the
    generation it replaced; only from Idle under COMPACT_IN_PLACE. The runtime checks first
    that there is a compaction to make again (the core does not hold the transcript)."""

    kind: Literal["summary_redo_requested"] = "summary_redo_requested"
    focus: Focus | None = None
    """What the new summary must keep above all (REQ-SEG-041)."""
    summary_prompt: Annotated[str, Field(max_length=20_000, pattern=r"\S")] | None = None
    """The instruction for this summary only, in place of the conversation's."""
    summary_model: Annotated[str, Field(min_length=1)] | None = None
    """The model that writes this summary only, in place of the conversation's."""


class ContinuationRedone(Frozen):
    """A read-only conversation's continuation summary, made again before a child was started
    from it (REQ-SEG-063). The runtime asked for it (the conversation stays read-only
    meanwhile, and a summary that could not be had changes nothing); the core records it and
    makes it the one a child is seeded with. The first stays in the transcript as a version."""

    kind: Literal["continuation_redone"] = "continuation_redone"
    summary: Annotated[str, Field(min_length=1, pattern=r"\S")]
    usage: Usage | None = None


class CompactionUndoRequested(Frozen):
    """The user takes the latest compaction back (REQ-SEG-064): a new generation holds
    ``messages``, copies of the view before it plus what came after, which the runtime read from
    the transcript. Only from Idle, and only when ``tokens`` (their size with the system prompt
    and the pinned messages) stays below the continuation threshold."""

    kind: Literal["compaction_undo_requested"] = "compaction_undo_requested"
    messages: tuple[Message, ...]
    tokens: TokenCount


class PauseRequested(Frozen):
    """An orchestrator asks to pause at the next turn boundary."""

    kind: Literal["pause_requested"] = "pause_requested"
    reason: str = ""


class ResumeRequested(Frozen):
    """Resume a paused conversation in a new session seeded with the compiled resume context."""

    kind: Literal["resume_requested"] = "resume_requested"
    prompt: str | None = None
    """The first user message of the new session; a standard "continue" prompt when absent."""
    snapshot: SessionSnapshot | None = None
    """The pause's snapshot as the runtime stored it (with when it was saved and the
    application's context); used when it is this pause's (same conversation and version)."""
    current_context: dict[str, Any] | None = None
    """The application's context now (a git HEAD that moved since the pause is stated)."""
    at: Timestamp | None = None
    """Unix time of the resume, by the runtime's clock: ``pause_after_seconds`` measures from
    it (REQ-SEG-053). None: from the first answer of the resumed session that carries a time."""


Event = Annotated[
    UserMessage
    | LlmResponse
    | ProviderCompacted
    | LlmError
    | ToolResult
    | ContinuationResponse
    | ContinuationFailed
    | CheckpointResponse
    | CheckpointFailed
    | CompactionResponse
    | CompactionFailed
    | RetryDue
    | UserCancel
    | ManualContinuation
    | SummaryRedoRequested
    | ContinuationRedone
    | CompactionUndoRequested
    | PauseRequested
    | ResumeRequested,
    Field(discriminator="kind"),
]
"""Every event the core accepts."""

EVENT_TYPES: tuple[type[Frozen], ...] = (
    UserMessage,
    LlmResponse,
    ProviderCompacted,
    LlmError,
    ToolResult,
    ContinuationResponse,
    ContinuationFailed,
    CheckpointResponse,
    CheckpointFailed,
    CompactionResponse,
    CompactionFailed,
    RetryDue,
    UserCancel,
    ManualContinuation,
    SummaryRedoRequested,
    ContinuationRedone,
    CompactionUndoRequested,
    PauseRequested,
    ResumeRequested,
)


def content_text(blocks: Any) -> str:
    """The plain text of content blocks (dicts or block values): the text blocks joined by
    newlines, or a description of the attachments when there is no text."""
    texts: list[str] = []
    attachments: list[str] = []
    for block in blocks:
        get = block.get if isinstance(block, dict) else lambda name, b=block: getattr(b, name, None)
        kind = get("type")
        if kind == "text":
            text = get("text")
            if isinstance(text, str):
                texts.append(text)
        elif kind in ("image", "document"):
            title = get("title")
            attachments.append(f"[{kind}: {title}]" if isinstance(title, str) else f"[{kind}]")
    joined = "\n".join(texts)
    return joined if joined.strip() else " ".join(attachments) or joined
