"""Where updates go: the turn being streamed, and whoever watches the conversation.

A turn streamed by ``Runtime.stream`` runs in its own task, which carries the stream's ``Sink``
in a context variable: whatever that task does (commits, requests, tools) emits into it, and a
sub-agent's turn run by one of its tools does not (a sink takes only its own conversation's
updates). Watchers (``Runtime.watch``) get every update of a conversation, whichever drive
produced it. Nobody listening is the common case, and costs a context-variable read and a dict
lookup: callers ask ``listening()`` before they build an update.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from segue.executor.errors import ConversationNotFoundError, UpdatesLostError
from segue.executor.steps import Step
from segue.executor.updates import DoneUpdate, TextUpdate, Turn, Update
from segue.statemachine import ConversationState, LlmError, LlmResponse

WATCH_BUFFER: Final = 10_000
"""Updates a watcher may fall behind by before it is dropped (it reads the store to catch up)."""


@dataclass(frozen=True, slots=True)
class Committed:
    """Internal marker: the streamed turn's own event is committed: the state it left and the
    effects it returned (a rejection among them ends the stream with the caller's error)."""

    state: Any
    effects: tuple[Any, ...]


class Sink:
    """The updates of one streamed turn, in order, for its one consumer.

    A deque and at most one waiting future, rather than an ``asyncio.Queue``: one producer and
    one consumer need none of a queue's bounds or locks, and a turn's updates are many."""

    __slots__ = ("_items", "_waiter", "closed", "conversation_id", "started")

    def __init__(self, conversation_id: str) -> None:
        self.conversation_id = conversation_id
        self.started = False
        """Whether the turn's own event was committed (``Committed`` was put first)."""
        self.closed = False
        """The consumer stopped reading: the turn goes on, nothing more is kept for it."""
        self._items: deque[Update | Committed | BaseException] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: Update | Committed | BaseException) -> None:
        if self.closed:
            return
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> Update | Committed | BaseException:
        """The next item, waiting for it if there is none yet."""
        items = self._items
        while not items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter
        return items.popleft()


_SINK: contextvars.ContextVar[Sink | None] = contextvars.ContextVar("segue_sink", default=None)


@dataclass(slots=True, eq=False)
class _Watcher:
    queue: asyncio.Queue[Update | None] = field(default_factory=lambda: asyncio.Queue(WATCH_BUFFER))
    lost: bool = False
    ended: bool = False
    deleted: bool = False
    """The conversation was found deleted (by another process): the watch ends saying so."""

    def close_with_marker(self) -> None:
        """Queue the marker (None) that ends the watch, making room for it if need be."""
        try:
            self.queue.put_nowait(None)
        except asyncio.QueueFull:
            self.queue.get_nowait()
            self.queue.put_nowait(None)


@dataclass(slots=True)
class _Streamed:
    """Text streamed so far for one response, to check against what gets stored."""

    response: int
    parts: list[str] = field(default_factory=list)


