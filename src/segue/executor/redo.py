"""The latest compaction, read back from the transcript: what a redo summarises again and what an
undo restores (REQ-SEG-063 to 065).

The transcript is append-only, so neither deletes anything: both start a new generation of
copies. A copy names its original (``Message.copy_of``), carries no usage (its original's is
already counted) and keeps no ``kept_messages`` (the messages a summary kept follow it as
copies). How the latest compaction is found, in the current generation of the session:

- its first message is a summary that is not a copy: the generation a compaction made. An
  ordinary summary summarised the generation just before it and kept that generation's last
  ``kept_messages``; a summary made again names the generation it summarised
  (``summarises``) and is followed by ``carried`` copies of that generation's kept tail.
- anything else (a first generation, an undone compaction's copies): there is none.

"Before the compaction" is the view of the summarised generation, whole (what the model was
sent when the compaction was asked), and "after" is what the compacting generation holds
beyond its summary and kept tail.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from segue.executor.store_port import StoredMessage
from segue.executor.transcript import TranscriptView
from segue.statemachine import Message, estimate_content, estimate_tokens


@dataclass(frozen=True, slots=True)
class LatestCompaction:
    """The latest compaction of a session's current generation, as the transcript holds it."""

    summarised: int
    """The generation the compaction replaced: its view is what the summary stands for."""
    before: tuple[tuple[int, Message], ...]
    """That generation's view, whole, with each message's seq."""
    kept: int
    """How many of ``before``'s last messages stayed verbatim after the summary."""
    after: tuple[tuple[int, Message], ...]
    """What came after the summary and its kept tail, with seqs."""

    @property
    def restored(self) -> tuple[tuple[int, Message], ...]:
        """The view an undo restores: the view before the compaction, then what came after."""
        return self.before + self.after


def latest_compaction(
    transcript: Sequence[StoredMessage], session: int, generation: int
) -> LatestCompaction | None:
    """The latest compaction of ``session``'s ``generation`` in ``transcript`` (the whole
    transcript, in seq order), or None when that generation was not made by one."""
    own = [
        (item.seq, item.message)
        for item in transcript
        if item.message.session == session and item.message.generation == generation
    ]
    if not own:
        return None
    _, first = own[0]
    if first.kind != "summary" or first.copy_of is not None:
        return None
    if first.summarises is not None:
        summarised, kept, after = first.summarises, first.carried, own[1 + first.carried :]
    else:
        summarised, kept, after = generation - 1, first.kept_messages, own[1:]
    if summarised < 1 or not any(
        item.message.session == session and item.message.generation == summarised
        for item in transcript
    ):
        return None  # a generation of an earlier session: its view is not this session's
    return LatestCompaction(
        summarised=summarised,
        before=tuple(view_with_seqs(transcript, session, summarised)),
        kept=kept,
        after=tuple(after),
    )


def view_with_seqs(
    transcript: Sequence[StoredMessage], session: int, generation: int
) -> list[tuple[int, Message]]:
    """The model's view of (``session``, ``generation``) folded over the whole transcript, as
    ``transcript.current_view`` folds it, with the seq of each message (read back by identity:
    the fold holds the very objects it was given)."""
    view = TranscriptView(session, generation)
    seqs: dict[int, int] = {}
    for item in transcript:
        seqs[id(item.message)] = item.seq
        view.add(item.seq, item.message)
    return [(seqs[id(message)], message) for message in view.snapshot()]


def copies(
    items: Sequence[tuple[int, Message]], session: int, generation: int
) -> tuple[Message, ...]:
    """``items`` as the copies a new generation holds. The pinned messages that open a view
    (pinned ones of earlier generations, which a view sends before its summary) are left out:
    the new generation's view sends them again itself, from their originals."""
    start = 0
    while start < len(items):
        message = items[start][1]
        earlier = (message.session, message.generation) < (session, generation)
        if not (message.pinned and earlier and message.kind != "summary"):
            break
        start += 1
    return tuple(
        message.model_copy(
            update={
                "copy_of": message.copy_of or seq,
                "usage": None,
                "kept_messages": 0,
                "summarises": None,
                "carried": 0,
            }
        )
        for seq, message in items[start:]
    )


def estimated(system: str | None, messages: Sequence[Message]) -> int:
    """What ``messages`` hold with the system prompt, estimated as a request's would be."""
    held = sum(estimate_content(m.text, m.content) for m in messages)
    return estimate_tokens(system or "") + held
