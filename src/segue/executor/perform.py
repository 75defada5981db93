"""Performing the effects that talk to the world: the model, the tools, the archive.

The runtime's loop (``runtime.py``) decides when an effect is performed and commits what comes
back; a ``Performer`` turns one effect into the events it produced, and holds no state of its
own. It builds what the model is sent (the view, the system prompt, the ``LlmRequest``), asks,
and converts the reply or the error into the event the core answers; it runs tools, compacts,
archives, and counts a message's prompt exactly before the runtime commits it. It reads the
runtime's parts when it performs, so assigning ``rt.llm`` takes effect at the next request, and
keeps a conversation's folded view in the runtime's cache entry, next to the copy the loop
commits on (the loop folds its own messages into the same view).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from segue.executor._log import get_logger
from segue.executor.archive import write_archive, write_tool_output
from segue.executor.bus import UpdateBus
from segue.executor.errors import LlmCallError, SegueError
from segue.executor.instructions import (
    ALTERNATE_COMPACTION_INSTRUCTION,
    ALTERNATE_CONTINUATION_INSTRUCTION,
    COMPACTION_INSTRUCTION,
    CONTINUATION_INSTRUCTION,
    FINAL_ANSWER_INSTRUCTION,
    FOCUS_NOTE,
    at_the_limit,
    limit_instruction,
)
from segue.executor.model_port import (
    AgentToolActivity,
    LlmModel,
    LlmReply,
    LlmRequest,
    Purpose,
    ToolSink,
)
from segue.executor.snapshots import SnapshotContext, context_of, stored_snapshot
from segue.executor.store_port import Store, StoredConversation
from segue.executor.tools import ToolRegistry
from segue.executor.transcript import TranscriptView, ViewSnapshot, split_for_compaction
from segue.executor.updates import ToolFinishedUpdate, ToolStartedUpdate
from segue.statemachine import (
    CHECKPOINT_PROMPT,
    CheckpointFailed,
    CheckpointResponse,
    CompactionFailed,
    CompactionResponse,
    ContinuationFailed,
    ContinuationResponse,
    ErrorKind,
    Event,
    Failed,
    Idle,
    LlmError,
    LlmResponse,
    Message,
    ProviderCompacted,
    RetryDue,
    ToolCall,
    ToolExecuting,
    ToolResult,
    UserMessage,
    compile_resume_context,
    estimate_content,
    estimate_tokens,
    model_info,
)
from segue.statemachine.accounting import cap_text
from segue.statemachine.checkpoint import SessionSnapshot
from segue.statemachine.effects import (
    ArchiveTranscript,
    Effect,
    ExecuteTools,
    RequestCheckpoint,
    RequestCompaction,
    RequestContinuation,
    RequestLlm,
    SaveSnapshot,
    ScheduleRetry,
)

current_conversation_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "segue_current_conversation_id", default=None
)
"""The conversation whose tools are running (read by the sub-agent tool to set a parent)."""

_log = get_logger("segue.runtime")  # its events are the runtime's, under one name
_RECOVERABLE = frozenset({ErrorKind.LLM_ERROR, ErrorKind.RETRIES_EXHAUSTED})
"""Failures a user message recovers from (REQ-SEG-023): the core takes the message."""


class Parts(Protocol):
    """The runtime's public parts, read each time an effect is performed (never copied)."""

    store: Store
    llm: LlmModel
    tools: ToolRegistry
    archive_dir: Path | None
    keep_recent: int
    max_tokens: int | None
    snapshot_context: SnapshotContext | None


class ViewSlot(Protocol):
    """Where a conversation's folded view is kept between requests: the runtime's cache entry."""

    view: TranscriptView | None


