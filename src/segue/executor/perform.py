"""Performing the effects that talk to the world: the model, the tools, the archive.

The drive loop (``drive.py``) decides when an effect is performed and commits what comes back;
a ``Performer`` turns one effect into the events it produced, and holds no state of its own. It
asks the model with the request ``requests`` builds and converts the reply, or the error, into
the event the core answers; it compacts and saves snapshots, and hands the tools and the
archive to ``tool_runs``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from segue.effects import (
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
from segue.executor._log import get_logger
from segue.executor.bus import UpdateBus
from segue.executor.cache import ViewCache
from segue.executor.compactions import compacted
from segue.executor.errors import LlmCallError
from segue.executor.model_port import (
    AgentToolActivity,
    ContextManaging,
    LlmReply,
    LlmRequest,
    ToolSink,
)
from segue.executor.redo import copies, estimated, latest_compaction
from segue.executor.requests import Requests
from segue.executor.setup import Setup
from segue.executor.snapshots import context_of, stored_snapshot
from segue.executor.store_port import StoredConversation
from segue.executor.tool_runs import archive, run_tools
from segue.executor.tool_runs import current_conversation_id as current_conversation_id  # noqa: PLC0414  # segue's face reads it here
from segue.executor.transcript import current_view, split_for_compaction
from segue.executor.updates import (
    ContextEditedUpdate,
    ToolFinishedUpdate,
    ToolStartedUpdate,
    Update,
)
from segue.statemachine import (
    OPAQUE_SUMMARY,
    CheckpointFailed,
    CheckpointResponse,
    Compacting,
    CompactionFailed,
    CompactionResponse,
    ContinuationFailed,
    ContinuationRedone,
    ContinuationResponse,
    Event,
    LlmError,
    LlmResponse,
    RetryDue,
    ToolCall,
    estimate_tokens,
)
from segue.statemachine.checkpoint import SessionSnapshot
from segue.statemachine.content import AgentToolUseBlock, ToolUseBlock, input_fault

_log = get_logger("segue.runtime")  # its events are the runtime's, under one name
Failure = TypeVar("Failure", LlmError, ContinuationFailed, CheckpointFailed, CompactionFailed)


def _check_inputs(reply: LlmReply) -> None:
    """``LlmCallError`` (retryable, as a tool call whose arguments are not JSON) for a reply
    whose tool input nests too deep or is too large to keep (``MAX_INPUT_DEPTH``,
    ``MAX_INPUT_CHARS``): stored, it could no longer be read back whole. Nothing of the reply
    is kept; the conversation goes on as after any failed call."""
    blocks = (b for b in reply.content if isinstance(b, ToolUseBlock | AgentToolUseBlock))
    for name, value in (
        *((call.name, call.input) for call in reply.tool_calls),
        *((block.name, block.input) for block in blocks),
    ):
        fault = input_fault(value)
        if fault is not None:
            msg = f"the tool call {name[:80]!r} has an input that {fault}"
            raise LlmCallError(msg, retryable=True)


def failed(event: type[Failure], error: LlmCallError, **fields: Any) -> Failure:
    """The event that tells the core a request failed: ``error``'s facts in the event's terms
    (a fatal error is never retryable, whatever else it says)."""
    said: dict[str, Any] = {"message" if event is LlmError else "error": error.message}
    return event(
        **said,
        retryable=error.retryable and not error.fatal,
        context_overflow=error.context_overflow,
        retry_after=error.retry_after,
        **fields,
    )


def _refused_calls(stored: StoredConversation, reply: LlmReply) -> tuple[ToolCall, ...]:
    """The tool calls a summary answer made, for the core to refuse (REQ-SEG-056), logged: no
    tool runs at the limit."""
    if reply.tool_calls:
        _log.warning(
            "summary_called_tool",
            conversation_id=stored.state.id,
            tools=[call.name for call in reply.tool_calls],
        )
    return reply.tool_calls


class Performer:
    """Performs one effect against the world and returns the events it produced."""

    __slots__ = ("_bus", "_cache", "_requests", "_setup")

    def __init__(
        self, setup: Setup, *, requests: Requests, cache: ViewCache, bus: UpdateBus
    ) -> None:
        self._setup = setup
        self._requests = requests
        self._cache = cache
        self._bus = bus

    async def outcome(self, stored: StoredConversation, effect: Effect) -> list[Event]:
        """Perform one effect; the events it produced (none for notifications)."""
        if isinstance(effect, RequestLlm):
            return await self._turn(stored, effect)
        if isinstance(effect, ExecuteTools):
            return await run_tools(self._setup, stored, effect)
        if isinstance(effect, RequestContinuation | RequestCheckpoint):
            return [await self._summary(stored, effect)]
        if isinstance(effect, RequestCompaction):
            return [await self._compact(stored, effect)]
        if isinstance(effect, ScheduleRetry):
            await self._setup.sleep(effect.delay_seconds)
            return [RetryDue(attempt=effect.attempt)]
        if isinstance(effect, ArchiveTranscript):
            await archive(self._setup, stored, effect)
        elif isinstance(effect, SaveSnapshot):
            await self.save_snapshot(effect.snapshot)
        else:
            _log.info("notify", conversation_id=stored.state.id, effect=effect.kind)
        return []

    async def save_snapshot(self, snapshot: SessionSnapshot) -> None:
        """Store the snapshot with what the store and the host add to it (``snapshots``). Saved
        once: performed again after a crash, it finds its version stored and leaves it."""
        setup = self._setup
        saved = await setup.store.snapshots(snapshot.conversation_id)
        if any(existing.version == snapshot.version for existing in saved):
            return
        context = await context_of(setup.snapshot_context, snapshot.conversation_id)
        full = await stored_snapshot(setup.store, snapshot, saved_at=setup.clock(), context=context)
        await setup.store.save_snapshot(full)

    # ------------------------------------------------------------------ asking the model

    async def _ask(self, request: LlmRequest) -> LlmReply | LlmCallError:
        """The model's reply to ``request``, or its failure (logged), never an exception."""
        reply = await self._called(request, self._setup.llm.complete)
        return reply if reply is not None else LlmCallError("no answer", retryable=True)

    async def _called(
        self, request: LlmRequest, call: Callable[[LlmRequest], Awaitable[LlmReply | None]]
    ) -> LlmReply | LlmCallError | None:
        """``call(request)`` observed (telemetry, a failure logged), its failure returned."""
        telemetry = self._setup.telemetry
        token = telemetry.inference_begins(request, self._setup.llm)
        try:
            reply = await call(request)
            if reply is not None:
                _check_inputs(reply)
        except LlmCallError as error:
            telemetry.inference_ends(token, error)
            _log.warning(
                "llm_error",
                conversation_id=request.conversation_id,
                purpose=request.purpose,
                retryable=error.retryable,
                context_overflow=error.context_overflow,
                compaction_refused=error.compaction_refused,
                status_code=error.status_code,
            )
            return error
        telemetry.inference_ends(token, reply if reply is not None else LlmReply())
        return reply

    async def _turn(self, stored: StoredConversation, effect: RequestLlm) -> list[Event]:
        """A turn's answer, with the compactions the provider made of its context while
        answering (REQ-SEG-033, REQ-SEG-048) in the same event, in the order it made them; the
        edits it applied are told to whoever watches (REQ-SEG-050)."""
        request = await self._requests.of(stored, effect)
        cid = request.conversation_id
        on_text = self._bus.text_sink(cid)
        if on_text is not None:  # someone watches the turn
            request = dataclasses.replace(request, on_text=on_text, on_tool=self._tool_sink(cid))
        outcome = await self._ask(request)
        if isinstance(outcome, LlmCallError):
            return [failed(LlmError, outcome, compaction_refused=outcome.compaction_refused)]
        self._told_edits(cid, outcome)
        compactions = tuple(compacted(request, compaction) for compaction in outcome.compactions)
        return [
            LlmResponse(
                text=outcome.text,
                tool_calls=outcome.tool_calls,
                usage=outcome.usage,
                stop_reason=outcome.stop_reason,
                content=outcome.content,
                session_ref=outcome.session_ref,
                compactions=compactions,
                at=self._setup.clock(),  # what pause_after_seconds measures (REQ-SEG-053)
            )
        ]

    def _told_edits(self, conversation_id: str, reply: LlmReply) -> None:
        """What the provider cleared from the context before answering, logged and told to
        whoever watches the conversation (REQ-SEG-050)."""
        bus = self._bus
        for edit in reply.context_edits:
            _log.info(
                "context_edited",
                conversation_id=conversation_id,
                strategy=edit.strategy,
                cleared=edit.cleared,
                cleared_input_tokens=edit.cleared_input_tokens,
            )
            if bus.listening(conversation_id):
                update = ContextEditedUpdate(
                    strategy=edit.strategy,
                    cleared=edit.cleared,
                    cleared_input_tokens=edit.cleared_input_tokens,
                )
                bus.emit(conversation_id, update)

    async def _summary(
        self, stored: StoredConversation, effect: RequestContinuation | RequestCheckpoint
    ) -> Event:
        """The answer to the continuation summary or the checkpoint request. A checkpoint
        carries how long the run has gone on (REQ-SEG-044)."""
        outcome = await self._ask(await self._requests.of(stored, effect))
        if isinstance(effect, RequestContinuation):
            if isinstance(outcome, LlmCallError):
                return failed(ContinuationFailed, outcome)
            return ContinuationResponse(
                summary=outcome.text,
                usage=outcome.usage,
                stop_reason=outcome.stop_reason,
                tool_calls=_refused_calls(stored, outcome),
            )
        elapsed = max(0.0, self._setup.clock() - stored.created_at)
        if isinstance(outcome, LlmCallError):
            return failed(CheckpointFailed, outcome, elapsed_seconds=elapsed)
        return CheckpointResponse(
            text=outcome.text,
            usage=outcome.usage,
            elapsed_seconds=elapsed,
            tool_calls=_refused_calls(stored, outcome),
        )

    async def _compact(self, stored: StoredConversation, effect: RequestCompaction) -> Event:
        """The compaction's answer: the provider's on demand (a manual trigger of a
        conversation whose provider compacts, REQ-SEG-048), else segue's own summary of all
        but the recent tail."""
        if effect.redo:
            return await self._redo(stored, effect)
        on_demand = await self._on_demand(stored, effect)
        if on_demand is not None:
            return on_demand
        state = stored.state
        view = await self._cache.view(stored)
        # Half the threshold at most kept verbatim: the summary and the next turn need the rest.
        budget = state.config.continuation_tokens // 2
        head, tail = split_for_compaction(view, state.generation, self._setup.keep_recent, budget)
        outcome = await self._ask(await self._requests.of(stored, effect, messages=head))
        if isinstance(outcome, LlmCallError):
            return failed(CompactionFailed, outcome)
        measured = outcome.compactions[-1].post_tokens if outcome.compactions else None
        if measured is not None:  # the provider compacted its own context and says what is left
            retained = measured
        else:
            retained = estimate_tokens(stored.system or "") + estimate_tokens(outcome.text)
            retained += sum(estimate_tokens(message.text) for message in tail)
            # Pinned messages outside the tail are sent before the summary (REQ-SEG-042).
            retained += sum(estimate_tokens(m.text) for m in head if m.pinned and m not in tail)
        return CompactionResponse(
            summary=outcome.text,
            retained_tokens=retained,
            kept_messages=len(tail),
            usage=outcome.usage,
            stop_reason=outcome.stop_reason,
            tool_calls=_refused_calls(stored, outcome),
        )

    async def _redo(self, stored: StoredConversation, effect: RequestCompaction) -> Event:
        """The latest compaction's summary made again (REQ-SEG-063): from the view of the
        generation it replaced, less the tail it kept verbatim, with this redo's own prompt
        and model when given. Its answer carries the copies the new generation holds after it:
        that kept tail, then what came after the first summary."""
        state = stored.state
        store = self._setup.store
        transcript = await store.messages(state.id, before_seq=stored.last_seq + 1)
        latest = latest_compaction(transcript, state.session, state.generation)
        if latest is None:
            return CompactionFailed(error="there is no compaction to make again")
        cut = len(latest.before) - min(latest.kept, len(latest.before))
        head = [message for _, message in latest.before[:cut]]
        tail = latest.before[cut:]
        stored = _with_summary_settings(stored, effect.summary_prompt, effect.summary_model)
        # Never the turn's prefix: the generation it summarises is no longer the current one.
        asked = effect.model_copy(update={"shape": "tool_less"})
        outcome = await self._ask(await self._requests.of(stored, asked, messages=head))
        if isinstance(outcome, LlmCallError):
            return failed(CompactionFailed, outcome)
        carried = copies((*tail, *latest.after), state.session, latest.summarised)
        retained = estimated(stored.system, carried) + estimate_tokens(outcome.text)
        retained += sum(estimate_tokens(m.text) for m in head if m.pinned)
        return CompactionResponse(
            summary=outcome.text,
            retained_tokens=retained,
            usage=outcome.usage,
            stop_reason=outcome.stop_reason,
            tool_calls=_refused_calls(stored, outcome),
            summarises=latest.summarised,
            copies=carried,
            carried=len(tail),
        )

    async def continuation_again(
        self,
        stored: StoredConversation,
        *,
        focus: str | None,
        summary_prompt: str | None,
        summary_model: str | None,
    ) -> ContinuationRedone | LlmCallError:
        """A read-only conversation's continuation summary asked for again (REQ-SEG-063): its
        last session's view without the summaries it ended with, tool-less, with this redo's
        focus, prompt and model. The answer is the core's event, or why there is none (a
        failure, an empty answer, a refusal): nothing is recorded then."""
        state = stored.state
        transcript = [item.message for item in await self._setup.store.messages(state.id)]
        view = current_view(transcript, state.session, state.generation)
        history = [message for message in view if message.kind != "continuation"]
        stored = _with_summary_settings(stored, summary_prompt, summary_model)
        effect = RequestContinuation(focus=focus, shape="tool_less")
        outcome = await self._ask(await self._requests.of(stored, effect, messages=history))
        if isinstance(outcome, LlmCallError):
            return outcome
        if not outcome.text.strip() or outcome.stop_reason == "refusal" or outcome.tool_calls:
            return LlmCallError("the model gave no usable summary", retryable=True)
        return ContinuationRedone(summary=outcome.text.strip(), usage=outcome.usage)

    async def _on_demand(
        self, stored: StoredConversation, effect: RequestCompaction
    ) -> CompactionResponse | CompactionFailed | None:
        """The provider's compaction asked now, for a manual trigger of a conversation whose
        provider compacts (REQ-SEG-048); None where the provider cannot be asked (segue
        compacts): the trigger was not the user's, the provider takes no focus, or the adapter
        says it cannot for this request. A block without a summary is a refusal (REQ-SEG-049),
        never a summary."""
        state = stored.state
        phase = state.phase
        if not (isinstance(phase, Compacting) and phase.trigger == "manual"):
            return None
        llm = self._setup.llm
        request = await self._requests.on_demand(stored, effect)
        if request is None or not isinstance(llm, ContextManaging):
            return None
        outcome = await self._called(request, llm.compact_now)
        if isinstance(outcome, LlmCallError):
            return failed(CompactionFailed, outcome, compaction_refused=outcome.compaction_refused)
        made = outcome.compactions[-1] if outcome is not None and outcome.compactions else None
        if made is None:
            return None
        block = made.block
        if block is None or block.failed:
            why = "the provider's compaction produced no summary"
            return CompactionFailed(error=why, compaction_refused=True)
        settled = compacted(request, made)
        return CompactionResponse(
            summary=settled.summary.strip() or OPAQUE_SUMMARY,
            retained_tokens=settled.post_tokens or 0,
            usage=made.usage,
            block=block,
        )

    def _tool_sink(self, conversation_id: str) -> ToolSink:
        """Tells listeners of the tools a provider's own agent runs, as segue's own are told."""
        bus = self._bus

        def told(activity: AgentToolActivity) -> None:
            update: Update
            if activity.finished:
                update = ToolFinishedUpdate(
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


def _with_summary_settings(
    stored: StoredConversation, summary_prompt: str | None, summary_model: str | None
) -> StoredConversation:
    """``stored`` as a redo asks it (REQ-SEG-063): with its own summary prompt and model, for
    that request only, where given; nothing stored changes."""
    override = {
        name: value
        for name, value in (("summary_prompt", summary_prompt), ("summary_model", summary_model))
        if value is not None
    }
    if not override:
        return stored
    state = stored.state
    config = state.config.model_copy(update=override)
    return dataclasses.replace(stored, state=state.model_copy(update={"config": config}))
