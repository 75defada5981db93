"""The runtime: performs the core's effects and feeds their outcomes back as events.

Theory of operation. ``_drive`` holds the conversation's lock, commits ``transition(state,
event)`` (new state, the event, the messages and the pending effects, in one transaction), then
performs the outbox in order: each effect that yields an event is completed by the commit of that
event, so a crash at any point leaves either the effect pending (it is performed again on start)
or its outcome committed (it is not). The loop stops when the outbox is empty: the conversation
waits for input. This module decides when an effect is performed and commits what comes back;
what performing one means (asking the model, running tools, compacting, archiving) is in
``perform``.

Every commit returns the conversation as it now is, so a drive never reads it back; a drive
that starts with an event does not even load it, but commits on the copy its last commit
returned: if another writer moved the conversation on since, the store's version check refuses
the commit, and the event is committed again on the conversation as loaded. Requests to stop or
pause that arrive while a drive runs are flags the loop reads before each effect, so they land
at once, not behind the lock. The view sent to the model is folded incrementally per
conversation and checked against the store's ``last_seq`` on every request: a cached view is
extended with what the store holds beyond it (written by this runtime or by any other), never
served stale, and a request costs the same at any length.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from segue.executor._log import get_logger
from segue.executor.bus import Committed, Sink, UpdateBus, Watch
from segue.executor.perform import (
    COMPACTION_INSTRUCTION,
    CONTINUATION_INSTRUCTION,
    Performer,
    current_conversation_id,
)
from segue.executor.ports import (
    Commit,
    ConcurrentUpdateError,
    InvalidMessageError,
    LlmModel,
    PendingEffect,
    SegueError,
    Store,
    StoredConversation,
    StoredMessage,
)
from segue.executor.tools import Tool, ToolRegistry
from segue.executor.updates import (
    DoneUpdate,
    Update,
    UserMessageUpdate,
    effect_update,
    occupancy_update,
)
from segue.executor.views import DEFAULT_KEEP_RECENT, TranscriptView
from segue.statemachine import (
    ContentBlock,
    ContextExhaustionBehavior,
    ConversationState,
    ErrorKind,
    Event,
    LlmError,
    LlmResponse,
    ManualContinuation,
    Message,
    ModelSettings,
    PauseRequested,
    ResumeRequested,
    UserCancel,
    UserMessage,
    estimate_tokens,
    model_info,
    new_conversation,
    transition,
)
from segue.statemachine.effects import (
    AppendMessage,
    CancelRequest,
    Effect,
    ExecuteTools,
    RejectUserMessage,
    RequestCheckpoint,
    RequestCompaction,
    RequestContinuation,
    RequestLlm,
    ScheduleRetry,
)

__all__ = [  # the prompts and the tools' context variable live in ``perform``, imported from here
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

Listener = Callable[[str, Effect], None]
_log = get_logger("segue.runtime")
_events = logging.getLogger("segue.runtime")
"""The same logger in stdlib form: checked before building a per-transition event."""
DEFAULT_OUTPUT_TOKENS = 8192
"""A conversation's bound on one answer unless it says otherwise: room for a long reply, while a
prompt at the continuation threshold plus this still fits the smallest window."""
_REPLY_SCAN = 64
"""Messages read per step when ``last_reply`` looks back for the latest assistant message."""
_CACHE_SIZE = 256
"""Conversations whose last known copy and view are kept (the most recently used)."""
_ANSWERED_BY_EVENTS = (
    RequestLlm,
    ExecuteTools,
    RequestContinuation,
    RequestCheckpoint,
    RequestCompaction,
    ScheduleRetry,
)
"""Effects whose outcome comes back as an event: the requests a ``CancelRequest`` makes stale."""


@dataclasses.dataclass(slots=True)
class _Known:
    """What this runtime last saw of a conversation; each part is checked before it is used."""

    stored: StoredConversation | None = None
    """As the last commit or load returned it; the store's version check catches a stale one."""
    view: TranscriptView | None = None
    """The model's view; checked against ``stored.last_seq`` on every request."""


