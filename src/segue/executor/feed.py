"""Updates read back from the store: what other runtimes did to a watched conversation.

``Runtime.watch`` hears every turn this runtime drives as it happens (the bus). A turn driven by
another process sharing the store (a second ``segue serve`` worker behind the same address) is
heard here instead: while someone watches a conversation that this runtime is not driving, a
``Feed`` reads the store (the conversation's row, and its event log once the version moved) and
decides each new step again from its logged event (``transition`` is pure: the same state and
event give the step the writer committed), then folds it with ``updates_of``, the fold the
driving runtime uses: the same updates, in the same order, with the same reasons. Only what
never reaches the store is missing: the reply comes whole (its deltas are live only), and a
provider's own tools and context edits are not heard.

It reads often while the conversation is busy and backs off while it is idle; a store that can
say when a conversation changed (``wait_for_change``, PostgreSQL's LISTEN/NOTIFY) wakes it at
once instead. What this runtime commits itself is never read back (its updates went out live):
the drive hands each of its commits to the feed (``observe``), which takes it as its starting
point, so only what came after from elsewhere is emitted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from segue.effects import AppendMessage
from segue.executor._log import get_logger
from segue.executor.bus import UpdateBus
from segue.executor.errors import ConversationNotFoundError, SegueError
from segue.executor.steps import Step
from segue.executor.store_port import (
    LogReader,
    StoredConversation,
    TransitionRecord,
    notifies_changes,
)
from segue.executor.stores.codec import load_event
from segue.executor.updates import TextUpdate, Turn, Update
from segue.statemachine import WAITING_PHASES, transition

BUSY_POLL: Final = 0.05
"""Seconds between reads while the conversation is in a turn (replies land within a tick)."""
IDLE_POLL: Final = 1.0
"""The longest pause between reads of a conversation nobody is talking to."""
_log = get_logger("segue.runtime")


class Feed:
    """Reads one watched conversation back from the store and emits what others changed."""

    def __init__(
        self,
        store: LogReader,
        stored: StoredConversation,
        *,
        emit: Callable[[Update], None],
        next_response: Callable[[], int],
        committing: Callable[[], bool],
        gone: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._gone = gone
        self._emit = emit
        self._next_response = next_response
        self._committing = committing
        """Whether this runtime has a commit of the conversation in flight: what the store
        holds may then be a commit this runtime has not observed yet, so a read is set aside."""
        self._state = stored.state
        self._version = stored.version
        self._turn = Turn()

    def observe(self, stored: StoredConversation) -> None:
        """This runtime committed ``stored``: its updates went out live; start from it."""
        if stored.version > self._version:
            self._state, self._version = stored.state, stored.version

    async def run(self) -> None:
        """Read and emit until cancelled; a store that fails is read again later."""
        cid = self._state.id
        pause = BUSY_POLL
        while True:
            await self._wait(pause)
            try:
                changed = await self._read()
            except ConversationNotFoundError:
                self._gone()  # deleted, by another process: its watches end, saying so
                return
            except SegueError as error:
                _log.warning("feed_read_failed", conversation_id=cid, error=type(error).__name__)
                pause = IDLE_POLL
                continue
            busy = self._state.phase.kind not in WAITING_PHASES
            pause = BUSY_POLL if changed or busy else min(pause * 2, IDLE_POLL)

    async def _wait(self, pause: float) -> None:
        store = self._store
        if notifies_changes(store):
            await store.wait_for_change(self._state.id, timeout=pause)
        else:
            await asyncio.sleep(pause)

    async def _read(self) -> bool:
        """One read; whether the conversation changed."""
        store = self._store
        cid = self._state.id
        stored = await store.load(cid)
        if stored.version <= self._version or self._committing():
            return False
        seen = self._version  # as observed now: this runtime's own commits are not read back
        log = await store.transitions(cid, after_seq=seen - 1)  # the new lines alone
        if stored.version <= self._version or self._committing():
            return True  # a commit of this runtime, observed meanwhile or on its way: told live
        steps = [record for record in log if seen <= record.seq < stored.version]
        updates = self._replayed(steps, stored)
        self._state, self._version = stored.state, stored.version
        for update in updates:
            if isinstance(update, TextUpdate):  # numbered here, as a live reply is
                self._emit(TextUpdate(text=update.text, response=self._next_response()))
            else:
                self._emit(update)
        return True

    def _replayed(self, steps: list[TransitionRecord], stored: StoredConversation) -> list[Update]:
        """The updates of the steps from the state last seen to ``stored``: each step's event
        from the log decided again (the core is pure: the same state and event give the same
        step the writer committed) and folded as the writer folded it. Should the steps not
        lead to the stored state (a log that misses a step), only the difference is told:
        the meter, and ``done`` if the conversation now waits."""
        state = self._state
        turn = Turn(self._turn.reply)
        updates: list[Update] = []
        for record in sorted(steps, key=lambda record: record.seq):
            event = load_event(record.event_json)
            after, effects = transition(state, event)
            appended = [effect.message for effect in effects if isinstance(effect, AppendMessage)]
            updates += turn.step(state, after, event, effects, appended)
            state = after
        if len(steps) != stored.version - self._version or state != stored.state:
            _log.warning(
                "feed_replay_diverged",
                conversation_id=stored.state.id,
                steps=len(steps),
                versions=stored.version - self._version,
            )
            turn = Turn(self._turn.reply)
            updates = turn.step(self._state, stored.state, None, (), ())
        self._turn = turn
        return updates


class Feeds:
    """A runtime's feeds: one per conversation watched here, started when the first watcher
    comes, stopped when the last one leaves; and the commits this runtime has in flight, which
    every feed of the conversation sets aside (it hears of them through ``committed``). An
    observer of the runtime's ``Commits``."""

    __slots__ = ("_bus", "_committing", "_feeds", "_store")

    def __init__(self, *, store: LogReader, bus: UpdateBus) -> None:
        self._store = store
        self._bus = bus
        self._feeds: dict[str, tuple[Feed, asyncio.Task[None]]] = {}
        self._committing: dict[str, int] = {}
        """Commits in flight per conversation."""

    def __bool__(self) -> bool:
        return bool(self._feeds)

    async def start(self, conversation_id: str) -> None:
        """Read a watched conversation back from the store while it is watched (the first
        read raises ``ConversationNotFoundError`` for an unknown id)."""
        store = self._store
        stored = await store.load(conversation_id)
        bus = self._bus
        if conversation_id in self._feeds or not bus.watched(conversation_id):
            return
        feed = Feed(
            store,
            stored,
            emit=lambda update: bus.emit(conversation_id, update),
            next_response=bus.next_response,
            committing=lambda: conversation_id in self._committing,
            gone=lambda: bus.gone(conversation_id),
        )
        self._feeds[conversation_id] = (feed, asyncio.ensure_future(feed.run()))

    def stop(self, conversation_id: str) -> None:
        running = self._feeds.pop(conversation_id, None)
        if running is not None:
            running[1].cancel()

    def stop_all(self) -> None:
        for conversation_id in list(self._feeds):
            self.stop(conversation_id)

    def writing(self, conversation_id: str) -> None:
        """A commit of the conversation is in flight: its feed sets aside what it reads until
        ``committed`` (the store may hold the commit before this runtime hears of it)."""
        committing = self._committing
        committing[conversation_id] = committing.get(conversation_id, 0) + 1

    def committed(self, conversation_id: str, step: Step | None) -> None:
        """The commit ended: the feed starts from what it wrote (its updates went out live)."""
        committing = self._committing
        left = committing[conversation_id] - 1
        if left:
            committing[conversation_id] = left
        else:
            del committing[conversation_id]
        running = self._feeds.get(conversation_id)
        if step is not None and running is not None:
            running[0].observe(step.stored)
