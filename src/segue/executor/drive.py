"""The loop under ``Runtime``: commit an event, then perform the outbox until it is empty.

Theory of operation. A drive holds the conversation's lock (``locks``), commits ``transition(
state, event)`` (``commits``: the new state, the event, its messages and its pending effects, in
one transaction), then performs the outbox in order: each effect that yields an event is
completed by the commit of that event, so a crash at any point leaves either the effect pending
(it is performed again on start) or its outcome committed (it is not). The loop stops when the
outbox is empty: the conversation waits for input. Before each step it takes the cancel and
pause asked meanwhile (``signals``), so they land at once, not behind the lock.

Work another runtime holds under a live claim (``claims``) is never performed here: a drive that
needs its outcome waits for it, reading the store; work nobody holds any longer (its runtime died
or let go) is claimed and performed. What performing an effect means is ``perform``'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import secrets
from collections.abc import Callable

from segue.effects import ANSWERED_BY_EVENTS, Effect, RejectUserMessage
from segue.executor._log import get_logger
from segue.executor.bus import Committed, Sink, UpdateBus
from segue.executor.claims import Claims, live_holder
from segue.executor.commits import Commits, Effects, refused
from segue.executor.errors import SegueError, StoreLockedError, StoreUnavailableError
from segue.executor.locks import Locks
from segue.executor.overtaken import Overtaken
from segue.executor.perform import Performer
from segue.executor.requests import Requests
from segue.executor.signals import Signals
from segue.executor.store_port import PendingEffect, StoredConversation
from segue.executor.telemetry import Telemetry
from segue.statemachine import ConversationState, Event, PauseRequested, UserCancel, UserMessage

Listener = Callable[[str, Effect], None]
"""Called with a conversation id and each effect performed for it (UI hooks)."""
_log = get_logger("segue.runtime")
_POLL_FIRST, _POLL_MAX = 0.02, 0.5
_UNSAVED = 64
"""Outcomes kept for a store that could not take them (the oldest go first)."""
"""Pauses (seconds) between reads of the store while another runtime performs the work."""
_SETTLE, _SETTLE_LOOK = 0.5, 0.05
"""Seconds a drive whose work another runtime cancelled waits for that runtime's next commit
(a forced pause commits the pause right after the cancel), and between its reads meanwhile."""


def _busy_refusal(effects: Effects) -> bool:
    return any(isinstance(e, RejectUserMessage) and e.cause == "busy" for e in effects)


def _naming_holder(effects: Effects, head: PendingEffect) -> Effects:
    """The busy refusal, saying which runtime holds the work (so an operator can find it)."""
    if head.owner is None:
        return effects
    return tuple(
        RejectUserMessage(
            reason=f"{e.reason} (runtime {head.owner} is performing its {head.effect.kind})",
            cause=e.cause,
        )
        if isinstance(e, RejectUserMessage)
        else e
        for e in effects
    )


def _cancelled(task: asyncio.Task[object] | None) -> bool:
    """Whether ``task`` itself is being cancelled (a shutdown, a caller's timeout), as opposed to
    the work it awaited."""
    return task is not None and task.cancelling() > 0


class Driver:
    """Drives conversations: commits each event, then performs the outbox it leaves."""

    def __init__(
        self,
        *,
        telemetry: Telemetry,
        locks: Locks,
        signals: Signals,
        commits: Commits,
        claims: Claims,
        performer: Performer,
        requests: Requests,
        bus: UpdateBus,
        overtaken: Overtaken,
    ) -> None:
        self._telemetry = telemetry
        self._overtaken = overtaken
        self._locks = locks
        self._signals = signals
        self._commits = commits
        self._claims = claims
        self._performer = performer
        self._requests = requests
        self._bus = bus
        self._listeners: list[Listener] = []
        """Told of every effect as it is performed (``listen``)."""
        self._unsaved: dict[tuple[str, int], list[Event]] = {}
        """Outcomes performed here whose commit failed (a full disk, a store gone), by
        conversation and effect id: the next drive commits them rather than paying again."""
        self._key_prefix = f"auto:{secrets.token_hex(8)}"
        self._keys = itertools.count(1)
        """Idempotency keys of messages sent without one: unique to this runtime (a random
        prefix) and within it (a count), without a call to the system's random source each."""

    def listen(self, listener: Listener) -> None:
        """Call ``listener(conversation_id, effect)`` for every effect performed from now on
        (``Runtime.subscribe``: a UI's hooks), in the order they were added."""
        self._listeners.append(listener)

    async def streamed(
        self, sink: Sink, event: UserMessage, *, wait: bool = True, key: str | None = None
    ) -> None:
        """Drive ``event`` with ``sink`` as this task's sink; hand any failure to the consumer."""
        token = self._bus.use(sink)
        cid = sink.conversation_id
        try:
            await self.drive(cid, event, wait=wait, key=key)
        except asyncio.CancelledError:
            sink.put(SegueError("the turn was interrupted: the runtime is closing"))
            raise
        except Exception as error:  # noqa: BLE001  # the consumer raises it from stream()
            sink.put(error)
        finally:
            self._bus.reset(token)
            self._locks.unschedule(cid)

    async def drive(
        self,
        conversation_id: str,
        event: Event | None,
        *,
        wait: bool = True,
        key: str | None = None,
    ) -> tuple[ConversationState, Effects]:
        """Commit ``event`` (if any), then perform the outbox until it is empty.

        A drive whose event was taken while another runtime holds the conversation's work waits
        for that runtime's outcome, so its caller gets the turn's result; a message refused as
        busy because of it waits the same way and is then sent again (``wait=False``: the
        refusal is returned at once, naming who is busy); a drive without an event
        (``recover()``) leaves such work alone. ``key`` is the message's idempotency key: a
        message already stored under it is not stored again, the drive only waits for its turn.
        """
        async with self._locks.driving(conversation_id):
            telemetry = self._telemetry
            turn = telemetry.turn_begins(conversation_id, event)
            try:
                state, effects = await self._turn(conversation_id, event, wait=wait, key=key)
            except BaseException as error:
                self._bus.release(conversation_id)  # a step's done, held for the drive's end
                telemetry.turn_ends(turn, None, error)
                raise
            telemetry.turn_ends(turn, state, None)
            return state, effects

    async def _turn(
        self, conversation_id: str, event: Event | None, *, wait: bool, key: str | None
    ) -> tuple[ConversationState, Effects]:
        """``drive``'s work, under the conversation's lock."""
        bus = self._bus
        bus.turn_begins(conversation_id)
        sink = bus.sink_for(conversation_id)
        if key is None and isinstance(event, UserMessage):
            # Every message carries a key: a commit whose reply was lost (a dropped database
            # session) and is tried again cannot store the message twice.
            key = f"{self._key_prefix}:{next(self._keys)}"
        first: Effects = ()
        if event is None:
            stored = await self._commits.load(conversation_id)
            follow = False
        else:
            stored, first = await self._counted_commit(conversation_id, event, key)
            follow = not refused(first) or wait
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
            stored, first = await self._counted_commit(conversation_id, event, key)
            follow = not refused(first) or wait
        if _busy_refusal(first) and stored.pending:
            first = _naming_holder(first, stored.pending[0])
        if sink is not None and not sink.started:
            sink.started = True
            sink.put(Committed(stored.state, first))
        if settled:
            # Nothing is pending: a cancel that arrived during the last step has nothing
            # left to stop (a pause was taken above). It may not outlive this turn.
            self._signals.cancel_taken(conversation_id)
        bus.turn_ends(conversation_id, stored.state)
        return stored.state, first

    async def _counted_commit(
        self, conversation_id: str, event: Event, key: str | None
    ) -> tuple[StoredConversation, Effects]:
        """Commit a caller's event counted once, on the copy it is first decided on: a commit
        decided again (a conflict, a locked store, a refusal checked on the store's copy) asks
        the model nothing more."""
        commits = self._commits
        counted = await self._requests.counted(await commits.copy(conversation_id), event)
        return await commits.commit(conversation_id, counted, key)

    async def _run_outbox(
        self, stored: StoredConversation, *, follow: bool
    ) -> tuple[StoredConversation, bool]:
        """Perform the outbox in order until it is empty (settled: True), or until its head is
        another runtime's live work and ``follow`` is False (settled: False)."""
        cid = stored.state.id
        signals = self._signals
        commits = self._commits
        while True:
            if signals.cancel_asked(cid):
                stored, _ = await commits.commit(cid, UserCancel())
                signals.cancel_taken(cid)
            reason = signals.pause_asked(cid)
            if reason is not None:
                stored, _ = await commits.commit(cid, PauseRequested(reason=reason))
                signals.pause_taken(cid)
            if not stored.pending:
                return stored, True
            head = stored.pending[0]
            if not self._claims.holds(head):
                claimed = await commits.claim(cid, head)
                if claimed is None:  # performed meanwhile by its owner
                    stored = await commits.load(cid)
                    continue
                stored = dataclasses.replace(stored, pending=(claimed, *stored.pending[1:]))
                if claimed.owner != self._claims.owner:
                    if not follow:
                        return stored, False
                    stored = await self._await_owner(cid, claimed)
                    continue
                head = claimed
            stored = await self._perform(stored, head)

    async def _pause_first(self, stored: StoredConversation) -> StoredConversation:
        """A pause asked while an effect was performed, committed before its outcome: the turn
        boundary the outcome reaches takes it, so the turn ends paused with one ``done``
        (committed after, it would end the turn, and the pause would be a turn of its own)."""
        cid = stored.state.id
        reason = self._signals.pause_asked(cid)
        if reason is None:
            return stored
        stored, _ = await self._commits.commit(cid, PauseRequested(reason=reason))
        self._signals.pause_taken(cid)
        return stored

    async def _await_owner(self, conversation_id: str, held: PendingEffect) -> StoredConversation:
        """Wait while another runtime performs ``held``: until it is done (or its claim lapses),
        reading the store with a growing pause; a cancel or pause asked of this runtime ends
        the wait (the drive commits it, which makes the other's answer stale)."""
        delay = _POLL_FIRST
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)
            stored = await self._commits.load(conversation_id)
            if (
                not stored.pending
                or stored.pending[0].id != held.id
                or self._signals.interrupted(conversation_id)
                or live_holder(stored.pending) is None  # let go of, lapsed, or its process died
            ):
                return stored

    async def _after_ended_elsewhere(self, conversation_id: str) -> StoredConversation:
        """The conversation once another runtime ended the work performed here (``overtaken``):
        as the store has it, the drive carrying on from there (following that runtime's work,
        if any). A forced pause commits the cancel, then the pause: a conversation left idle
        with nothing pending is read again until it moves or ``_SETTLE`` seconds pass, so the
        caller gets the paused state rather than the moment between."""
        stored = await self._commits.load(conversation_id)
        deadline = asyncio.get_running_loop().time() + _SETTLE
        while (
            not stored.pending
            and stored.state.phase.kind == "idle"
            and asyncio.get_running_loop().time() < deadline
        ):
            await asyncio.sleep(_SETTLE_LOOK)  # a short bounded wait for the other's commit
            again = await self._commits.load(conversation_id)
            if again.version != stored.version:
                return again
        return stored

    async def _outcome(self, stored: StoredConversation, pending: PendingEffect) -> list[Event]:
        """What performing ``pending`` gives: an outcome this runtime was paid for and could
        not store is committed again, not asked for again (the effect is still the one pending
        under its id)."""
        unsaved = self._unsaved.pop((stored.state.id, pending.id), None)
        if unsaved is not None:
            return unsaved  # counted when it was performed
        outcome = await self._performer.outcome(stored, pending.effect)
        # Counted once, here: committing it (again after a conflict) asks the model nothing.
        return [await self._requests.counted(stored, event) for event in outcome]

    async def _perform(
        self, stored: StoredConversation, pending: PendingEffect
    ) -> StoredConversation:
        """Perform ``pending`` (claimed by this runtime) and commit its outcome.

        Work that does not finish is let go at once, so that the next drive (here or in another
        runtime) performs it instead of waiting for the lease to end: an adapter or tool runner
        that raised instead of reporting, a caller's timeout, a shutdown. Only the user's cancel
        of a request becomes an event (committed at the top of the loop)."""
        effect = pending.effect
        cid = stored.state.id
        for listener in self._listeners:
            listener(cid, effect)
        claims = self._claims
        overtaken = self._overtaken
        task = asyncio.ensure_future(self._outcome(stored, pending))
        claims.performing(cid, pending.id)
        if isinstance(effect, ANSWERED_BY_EVENTS):
            overtaken.watch(cid, pending.id, task)
        try:
            with self._signals.performing(cid, task, effect):
                outcome = await task
        except asyncio.CancelledError:
            claims.done(cid)
            ended_elsewhere = overtaken.done(cid)
            if self._signals.stops(cid, effect):
                return stored
            if ended_elsewhere and not _cancelled(asyncio.current_task()):
                return await self._after_ended_elsewhere(cid)
            await claims.let_go(cid, (pending.id,))
            raise
        except Exception as error:
            claims.done(cid)
            overtaken.done(cid)
            _log.error(
                "perform_raised",
                conversation_id=cid,
                effect_kind=effect.kind,
                error_type=type(error).__name__,
            )
            await claims.let_go(cid, (pending.id,))
            raise
        claims.done(cid)
        overtaken.done(cid)
        try:
            if outcome:
                stored = await self._pause_first(stored)
            return await self._commits.settle(stored, pending, outcome)
        except (StoreLockedError, StoreUnavailableError) as error:
            # The store stayed down: let go of the work, so that the next drive (here or in
            # another process) asks again instead of waiting out the lease; this runtime keeps
            # the outcome for its next try.
            if outcome:
                self._unsaved[(cid, pending.id)] = outcome
                while len(self._unsaved) > _UNSAVED:
                    self._unsaved.pop(next(iter(self._unsaved)))
            await claims.let_go(cid, (pending.id,))
            self._commits.forget(cid)
            msg = (
                f"the outcome of {effect.kind} could not be stored ({error}); it was let go, "
                "and the next message or recover() performs it again"
            )
            raise type(error)(msg) from error  # the same kind: a full disk says so
