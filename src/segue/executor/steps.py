"""A committed step, and who is told of it.

``Commits`` writes each step of a conversation and then tells its observers, in the order it
was given them; it knows nothing of what they do with it (the updates a UI hears, the feeds
that read other processes' steps back). An observer is told twice per write: ``writing``
before the store is asked, and ``committed`` after, with the step, or with None when nothing
was written (the store refused it, or failed). Observers run in the commit's own task, between
two awaits: they must not block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from segue.effects import Effect
from segue.executor.store_port import StoredConversation
from segue.statemachine import ConversationState, Event, Message


@dataclass(frozen=True, slots=True)
class Step:
    """One committed step: the state it was decided on and the state it left, its event as
    committed, its effects, the messages it recorded, and the conversation as stored after."""

    before: ConversationState
    after: ConversationState
    event: Event
    effects: tuple[Effect, ...]
    appended: tuple[Message, ...]
    stored: StoredConversation


class CommitObserver(Protocol):
    """Told of every write ``Commits`` makes."""

    def writing(self, conversation_id: str) -> None:
        """A step of ``conversation_id`` is about to be written (``committed`` follows)."""

    def committed(self, conversation_id: str, step: Step | None) -> None:
        """The write ended: ``step`` as committed, or None when nothing was written."""