@dataclasses.dataclass(slots=True)
class _Gate:
    """A conversation's lock and how many drives hold or wait for it, so that it can be dropped
    when nobody does (a long-running server sees many conversations once)."""

    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    users: int = 0


class ConversationExhaustedError(SegueError):
    """A message was sent to a conversation that reached its context limit (it is read-only)."""

    def __init__(self, conversation_id: str, reason: str) -> None:
        super().__init__(
            f"Conversation {conversation_id} is read-only: {reason} "
            f"Call start_new_from({conversation_id!r}) to continue in a new conversation."
        )
        self.conversation_id = conversation_id


class MessageRejectedError(SegueError):
    """The conversation did not accept the message (too large, paused, failed, busy)."""

    def __init__(self, conversation_id: str, reason: str) -> None:
        super().__init__(f"Conversation {conversation_id} rejected the message: {reason}")
        self.conversation_id = conversation_id
        self.reason = reason


class Runtime:
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
    ) -> None:
        self.store = store
        self.llm = llm
        self.tools = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools or ())
        self.archive_dir = Path(archive_dir) if archive_dir is not None else None
        self.keep_recent = keep_recent
        self.max_tokens = max_tokens
        self._clock = clock
        self._gates: dict[str, _Gate] = {}
        self._inflight: dict[str, tuple[asyncio.Task[Any], Effect]] = {}
        self._driving: set[str] = set()
        self._cancel_requests: set[str] = set()
        self._pause_requests: dict[str, str] = {}
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._listeners: list[Listener] = []
        self._recovery: asyncio.Task[None] | None = None
        self._bus = UpdateBus()
        self._replies: dict[str, str] = {}
        """The last assistant text each streamed or watched drive recorded (for ``done``)."""
        self._turns: set[asyncio.Task[None]] = set()
        """Streamed turns running on their own, so a consumer that leaves does not stop them."""
        # It reads store, llm, tools, ... from here per effect: ``rt.llm = other`` is heard.
        self._performer = Performer(self, entry=self._entry, sleep=sleep, bus=self._bus)

    async def __aenter__(self) -> Runtime:
        await self.recover()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Cancel what is in flight and close the store (what was pending stays in the outbox,
        performed again by the next ``recover()``)."""
        for task, _effect in list(self._inflight.values()):
            task.cancel()
        for turn in list(self._turns):
            turn.cancel()
        if self._turns:
            await asyncio.gather(*self._turns, return_exceptions=True)
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
        context_window: int | None = None,
        max_output_tokens: int | None = None,
        temperature: float | None = None,
        thinking_budget: int | None = None,
        tool_choice: Mapping[str, Any] | None = None,
        seed: Sequence[Message] = (),
    ) -> ConversationState:
        """Create and store a new idle conversation.

        The window is ``context_window`` when given (a proxy or compatible server often has no
        model endpoint), else what the provider reports, else segue's table of models (with a
        warning in the log: a lookup that fails never fails the conversation). Each answer may
        hold ``max_output_tokens`` (default: ``DEFAULT_OUTPUT_TOKENS``, or room for the thinking
        budget, within the model's limit). ``temperature``, ``thinking_budget`` (extended
        thinking) and ``tool_choice`` (as the Messages API takes it) are how the model is asked;
        combinations the API refuses raise ``pydantic.ValidationError`` here.
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
            settings=settings,
        )
        if seed:
            seeded = sum(estimate_tokens(message.text) for message in seed)
            state = state.model_copy(update={"pending_tokens": state.pending_tokens + seeded})
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
        self, conversation_id: str, text: str | Sequence[ContentBlock | dict[str, Any]]
    ) -> ConversationState:
        """Record a user message and run until the conversation waits for input.

        ``text`` is a string, or content blocks (text, images, documents; values or the Messages
        API's dicts) for a message that carries more than text.

        ``last_reply()`` then gives the text the model answered with. Raises
        ``InvalidMessageError`` (also a ``ValueError``) for an empty message or text that cannot
        be encoded, ``TypeError`` for text that is not a ``str``, and ``MessageRejectedError`` or
        ``ConversationExhaustedError`` when the conversation does not take it: in each case
        nothing is stored and nothing is sent.
        """
        state, effects = await self._drive(conversation_id, user_message(text))
        _raise_if_rejected(conversation_id, state, effects)
        return state

    async def stream(
        self, conversation_id: str, text: str | Sequence[ContentBlock | dict[str, Any]]
    ) -> AsyncIterator[Update]:
        """The same turn as ``send()``, yielding ``Update`` values as they happen; ``done`` last.

        Refusals raise before the first update, as ``send()`` raises them. The turn runs in its
        own task: a consumer that stops iterating (a web client that disconnects) does not stop
        it, the turn finishes and is stored; ``cancel()`` stops it.
        """
        event = user_message(text)
        sink = Sink(conversation_id)
        turn = asyncio.ensure_future(self._streamed_turn(sink, event))
        self._turns.add(turn)
        turn.add_done_callback(self._turns.discard)
        try:
            while True:
                item = await sink.get()
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Committed):
                    _raise_if_rejected(conversation_id, item.state, item.effects)
                    continue
                yield item
                if isinstance(item, DoneUpdate):
                    return
        finally:
            sink.closed = True

    async def _streamed_turn(self, sink: Sink, event: UserMessage) -> None:
        """Drive ``event`` with ``sink`` as this task's sink; hand any failure to the consumer."""
        token = self._bus.use(sink)
        try:
            await self._drive(sink.conversation_id, event)
        except asyncio.CancelledError:
            sink.put(SegueError("the turn was interrupted: the runtime is closing"))
            raise
        except Exception as error:  # noqa: BLE001  # the consumer raises it from stream()
            sink.put(error)
        finally:
            self._bus.reset(token)

    def watch(self, conversation_id: str) -> Watch:
        """Every update of the conversation's turns driven by this runtime, from this call on
        (a second browser tab, a reconnecting client), until the consumer calls ``aclose()``
        or drops it; ``async with rt.watch(id) as updates:`` closes it for you. A watcher that
        falls too far behind gets ``UpdatesLostError`` and should read the store before
        watching again. An unknown id raises ``ConversationNotFoundError`` on the first read."""
        return self._bus.watch(conversation_id, lambda: self.store.load(conversation_id))

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

    async def continue_manually(self, conversation_id: str) -> ConversationState:
        """Take the exhaustion path now (REQ-BED-023); a no-op unless the conversation is idle.

        A request or tools in flight in this runtime make it a no-op at once: it never waits
        for the turn to end and then ends the conversation the user was still using.
        """
        gate = self._gates.get(conversation_id)
        if gate is not None and gate.lock.locked():
            return (await self.store.load(conversation_id)).state
        state, _ = await self._drive(conversation_id, ManualContinuation())
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
            if isinstance(effect, _ANSWERED_BY_EVENTS) and not task.done():
                task.cancel()
        state, _ = await self._drive(conversation_id, None)
        return state

    async def pause(self, conversation_id: str, reason: str = "") -> ConversationState:
        """Pause at the next turn boundary (at once when idle) and store a snapshot."""
        if conversation_id in self._driving:
            # The running drive commits the request before its next effect, so the pause
            # takes effect at the next turn boundary. (Only a drive reads the request: while
            # anything else holds the lock, the pause waits for the lock below.)
            self._pause_requests[conversation_id] = reason
            return (await self.store.load(conversation_id)).state
        state, _ = await self._drive(conversation_id, PauseRequested(reason=reason))
        return state

    async def resume(self, conversation_id: str, prompt: str | None = None) -> ConversationState:
        """Resume a paused conversation in a new session with the compiled resume context."""
        state, _ = await self._drive(conversation_id, ResumeRequested(prompt=prompt))
        return state

    async def start_new_from(
        self, conversation_id: str, *, seed_with_summary: bool = True
    ) -> ConversationState:
        """The one child of an exhausted conversation (asking twice returns the same child)."""
        async with self._exclusive(conversation_id):
            parent = await self.store.load(conversation_id)
            if parent.child_id is not None:
                return (await self.store.load(parent.child_id)).state
            phase = parent.state.phase
            if phase.kind != "context_exhausted":
                msg = (
                    f"Conversation {conversation_id} is {phase.kind}, not context_exhausted: "
                    "only an exhausted conversation is continued in a new one."
                )
                raise SegueError(msg)
            seed: list[Message] = []
            if seed_with_summary:
                seed.append(Message(kind="summary", text=getattr(phase, "summary", "")))
            config = parent.state.config
            child = await self.create_conversation(
                model=config.model,
                behavior=config.behavior,
                system=parent.system,
                parent_id=conversation_id,
                warning_threshold=config.warning_threshold,
                continuation_threshold=config.continuation_threshold,
                max_continuations=config.max_continuations,
                seed=seed,
            )
            winner = await self.store.link_child(conversation_id, child.id)
            return (await self.store.load(winner)).state

    async def recover(self) -> None:
        """Perform what a crash left pending, for every conversation with a non-empty outbox."""
        ids = await self.store.with_pending()
        if ids:
            _log.info("recovering", conversations=len(ids))
            await asyncio.gather(*(self._drive(cid, None) for cid in ids))

    # ------------------------------------------------------------------ the loop

    @contextlib.asynccontextmanager
    async def _exclusive(self, conversation_id: str) -> AsyncIterator[None]:
        """Hold the conversation's lock; the lock is forgotten once nobody holds or awaits it."""
        gate = self._gates.get(conversation_id)
        if gate is None:
            gate = self._gates[conversation_id] = _Gate()
        gate.users += 1
        try:
            async with gate.lock:
                yield
        finally:
            gate.users -= 1
            if not gate.users:
                del self._gates[conversation_id]

    async def _drive(
        self, conversation_id: str, event: Event | None
    ) -> tuple[ConversationState, tuple[Effect, ...]]:
        """Commit ``event`` (if any), then perform the outbox until it is empty.

        Before each step it takes the flags ``cancel`` and ``pause`` left: a flag is cleared
        only once its event is committed (a failed commit leaves it for the next drive), and
        whatever is left when the outbox is empty has nothing more to act on: the turn is over.
        """
        async with self._exclusive(conversation_id):
            self._driving.add(conversation_id)
            try:
                first: tuple[Effect, ...] = ()
                self._replies.pop(conversation_id, None)
                if event is None:
                    stored = await self._load(conversation_id)
                else:
                    stored, first = await self._commit_event(conversation_id, event)
                    sink = self._bus.sink_for(conversation_id)
                    if sink is not None and not sink.started:
                        sink.started = True
                        sink.put(Committed(stored.state, first))
                while True:
                    if conversation_id in self._cancel_requests:
                        stored, _ = await self._commit(stored, UserCancel(), ())
                        self._cancel_requests.discard(conversation_id)
                    reason = self._pause_requests.get(conversation_id)
                    if reason is not None:
                        stored, _ = await self._commit(stored, PauseRequested(reason=reason), ())
                        self._pause_requests.pop(conversation_id, None)
                    if not stored.pending:
                        break
                    stored = await self._perform(stored, stored.pending[0])
                # Nothing is pending: a cancel that arrived during the last step has nothing
                # left to stop, and a pause was taken above. Neither may outlive this turn.
                self._cancel_requests.discard(conversation_id)
                if self._bus.listening(conversation_id):
                    reply = self._replies.pop(conversation_id, None)
                    done = DoneUpdate._make(state=stored.state, reply=reply)
                    self._bus.emit(conversation_id, done)
                return stored.state, first
            finally:
                self._driving.discard(conversation_id)

    def _entry(self, conversation_id: str) -> _Known:
        """The conversation's cache entry (made if missing), marked most recently used."""
        entry = self._known.get(conversation_id)
        if entry is None:
            entry = self._known[conversation_id] = _Known()
            while len(self._known) > _CACHE_SIZE:
                self._known.popitem(last=False)
        else:
            self._known.move_to_end(conversation_id)
        return entry

    async def _load(self, conversation_id: str) -> StoredConversation:
        stored = await self.store.load(conversation_id)
        self._entry(conversation_id).stored = stored
        return stored

    async def _commit_event(
        self, conversation_id: str, event: Event
    ) -> tuple[StoredConversation, tuple[Effect, ...]]:
        """Commit a caller's event on the last known copy, or on a fresh load if it is stale."""
        stored = self._entry(conversation_id).stored
        while True:
            remembered = stored is not None
            if stored is None:
                stored = await self._load(conversation_id)
            if isinstance(event, UserMessage) and stored.state.phase.kind == "context_exhausted":
                # Refused before the core sees it: a read-only conversation's log stays as it
                # is. (Exhausted is absorbing, so even an old copy that says so is right.)
                raise ConversationExhaustedError(
                    conversation_id, "its context window is exhausted."
                )
            try:
                return await self._commit(stored, event, ())
            except ConcurrentUpdateError:
                if not remembered:
                    raise  # another writer in the moment since we loaded: theirs to win
                stored = None  # our copy was behind (another runtime or process wrote)

    async def _commit(
        self, stored: StoredConversation, event: Event, completes: tuple[int, ...]
    ) -> tuple[StoredConversation, tuple[Effect, ...]]:
        event = await self._performer.counted(stored, event)
        before = stored.state
        after, effects = transition(before, event)
        if any(isinstance(effect, CancelRequest) for effect in effects):
            # The core cancelled the pending request: its answer would be stale, so the request
            # leaves the outbox with this commit instead of being performed after it.
            stale = (p.id for p in stored.pending if isinstance(p.effect, _ANSWERED_BY_EVENTS))
            completes = tuple(dict.fromkeys((*completes, *stale)))
        phase = after.phase
        fields = phase.__dict__  # a missing attribute costs pydantic's slow __getattr__
        reason = fields.get("message") or fields.get("trigger") or ""
        commit = Commit(
            conversation_id=before.id,
            expected_version=stored.version,
            state=after,
            event_kind=event.kind,
            event_json=event.model_dump_json(),
            from_phase=before.phase.kind,
            reason=str(reason),
            effects=effects,
            completes=completes,
            at=self._clock(),
        )
        committed = await self.store.commit(commit)
        entry = self._entry(before.id)
        entry.stored = committed
        appended = [effect.message for effect in effects if isinstance(effect, AppendMessage)]
        view = entry.view
        if appended and view is not None and view.last_seq == committed.last_seq - len(appended):
            # Our messages landed right after what the view holds: fold them in without a read.
            # Otherwise someone else wrote too, and the next request reads the gap from the store.
            view.extend(view.last_seq + 1, appended)
        if self._bus.listening(before.id):
            self._commit_updates(before, after, event, effects)
        if _events.isEnabledFor(logging.INFO):
            self._log_transition(before, after, event, effects)
        return committed, effects

    def _commit_updates(
        self,
        before: ConversationState,
        after: ConversationState,
        event: Event,
        effects: tuple[Effect, ...],
    ) -> None:
        """What a listener learns from a commit: recorded user text, the settled reply, the
        meter. (Notifications become updates when they are performed, in outbox order.)"""
        cid = before.id
        bus = self._bus
        for effect in effects:
            if not isinstance(effect, AppendMessage):
                continue
            message = effect.message
            if message.kind == "user":
                bus.emit(cid, UserMessageUpdate._make(text=message.text))
            elif message.kind == "assistant" and isinstance(event, LlmResponse):
                bus.settle(cid, message.text)
                self._replies[cid] = message.text
        if isinstance(event, LlmError):
            bus.forget_response(cid)
        meter = occupancy_update(before, after)
        if meter is not None:
            bus.emit(cid, meter)

    @staticmethod
    def _log_transition(
        before: ConversationState,
        after: ConversationState,
        event: Event,
        effects: tuple[Effect, ...],
    ) -> None:
        phase = after.phase
        window = after.context_window
        _log.info(
            "transition",
            conversation_id=before.id,
            event_kind=event.kind,
            from_phase=before.phase.kind,
            to_phase=phase.kind,
            context_tokens=after.context_tokens,
            ratio=None if after.context_tokens is None else after.context_tokens / window,
            effects=[effect.kind for effect in effects],
        )

    async def _perform(self, stored: StoredConversation, pending: PendingEffect) -> Any:
        effect = pending.effect
        cid = stored.state.id
        for listener in self._listeners:
            listener(cid, effect)
        if self._bus.listening(cid):
            update = effect_update(effect)
            if update is not None:
                self._bus.emit(cid, update)
        task = asyncio.ensure_future(self._performer.outcome(stored, effect))
        self._inflight[cid] = (task, effect)
        try:
            outcome = await task
        except asyncio.CancelledError:
            # Only the user's cancel of a request becomes an event (committed at the top of the
            # drive loop, which clears the flag); a caller's timeout or a shutdown leaves the
            # effect pending in the outbox, to be performed again on the next start.
            if cid not in self._cancel_requests or not isinstance(effect, _ANSWERED_BY_EVENTS):
                raise
            return stored
        finally:
            self._inflight.pop(cid, None)
        if not outcome:
            await self.store.complete(cid, (pending.id,))
            # Completing changes nothing but the outbox (not even the version): no need to load.
            rest = tuple(p for p in stored.pending if p.id != pending.id)
            stored = dataclasses.replace(stored, pending=rest)
            self._entry(cid).stored = stored
            return stored
        for index, event in enumerate(outcome):
            last = index == len(outcome) - 1
            stored, _ = await self._commit(stored, event, (pending.id,) if last else ())
        return stored


