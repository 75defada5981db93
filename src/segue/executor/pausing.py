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
makes the other runtime's answer stale) and then pauses. ``outcome()`` is the orchestration of
the three that every caller runs: what to wait for, for how long, and what then.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Final

from segue.executor._log import get_logger
from segue.executor.drive import Driver
from segue.executor.locks import Locks
from segue.executor.signals import Signals
from segue.executor.store_port import LogReader
from segue.executor.turn_holder import Turn, Where
from segue.statemachine import ConversationState, PauseRequested

_log = get_logger("segue.runtime")
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
        turn: Turn,
        owner: str,
        store: LogReader,
        driver: Driver,
        locks: Locks,
        signals: Signals,
        cancel: Callable[[str], Awaitable[ConversationState]],
    ) -> None:
        self.conversation_id = conversation_id
        self.reason = reason
        self.turn = turn
        """Where the turn ran when the pause was asked (``Conversations.turn``)."""
        self._owner = owner
        self._store = store
        self._driver = driver
        self._locks = locks
        self._signals = signals
        self._cancel = cancel
        self._task: asyncio.Task[ConversationState] | None = None

    @property
    def where(self) -> Where:
        """Where the turn ran when the pause was asked."""
        return self.turn.where

    @property
    def holder(self) -> str | None:
        """The runtime that held the turn's work when it was asked (``where == "elsewhere"``)."""
        return self.turn.holder

    def start(self) -> None:
        """Ask: a flag for a drive of this runtime, else a drive of the request itself."""
        _log.info(
            "pause_asked",
            conversation_id=self.conversation_id,
            where=self.where,
            holder=self.holder,
        )
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
        return (await self._store.load(self.conversation_id)).state

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

    async def outcome(
        self,
        timeout: float | None = None,  # noqa: ASYNC109  # a bound on the wait, then ``then``
        *,
        force: bool = True,
    ) -> ConversationState:
        """The pause's outcome, as every caller wants it: when nobody held the turn, the pause
        this runtime takes (its own checkpoint: never cut short); without ``timeout``, the
        request recorded (a turn here, which pauses at its boundary on its own) or the pause
        taken (a turn elsewhere). With ``timeout``, at most that long for the pause once the
        request is recorded; then, with ``force``, the turn ended and paused (``forced``),
        else the conversation as it is, the request still standing (the runtime running the
        turn pauses at its boundary), unless the checkpoint is this runtime's own request by
        then. A caller that stops waiting stops following the turn; the request stays."""
        try:
            if self.where == "nobody":
                return await self.taken()
            if timeout is None:
                return await (self.recorded() if self.where == "here" else self.taken())
            await self.recorded()
            state = await self.taken(timeout)
            if state.phase.kind == "paused":
                return state
            if force:
                return await self.forced()
            if await self._checkpointing_here():
                return await self.taken()  # leaving it would waste a request paid for here
            await self.abandon()
            return state
        except asyncio.CancelledError:
            if self.where == "elsewhere":
                await self.abandon()
            raise

    async def _checkpointing_here(self) -> bool:
        """Whether this runtime holds the conversation's next work now (the turn ended
        elsewhere first, and the pause's checkpoint is asked here)."""
        pending = (await self._store.load(self.conversation_id)).pending
        return bool(pending) and pending[0].owner == self._owner

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
