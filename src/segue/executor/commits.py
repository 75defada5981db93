"""Every call the runtime makes to its store, under one policy for a store that is locked,
unreachable, or moved on by another writer.

A commit is one step of a conversation: ``transition(state, event)`` decided on the copy last
seen, and the new state, the event, its messages and its pending effects written in one
transaction (the store's version check refuses it if another writer moved the conversation on).
What can go wrong is answered here, in one loop:

- a store that is locked or unreachable is tried again after a growing pause, a few times, and
  then its error goes to the caller (nothing half-written was kept);
- a commit refused because another writer moved the conversation on is decided again on the
  conversation as it now is (a few times, with a little jitter: writers that keep colliding
  spread out); the outcome of an effect that is no longer pending there (cancelled, or answered
  by a runtime that took it over) is stale and changes nothing;
- a refusal of a message (``RejectUserMessage``) is the caller's answer, not a step: nothing is
  written, so the version does not move under the turn that made the conversation busy. Since
  no version check stands behind it, a refusal decided on a copy that may be stale is decided
  again on the conversation as the store holds it now.

The event comes counted (``Requests.counted``, the driver's, once, before it commits): what is
decided again here after a conflict or a refusal costs no model call. After a commit the view
cache keeps it, and the observers it was given (the watchers' feeds, the updates of the turn)
hear of it (``steps``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, ParamSpec, TypeVar

from segue.effects import (
    ANSWERED_BY_EVENTS,
    AppendMessage,
    CancelRequest,
    Effect,
    RejectUserMessage,
)
from segue.executor._log import get_logger
from segue.executor.cache import ViewCache
from segue.executor.claims import Claims
from segue.executor.errors import (
    ConcurrentUpdateError,
    DuplicateMessageError,
    StoreLockedError,
    StoreUnavailableError,
)
from segue.executor.setup import Setup
from segue.executor.steps import CommitObserver, Step
from segue.executor.store_port import Commit, PendingEffect, StoredConversation
from segue.statemachine import (
    AwaitingCheckpoint,
    AwaitingContinuation,
    Compacting,
    ConversationState,
    Event,
    Failed,
    Phase,
    transition,
)

T = TypeVar("T")
P = ParamSpec("P")
Effects = tuple[Effect, ...]
_log = get_logger("segue.runtime")
_events = logging.getLogger("segue.runtime")
"""The same logger in stdlib form: checked before building a per-transition event."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How hard the runtime tries a store call before the store's error goes to the caller."""

    attempts: int = 6
    """Tries of a call that failed as locked or unreachable."""
    backoff: float = 0.1
    """Seconds before the second try, doubled for each one after it."""
    conflicts: int = 20
    """Commits of one event on a conversation other writers keep moving on."""

    async def run(
        self,
        conversation_id: str,
        call: Callable[P, Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``call()``, tried again after a pause while the store is locked or unreachable."""
        attempt = 0
        while True:
            try:
                return await call(*args, **kwargs)
            except (StoreLockedError, StoreUnavailableError) as error:
                attempt += 1
                await self.pause(conversation_id, attempt, error)

    async def pause(self, conversation_id: str, attempt: int, error: Exception) -> None:
        """Wait before try ``attempt + 1`` after ``error``; raise it if that was the last."""
        if attempt >= self.attempts:
            raise error
        _log.warning(
            "store_retry",
            conversation_id=conversation_id,
            attempt=attempt,
            error=type(error).__name__,
        )
        await asyncio.sleep(self.backoff * 2 ** (attempt - 1))


DEFAULT_POLICY: Final = RetryPolicy()


def refused(effects: Effects) -> bool:
    """Whether the core refused the message these effects answer."""
    return any(isinstance(effect, RejectUserMessage) for effect in effects)


class Commits:
    """The runtime's store calls: loads, claims, completions and commits, each under the one
    ``RetryPolicy``, each keeping the view cache up to date; each commit told to ``observers``
    in order."""

    __slots__ = ("_cache", "_claims", "_observers", "_policy", "_setup")

    def __init__(
        self,
        *,
        setup: Setup,
        cache: ViewCache,
        claims: Claims,
        observers: Sequence[CommitObserver] = (),
        policy: RetryPolicy = DEFAULT_POLICY,
    ) -> None:
        self._setup = setup
        self._cache = cache
        self._claims = claims
        self._observers = tuple(observers)
        self._policy = policy

    async def copy(self, conversation_id: str) -> StoredConversation:
        """The copy the next commit of the conversation is decided on (loaded if none)."""
        return self._cache.stored(conversation_id) or await self.load(conversation_id)

    async def load(self, conversation_id: str) -> StoredConversation:
        """The conversation as the store holds it now (kept as the copy to commit on)."""
        stored = await self._policy.run(conversation_id, self._setup.store.load, conversation_id)
        self._cache.keep(stored)
        return stored

    def forget(self, conversation_id: str) -> None:
        """What this runtime last saw of the conversation may be wrong (a commit's reply was
        lost): the next drive loads it."""
        self._cache.forget(conversation_id)

    async def claim(self, conversation_id: str, head: PendingEffect) -> PendingEffect | None:
        """Claim ``head`` for this runtime unless another live one holds it (``Claims.take``)."""
        return await self._policy.run(conversation_id, self._claims.take, conversation_id, head)

    async def commit(
        self, conversation_id: str, event: Event, key: str | None = None
    ) -> tuple[StoredConversation, Effects]:
        """Commit a caller's event (a message, a cancel, a pause...) on the last known copy.

        A message already stored under ``key`` is not stored again: the conversation is
        returned as it is, with no effects, and the caller goes on to that message's outcome."""
        stored = await self.copy(conversation_id)
        try:
            committed, effects = await self._commit(stored, event, key=key)
        except DuplicateMessageError:
            return await self.load(conversation_id), ()
        assert effects is not None  # only an outcome can be stale  # noqa: S101
        return committed, effects

    async def settle(
        self, stored: StoredConversation, pending: PendingEffect, outcome: list[Event]
    ) -> StoredConversation:
        """Commit what performing ``pending`` gave, completing it with the last event (or only
        complete it, when it gave nothing). Stale, it changes nothing."""
        cid = stored.state.id
        if not outcome:
            await self._policy.run(cid, self._setup.store.complete, cid, (pending.id,))
            # Completing changes nothing but the outbox (not even the version): no need to load.
            rest = tuple(p for p in stored.pending if p.id != pending.id)
            stored = dataclasses.replace(stored, pending=rest)
            self._cache.keep(stored)
            return stored
        last = len(outcome) - 1
        for index, event in enumerate(outcome):
            completes = (pending.id,) if index == last else ()
            stored, effects = await self._commit(stored, event, completes=completes, of=pending)
            if effects is None:
                break
        return stored

    async def _commit(
        self,
        stored: StoredConversation,
        event: Event,
        *,
        completes: tuple[int, ...] = (),
        key: str | None = None,
        of: PendingEffect | None = None,
    ) -> tuple[StoredConversation, Effects | None]:
        """Commit ``event`` under the policy (see the module's docstring). ``of``: the pending
        effect whose outcome it is; effects None: it is no longer pending, the outcome stale."""
        cid = stored.state.id
        policy = self._policy
        failures = conflicts = 0
        while True:
            try:
                return await self._write(stored, event, completes, key)
            except (StoreLockedError, StoreUnavailableError) as error:
                failures += 1
                await policy.pause(cid, failures, error)
            except ConcurrentUpdateError:
                conflicts += 1
                if conflicts >= policy.conflicts:
                    if of is None:
                        raise
                    msg = (
                        f"conversation {cid!r} kept changing under the outcome of {of.effect.kind}"
                    )
                    raise ConcurrentUpdateError(msg) from None
                stored = await self.load(cid)
                if of is not None and all(p.id != of.id for p in stored.pending):
                    _log.info("stale_outcome", conversation_id=cid, effect_kind=of.effect.kind)
                    return stored, None
                if conflicts > 1:
                    await asyncio.sleep(random.uniform(0, policy.backoff * conflicts))  # noqa: S311

    async def _decide(
        self, stored: StoredConversation, event: Event
    ) -> tuple[StoredConversation, ConversationState, Effects]:
        """``transition()`` on ``stored``: the copy decided on, the state after it and its
        effects. A refusal is decided again on the store's own copy (no version check stands
        behind a refusal, and the copy may be stale)."""
        after, effects = transition(stored.state, event)
        if not refused(effects):
            return stored, after, effects
        stored = await self._setup.store.load(stored.state.id)
        self._cache.keep(stored)
        after, effects = transition(stored.state, event)
        if refused(effects):
            cause = next(e.cause for e in effects if isinstance(e, RejectUserMessage))
            self._setup.telemetry.refused(stored.state.id, cause)
            _log.info(
                "message_refused",
                conversation_id=stored.state.id,
                phase=stored.state.phase.kind,
                cause=cause,
            )
        return stored, after, effects

    async def _write(
        self,
        stored: StoredConversation,
        event: Event,
        completes: tuple[int, ...],
        key: str | None,
    ) -> tuple[StoredConversation, Effects]:
        """One try: decide the step and write it (a refusal is written nowhere)."""
        stored, after, effects = await self._decide(stored, event)
        if refused(effects):
            return stored, effects
        before = stored.state
        if any(isinstance(effect, CancelRequest) for effect in effects):
            # The core cancelled the pending request: its answer would be stale, so the request
            # leaves the outbox with this commit instead of being performed after it.
            stale = (p.id for p in stored.pending if isinstance(p.effect, ANSWERED_BY_EVENTS))
            completes = tuple(dict.fromkeys((*completes, *stale)))
        claims = self._claims
        commit = Commit(
            conversation_id=before.id,
            expected_version=stored.version,
            state=after,
            event_kind=event.kind,
            event_json=event.model_dump_json(),
            from_phase=before.phase.kind,
            reason=_reason(after.phase),
            effects=effects,
            completes=completes,
            at=self._setup.clock(),
            owner=claims.owner,
            lease_until=claims.lease_until(),
            idempotency_key=key,
            session=before.session,
        )
        setup = self._setup
        store = setup.store
        started = time.perf_counter()
        committed = await self._written(commit)
        telemetry = setup.telemetry
        if telemetry.enabled:
            seconds = time.perf_counter() - started
            telemetry.committed(
                before, after, event, effects, seconds=seconds, store=type(store).__name__
            )
        appended = tuple(e.message for e in effects if isinstance(e, AppendMessage))
        self._cache.committed(committed, appended)
        step = Step(before, after, event, effects, appended, committed)
        for observer in self._observers:
            observer.committed(before.id, step)
        if _events.isEnabledFor(logging.INFO):
            _log_transition(before, after, event, effects)
        return committed, effects

    async def _written(self, commit: Commit) -> StoredConversation:
        """``commit`` written to the store, the observers told it is in flight (and told it
        was not written when the store refuses it or fails)."""
        cid = commit.conversation_id
        observers = self._observers
        for observer in observers:
            observer.writing(cid)
        try:
            return await self._setup.store.commit(commit)
        except BaseException:
            for observer in observers:
                observer.committed(cid, None)
            raise


def _reason(phase: Phase) -> str:
    """What the event log says of the phase a step ended in: why it failed, or what started
    the path at the limit."""
    if isinstance(phase, Failed):
        return phase.message
    if isinstance(phase, AwaitingContinuation | AwaitingCheckpoint | Compacting):
        return phase.trigger
    return ""


def _log_transition(
    before: ConversationState, after: ConversationState, event: Event, effects: Effects
) -> None:
    window = after.context_window
    _log.info(
        "transition",
        conversation_id=before.id,
        event_kind=event.kind,
        from_phase=before.phase.kind,
        to_phase=after.phase.kind,
        context_tokens=after.context_tokens,
        ratio=None if after.context_tokens is None else after.context_tokens / window,
        effects=[effect.kind for effect in effects],
    )
