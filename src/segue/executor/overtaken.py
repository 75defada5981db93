"""Work this runtime performs that another runtime ended through the store.

A cancel, or a forced pause, asked of a conversation whose turn runs in another process reaches
the store, not that process: the asking runtime commits the cancel there (the request in flight
is no longer pending, so its answer would be stale) and, for a forced pause, takes the pause
next. The runtime running the turn would go on waiting for a model call nobody wants any more,
and its ``send()`` would return only when that call ends (never, for a call that hangs).

So work in flight for a while is checked against the store: every ``CHECK_FIRST`` seconds at
first, then less often (``CHECK_LONGEST`` at most), the conversation is read, and when the work
is no longer pending there under this runtime's claim (cancelled, or taken over by another
runtime), its task is cancelled. The drive then carries on from the conversation as the store
has it (``Driver``), so the turn's caller gets the cancelled or paused state within a check or
two of the force.

One timer serves all the work in flight, set when work starts and none is set (as the claims'
renewal is): most work ends long before its first check is due and costs nothing here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from segue.executor._log import get_logger
from segue.executor.errors import ConversationNotFoundError, SegueError
from segue.executor.store_port import LogReader

CHECK_FIRST: Final = 0.25
"""Seconds work runs before the store is first read about it (then twice that, and so on)."""
CHECK_LONGEST: Final = 1.0
"""The longest wait between two reads of the store about one piece of work."""
_log = get_logger("segue.runtime")


@dataclass(slots=True)
class _Work:
    effect_id: int
    task: asyncio.Future[Any]
    due: float
    """When (loop time) its next check is due."""
    period: float
    """The wait before the check after the next one."""
    checking: bool = False


class Overtaken:
    """The work in flight here, checked against the store while it runs (see the module)."""

    __slots__ = ("_ended", "_handle", "_loop", "_owner", "_store", "_tasks", "_work")

    def __init__(self, *, store: Callable[[], LogReader], owner: Callable[[], str]) -> None:
        self._store = store
        """Read at each use: the runtime's store may be replaced."""
        self._owner = owner
        self._work: dict[str, _Work] = {}
        self._ended: set[str] = set()
        """Conversations whose work here was cancelled because another runtime ended it."""
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def watch(self, conversation_id: str, effect_id: int, task: asyncio.Future[Any]) -> None:
        """``task`` performs the outbox entry ``effect_id`` here: check on it until ``done``."""
        loop = asyncio.get_running_loop()
        due = loop.time() + CHECK_FIRST
        self._work[conversation_id] = _Work(effect_id, task, due, CHECK_FIRST * 2)
        if self._handle is None or self._loop is not loop:  # none, or of a loop that ended
            self._loop = loop
            self._handle = loop.call_at(due, self._fire)

    def done(self, conversation_id: str) -> bool:
        """The work is over here; whether it ended because another runtime ended it."""
        self._work.pop(conversation_id, None)
        if conversation_id in self._ended:
            self._ended.discard(conversation_id)
            return True
        return False

    def _fire(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for cid, work in list(self._work.items()):
            if work.due <= now:
                work.due = now + work.period
                work.period = min(work.period * 2, CHECK_LONGEST)
                if not work.checking:  # a slow store: one read at a time per conversation
                    work.checking = True
                    task = loop.create_task(self._check(cid, work))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        self._handle = None
        if self._work:
            self._handle = loop.call_at(min(w.due for w in self._work.values()), self._fire)

    async def _check(self, conversation_id: str, work: _Work) -> None:
        """Cancel ``work`` if the store no longer has it pending under this runtime's claim."""
        try:
            stored = await self._store().load(conversation_id)
            pending = next((p for p in stored.pending if p.id == work.effect_id), None)
            mine = pending is not None and pending.owner in (None, self._owner())
        except ConversationNotFoundError:
            mine = False  # deleted meanwhile: nothing will take its outcome
        except SegueError as error:  # unreachable or closed: the next check tries again
            _log.debug("overtaken_check_failed", conversation_id=conversation_id, error=str(error))
            return
        finally:
            work.checking = False
        if mine or self._work.get(conversation_id) is not work or work.task.done():
            return
        _log.info("work_ended_elsewhere", conversation_id=conversation_id, effect_id=work.effect_id)
        self._ended.add(conversation_id)
        work.task.cancel()

    async def close(self) -> None:
        """Stop checking (the runtime closes)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._work.clear()
        self._ended.clear()
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


__all__ = ["CHECK_FIRST", "CHECK_LONGEST", "Overtaken"]
