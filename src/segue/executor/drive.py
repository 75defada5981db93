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
import itertools
import logging
import random
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from segue.executor._log import get_logger
from segue.executor.bus import Committed, Sink, UpdateBus
from segue.executor.claims import DEFAULT_LEASE, Claims, live_holder
from segue.executor.errors import (
    ConcurrentUpdateError,
    ConversationExhaustedError,
    DuplicateMessageError,
    SegueError,
    StoreLockedError,
    StoreUnavailableError,
)
from segue.executor.feed import Feeds
from segue.executor.model_port import LlmModel
from segue.executor.perform import Performer
from segue.executor.snapshots import SnapshotContext
from segue.executor.store_port import Commit, PendingEffect, Store, StoredConversation
from segue.executor.tools import Tool, ToolRegistry
from segue.executor.transcript import TranscriptView
from segue.executor.updates import (
    DoneUpdate,
    effect_update,
)
from segue.statemachine import (
    ConversationState,
    Event,
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
    RejectUserMessage,
    RequestCheckpoint,
    RequestCompaction,
    RequestContinuation,
    RequestLlm,
    ScheduleRetry,
)

T = TypeVar("T")
P = ParamSpec("P")
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
_POLL_FIRST, _POLL_MAX = 0.02, 0.5
"""Pauses (seconds) between reads of the store while another runtime performs the work."""
_STORE_ATTEMPTS, _STORE_BACKOFF = 6, 0.1
"""Tries of a store call that failed as locked or unreachable, and the first pause (doubled)."""
_CONFLICT_ATTEMPTS = 20
"""Commits of one event on a conversation other writers keep moving on, before giving up."""


def _refused(effects: tuple[Effect, ...]) -> bool:
    return any(isinstance(effect, RejectUserMessage) for effect in effects)


def _busy_refusal(effects: tuple[Effect, ...]) -> bool:
    return any(isinstance(e, RejectUserMessage) and e.cause == "busy" for e in effects)