def user_message(text: object) -> UserMessage:
    """The ``UserMessage`` for ``text`` (a string, or content blocks: text, images, documents,
    as values or as the Messages API's dicts), or the caller's mistake as an exception: nothing
    of it reaches the store or the model."""
    if isinstance(text, str):
        _check_text(text)
        if not text.strip():
            msg = "the message is empty (or only whitespace); nothing was sent"
            raise InvalidMessageError(msg)
        return UserMessage(text=text)
    if not isinstance(text, Sequence) or isinstance(text, bytes | bytearray):
        msg = f"a message is text (str) or a list of content blocks, not {type(text).__name__}"
        raise TypeError(msg)
    for block in text:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            _check_text(block["text"])
    try:
        message = UserMessage.model_validate({"content": tuple(text)})
    except ValidationError as error:
        msg = f"the message's content blocks are not valid: {error}"
        raise InvalidMessageError(msg) from None
    if not message.text.strip():
        msg = "the message is empty (or only whitespace); nothing was sent"
        raise InvalidMessageError(msg)
    return message


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        msg = (
            f"the message holds text that cannot be encoded as UTF-8 ({error.reason} at "
            f"position {error.start}), such as a lone surrogate; nothing was sent"
        )
        raise InvalidMessageError(msg) from None


def _raise_if_rejected(
    conversation_id: str, state: ConversationState, effects: Sequence[Effect]
) -> None:
    rejection = next((e for e in effects if isinstance(e, RejectUserMessage)), None)
    if rejection is None:
        return
    if state.phase.kind == "context_exhausted":
        raise ConversationExhaustedError(conversation_id, rejection.reason)
    raise MessageRejectedError(conversation_id, rejection.reason)


def failure_of(state: ConversationState) -> tuple[ErrorKind, str] | None:
    """``(error_kind, message)`` of a failed conversation, else None."""
    phase = state.phase
    if phase.kind != "failed":
        return None
    failed = cast(Any, phase)
    return failed.error_kind, failed.message