class Performer:
    """Performs one effect against the world and returns the events it produced."""

    def __init__(
        self,
        parts: Parts,
        *,
        entry: Callable[[str], ViewSlot],
        sleep: Callable[[float], Any],
        bus: UpdateBus,
        clock: Callable[[], float],
    ) -> None:
        self._parts = parts
        self._entry = entry
        self._sleep = sleep
        self._bus = bus
        self._clock = clock

    async def outcome(self, stored: StoredConversation, effect: Effect) -> list[Event]:
        """Perform one effect; the events it produced (none for notifications)."""
        if isinstance(effect, RequestLlm):
            return await self._ask(
                stored,
                "turn",
                instruction=FINAL_ANSWER_INSTRUCTION if effect.final else None,
                rejected=(),
                trim_level=0,
                to_events=self._turn_events,
                final=effect.final,
            )
        if isinstance(effect, ExecuteTools):
            return list(await self._run_tools(stored, effect))
        if isinstance(effect, RequestContinuation | RequestCheckpoint):
            purpose, instruction, to_event = _SUMMARY_REQUESTS[type(effect)]
            if isinstance(effect, RequestContinuation) and effect.alternate:
                instruction = ALTERNATE_CONTINUATION_INSTRUCTION  # the user's did not work
            elif at_the_limit(stored.state, effect):
                instruction = limit_instruction(instruction, stored.state, None)
            if effect.focus:
                instruction += FOCUS_NOTE.format(focus=effect.focus)
            elapsed = max(0.0, self._clock() - stored.created_at)
            return await self._ask(
                stored,
                purpose,
                instruction=instruction,
                rejected=effect.rejected_tool_calls,
                trim_level=effect.trim_level,
                to_events=lambda outcome: [to_event(outcome, elapsed)],
            )
        if isinstance(effect, RequestCompaction):
            return [await self._compact(stored, effect)]
        if isinstance(effect, ScheduleRetry):
            await self._sleep(effect.delay_seconds)
            return [RetryDue(attempt=effect.attempt)]
        if isinstance(effect, ArchiveTranscript):
            await self._archive(stored, effect)
        elif isinstance(effect, SaveSnapshot):
            await self._save_snapshot(effect.snapshot)
        else:
            _log.info("notify", conversation_id=stored.state.id, effect=effect.kind)
        return []

    async def _save_snapshot(self, snapshot: SessionSnapshot) -> None:
        """Store the snapshot with what the store and the host add to it (``snapshots``). Saved
        once: performed again after a crash, it finds its version stored and leaves it."""
        store = self._parts.store
        saved = await store.snapshots(snapshot.conversation_id)
        if any(existing.version == snapshot.version for existing in saved):
            return
        context = await context_of(self._parts.snapshot_context, snapshot.conversation_id)
        full = await stored_snapshot(store, snapshot, saved_at=self._clock(), context=context)
        await store.save_snapshot(full)

    async def counted(self, stored: StoredConversation, event: Event) -> Event:
        """``event`` with an exact ``token_count`` when the model can count prompts.

        Pre-flight compares the projected prompt (last occupancy + what was appended since) with
        the threshold. When ``llm.count_tokens`` answers, the message gets the count that makes
        that projection the exact prompt of the next request: counted minus projected, never
        below zero (an estimate above the truth stays, which errs on the safe side). Only a user
        message or tool result the core will record is counted, and only once.
        """
        if (
            not self._parts.llm.exact_preflight
            or not isinstance(event, UserMessage | ToolResult)
            or event.token_count is not None
        ):
            return event
        state = stored.state
        phase = state.phase
        where = {"session": state.session, "generation": state.generation}
        if isinstance(event, UserMessage):
            accepted = isinstance(phase, Idle) or (
                isinstance(phase, Failed) and phase.error_kind in _RECOVERABLE
            )
            if not accepted:
                return event  # the core rejects it: nothing to count
            message = Message(kind="user", text=event.text, **where)
        else:
            if not isinstance(phase, ToolExecuting) or event.tool_call_id not in phase.pending:
                return event  # a stale result the core ignores
            message = Message(
                kind="tool_result",
                text=event.output,
                tool_call_id=event.tool_call_id,
                is_error=event.is_error,
                **where,
            )
        view = await self._view(stored)
        request = await self._request(
            stored, "turn", instruction=None, rejected=(), trim_level=0, messages=[*view, message]
        )
        counted = await self._parts.llm.count_tokens(request)
        if counted is None:
            return event
        return event.model_copy(update={"token_count": max(0, counted - state.projected_tokens)})

    # ------------------------------------------------------------------ requests

    async def _view(self, stored: StoredConversation) -> ViewSnapshot:
        """The current view, exactly as of ``stored`` (its state and ``last_seq``).

        The cached fold is reused only for the state's session and generation and only while it
        holds no more than the store does; it is brought up to ``stored.last_seq`` with the
        messages after its own ``last_seq``, whoever wrote them. A new session or generation,
        or a transcript the store no longer agrees with, is folded again from the start.
        """
        state = stored.state
        cid = state.id
        entry = self._entry(cid)
        view = entry.view
        if (
            view is None
            or view.session != state.session
            or view.generation != state.generation
            or view.last_seq > stored.last_seq
        ):
            view = entry.view = TranscriptView(state.session, state.generation)
        if view.last_seq < stored.last_seq:
            try:
                for message in await self._parts.store.messages(cid, after_seq=view.last_seq):
                    if message.seq > stored.last_seq:
                        break  # written after ``stored`` was read: not part of this state
                    view.add(message.seq, message.message)
            except ValueError as error:  # a gap in the seqs: the store broke its contract
                entry.view = None
                raise SegueError(f"transcript of {cid} is not contiguous: {error}") from error
            if view.last_seq != stored.last_seq:
                entry.view = None
                msg = f"the store holds {view.last_seq} messages of {cid}, not {stored.last_seq}"
                raise SegueError(msg)
        return view.snapshot()

    async def _system(self, stored: StoredConversation) -> str | None:
        state = stored.state
        resumed = state.resume_context
        if resumed is not None:
            return f"{stored.system}\n\n{resumed}" if stored.system else resumed
        if state.snapshots == 0 or state.session == 1:
            return stored.system
        # Resumed before the state kept its resume context: compile it from the store.
        snapshots = await self._parts.store.snapshots(state.id)
        latest = snapshots[-1] if snapshots else None
        if latest is None or latest.session + 1 != state.session:
            return stored.system
        context = compile_resume_context(latest)
        return f"{stored.system}\n\n{context}" if stored.system else context

    async def _request(
        self,
        stored: StoredConversation,
        purpose: Purpose,
        *,
        instruction: str | None,
        rejected: Sequence[Any],
        trim_level: int,
        messages: Sequence[Message] | None = None,
        final: bool = False,
    ) -> LlmRequest:
        state = stored.state
        cap = self._parts.max_tokens
        config = state.config
        model, output = state.model, config.max_output_tokens
        if purpose != "turn" and config.summary_model is not None:  # REQ-SEG-045
            model = config.summary_model
            output = min(output, model_info(model).max_output_tokens)
        return LlmRequest(
            conversation_id=state.id,
            model=model,
            purpose=purpose,
            system=await self._system(stored),
            messages=messages if messages is not None else await self._view(stored),
            tools=self._parts.tools.specs if purpose == "turn" else (),
            instruction=instruction,
            rejected_tool_calls=tuple(rejected),
            trim_level=trim_level,
            max_tokens=output if cap is None else min(cap, output),
            settings=state.config.settings,
            final=final,
            behavior=state.behavior,
            context_window=state.context_window,
            stop_at_tokens=state.config.continuation_tokens,
            provider_session=state.provider_session,
        )

    async def _ask(
        self,
        stored: StoredConversation,
        purpose: Purpose,
        *,
        instruction: str | None,
        rejected: Sequence[Any],
        trim_level: int,
        to_events: Callable[[LlmReply | LlmCallError], list[Event]],
        final: bool = False,
    ) -> list[Event]:
        request = await self._request(
            stored,
            purpose,
            instruction=instruction,
            rejected=rejected,
            trim_level=trim_level,
            final=final,
        )
        cid = request.conversation_id
        on_text = self._bus.text_sink(cid) if purpose == "turn" else None
        if on_text is not None:  # someone watches the turn
            request = dataclasses.replace(request, on_text=on_text, on_tool=self._tool_sink(cid))
        try:
            reply = await self._parts.llm.complete(request)
        except LlmCallError as error:
            _log.warning(
                "llm_error",
                conversation_id=stored.state.id,
                purpose=purpose,
                retryable=error.retryable,
                context_overflow=error.context_overflow,
                status_code=error.status_code,
            )
            return to_events(error)
        return to_events(reply)

    def _tool_sink(self, conversation_id: str) -> ToolSink:
        """Tells listeners of the tools a provider's own agent runs, as segue's own are told."""
        bus = self._bus

        def told(activity: AgentToolActivity) -> None:
            if activity.finished:
                update: Any = ToolFinishedUpdate(
                    id=activity.id,
                    name=activity.name,
                    is_error=activity.is_error,
                    output=activity.output,
                )
            else:
                update = ToolStartedUpdate(
                    id=activity.id, name=activity.name, input=dict(activity.input)
                )
            bus.emit(conversation_id, update)

        return told

    @staticmethod
    def _turn_events(outcome: LlmReply | LlmCallError) -> list[Event]:
        """The answer to a turn's request; first, any compaction the provider made of its own
        context while answering (REQ-SEG-033), in the order it made them."""
        if isinstance(outcome, LlmCallError):
            return [
                LlmError(
                    message=outcome.message,
                    retryable=outcome.retryable and not outcome.fatal,
                    context_overflow=outcome.context_overflow,
                    retry_after=outcome.retry_after,
                )
            ]
        events: list[Event] = [
            ProviderCompacted(
                summary=compaction.summary,
                trigger=compaction.trigger,
                pre_tokens=compaction.pre_tokens,
                post_tokens=compaction.post_tokens,
            )
            for compaction in outcome.compactions
        ]
        events.append(
            LlmResponse(
                text=outcome.text,
                tool_calls=outcome.tool_calls,
                usage=outcome.usage,
                stop_reason=outcome.stop_reason,
                content=outcome.content,
                session_ref=outcome.session_ref,
            )
        )
        return events

    # ------------------------------------------------------------------ tools, compaction, archive

    async def _run_tools(self, stored: StoredConversation, effect: ExecuteTools) -> list[Event]:
        phase = stored.state.phase
        cid = stored.state.id
        waiting = set(phase.pending) if isinstance(phase, ToolExecuting) else set()
        calls = [call for call in effect.tool_calls if call.id in waiting]
        tools = self._parts.tools
        bus = self._bus

        cap = stored.state.config.tool_output_cap

        async def run(call: ToolCall) -> ToolResult:
            if bus.listening(cid):
                bus.emit(cid, ToolStartedUpdate(id=call.id, name=call.name, input=call.input))
            result = await self._capped(cid, await tools.run(call), cap)
            if bus.listening(cid):
                finished = ToolFinishedUpdate(
                    id=call.id, name=call.name, is_error=result.is_error, output=result.output
                )
                bus.emit(cid, finished)
            return result

        token = current_conversation_id.set(cid)
        try:
            return list(await asyncio.gather(*(run(call) for call in calls)))
        finally:
            current_conversation_id.reset(token)

    async def _capped(self, conversation_id: str, result: ToolResult, cap: int) -> ToolResult:
        """``result`` within the conversation's cap on tool output (REQ-SEG-043): its head and
        tail, and a note of what was cut. With an ``archive_dir`` the whole output is first
        saved as a private file, and the note names it. The core would cap an oversize result
        itself (without the file); capping here also keeps the event log small."""
        content = result.content
        text = result.output
        if (estimate_content(text, content) if content else estimate_tokens(text)) <= cap:
            return result
        saved_as: str | None = None
        directory = self._parts.archive_dir
        if directory is not None:
            try:
                path = await asyncio.to_thread(
                    write_tool_output, directory, conversation_id, result.tool_call_id, text
                )
                saved_as = str(path)
            except (OSError, ValueError) as error:
                _log.error(
                    "tool_output_not_saved",
                    conversation_id=conversation_id,
                    error_type=type(error).__name__,
                )
        blocks = tuple(
            block.model_copy(update={"text": cap_text(block.text, cap, saved_as=saved_as)})
            if block.type == "text"
            else block
            for block in content
        )
        _log.info(
            "tool_output_capped",
            conversation_id=conversation_id,
            cap_tokens=cap,
            output_bytes=len(text.encode("utf-8")),
            saved=saved_as is not None,
        )
        return result.model_copy(
            update={"output": cap_text(text, cap, saved_as=saved_as), "content": blocks}
        )

    async def _compact(self, stored: StoredConversation, effect: RequestCompaction) -> Event:
        state = stored.state
        view = await self._view(stored)
        head, tail = split_for_compaction(view, state.generation, self._parts.keep_recent)
        instruction = (
            ALTERNATE_COMPACTION_INSTRUCTION
            if effect.alternate
            else limit_instruction(COMPACTION_INSTRUCTION, state, None)
        )
        if effect.focus:
            instruction += FOCUS_NOTE.format(focus=effect.focus)
        request = await self._request(
            stored,
            "compaction",
            instruction=instruction,
            rejected=effect.rejected_tool_calls,
            trim_level=effect.trim_level,
            messages=head,
        )
        try:
            reply = await self._parts.llm.complete(request)
        except LlmCallError as error:
            return CompactionFailed(
                error=error.message,
                retryable=error.retryable and not error.fatal,
                context_overflow=error.context_overflow,
                retry_after=error.retry_after,
            )
        measured = reply.compactions[-1].post_tokens if reply.compactions else None
        if measured is not None:  # the provider compacted its own context and says what is left
            retained = measured
        else:
            retained = estimate_tokens(stored.system or "") + estimate_tokens(reply.text)
            retained += sum(estimate_tokens(message.text) for message in tail)
            # Pinned messages outside the tail are sent before the summary (REQ-SEG-042).
            retained += sum(estimate_tokens(m.text) for m in head if m.pinned and m not in tail)
        return CompactionResponse(
            summary=reply.text,
            retained_tokens=retained,
            kept_messages=len(tail),
            usage=reply.usage,
            stop_reason=reply.stop_reason,
        )

    async def _archive(self, stored: StoredConversation, effect: ArchiveTranscript) -> None:
        directory = self._parts.archive_dir or Path.home() / ".segue" / "archives"
        transcript = [m.message for m in await self._parts.store.messages(stored.state.id)]
        try:
            path = await asyncio.to_thread(
                write_archive, directory, stored.state.id, effect.generation, transcript
            )
        except (OSError, ValueError) as error:
            _log.error(
                "archive_failed",
                conversation_id=stored.state.id,
                generation=effect.generation,
                error_type=type(error).__name__,
            )
            return
        _log.info("archived", conversation_id=stored.state.id, path=str(path))