class UpdateBus:
    """Fans updates out to the current turn's sink and to the conversation's watchers."""

    def __init__(self, *, unwatched: Callable[[str], None] | None = None) -> None:
        self._watchers: dict[str, set[_Watcher]] = {}
        self._streamed: dict[str, _Streamed] = {}
        self._turns: dict[str, Turn] = {}
        """The turn each listened-to conversation is in (its reply so far, for ``done``)."""
        self._held: dict[str, DoneUpdate] = {}
        """The ``done`` of a step, until its drive ends or the next step comes."""
        self._done: set[str] = set()
        """Conversations whose drive told ``done`` already (a step of it ended the turn)."""
        self._responses = 0
        self._unwatched = unwatched
        """Told the id of a conversation whose last watcher left (its store feed can stop)."""

    def next_response(self) -> int:
        """A new response number, for text that was not streamed here (read from the store)."""
        self._responses += 1
        return self._responses

    @staticmethod
    def sink_for(conversation_id: str) -> Sink | None:
        """The sink of the turn running in this task, if it streams ``conversation_id``."""
        sink = _SINK.get()
        if sink is None or sink.conversation_id != conversation_id or sink.closed:
            return None
        return sink

    @staticmethod
    def use(sink: Sink) -> contextvars.Token[Sink | None]:
        """Make ``sink`` the current task's sink (``reset`` with the token)."""
        return _SINK.set(sink)

    @staticmethod
    def reset(token: contextvars.Token[Sink | None]) -> None:
        _SINK.reset(token)

    def watched(self, conversation_id: str) -> bool:
        """Whether anyone watches ``conversation_id`` (a streamed turn alone is not watching)."""
        return conversation_id in self._watchers

    def listening(self, conversation_id: str) -> bool:
        """Whether any update of ``conversation_id`` would reach someone now."""
        return conversation_id in self._watchers or self.sink_for(conversation_id) is not None

    def gone(self, conversation_id: str) -> None:
        """The conversation was deleted (found so by its store feed): every watch of it ends,
        its reader told with ``ConversationNotFoundError`` once what was delivered is read."""
        for watcher in self._watchers.get(conversation_id, ()):
            if not (watcher.ended or watcher.lost):
                watcher.ended = watcher.deleted = True
                watcher.close_with_marker()

    def emit(self, conversation_id: str, update: Update) -> None:
        """Deliver ``update`` to the current turn's sink and to every watcher."""
        sink = self.sink_for(conversation_id)
        if sink is not None:
            sink.put(update)
        for watcher in self._watchers.get(conversation_id, ()):
            if watcher.lost or watcher.ended:
                continue
            try:
                watcher.queue.put_nowait(update)
            except asyncio.QueueFull:
                watcher.lost = True
                watcher.close_with_marker()

    # ------------------------------------------------------------------ streamed text

    def text_sink(self, conversation_id: str) -> Any:
        """A callback for the model's text deltas of a new response, or None if nobody listens.

        The deltas are kept until the response is stored, so ``settle`` can make what was
        streamed add up to what was stored."""
        if not self.listening(conversation_id):
            self._streamed.pop(conversation_id, None)
            return None
        self._responses += 1
        streamed = self._streamed[conversation_id] = _Streamed(self._responses)

        def on_text(delta: str) -> None:
            if delta:
                streamed.parts.append(delta)
                self.emit(conversation_id, TextUpdate(text=delta, response=streamed.response))

        return on_text

    def settle(self, conversation_id: str, stored_text: str) -> None:
        """A response's text was stored: emit whatever of it was not streamed (all of it when
        the model does not stream, the rest when it streamed a prefix)."""
        streamed = self._streamed.pop(conversation_id, None)
        if not self.listening(conversation_id):
            return
        if streamed is None:
            self._responses += 1
            streamed = _Streamed(self._responses)
        sent = "".join(streamed.parts)
        if sent == stored_text:
            return
        response = streamed.response
        if stored_text.startswith(sent):
            rest = stored_text[len(sent) :]
        else:
            # What was streamed is not what was stored (an adapter that rewrites its reply):
            # the stored text goes out whole as a new response, voiding the streamed one.
            self._responses += 1
            response, rest = self._responses, stored_text
        if rest:
            self.emit(conversation_id, TextUpdate(text=rest, response=response))

    def writing(self, conversation_id: str) -> None:
        """A commit is being written: nothing to tell yet (``committed`` tells it)."""

    def committed(self, conversation_id: str, step: Step | None) -> None:
        """Emit what a listener learns from a commit: ``updates_of`` the step (the one fold a
        reader of the store uses too), the reply settled against the text streamed of it. A
        step's ``done`` is held until the drive has performed what the step left (a snapshot
        saved, an archive written: a caller told ``done`` finds them) or the next step comes,
        so it is told in the fold's order, only later."""
        if step is None or not self.listening(conversation_id):
            return
        cid = conversation_id
        self.release(cid)
        turn = self._turns.setdefault(cid, Turn())
        event = step.event
        for update in turn.step(step.before, step.after, event, step.effects, step.appended):
            if isinstance(update, TextUpdate):
                self.settle(cid, update.text)
            elif isinstance(update, DoneUpdate):
                self._held[cid] = update
            else:
                self.emit(cid, update)
        if isinstance(event, LlmResponse | LlmError):
            self.forget_response(cid)  # stored (and settled), or never to be

    def release(self, conversation_id: str) -> bool:
        """Emit the ``done`` held for the conversation, if any; whether there was one."""
        held = self._held.pop(conversation_id, None)
        if held is None:
            return False
        self._done.add(conversation_id)
        self.emit(conversation_id, held)
        return True

    def turn_begins(self, conversation_id: str) -> None:
        """A drive of the conversation begins: no reply of an earlier turn is its reply (a
        ``done`` an earlier drive that failed still held goes out now)."""
        self.release(conversation_id)
        self._turns.pop(conversation_id, None)
        self._done.discard(conversation_id)

    def turn_ends(self, conversation_id: str, state: ConversationState) -> None:
        """The drive ended in ``state``: the ``done`` held goes out. A drive that ended no
        turn (a refused message, a recovery with nothing to do) still closes its stream with
        ``done``: live only, since nothing of it reached the store."""
        turn = self._turns.pop(conversation_id, None)
        told = self.release(conversation_id) or conversation_id in self._done
        self._done.discard(conversation_id)
        if not told and self.listening(conversation_id):
            reply = None if turn is None else turn.reply
            self.emit(conversation_id, DoneUpdate(state=state, reply=reply))

    def forget_response(self, conversation_id: str) -> None:
        """The response being streamed will not be stored (it failed or was cancelled)."""
        self._streamed.pop(conversation_id, None)

    # ------------------------------------------------------------------ watchers

    def watch(self, conversation_id: str, check: Callable[[], Awaitable[Any]]) -> Watch:
        """A ``Watch`` of ``conversation_id``, receiving from this moment on."""
        watcher = _Watcher()
        self._watchers.setdefault(conversation_id, set()).add(watcher)
        return Watch(self, conversation_id, watcher, check)

    def _unwatch(self, conversation_id: str, watcher: _Watcher) -> None:
        watchers = self._watchers.get(conversation_id)
        if watchers is not None:
            watchers.discard(watcher)
            if not watchers:
                del self._watchers[conversation_id]
                if self._unwatched is not None:
                    self._unwatched(conversation_id)


