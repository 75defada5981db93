"""The loop under ``Runtime``: commit an event, then perform the outbox until it is empty.

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

``Runtime`` (``runtime.py``) is the facade a backend calls; this is what it runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

from segue.executor._log import get_logger
from segue.executor.bus import Committed, Sink, UpdateBus
from segue.executor.perform import Performer
from segue.executor.ports import (
    Commit,
    ConcurrentUpdateError,
    ConversationExhaustedError,
    LlmModel,
    PendingEffect,
    SegueError,
    Store,
    StoredConversation,
)
from segue.executor.snapshots import SnapshotContext
from segue.executor.tools import Tool, ToolRegistry
from segue.executor.updates import (
    DoneUpdate,
    UserMessageUpdate,
    effect_update,
    occupancy_update,
)
from segue.executor.views import TranscriptView
from segue.statemachine import (
    ConversationState,
    Event,
    LlmError,
    LlmResponse,
    PauseRequested,
    UserCancel,
    UserMessage,
    transition,
)
from segue.statemachine.effects import (
    AppendMessage,
    CancelRequest,
    Effect,
    ExecuteTools,
    RequestCheckpoint,
    RequestCompaction,
    RequestContinuation,
    RequestLlm,
    ScheduleRetry,
)

Listener = Callable[[str, Effect], None]
_log = get_logger("segue.runtime")
_events = logging.getLogger("segue.runtime")
"""The same logger in stdlib form: checked before building a per-transition event."""
_CACHE_SIZE = 256
"""Conversations whose last known copy and view are kept (the most recently used)."""
ANSWERED_BY_EVENTS = (
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



class Driver:
    """Drives conversations: the per-conversation lock, the commit, the outbox, the flags that
    cancel and pause, the cache of what was last seen, and the updates listeners get."""

    def __init__(
        self,
        *,
        store: Store,
        llm: LlmModel,
        tools: ToolRegistry | Iterable[Tool] | None,
        archive_dir: Path | str | None,
        keep_recent: int,
        max_tokens: int | None,
        clock: Callable[[], float],
        sleep: Callable[[float], Any],
        snapshot_context: SnapshotContext | None = None,
    ) -> None:
        self.store = store
        self.snapshot_context = snapshot_context
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
        self._streaming: dict[str, int] = {}
        """Streamed turns per conversation, counted from when they are scheduled (before their
        task takes the lock), so that ``wait=False`` sees a turn that has not started yet."""
        # It reads store, llm, tools, ... from here per effect: ``rt.llm = other`` is heard.
        self._performer = Performer(
            self, entry=self._entry, sleep=sleep, bus=self._bus, clock=clock
        )

    async def _streamed_turn(self, sink: Sink, event: UserMessage) -> None:
        """Drive ``event`` with ``sink`` as this task's sink; hand any failure to the consumer."""
        token = self._bus.use(sink)
        cid = sink.conversation_id
        try:
            await self._drive(cid, event)
        except asyncio.CancelledError:
            sink.put(SegueError("the turn was interrupted: the runtime is closing"))
            raise
        except Exception as error:  # noqa: BLE001  # the consumer raises it from stream()
            sink.put(error)
        finally:
            self._bus.reset(token)
            self._streaming[cid] -= 1
            if not self._streaming[cid]:
                del self._streaming[cid]

    def _busy(self, conversation_id: str) -> bool:
        """Whether this runtime runs, or has scheduled, a turn of the conversation."""
        gate = self._gates.get(conversation_id)
        return conversation_id in self._streaming or (gate is not None and gate.users > 0)

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
            stale = (p.id for p in stored.pending if isinstance(p.effect, ANSWERED_BY_EVENTS))
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
            if cid not in self._cancel_requests or not isinstance(effect, ANSWERED_BY_EVENTS):
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
