"""The runtime: what a chat backend calls to run conversations.

``Runtime`` is the facade: create a conversation, send or stream a message, read the state and
the transcript, cancel, pause, resume, continue in a new conversation. What it runs on, the loop
that commits each event and performs the outbox, is ``drive.Driver``; what performing an effect
means (asking the model, running tools, compacting, archiving) is ``perform``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from segue.executor._log import get_logger
from segue.executor.bus import Committed, Sink, Watch
from segue.executor.chains import (
    LIMIT_PURPOSES,
    Link,
    UsageReport,
    lineage,
    usage_from_log,
    usage_report,
)
from segue.executor.claims import DEFAULT_LEASE
from segue.executor.drive import ANSWERED_BY_EVENTS, Driver, Listener
from segue.executor.errors import (
    ConversationExhaustedError,
    InvalidMessageError,
    MessageRejectedError,
    SegueError,
)
from segue.executor.inputs import (
    check_content,
    check_key,
    failure_of,
    raise_if_rejected,
    user_message,
)
from segue.executor.instructions import COMPACTION_INSTRUCTION, CONTINUATION_INSTRUCTION
from segue.executor.model_port import LlmModel
from segue.executor.perform import current_conversation_id
from segue.executor.snapshots import SnapshotContext, context_of
from segue.executor.store_port import Store, StoredConversation, StoredMessage
from segue.executor.tools import Tool, ToolRegistry
from segue.executor.transcript import DEFAULT_KEEP_RECENT
from segue.executor.updates import (
    DoneUpdate,
    Update,
)
from segue.statemachine import (
    ContentBlock,
    ContextExhausted,
    ContextExhaustionBehavior,
    ConversationState,
    ErrorKind,
    Failed,
    ManualContinuation,
    Message,
    ModelSettings,
    PauseRequested,
    ResumeRequested,
    estimate_tokens,
    model_info,
    new_conversation,
)

__all__ = [  # also what callers found here before it moved (``instructions``, ``inputs``)
    "COMPACTION_INSTRUCTION",
    "CONTINUATION_INSTRUCTION",
    "ConversationExhaustedError",
    "InvalidMessageError",
    "Listener",
    "MessageRejectedError",
    "Runtime",
    "current_conversation_id",
    "failure_of",
    "user_message",
]

_log = get_logger("segue.runtime")
DEFAULT_OUTPUT_TOKENS = 8192
"""A conversation's bound on one answer unless it says otherwise: room for a long reply, while a
prompt at the continuation threshold plus this still fits the smallest window."""
AUTO_CONTINUE_PROMPT = (
    "Continue from the summary of our earlier conversation above: pick up where we left off."
)
"""The first message of a child started with ``auto_continue``."""
_FAILED_FOR_CONTEXT = frozenset(
    {
        ErrorKind.CONTEXT_EXHAUSTED,
        ErrorKind.CHECKPOINT_OVERFLOW,
        ErrorKind.COMPACTION_INEFFECTIVE,
        ErrorKind.RUN_TIME_LIMIT,
    }
)
"""Failures of a conversation whose context (or its run's time) ran out: it may be continued in
a new one, seeded with the last summary or checkpoint it wrote."""
_REPLY_SCAN = 64
"""Messages read per step when ``last_reply`` looks back for the latest assistant message."""


class Runtime(Driver):
    """Runs conversations: ``send`` a message and get back the state once it waits for input."""

    def __init__(
        self,
        *,
        store: Store,
        llm: LlmModel,
        tools: ToolRegistry | Iterable[Tool] | None = None,
        archive_dir: Path | str | None = None,
        keep_recent: int = DEFAULT_KEEP_RECENT,
        max_tokens: int | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Any] = asyncio.sleep,
        snapshot_context: SnapshotContext | None = None,
        owner: str | None = None,
        lease: float = DEFAULT_LEASE,
    ) -> None:
        """``snapshot_context``: called with a conversation id when it pauses and when it
        resumes; what it returns (JSON data: task, test or git state; ``git_context(dir)`` is a
        built-in one) is stored with the snapshot and compiled into the resume context.

        Several runtimes (processes, machines) may share one store. Each model request or tool
        run is claimed in the store by the runtime that performs it, as ``owner`` (default: host,
        process id and a random part), for ``lease`` seconds, renewed while it runs: no other
        runtime performs it meanwhile, and one that needs its outcome waits for it. Work whose
        runtime died is taken over once the lease ends (at once when it was a process on this
        host)."""
        super().__init__(
            store=store,
            llm=llm,
            tools=tools,
            archive_dir=archive_dir,
            keep_recent=keep_recent,
            max_tokens=max_tokens,
            clock=clock,
            sleep=sleep,
            snapshot_context=snapshot_context,
            owner=owner,
            lease=lease,
        )

    async def __aenter__(self) -> Runtime:
        await self.recover()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Cancel what is in flight and close the store (what was pending stays in the outbox,
        performed again by the next ``recover()``)."""
        self._feeds.stop_all()
        for task, _effect in list(self._inflight.values()):
            task.cancel()
        claims = self.claims.in_flight()
        for turn in list(self._turns):
            turn.cancel()
        if self._turns:
            await asyncio.gather(*self._turns, return_exceptions=True)
        # Let go of the work cancelled here, so another runtime takes it at once rather than
        # when its lease ends.
        for cid, effect_id in claims.items():
            await self.claims.let_go(cid, (effect_id,))
        await self.store.close()

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(conversation_id, effect)`` for every effect performed (UI hooks)."""
        self._listeners.append(listener)

    # ------------------------------------------------------------------ public API

    async def create_conversation(
        self,
        *,
        model: str,
        behavior: ContextExhaustionBehavior | str = (
            ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION
        ),
        system: str | None = None,
        parent_id: str | None = None,
        conversation_id: str | None = None,
        warning_threshold: float = 0.80,
        continuation_threshold: float = 0.90,
        max_continuations: int = 10,
        max_attempts: int = 4,
        max_tool_rounds: int = 50,
        context_window: int | None = None,
        max_output_tokens: int | None = None,
        temperature: float | None = None,
        thinking_budget: int | None = None,
        tool_choice: Mapping[str, Any] | None = None,
        summary_prompt: str | None = None,
        summary_model: str | None = None,
        max_tool_output_tokens: int | None = None,
        max_run_seconds: float | None = None,
        seed: Sequence[Message] = (),
    ) -> ConversationState:
        """Create and store a new idle conversation.

        The window is ``context_window`` when given (a proxy or compatible server often has no
        model endpoint), else what the provider reports, else segue's table of models (with a
        warning in the log: a lookup that fails never fails the conversation). Each answer may
        hold ``max_output_tokens`` (default: ``DEFAULT_OUTPUT_TOKENS``, or room for the thinking
        budget, within the model's limit). ``max_tool_rounds`` bounds the tool rounds one message
        may start (then the model is asked, without tools, for its answer). ``temperature``,
        ``thinking_budget`` (extended thinking) and ``tool_choice`` (as the Messages API takes
        it) are how the model is asked; combinations the API refuses raise
        ``pydantic.ValidationError`` here.

        What is kept at the limit is the caller's to steer: ``summary_prompt`` replaces segue's
        instruction of the request the behaviour sends there (the continuation summary, the
        checkpoint, the compaction summary); ``summary_model`` answers those requests while
        ``model`` answers the turns; ``max_tool_output_tokens`` caps one tool result (default:
        25,000 tokens, or an eighth of a smaller window), the rest cut from its middle and,
        with the runtime's ``archive_dir``, saved whole to a private file the note names;
        ``max_run_seconds`` bounds a ``CHECKPOINT_RESTART`` run: reaching the limit after it,
        the run stops (``Failed(RUN_TIME_LIMIT)``, its checkpoint recorded) instead of
        restarting.
        """
        window = context_window
        if window is None:
            window = await self.llm.context_window(model)
            if window is None:
                _log.warning(
                    "model_window_unknown",
                    model=model,
                    assumed_window=model_info(model).context_window,
                    known_model=model_info(model).known,
                )
        settings = ModelSettings(
            temperature=temperature,
            thinking_budget=thinking_budget,
            tool_choice=dict(tool_choice) if tool_choice is not None else None,
        )
        if max_output_tokens is None:
            limit = model_info(model).max_output_tokens
            wanted = DEFAULT_OUTPUT_TOKENS
            if thinking_budget is not None:
                wanted = max(wanted, thinking_budget + DEFAULT_OUTPUT_TOKENS)
            max_output_tokens = min(limit, wanted)
        state = new_conversation(
            model=model,
            behavior=behavior,
            warning_threshold=warning_threshold,
            continuation_threshold=continuation_threshold,
            conversation_id=conversation_id or uuid.uuid4().hex,
            parent_id=parent_id,
            context_window=window,
            max_output_tokens=max_output_tokens,
            system_tokens=estimate_tokens(system) if system else 0,
            max_attempts=max_attempts,
            max_continuations=max_continuations,
            max_tool_rounds=max_tool_rounds,
            settings=settings,
            summary_prompt=summary_prompt,
            summary_model=summary_model,
            max_tool_output_tokens=max_tool_output_tokens,
            max_run_seconds=max_run_seconds,
        )
        if seed:
            seeded = sum(estimate_tokens(message.text) for message in seed)
            pinned = sum(estimate_tokens(m.text) for m in seed if m.pinned)
            state = state.model_copy(
                update={"pending_tokens": state.pending_tokens + seeded, "pinned_tokens": pinned}
            )
        stored = await self.store.create(state, system=system, messages=seed, at=self._clock())
        self._entry(state.id).stored = stored
        _log.info(
            "conversation_created",
            conversation_id=state.id,
            model=model,
            behavior=state.behavior.value,
            context_window=state.context_window,
            parent_id=parent_id,
        )
        return stored.state

    async def send(
        self,
        conversation_id: str,
        text: str | Sequence[ContentBlock | dict[str, Any]],
        *,
        wait: bool = True,
        idempotency_key: str | None = None,
        pinned: bool = False,
    ) -> ConversationState:
        """Record a user message and run until the conversation waits for input.

        ``text`` is a string, or content blocks (text, images, documents; values or the Messages
        API's dicts) for a message that carries more than text.

        ``last_reply()`` then gives the text the model answered with. Raises
        ``InvalidMessageError`` (also a ``ValueError``) for an empty message, text that cannot
        be encoded or content the model's API cannot take (the adapter's reason), ``TypeError``
        for text that is not a ``str``, and ``MessageRejectedError`` or
        ``ConversationExhaustedError`` when the conversation does not take it: in each case
        nothing is stored and nothing is sent.

        A message sent while a turn of the conversation runs (in this runtime or another one
        sharing the store) waits for that turn and is then taken; with ``wait=False`` it raises
        ``MessageRejectedError`` (cause ``busy``, naming the runtime) at once instead, as a
        server answering a second browser tab wants.

        ``idempotency_key``: a message sent again with the key of one already stored in the
        conversation (a client retrying after a lost reply) is not stored again; the call
        returns once that message's turn is over, as the first call would have.

        ``pinned``: the message is never summarised away: every fresh start (a checkpoint
        restart, a compaction, a resume, a seeded new conversation) still sends it, verbatim.
        Pinned messages may hold a quarter of the window together; one that would pass that is
        refused (``MessageRejectedError``, cause ``too_large``), nothing stored.
        """
        event = user_message(text, pinned=pinned)
        check_content(self.llm, event)
        check_key(idempotency_key)
        self._refuse_if_busy(conversation_id, wait=wait)
        state, effects = await self._drive(conversation_id, event, wait=wait, key=idempotency_key)
        raise_if_rejected(conversation_id, state, effects)
        return state

    async def stream(
        self,
        conversation_id: str,
        text: str | Sequence[ContentBlock | dict[str, Any]],
        *,
        wait: bool = True,
        idempotency_key: str | None = None,
        pinned: bool = False,
    ) -> AsyncIterator[Update]:
        """The same turn as ``send()``, yielding ``Update`` values as they happen; ``done`` last.

        Refusals raise before the first update, as ``send()`` raises them. The turn runs in its
        own task: a consumer that stops iterating (a web client that disconnects) does not stop
        it, the turn finishes and is stored; ``cancel()`` stops it. ``wait``,
        ``idempotency_key`` and ``pinned`` are as for ``send()``.
        """
        event = user_message(text, pinned=pinned)
        check_content(self.llm, event)
        check_key(idempotency_key)
        self._refuse_if_busy(conversation_id, wait=wait)
        sink = Sink(conversation_id)
        self._streaming[conversation_id] = self._streaming.get(conversation_id, 0) + 1
        turn = asyncio.ensure_future(
            self._streamed_turn(sink, event, wait=wait, key=idempotency_key)
        )
        self._turns.add(turn)
        turn.add_done_callback(self._turns.discard)
        try:
            while True:
                item = await sink.get()
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Committed):
                    raise_if_rejected(conversation_id, item.state, item.effects)
                    continue
                yield item
                if isinstance(item, DoneUpdate):
                    return
        finally:
            sink.closed = True

    def _refuse_if_busy(self, conversation_id: str, *, wait: bool) -> None:
        """With ``wait=False``, refuse a message while this runtime holds the conversation.

        Checked and followed by the drive's lock request in the same step of the event loop,
        so no other turn can slip in between."""
        if not wait and self._busy(conversation_id):
            reason = "a turn is running; wait for it to end (or cancel it) and send again"
            raise MessageRejectedError(conversation_id, reason, "busy")

    def watch(self, conversation_id: str) -> Watch:
        """Every update of the conversation from this call on (a second browser tab, a
        reconnecting client), until the consumer calls ``aclose()`` or drops it; ``async with
        rt.watch(id) as updates:`` closes it for you.

        Turns this runtime drives are heard as they happen (text deltas included). Turns that
        another runtime sharing the store drives (another process, another machine) are read
        back from the store while the watch lasts: their messages, tools, meter, warnings and
        endings arrive as the same updates, the reply whole rather than in deltas, within a
        fraction of a second, from when the watch starts reading (its first read, or ``await
        watch.start()``: a caller that reads the conversation next awaits it first). A watcher
        that falls too far behind gets ``UpdatesLostError`` and should read the store before
        watching again. An unknown id raises ``ConversationNotFoundError`` on the first read
        (or the start)."""
        return self._bus.watch(conversation_id, lambda: self._feeds.start(conversation_id))

    async def last_reply(self, conversation_id: str) -> str | None:
        """The text of the conversation's latest assistant reply, or None if it has none."""
        stored = await self.store.load(conversation_id)
        after = stored.last_seq
        while after > 0:
            start = max(0, after - _REPLY_SCAN)
            messages = await self.store.messages(conversation_id, after_seq=start)
            for message in reversed(messages[: after - start]):
                if message.kind == "assistant":
                    return message.text
            after = start
        return None

    async def state(self, conversation_id: str) -> ConversationState:
        """The conversation's current state."""
        return (await self.store.load(conversation_id)).state

    async def conversation(self, conversation_id: str) -> StoredConversation:
        """The conversation as stored: its state, system prompt, child (if it was continued in
        a new one), creation time and pending work."""
        return await self.store.load(conversation_id)

    async def conversations(self) -> list[StoredConversation]:
        """Every conversation in the store, newest first (without their pending work)."""
        listed = await self.store.list_conversations()
        return listed[::-1]

    async def messages(self, conversation_id: str) -> list[StoredMessage]:
        """The whole transcript (every session and generation), in order."""
        return await self.store.messages(conversation_id)  # ConversationNotFoundError if none

    async def continue_manually(
        self, conversation_id: str, focus: str | None = None
    ) -> ConversationState:
        """Take the exhaustion path now (REQ-BED-023); a no-op unless the conversation is idle.

        ``focus`` says what the summary (checkpoint, compaction) must keep above all; it goes
        into that request's instruction (REQ-SEG-041), as Claude Code's ``/compact <focus>``.
        A request or tools in flight in this runtime make it a no-op at once: it never waits
        for the turn to end and then ends the conversation the user was still using.
        """
        event = ManualContinuation(focus=focus)  # a blank focus is refused here, as a ValueError
        gate = self._gates.get(conversation_id)
        if gate is not None and gate.lock.locked():
            return (await self.store.load(conversation_id)).state
        state, _ = await self._drive(conversation_id, event)
        return state

    async def cancel(self, conversation_id: str) -> ConversationState:
        """Stop the turn now; a running ``send`` returns with the cancelled state.

        The cancel is a flag the running drive reads before its next step, so it lands whether
        a request is in flight (that request is cancelled) or the drive is between two effects
        (waiting on the store): it never queues behind the turn it is meant to stop. It also
        drops a pause asked for in the meantime (REQ-SEG-021). A notification in flight (a
        snapshot, an archive) is let finish: cancelling it would lose it. The flag is cleared
        only by the commit of the cancel, or by a drive that ends with nothing left to cancel,
        so neither a failed commit nor this caller giving up can let the turn run on. This call
        then takes the lock itself, and commits the cancel if no drive did.
        """
        self._cancel_requests.add(conversation_id)
        self._pause_requests.pop(conversation_id, None)
        inflight = self._inflight.get(conversation_id)
        if inflight is not None:
            task, effect = inflight
            if isinstance(effect, ANSWERED_BY_EVENTS) and not task.done():
                task.cancel()
        state, _ = await self._drive(conversation_id, None)
        return state

    async def pause(
        self,
        conversation_id: str,
        reason: str = "",
        *,
        timeout: float | None = None,  # noqa: ASYNC109  # a bound on the wait, then a forced pause
    ) -> ConversationState:
        """Pause at the next turn boundary (at once when idle) and store a snapshot.

        While a turn runs in this runtime the pause is taken at its next boundary, and this
        returns at once; with ``timeout`` it waits for that at most ``timeout`` seconds, then
        cancels what is in flight (recorded as cancelled, never lost) and pauses: a forced pause.
        While another runtime sharing the store runs the turn, the request goes through the
        store and that runtime pauses at the boundary; this waits for it (at most ``timeout``
        seconds, then returns the state with ``pause_requested`` set: the pause still comes).
        """
        local = conversation_id in self._driving
        if local:
            # The running drive commits the request before its next effect, so the pause
            # takes effect at the next turn boundary. (Only a drive reads the request: while
            # anything else holds the lock, the pause waits for the lock below.)
            self._pause_requests[conversation_id] = reason
            if timeout is None:
                return (await self.store.load(conversation_id)).state
            try:
                async with asyncio.timeout(timeout), self._exclusive(conversation_id):
                    pass  # the running turn is over, and its pause was taken at its boundary
            except TimeoutError:
                await self.cancel(conversation_id)  # which also drops the pending pause
            else:
                state = (await self.store.load(conversation_id)).state
                if state.phase.kind == "paused":
                    return state
        if timeout is None or local:  # a local turn was waited for, or cancelled, above
            state, _ = await self._drive(conversation_id, PauseRequested(reason=reason))
            return state
        # Another runtime may be running the turn: the request is stored at once, and that
        # runtime pauses at the turn's boundary; wait for it at most ``timeout`` seconds.
        try:
            async with asyncio.timeout(timeout):
                state, _ = await self._drive(conversation_id, PauseRequested(reason=reason))
        except TimeoutError:
            state = (await self.store.load(conversation_id)).state
        return state

    async def resume(self, conversation_id: str, prompt: str | None = None) -> ConversationState:
        """Resume a paused conversation in a new session with the compiled resume context: from
        its snapshot as stored (what the session did, the application's context), and what the
        ``snapshot_context`` says now (a git HEAD that moved is stated)."""
        snapshots = await self.store.snapshots(conversation_id)
        current = await context_of(self.snapshot_context, conversation_id)
        event = ResumeRequested(
            prompt=prompt,
            snapshot=snapshots[-1] if snapshots else None,
            current_context=current,
        )
        state, _ = await self._drive(conversation_id, event)
        return state

    async def start_new_from(
        self,
        conversation_id: str,
        *,
        seed_with_summary: bool = True,
        auto_continue: bool = False,
    ) -> ConversationState:
        """The one child of an exhausted conversation (asking twice returns the same child).

        A conversation that failed because its context was exhausted (a sub-agent, a checkpoint
        that could not fit) can be continued too; it is seeded with the last summary or
        checkpoint it wrote, if any. ``auto_continue`` starts the child's first turn with the
        summary at once, so the user lands in a conversation that already answered (only the
        first time: asking again returns the child as it is).
        """
        if auto_continue and not seed_with_summary:
            msg = "auto_continue needs the summary to continue from (seed_with_summary=True)"
            raise ValueError(msg)
        async with self._exclusive(conversation_id):
            parent = await self.store.load(conversation_id)
            if parent.child_id is not None:
                return (await self.store.load(parent.child_id)).state
            summary = await self._summary_to_seed(parent)
            seed = [Message(kind="summary", text=summary)] if seed_with_summary and summary else []
            if parent.state.pinned_tokens:  # pinned messages go on, whatever the summary says
                # After the summary: a summary starts the view it is in (what came before it in
                # its generation is what it summarised).
                seed += [
                    Message(kind="user", text=m.text, content=m.message.content, pinned=True)
                    for m in await self.store.messages(conversation_id)
                    if m.message.pinned
                ]
            config = parent.state.config
            child = await self.create_conversation(
                model=config.model,
                behavior=config.behavior,
                system=parent.system,
                parent_id=conversation_id,
                warning_threshold=config.warning_threshold,
                continuation_threshold=config.continuation_threshold,
                max_continuations=config.max_continuations,
                max_attempts=config.max_attempts,
                max_tool_rounds=config.max_tool_rounds,
                context_window=config.context_window,
                max_output_tokens=config.max_output_tokens,
                temperature=config.settings.temperature,
                thinking_budget=config.settings.thinking_budget,
                tool_choice=config.settings.tool_choice,
                summary_prompt=config.summary_prompt,
                summary_model=config.summary_model,
                max_tool_output_tokens=config.max_tool_output_tokens,
                max_run_seconds=config.max_run_seconds,
                seed=seed,
            )
            winner = await self.store.link_child(conversation_id, child.id)
        if winner != child.id or not auto_continue or not seed_with_summary or not summary:
            return (await self.store.load(winner)).state
        return await self.send(winner, AUTO_CONTINUE_PROMPT)

    async def _summary_to_seed(self, parent: StoredConversation) -> str | None:
        phase = parent.state.phase
        if isinstance(phase, ContextExhausted):
            return phase.summary
        if isinstance(phase, Failed) and phase.error_kind in _FAILED_FOR_CONTEXT:
            for message in reversed(await self.store.messages(parent.state.id)):
                if message.kind in ("continuation", "checkpoint", "summary") and message.text:
                    return message.text
            return None
        msg = (
            f"Conversation {parent.state.id} is {phase.kind}, not context_exhausted (nor failed "
            "for its context): only an exhausted conversation is continued in a new one."
        )
        raise SegueError(msg)

    async def lineage(self, conversation_id: str) -> list[Link]:
        """The continuation chain ``conversation_id`` belongs to, root first, each link with
        its place (``label``: ``root``, ``2``, ``3``...) and the summary it ended with."""
        return await lineage(self.store, conversation_id)

    async def usage(self, conversation_id: str) -> UsageReport:
        """What the conversation's requests cost, by purpose (turn, continuation, checkpoint,
        compaction) and by session: sums of the per-request usage of every answer, read from
        the event log (an answer that was not kept, such as a refused summary asked for again,
        was paid for too)."""
        stored = await self.store.load(conversation_id)
        config = stored.state.config
        limit_model = config.summary_model or config.model
        models = {"turn": config.model, **dict.fromkeys(LIMIT_PURPOSES, limit_model)}
        logged = usage_from_log(await self.store.transitions(conversation_id))
        if logged is None:
            logged = usage_report(await self.store.messages(conversation_id))
        return dataclasses.replace(logged, models=models)

    async def recover(self) -> None:
        """Perform what a crash left pending, for every conversation with a non-empty outbox."""
        ids = await self.store.with_pending()
        if ids:
            _log.info("recovering", conversations=len(ids))
            await asyncio.gather(*(self._drive(cid, None) for cid in ids))