class Watch(AsyncIterator[Update]):
    """Every update of one conversation from its creation until ``aclose()`` (or until it is
    dropped: a watch nobody holds any more stops receiving). Also an async context manager."""

    def __init__(
        self,
        bus: UpdateBus,
        conversation_id: str,
        watcher: _Watcher,
        check: Callable[[], Awaitable[Any]],
    ) -> None:
        self.conversation_id = conversation_id
        self._watcher = watcher
        self._check: Callable[[], Awaitable[Any]] | None = check
        self._stop = weakref.finalize(self, bus._unwatch, conversation_id, watcher)

    async def __anext__(self) -> Update:
        if not self._stop.alive:
            raise StopAsyncIteration
        if self._check is not None:
            await self.start()
        update = await self._watcher.queue.get()
        if update is None:
            self._stop()
            if self._watcher.deleted:
                raise ConversationNotFoundError(f"conversation {self.conversation_id} was deleted")
            if self._watcher.ended:
                raise StopAsyncIteration
            msg = (
                f"the watcher of {self.conversation_id} fell {WATCH_BUFFER} updates behind; "
                "read the conversation from the store and watch again"
            )
            raise UpdatesLostError(msg)
        return update

    async def start(self) -> None:
        """Check the conversation and start reading what other runtimes commit to it, from the
        store's state at this moment (the first ``__anext__`` does it otherwise). Turns this
        runtime drives are heard from ``watch()`` on; another process's commit made after
        ``watch()`` but before the start is not (the store is read from the start on). So a
        caller that reads the conversation after watching, to miss nothing (a page: watch,
        then read the state), awaits this first. ``ConversationNotFoundError`` for an unknown
        id."""
        if self._check is None:
            return
        check, self._check = self._check, None
        try:
            await check()
        except BaseException:
            self._stop()
            raise

    async def aclose(self) -> None:
        """Stop receiving."""
        self._stop()

    def end(self) -> None:
        """End the watch from outside its reader: what was delivered is still read, then
        the iteration stops (a server that stops ends its open streams so). Call it in the
        watch's event loop."""
        watcher = self._watcher
        if watcher.ended or not self._stop.alive:
            return
        watcher.ended = True
        if not watcher.lost:  # a lost watch has its marker queued already
            watcher.close_with_marker()

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
