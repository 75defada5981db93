"""Claims on pending work: which runtime performs an effect, until when, and letting it go.

Theory of operation. An effect in a store's outbox is performed by the runtime that claimed it:
the claim names the runtime (its owner id) and lasts until a wall-clock time (its lease), so
several processes sharing one database never perform the same work twice. A runtime renews its
claims every third of the lease while it works, and lets go of one at once when it stops early
(its adapter raised, the turn was cancelled, the runtime closed): the next drive, here or in
another process, takes the work then, not when the lease ends. A claim whose owner is a process
of this host that no longer exists is taken at once as well.

Leases are wall-clock times (``time.time``), whatever clock the runtime was given for its
records: they are compared between processes. The store decides who wins a claim
(``Outbox.claim``); this module only keeps this runtime's side of it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from typing import Final

from segue.executor._log import get_logger
from segue.executor.errors import SegueError
from segue.executor.store_port import Outbox, PendingEffect

DEFAULT_LEASE: Final = 30.0
"""Seconds a claim on pending work lasts unless renewed (every third of it while it runs): how
long another process waits before taking over the work of one that died without a trace."""
_HOST: Final = socket.gethostname()
_log = get_logger("segue.runtime")


def default_owner() -> str:
    """A runtime's owner id: host and process (so a dead one on this host is recognised at
    once), and a random part (several runtimes in one process are distinct)."""
    return f"{_HOST}/{os.getpid()}/{secrets.token_hex(4)}"


def owner_is_dead(owner: str) -> bool:
    """Whether ``owner`` is a runtime of a process on this host that no longer exists (its
    claims can be taken at once, without waiting for their lease to end)."""
    host, _, rest = owner.partition("/")
    pid_text = rest.partition("/")[0]
    if host != _HOST or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # it exists (owned by someone else), or we cannot tell
    return False


def live_holder(pending: Sequence[PendingEffect]) -> str | None:
    """Who holds the conversation's next work (the head of ``pending``) under a live claim:
    its owner, or None when there is no work, nobody claimed it, its lease ended, or its
    owner is a process on this host that is gone."""
    if not pending:
        return None
    head = pending[0]
    owner = head.owner
    if owner is None or head.lease_until is None or head.lease_until <= time.time():
        return None
    return None if owner_is_dead(owner) else owner


class Claims:
    """This runtime's claims: taking one, the work being performed under each, their renewal
    and letting them go.

    Renewal is one timer for all the work in flight, set when work starts and none is set: most
    work ends long before its first renewal is due, and a timer per piece of work, set and
    cancelled each time, cost every step more than renewing ever did (cancelled timers stay in
    the loop's heap until their time)."""

    __slots__ = ("_due", "_handle", "_loop", "_store", "_tasks", "lease", "owner")

    def __init__(self, *, store: Callable[[], Outbox], owner: str | None, lease: float) -> None:
        if not lease > 0:
            msg = f"lease must be a positive number of seconds, not {lease!r}"
            raise ValueError(msg)
        self._store = store
        """Read at each use: the runtime's store may be replaced."""
        self.owner = owner or default_owner()
        """Who this runtime is in the store's claims (see ``default_owner``)."""
        self.lease = lease
        """Read at each use: a runtime's lease may be changed while it runs."""
        self._due: dict[str, tuple[int, float]] = {}
        """The work each conversation performs here: its outbox id, when its renewal is due."""
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def holds(self, pending: PendingEffect) -> bool:
        """Whether this runtime's claim on ``pending`` (as last seen) is still good."""
        return (
            pending.owner == self.owner
            and pending.lease_until is not None
            and pending.lease_until > time.time()
        )

    def lease_until(self) -> float:
        """When a claim made now ends."""
        return time.time() + self.lease

    async def take(self, conversation_id: str, head: PendingEffect) -> PendingEffect | None:
        """Claim ``head`` for this runtime unless another live runtime holds it; the entry as
        the store now has it (whoever holds it), or None if it was performed meanwhile."""
        now = time.time()
        owner = head.owner
        return await self._store().claim(
            conversation_id,
            head.id,
            owner=self.owner,
            lease_until=now + self.lease,
            now=now,
            take_from=owner if owner and owner_is_dead(owner) else None,
        )

    def performing(self, conversation_id: str, effect_id: int) -> None:
        """``effect_id`` is being performed here: renew its claim every third of the lease
        until ``done``."""
        loop = asyncio.get_running_loop()
        when = loop.time() + self.lease / 3
        self._due[conversation_id] = (effect_id, when)
        if self._handle is None or self._loop is not loop:  # none, or of a loop that ended
            self._loop = loop
            self._handle = loop.call_at(when, self._fire)

    def done(self, conversation_id: str) -> None:
        """The conversation's work here is over (performed, or given up)."""
        self._due.pop(conversation_id, None)

    def in_flight(self) -> dict[str, int]:
        """The outbox id of the work each conversation is performing here, as of now."""
        return {cid: effect_id for cid, (effect_id, _) in self._due.items()}

    async def let_go(self, conversation_id: str, effect_ids: tuple[int, ...]) -> None:
        """Release this runtime's claims on ``effect_ids``; a store that cannot be reached
        keeps them until their lease ends (nothing else can be done about it here)."""
        try:
            await self._store().release(conversation_id, effect_ids, owner=self.owner)
        except SegueError as error:
            _log.warning("claim_not_released", conversation_id=conversation_id, error=str(error))

    def _fire(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        period = self.lease / 3
        for cid, (effect_id, when) in list(self._due.items()):
            if when <= now:
                task = loop.create_task(self._renew(cid, effect_id))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                self._due[cid] = (effect_id, now + period)
        self._handle = None
        if self._due:  # the next one due; every later start is due after it
            self._handle = loop.call_at(min(when for _, when in self._due.values()), self._fire)

    async def _renew(self, conversation_id: str, effect_id: int) -> None:
        try:
            kept = await self._store().renew(
                conversation_id, (effect_id,), owner=self.owner, lease_until=self.lease_until()
            )
        except SegueError as error:
            _log.warning("lease_not_renewed", conversation_id=conversation_id, error=str(error))
            return
        if not kept:
            _log.warning("claim_lost", conversation_id=conversation_id, effect_id=effect_id)