def _naming_holder(effects: tuple[Effect, ...], head: PendingEffect) -> tuple[Effect, ...]:
    """The busy refusal, saying which runtime holds the work (so an operator can find it)."""
    if head.owner is None:
        return effects
    return tuple(
        RejectUserMessage._make(
            reason=f"{e.reason} (runtime {head.owner} is performing its {head.effect.kind})",
            cause=e.cause,
        )
        if isinstance(e, RejectUserMessage)
        else e
        for e in effects
    )


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
        owner: str | None = None,
        lease: float = DEFAULT_LEASE,
    ) -> None:
        self.claims = Claims(store=lambda: self.store, owner=owner, lease=lease)
        """This runtime's claims on pending work (``claims``)."""
        self.store = store
        self.snapshot_context = snapshot_context
        self.llm = llm
        self.tools = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools or ())
        self.archive_dir = Path(archive_dir) if archive_dir is not None else None
        self.keep_recent = keep_recent
        self.max_tokens = max_tokens
        self._clock = clock
        self._key_prefix = secrets.token_hex(8)
        self._key_numbers = itertools.count(1)
        """Idempotency keys of messages sent without one: unique to this runtime (a random
        prefix) and within it (a count), without a call to the system's random source each."""
        self._gates: dict[str, _Gate] = {}
        self._inflight: dict[str, tuple[asyncio.Task[Any], Effect]] = {}
        self._driving: set[str] = set()
        self._cancel_requests: set[str] = set()
        self._pause_requests: dict[str, str] = {}
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._listeners: list[Listener] = []
        self._recovery: asyncio.Task[None] | None = None
        self._bus = UpdateBus(unwatched=lambda cid: self._feeds.stop(cid))  # noqa: PLW0108  # made next
        self._feeds = Feeds(store=lambda: self.store, bus=self._bus)
        """Watched conversations read back from the store (what other runtimes commit)."""
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

    @property
    def owner(self) -> str:
        """Who this runtime is in the store's claims (``claims.default_owner`` unless given)."""
        return self.claims.owner

    @property
    def lease(self) -> float:
        """Seconds a claim of this runtime lasts unless renewed (``claims.DEFAULT_LEASE``)."""
        return self.claims.lease

    @lease.setter
    def lease(self, seconds: float) -> None:
        if not seconds > 0:
            msg = f"lease must be a positive number of seconds, not {seconds!r}"
            raise ValueError(msg)
        self.claims.lease = seconds

    async def _streamed_turn(
        self, sink: Sink, event: UserMessage, *, wait: bool = True, key: str | None = None
    ) -> None:
        """Drive ``event`` with ``sink`` as this task's sink; hand any failure to the consumer."""
        token = self._bus.use(sink)
        cid = sink.conversation_id
        try:
            await self._drive(cid, event, wait=wait, key=key)
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
        self,
        conversation_id: str,
        event: Event | None,
        *,
        wait: bool = True,
        key: str | None = None,
    ) -> tuple[ConversationState, tuple[Effect, ...]]:
        """Commit ``event`` (if any), then perform the outbox until it is empty.

        Before each step it takes the flags ``cancel`` and ``pause`` left: a flag is cleared
        only once its event is committed (a failed commit leaves it for the next drive), and
        whatever is left when the outbox is empty has nothing more to act on: the turn is over.

        Work another runtime holds (a live claim) is never performed here. A drive whose event
        was taken waits for that runtime's outcome, so its caller gets the turn's result; a
        message refused as busy because of it waits the same way and is then sent again
        (``wait=False``: the refusal is returned at once, naming who is busy); a drive without
        an event (``recover()``) leaves it alone. Work nobody holds any longer (its runtime
        died, or let go after a store failure) is claimed and performed. ``key`` is the
        message's idempotency key: a message already stored under it is not stored again, the
        drive only waits for its turn.
        """
        async with self._exclusive(conversation_id):
            self._driving.add(conversation_id)
            try:
                first: tuple[Effect, ...] = ()
                self._replies.pop(conversation_id, None)
                sink = self._bus.sink_for(conversation_id)
                if key is None and isinstance(event, UserMessage):
                    # Every message carries a key: a commit whose reply was lost (a dropped
                    # database session) and is tried again cannot store the message twice.
                    key = f"auto:{self._key_prefix}:{next(self._key_numbers)}"
                if event is None:
                    stored = await self._load(conversation_id)
                    follow = False
                else:
                    stored, first = await self._commit_event(conversation_id, event, key)
                    follow = not _refused(first) or wait
                while True:
                    if sink is not None and not sink.started and not _busy_refusal(first):
                        sink.started = True
                        sink.put(Committed(stored.state, first))
                    refused_at = stored.version
                    stored, settled = await self._run_outbox(stored, follow=follow)
                    if (
                        event is None
                        or not settled
                        or not _busy_refusal(first)
                        or stored.version == refused_at  # nothing moved: it would refuse again
                    ):
                        break
                    # What made it busy is over (done here or by its owner): take the message.
                    stored, first = await self._commit_event(conversation_id, event, key)
                    follow = not _refused(first) or wait
                if _busy_refusal(first) and stored.pending:
                    first = _naming_holder(first, stored.pending[0])
                if sink is not None and not sink.started:
                    sink.started = True
                    sink.put(Committed(stored.state, first))
                # Nothing is pending: a cancel that arrived during the last step has nothing
                # left to stop, and a pause was taken above. Neither may outlive this turn.
                if settled:
                    self._cancel_requests.discard(conversation_id)
                if self._bus.listening(conversation_id):
                    reply = self._replies.pop(conversation_id, None)
                    done = DoneUpdate._make(state=stored.state, reply=reply)
                    self._bus.emit(conversation_id, done)
                return stored.state, first
            finally:
                self._driving.discard(conversation_id)

    async def _run_outbox(
        self, stored: StoredConversation, *, follow: bool
    ) -> tuple[StoredConversation, bool]:
        """Perform the outbox in order until it is empty (settled: True), or until its head is
        another runtime's live work and ``follow`` is False (settled: False)."""
        cid = stored.state.id
        while True:
            if cid in self._cancel_requests:
                stored, _ = await self._commit_retrying(stored, UserCancel())
                self._cancel_requests.discard(cid)
            reason = self._pause_requests.get(cid)
            if reason is not None:
                stored, _ = await self._commit_retrying(stored, PauseRequested(reason=reason))
                self._pause_requests.pop(cid, None)
            if not stored.pending:
                return stored, True
            head = stored.pending[0]
            if not self.claims.holds(head):
                claimed = await self._retrying(cid, self.claims.take, cid, head)
                if claimed is None:  # performed meanwhile by its owner
                    stored = await self._load(cid)
                    continue
                if claimed.owner != self.claims.owner:
                    if not follow:
                        return dataclasses.replace(
                            stored, pending=(claimed, *stored.pending[1:])
                        ), False
                    stored = await self._await_owner(cid, claimed)
                    continue
                stored = dataclasses.replace(stored, pending=(claimed, *stored.pending[1:]))
                head = claimed
            stored = await self._perform(stored, head)

    async def _await_owner(self, conversation_id: str, held: PendingEffect) -> StoredConversation:
        """Wait while another runtime performs ``held``: until it is done (or its claim lapses),
        reading the store with a growing pause; a cancel or pause asked of this runtime ends
        the wait (the drive commits it, which makes the other's answer stale)."""
        delay = _POLL_FIRST
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)
            stored = await self._retrying(conversation_id, self._load, conversation_id)
            if (
                not stored.pending
                or stored.pending[0].id != held.id
                or conversation_id in self._cancel_requests
                or conversation_id in self._pause_requests
            ):
                return stored
            if live_holder(stored.pending) is None:
                return stored  # let go of, lapsed, or its process died: the drive claims it

    async def _retrying(
        self,
        conversation_id: str,
        call: Callable[P, Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``call()``, again after a pause while the store is locked or unreachable, a few
        times; then the store's error goes to the caller."""
        for attempt in range(_STORE_ATTEMPTS):
            try:
                return await call(*args, **kwargs)
            except (StoreLockedError, StoreUnavailableError) as error:
                if attempt == _STORE_ATTEMPTS - 1:
                    raise
                _log.warning(
                    "store_retry",
                    conversation_id=conversation_id,
                    attempt=attempt + 1,
                    error=type(error).__name__,
                )
                await asyncio.sleep(_STORE_BACKOFF * 2**attempt)
        raise AssertionError  # unreachable: the last attempt returns or raises

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
        self, conversation_id: str, event: Event, key: str | None = None
    ) -> tuple[StoredConversation, tuple[Effect, ...]]:
        """Commit a caller's event on the last known copy, or on a fresh load if it is stale.

        A message already stored under ``key`` is not stored again: the conversation is
        returned as it is, with no effects, and the drive goes on to its outcome."""
        stored = self._entry(conversation_id).stored
        if stored is None:
            stored = await self._load(conversation_id)
        if isinstance(event, UserMessage) and stored.state.phase.kind == "context_exhausted":
            # Refused before the core sees it: a read-only conversation's log stays as it
            # is. (Exhausted is absorbing, so even an old copy that says so is right.)
            raise ConversationExhaustedError(conversation_id, "its context window is exhausted.")
        try:
            return await self._commit_retrying(stored, event, key)
        except DuplicateMessageError:
            return await self._load(conversation_id), ()

    async def _commit_retrying(
        self, stored: StoredConversation, event: Event, key: str | None = None
    ) -> tuple[StoredConversation, tuple[Effect, ...]]:
        """Commit ``event`` on ``stored``; when another writer moved the conversation on since,
        on the conversation as it now is (a few times, then ``ConcurrentUpdateError``). A store
        that is locked or unreachable is retried too."""
        cid = stored.state.id
        for attempt in range(_CONFLICT_ATTEMPTS):
            try:
                return await self._retrying(cid, self._commit, stored, event, (), key)
            except ConcurrentUpdateError:
                if attempt == _CONFLICT_ATTEMPTS - 1:
                    raise
                stored = await self._retrying(cid, self._load, cid)
                if attempt:
                    await asyncio.sleep(random.uniform(0, _STORE_BACKOFF * attempt))  # noqa: S311
        raise AssertionError  # unreachable

    async def _commit(
        self,
        stored: StoredConversation,
        event: Event,
        completes: tuple[int, ...],
        key: str | None = None,
        *,
        fresh: bool = False,
    ) -> tuple[StoredConversation, tuple[Effect, ...]]:
        """Commit ``transition(stored.state, event)``; a refused message is not committed.

        A refusal (``RejectUserMessage``) is the caller's answer, not a step of the
        conversation: nothing is written, so nothing is left in the outbox for anyone to
        perform, and the version does not move under the turn that made the conversation busy
        (in this runtime or another one). Since no version check stands behind it, a refusal
        decided on a copy that may be stale (``fresh`` False) is decided again on the
        conversation as the store holds it now."""
        event = await self._performer.counted(stored, event)
        before = stored.state
        after, effects = transition(before, event)
        if _refused(effects):
            if not fresh:
                stored = await self._load(before.id)
                return await self._commit(stored, event, completes, key, fresh=True)
            _log.info(
                "message_refused",
                conversation_id=before.id,
                phase=before.phase.kind,
                cause=next(e.cause for e in effects if isinstance(e, RejectUserMessage)),
            )
            return stored, effects
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
            owner=self.claims.owner,
            lease_until=self.claims.lease_until(),
            idempotency_key=key,
            session=before.session,
        )
        committed = await self._feeds.committing(before.id, self.store.commit(commit))
        entry = self._entry(before.id)
        entry.stored = committed
        appended = [effect.message for effect in effects if isinstance(effect, AppendMessage)]
        view = entry.view
        if appended and view is not None and view.last_seq == committed.last_seq - len(appended):
            # Our messages landed right after what the view holds: fold them in without a read.
            # Otherwise someone else wrote too, and the next request reads the gap from the store.
            view.extend(view.last_seq + 1, appended)
        if self._bus.listening(before.id):
            reply = self._bus.committed(before, after, event, effects)
            if reply is not None:
                self._replies[before.id] = reply
        if _events.isEnabledFor(logging.INFO):
            self._log_transition(before, after, event, effects)
        return committed, effects

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

    async def _perform(
        self, stored: StoredConversation, pending: PendingEffect
    ) -> StoredConversation:
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
        self.claims.performing(cid, pending.id)
        try:
            outcome = await task
        except asyncio.CancelledError:
            self.claims.done(cid)
            # Only the user's cancel of a request becomes an event (committed at the top of the
            # drive loop, which clears the flag); a caller's timeout or a shutdown leaves the
            # effect pending in the outbox, let go, to be performed by the next drive here or
            # in any runtime sharing the store.
            if cid not in self._cancel_requests or not isinstance(effect, ANSWERED_BY_EVENTS):
                await self.claims.let_go(cid, (pending.id,))
                raise
            return stored
        except Exception as error:
            self.claims.done(cid)
            # An adapter or tool runner that raised instead of reporting (a bug, an unmapped
            # error): the effect stays pending, and is let go at once, so the next drive (here or
            # in another runtime) performs it instead of waiting for the lease to end.
            _log.error(
                "perform_raised",
                conversation_id=cid,
                effect_kind=effect.kind,
                error_type=type(error).__name__,
            )
            await self.claims.let_go(cid, (pending.id,))
            raise
        finally:
            self.claims.done(cid)
            self._inflight.pop(cid, None)
        try:
            return await self._settle(stored, pending, outcome)
        except (StoreLockedError, StoreUnavailableError) as error:
            # The store stayed down: let go of the work, so that the next drive (here or in
            # another process) asks again instead of waiting out the lease.
            await self.claims.let_go(cid, (pending.id,))
            self._entry(cid).stored = None
            msg = (
                f"the outcome of {effect.kind} could not be stored ({error}); it was let go, "
                "and the next message or recover() performs it again"
            )
            raise SegueError(msg) from error

    async def _settle(
        self, stored: StoredConversation, pending: PendingEffect, outcome: list[Event]
    ) -> StoredConversation:
        """Commit what performing ``pending`` gave (or only complete it). When another writer
        moved the conversation on meanwhile, the outcome is committed on the conversation as it
        now is, if ``pending`` is still pending there; if it is not (cancelled, or answered by
        a runtime that took it over), the outcome is stale and changes nothing."""
        cid = stored.state.id
        if not outcome:
            await self._retrying(cid, self.store.complete, cid, (pending.id,))
            # Completing changes nothing but the outbox (not even the version): no need to load.
            rest = tuple(p for p in stored.pending if p.id != pending.id)
            stored = dataclasses.replace(stored, pending=rest)
            self._entry(cid).stored = stored
            return stored
        for index, event in enumerate(outcome):
            done = (pending.id,) if index == len(outcome) - 1 else ()
            for _ in range(_CONFLICT_ATTEMPTS):
                try:
                    stored, _ = await self._retrying(cid, self._commit, stored, event, done)
                    break
                except ConcurrentUpdateError:
                    stored = await self._retrying(cid, self._load, cid)
                    if all(p.id != pending.id for p in stored.pending):
                        _log.info(
                            "stale_outcome", conversation_id=cid, effect_kind=pending.effect.kind
                        )
                        return stored
            else:
                msg = (
                    f"conversation {cid!r} kept changing under the outcome of {pending.effect.kind}"
                )
                raise ConcurrentUpdateError(msg)
        return stored
