"""Updates read back from the store: what other runtimes did to a watched conversation.

``Runtime.watch`` hears every turn this runtime drives as it happens (the bus). A turn driven by
another process sharing the store (a second ``segue serve`` worker behind the same address) is
heard here instead: while someone watches a conversation that this runtime is not driving, a
``Feed`` reads the store (the conversation's state and the transcript after the last message it
saw, two cheap reads with nothing new) and turns what changed into the same updates a local
drive emits: the user's message, the reply (whole: deltas never reach the store), tools started
and finished, the meter, the warning, a new session or generation, the end of the conversation
(exhausted, failed, paused), and ``done`` when it waits for input again.

It reads often while the conversation is busy and backs off while it is idle; a store that can
say when a conversation changed (``wait_for_change``, PostgreSQL's LISTEN/NOTIFY) wakes it at
once instead. What this runtime commits itself is never read back (its updates went out live):
the drive hands each of its commits to the feed (``observe``), which takes it as its starting
point, so only what came after from elsewhere is emitted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

from segue.executor._log import get_logger
from segue.executor.bus import UpdateBus
from segue.executor.errors import ConversationNotFoundError, SegueError
from segue.executor.store_port import LogReader, StoredConversation, StoredMessage, notifies_changes
from segue.executor.updates import (
    CompactedUpdate,
    DoneUpdate,
    ExhaustedUpdate,
    FailedUpdate,
    FallbackUpdate,
    PausedUpdate,
    SessionUpdate,
    TextUpdate,
    ToolFinishedUpdate,
    ToolStartedUpdate,
    Update,
    UserMessageUpdate,
    WarningUpdate,
    occupancy_update,
)
from segue.statemachine import WAITING_PHASES, ConversationState

BUSY_POLL: Final = 0.05
"""Seconds between reads while the conversation is in a turn (replies land within a tick)."""
IDLE_POLL: Final = 1.0
"""The longest pause between reads of a conversation nobody is talking to."""
_log = get_logger("segue.runtime")
FALLBACK_READ_BACK: Final = "the provider could not compact this conversation"
"""A fallback's reason as a watcher in another process hears it: the state records that the
conversation fell back, not the provider's words (the event log has them)."""


def updates_between(
    before: ConversationState,
    after: ConversationState,
    messages: Sequence[StoredMessage],
    *,
    tool_names: dict[str, str],
    next_response: Callable[[], int],
) -> list[Update]:
    """What a watcher of a conversation that went from ``before`` to ``after`` (appending
    ``messages``) would have heard from the runtime that drove it, in order."""
    updates: list[Update] = []
    reply: str | None = None
    took_message = False
    for stored in messages:
        message = stored.message
        if message.kind == "user":
            took_message = True
            updates.append(UserMessageUpdate(text=message.text, pinned=message.pinned))
        elif message.kind == "assistant":
            reply = message.text
            if message.text:
                updates.append(TextUpdate(text=message.text, response=next_response()))
            for call in message.tool_calls:
                tool_names[call.id] = call.name
                updates.append(ToolStartedUpdate(id=call.id, name=call.name, input=call.input))
        elif message.kind == "tool_result" and message.tool_call_id is not None:
            name = tool_names.pop(message.tool_call_id, "tool")
            updates.append(
                ToolFinishedUpdate(
                    id=message.tool_call_id,
                    name=name,
                    is_error=message.is_error,
                    output=message.text,
                )
            )
        elif message.kind == "summary" and message.generation > before.generation:
            updates.append(CompactedUpdate(generation=message.generation, summary=message.text))
    if after.compaction_fallback and not before.compaction_fallback:
        updates.append(FallbackUpdate(reason=FALLBACK_READ_BACK))
    if after.session > before.session:
        reason = "resume" if after.resume_context is not None else "checkpoint_restart"
        updates.append(SessionUpdate(session=after.session, reason=reason))
    meter = occupancy_update(before, after)
    if meter is not None:
        updates.append(meter)
    if after.warned and (not before.warned or after.session != before.session):
        tokens = after.context_tokens or after.projected_tokens
        updates.append(WarningUpdate(tokens=tokens, window=after.context_window))
    updates += _ending(before, after)
    phase = after.phase.kind
    if phase in WAITING_PHASES and (
        before.phase.kind not in WAITING_PHASES or took_message or reply
    ):
        updates.append(DoneUpdate(state=after, reply=reply))
    return updates


def _ending(before: ConversationState, after: ConversationState) -> list[Update]:
    """What the conversation's new phase tells a watcher, when it is an end or a pause."""
    phase: Any = after.phase
    kind = phase.kind
    if kind == before.phase.kind and after.snapshots == before.snapshots:
        return []
    if kind == "context_exhausted":
        return [ExhaustedUpdate(summary=phase.summary)]
    if kind == "failed":
        return [FailedUpdate(error_kind=phase.error_kind, message=phase.message)]
    if kind == "paused":
        return [PausedUpdate(version=phase.snapshot.version, reason=phase.snapshot.reason)]
    return []


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
        self._seq = stored.last_seq
        self._tool_names: dict[str, str] = {}

    def observe(self, stored: StoredConversation) -> None:
        """This runtime committed ``stored``: its updates went out live; start from it."""
        if stored.version > self._version:
            self._state, self._version, self._seq = stored.state, stored.version, stored.last_seq

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
        seq = self._seq  # as observed now: this runtime's own commits are not read back
        messages = await store.messages(cid, after_seq=seq) if stored.last_seq > seq else []
        if stored.version <= self._version or self._committing():
            return True  # a commit of this runtime, observed meanwhile or on its way: told live
        messages = [m for m in messages if m.seq <= stored.last_seq]
        updates = updates_between(
            self._state,
            stored.state,
            messages,
            tool_names=self._tool_names,
            next_response=self._next_response,
        )
        self._state, self._version, self._seq = stored.state, stored.version, stored.last_seq
        for update in updates:
            self._emit(update)
        return True


class Feeds:
    """A runtime's feeds: one per conversation watched here, started when the first watcher
    comes, stopped when the last one leaves; and the commits this runtime has in flight, which
    every feed of the conversation sets aside (it hears of them through ``committed``)."""

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

    async def committing(
        self, conversation_id: str, commit: Coroutine[Any, Any, StoredConversation]
    ) -> StoredConversation:
        """Await ``commit`` of the conversation, set aside by its feed meanwhile; the feed
        starts from what it committed."""
        committing = self._committing
        committing[conversation_id] = committing.get(conversation_id, 0) + 1
        try:
            committed = await commit
            running = self._feeds.get(conversation_id)
            if running is not None:
                running[0].observe(committed)
            return committed
        finally:
            left = committing[conversation_id] - 1
            if left:
                committing[conversation_id] = left
            else:
                del committing[conversation_id]
