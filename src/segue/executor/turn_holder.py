"""Who holds a conversation's turn: this runtime, another one sharing the store, or nobody.

Several runtimes (processes, machines) may share one store, and a turn's work is performed by
the runtime whose claim on it is live (``claims``). Pausing, deleting, exporting, a purge and
``segue pause`` each need to know where the turn runs before they act: a pause travels through
the store to another runtime, a deletion is refused while another runtime runs the turn, a
cancel waits for the other runtime to let go. ``turn_of`` is the one answer they all read, so
that "a turn runs elsewhere" means the same thing to each of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from segue.executor.claims import live_holder
from segue.executor.store_port import StoredConversation

Where = Literal["here", "elsewhere", "nobody"]
"""Where a conversation's turn runs: ``here`` (a drive of this runtime), ``elsewhere`` (another
runtime's live claim on its work), ``nobody`` (no work, or work whose claim lapsed or whose
process is gone: the next drive, anywhere, takes it)."""


@dataclass(frozen=True, slots=True)
class Turn:
    """Where a conversation's turn runs, and who holds it when another runtime does."""

    where: Where
    holder: str | None = None
    """The owner id of the runtime running the turn (``where == "elsewhere"``), else None."""


HERE = Turn("here")
NOBODY = Turn("nobody")


def turn_of(stored: StoredConversation, *, owner: str, driving: bool = False) -> Turn:
    """Where the turn of ``stored`` runs, asked by the runtime ``owner``: ``here`` when it is
    ``driving`` the conversation, ``elsewhere`` when another owner holds a live claim on its
    next work, else ``nobody`` (a claim of ``owner`` itself that no drive follows is work this
    runtime's next drive performs)."""
    if driving:
        return HERE
    holder = live_holder(stored.pending)
    if holder is None or holder == owner:
        return NOBODY
    return Turn("elsewhere", holder)


__all__ = ["HERE", "NOBODY", "Turn", "Where", "turn_of"]