def _continuation_event(outcome: LlmReply | LlmCallError, _elapsed: float) -> Event:
    if isinstance(outcome, LlmCallError):
        return ContinuationFailed(
            error=outcome.message,
            retryable=outcome.retryable and not outcome.fatal,
            context_overflow=outcome.context_overflow,
            retry_after=outcome.retry_after,
        )
    return ContinuationResponse(
        summary=outcome.text, usage=outcome.usage, stop_reason=outcome.stop_reason
    )


def _checkpoint_event(outcome: LlmReply | LlmCallError, elapsed: float) -> Event:
    """The checkpoint's answer, with how long the run has gone on (REQ-SEG-044)."""
    if isinstance(outcome, LlmCallError):
        return CheckpointFailed(
            error=outcome.message,
            retryable=outcome.retryable and not outcome.fatal,
            context_overflow=outcome.context_overflow,
            retry_after=outcome.retry_after,
            elapsed_seconds=elapsed,
        )
    return CheckpointResponse(text=outcome.text, usage=outcome.usage, elapsed_seconds=elapsed)


_SUMMARY_REQUESTS: dict[
    type[Effect], tuple[Purpose, str, Callable[[LlmReply | LlmCallError, float], Event]]
] = {
    RequestContinuation: ("continuation", CONTINUATION_INSTRUCTION, _continuation_event),
    RequestCheckpoint: ("checkpoint", CHECKPOINT_PROMPT, _checkpoint_event),
}
"""The two tool-less requests that differ only in purpose, prompt and resulting event."""
