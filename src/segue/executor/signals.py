"""Requests to stop or pause a running turn, and the work in flight they act on.

A cancel or a pause is a flag the conversation's drive reads before each step, so it lands at
once, not behind the lock the turn holds: the drive commits it as an event (``UserCancel``,
``PauseRequested``) and only then is the flag cleared, so neither a failed commit nor a caller
that gave up can let the turn run on. A cancel also cancels the model request or tool run in
flight, whose outcome it makes stale; a notification in flight (a snapshot, an archive) is let
finish, since cancelling it would lose it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from segue.effects import ANSWERED_BY_EVENTS, Effect


class Signals:
    """This runtime's cancel and pause requests, and what each conversation performs now."""

    __slots__ = ("_cancel", "_in_flight", "_pause")

    def __init__(self) -> None:
        self._cancel: set[str] = set()
        self._pause: dict[str, str] = {}
        self._in_flight: dict[str, tuple[asyncio.Future[Any], Effect]] = {}

    def ask_cancel(self, conversation_id: str) -> None:
        """Stop the turn: drop a pause asked meanwhile (REQ-SEG-021) and cancel the request or
        tools in flight."""
        self._cancel.add(conversation_id)
        self._pause.pop(conversation_id, None)
        in_flight = self._in_flight.get(conversation_id)
        if in_flight is not None:
            task, effect = in_flight
            if isinstance(effect, ANSWERED_BY_EVENTS) and not task.done():
                task.cancel()

    def ask_pause(self, conversation_id: str, reason: str) -> None:
        """Pause at the turn's next boundary."""
        self._pause[conversation_id] = reason

    def cancel_asked(self, conversation_id: str) -> bool:
        return conversation_id in self._cancel

    def pause_asked(self, conversation_id: str) -> str | None:
        """The reason of the pause asked, or None."""
        return self._pause.get(conversation_id)

    def interrupted(self, conversation_id: str) -> bool:
        """Whether a cancel or a pause waits to be committed."""
        return conversation_id in self._cancel or conversation_id in self._pause

    def cancel_taken(self, conversation_id: str) -> None:
        """The cancel is committed (or nothing was left to cancel): the flag goes."""
        self._cancel.discard(conversation_id)

    def pause_taken(self, conversation_id: str) -> None:
        self._pause.pop(conversation_id, None)

    def stops(self, conversation_id: str, effect: Effect) -> bool:
        """Whether the end of ``effect`` by cancellation is the user's cancel of it (an event
        to commit), rather than a caller's timeout or a shutdown (the work stays pending)."""
        return conversation_id in self._cancel and isinstance(effect, ANSWERED_BY_EVENTS)

    @contextlib.contextmanager
    def performing(
        self, conversation_id: str, task: asyncio.Future[Any], effect: Effect
    ) -> Iterator[None]:
        """``task`` performs ``effect`` for the conversation meanwhile (a cancel may stop it)."""
        self._in_flight[conversation_id] = (task, effect)
        try:
            yield
        finally:
            self._in_flight.pop(conversation_id, None)

    def stop_all(self) -> None:
        """Cancel everything in flight (the runtime closes; the work stays pending)."""
        for task, _effect in list(self._in_flight.values()):
            task.cancel()
