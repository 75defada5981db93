"""A pause asked of a conversation, wherever its turn runs: one object for every caller.

A pause is taken at the running turn's next boundary (a checkpoint is asked of the model and
kept as a snapshot), at once when the conversation is idle. Where the turn runs decides how the
request travels and how long it takes, and every caller (``Runtime.pause``, the server, the
CLI) needs the same answers: is the request recorded yet, is the pause taken, and what if the
turn runs on past a bound. ``PauseRequest`` answers them, so that none of them works out who
holds the turn on its own:

- **here** (this runtime drives the turn): the request is a flag the drive commits before its
  next step; it is taken when the turn reaches its boundary.
- **elsewhere** (another runtime holds the turn's work under a live claim): the request is
  committed to the store, where that runtime's drive reads it at its boundary and pauses; a
  task of this runtime follows it there.
- **nobody** (idle, or work a dead runtime left): the pause is taken by this runtime now.

``forced()`` ends the turn wherever it runs (its request is cancelled through the store, which
makes the other runtime's answer stale) and then pauses.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Final, Literal

from segue.executor.claims import live_holder
from segue.executor.drive import Driver
from segue.executor.locks import Locks
from segue.executor.signals import Signals
from segue.executor.store_port import LogReader
from segue.statemachine import ConversationState, PauseRequested

Where = Literal["here", "elsewhere", "nobody"]
RECORDED_WITHIN: Final = 10.0
"""Seconds ``recorded`` waits for the request to reach the store (a commit: far less)."""
_FIRST_LOOK, _LONGEST_LOOK = 0.01, 0.2
"""Seconds between reads of the store while the request is on its way there."""


class PauseRequest:
    """One pause asked of one conversation (``Runtime.request_pause`` makes it)."""

    def __init__(
        self,
        conversation_id: str,
        reason: str,
        *,
        where: Where,
        holder: str | None,
        store: Callable[[], LogReader],
        driver: Driver,
        locks: Locks,
        signals: Signals,
        cancel: Callable[[str], Awaitable[ConversationState]],
    ) -> None:
        self.conversation_id = conversation_id
        self.reason = reason
        self.where: Where = where
        """Where the turn ran when the pause was asked."""
        self.holder = holder
        """The runtime that held the turn's work when it was asked (``where == "elsewhere"``)."""
        self._store = store
        self._driver = driver
        self._locks = locks
        self._signals = signals
        self._cancel = cancel
        self._task: asyncio.Task[ConversationState] | None = None

    def start(self) -> None:
        """Ask: a flag for a drive of this runtime, else a drive of the request itself."""
        if self.where == "here":
            self._signals.ask_pause(self.conversation_id, self.reason)
        else:
            self._task = asyncio.ensure_future(self._drive())

    async def _drive(self) -> ConversationState:
        state, _ = await self._driver.drive(
            self.conversation_id, PauseRequested(reason=self.reason)
        )
        return state

    async def _state(self) -> ConversationState:
        return (await self._store().load(self.conversation_id)).state

    async def recorded(self) -> ConversationState:
        """The conversation once the request is recorded: at once for a turn of this runtime
        (its drive commits the request before its next step); once the request is in the store
        for another's (its ``pause_requested`` set); once the pause is taken when nobody held
        the turn."""
        task = self._task
        if task is None:
            return await self._state()
        if self.where == "nobody":
            return await asyncio.shield(task)
        delay, deadline = _FIRST_LOOK, time.monotonic() + RECORDED_WITHIN
        while True:
            if task.done():
                return task.result()
            state = await self._state()
            if state.pause_requested or time.monotonic() > deadline:
                return state
            await asyncio.wait({task}, timeout=delay)
            delay = min(delay * 2, _LONGEST_LOOK)

    async def taken(self, timeout: float | None = None) -> ConversationState:  # noqa: ASYNC109  # a bound on the wait
        """The conversation once the pause is taken (or the turn ended otherwise: failed,
        exhausted, cancelled). With ``timeout``, at most that long: then the conversation as
        it is, the request still standing (``forced`` ends the turn instead)."""
        task = self._task
        try:
            async with asyncio.timeout(timeout):
                if task is None:
                    async with self._locks.holding(self.conversation_id):
                        pass  # the running turn is over, and its pause was taken at its boundary
                else:
                    return await asyncio.shield(task)
        except TimeoutError:
            pass
        return await self._state()

    async def forced(self) -> ConversationState:
        """End the turn wherever it runs (what is in flight is recorded as cancelled, never
        lost), then pause: the conversation paused, unless it ended meanwhile."""
        await self.abandon()
        await self._cancel(self.conversation_id)  # which also drops the request
        return await self._drive()

    async def abandon(self) -> None:
        """Stop waiting here (a server that stops). A request in the store stays: the runtime
        running the turn still pauses at its boundary."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def where_it_runs(
    conversation_id: str, *, store: LogReader, locks: Locks, owner: str
) -> tuple[Where, str | None]:
    """Where the conversation's turn runs now, and who holds it when another runtime does."""
    if locks.is_driving(conversation_id):
        return "here", None
    stored = await store.load(conversation_id)
    holder = live_holder(stored.pending)
    if holder is not None and holder != owner:
        return "elsewhere", holder
    return "nobody", None
