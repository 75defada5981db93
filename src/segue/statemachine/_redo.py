"""Handlers that make a summary again or take a compaction back (REQ-SEG-063..065): each
starts a new generation of copies the runtime read, so nothing stored is ever rewritten.
"""

from __future__ import annotations

from typing import cast

from segue.statemachine._paths import NOTHING, Result, record, request_for, turn_boundary
from segue.statemachine._values import replaced
from segue.statemachine.effects import (
    AppendMessage,
    ArchiveTranscript,
    Effect,
    NotifyContextExhausted,
    StartGeneration,
)
from segue.statemachine.events import (
    CompactionResponse,
    CompactionUndoRequested,
    ContinuationRedone,
    SummaryRedoRequested,
)
from segue.statemachine.models import ContextExhaustionBehavior, Message
from segue.statemachine.phases import Compacting, ContextExhausted
from segue.statemachine.state import ConversationState

# --------------------------------------------------------------------------- redo and undo


def _copied(state: ConversationState, messages: tuple[Message, ...]) -> list[Effect]:
    """``messages`` recorded again in the state's session and generation: the copies a redone
    summary carries or an undone compaction restores. The runtime made them (the core holds no
    transcript): each names its original (``copy_of``) and carries no usage, which its original
    already counts."""
    where = {"session": state.session, "generation": state.generation}
    return [AppendMessage._make(message=replaced(message, where)) for message in messages]


def on_summary_redo(state: ConversationState, event: SummaryRedoRequested) -> Result:
    """REQ-SEG-063: the latest compaction's summary is asked for again, from the generation it
    replaced (the runtime builds that request). The current generation is archived first, as
    every compaction's is. Its request is sent as the conversation's summary requests are (the
    runtime sends it without tools: it repeats no turn's prefix)."""
    if state.config.behavior is not ContextExhaustionBehavior.COMPACT_IN_PLACE:
        return state, NOTHING
    effects: list[Effect] = [ArchiveTranscript._make(generation=state.generation)]
    phase = Compacting._make(
        trigger="manual",
        focus=event.focus,
        redo=True,
        summary_prompt=event.summary_prompt,
        summary_model=event.summary_model,
        shape=state.config.summary_request,
    )
    effects.append(request_for(phase))
    return replaced(state, {"phase": phase}), tuple(effects)


def summary_redone(state: ConversationState, event: CompactionResponse, summary: str) -> Result:
    """The summary made again starts a new generation: the summary (with its own usage), then
    the copies the runtime read (the first summary's verbatim tail, and what came after it).
    Nothing is deleted: the first summary stays in the transcript as a version. It replaces a
    continuation rather than adding one, so ``continuations`` is unchanged: making a summary
    again never brings a conversation nearer its ``max_continuations``."""
    generation = state.generation + 1
    copies = event.copies
    fresh = replaced(
        state,
        {
            "generation": generation,
            "context_tokens": None,
            "pending_tokens": event.retained_tokens,
            "message_count": state.message_count + 1 + len(copies),
        },
    )
    redone = Message._make(
        kind="summary",
        text=summary,
        usage=event.usage,
        session=fresh.session,
        generation=generation,
        summarises=event.summarises,
        carried=min(event.carried, len(copies)),
    )
    effects: list[Effect] = [
        StartGeneration._make(generation=generation, summary=summary),
        AppendMessage._make(message=redone),
        *_copied(fresh, copies),
    ]
    return turn_boundary(fresh, effects, ask_llm=False)


def on_compaction_undo(state: ConversationState, event: CompactionUndoRequested) -> Result:
    """REQ-SEG-064: the view before the latest compaction, and what came after it, restored as
    a new generation of copies, when it fits below the continuation threshold now (a larger
    window since, say). The runtime refuses the rest with the figures; here they change
    nothing."""
    tokens = event.tokens
    if state.config.behavior is not ContextExhaustionBehavior.COMPACT_IN_PLACE:
        return state, NOTHING
    if not event.messages or tokens >= state.config.continuation_tokens:
        return state, NOTHING
    generation = state.generation + 1
    fresh = replaced(
        state,
        {
            "generation": generation,
            "context_tokens": None,
            "pending_tokens": tokens,
            "message_count": state.message_count + len(event.messages),
        },
    )
    # The generation taken back is archived first, as every compacted one is: together the
    # archives still hold the whole transcript up to the current generation.
    archive = ArchiveTranscript._make(generation=state.generation)
    start = StartGeneration._make(generation=generation, summary=event.messages[0].text)
    return fresh, (archive, start, *_copied(fresh, event.messages))


def on_continuation_redone(state: ConversationState, event: ContinuationRedone) -> Result:
    """REQ-SEG-063: the continuation summary made again is recorded and becomes the one a
    child is seeded with; the conversation stays read-only, its figures unchanged."""
    ended = cast(ContextExhausted, state.phase)
    summary = event.summary.strip()
    effects: list[Effect] = [
        record(state, "continuation", summary, usage=event.usage),
        NotifyContextExhausted._make(summary=summary),
    ]
    phase = replaced(ended, {"summary": summary, "final_usage": event.usage})
    redone = replaced(state, {"phase": phase, "message_count": state.message_count + 1})
    return redone, tuple(effects)
