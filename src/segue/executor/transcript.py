"""What the model sees: the current session's and generation's part of the transcript.

The transcript is append-only and keeps everything; fresh starts are views over it. A checkpoint
restart or a resume starts a new *session* (the model sees only that session's messages); a
compaction starts a new *generation* within a session (the model sees the summary, the verbatim
tail the summary names, then what came after).

Pinned messages (REQ-SEG-042) are never left behind: a view starts with every pinned message of
an earlier session or generation that it does not already hold (in a summary's kept tail), in
transcript order, before the summary.

``TranscriptView`` keeps one (session, generation)'s view up to date message by message, so a
request at the ten-thousandth message costs what it costs at the tenth: the runtime feeds it only
what the store appended since, and hands the model a ``ViewSnapshot`` (a read-only window on the
view's append-only lists) instead of copying them. ``current_view`` is the same fold run over a
whole transcript at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, islice
from typing import overload

from segue.statemachine import Message
from segue.statemachine.accounting import estimate_content, estimate_tool_calls

DEFAULT_KEEP_RECENT = 6
"""Messages kept verbatim by compaction: enough for the last exchange and its tool calls."""


class ViewSnapshot(Sequence[Message]):
    """The view as it was when taken: a fixed head (summary and kept tail), then the first
    ``length`` messages of a list that is only ever appended to. Later appends are not seen, so
    a request recorded by a test or an adapter never changes under it, and taking one is O(1)."""

    __slots__ = ("_head", "_length", "_tail")

    def __init__(self, head: tuple[Message, ...], tail: list[Message], length: int) -> None:
        self._head = head
        self._tail = tail
        self._length = length

    def __len__(self) -> int:
        return len(self._head) + self._length

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        if isinstance(index, slice):
            return list(self)[index]
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            msg = "view index out of range"
            raise IndexError(msg)
        head = len(self._head)
        return self._head[index] if index < head else self._tail[index - head]

    def __iter__(self) -> Iterator[Message]:
        return chain(self._head, islice(self._tail, self._length))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which do not hash

    def __repr__(self) -> str:
        return f"ViewSnapshot({list(self)!r})"


class TranscriptView:
    """The view of one (``session``, ``generation``), folded over the transcript in seq order.

    Exactly what ``current_view`` computes, kept incrementally: the last ``summary`` of this
    generation in this session, the messages of the previous generation it keeps verbatim, and
    this generation's messages after it. ``last_seq`` says how much of the transcript has been
    folded in, which is how the runtime knows whether the store holds more.
    """

    __slots__ = (
        "_after",
        "_copied",
        "_kept",
        "_pinned",
        "_previous",
        "_summary",
        "generation",
        "last_seq",
        "session",
    )

    def __init__(
        self,
        session: int,
        generation: int,
        *,
        first_seq: int = 1,
        pinned: Iterable[tuple[int, Message]] = (),
    ) -> None:
        """A view folded from ``first_seq`` on (``fold_from`` says where that may be), with
        ``pinned``: the (seq, message) of the pinned messages before it, which it does not
        read. From 1 with none, it is the fold of the whole transcript."""
        self.session = session
        self.generation = generation
        self.last_seq = first_seq - 1
        self._summary: Message | None = None
        self._kept: tuple[tuple[int, Message], ...] = ()
        self._after: list[Message] = []
        self._copied: set[int] = set()
        """The originals (seqs) that this generation's messages are copies of (REQ-SEG-063,
        064): a pinned original is not sent again before the summary when its copy is in."""
        self._previous: list[tuple[int, Message]] = []
        """The previous generation's non-summary messages: where a new summary's tail is from."""
        self._pinned: list[tuple[int, Message]] = [
            (seq, message) for seq, message in pinned if self._earlier(message)
        ]
        """Pinned messages of earlier sessions and generations, with their seqs."""

    def _earlier(self, message: Message) -> bool:
        """Whether ``message`` is of an earlier session, or an earlier generation of this one."""
        return message.session < self.session or (
            message.session == self.session and message.generation < self.generation
        )

    def add(self, seq: int, message: Message) -> None:
        """Fold in the transcript message ``seq``; seqs must come one after another."""
        if seq != self.last_seq + 1:
            msg = f"transcript message {seq} does not follow {self.last_seq}"
            raise ValueError(msg)
        self.last_seq = seq
        if message.session != self.session:
            if message.pinned and message.session < self.session:
                self._pinned.append((seq, message))
            return
        if message.generation == self.generation:
            if message.kind == "summary":
                keep = message.kept_messages
                self._summary = message
                self._kept = tuple(self._previous[-keep:]) if keep else ()
                self._after = []  # a new list: snapshots taken so far keep the old one
                self._copied = {m.copy_of for _, m in self._kept if m.copy_of is not None}
            else:
                self._after.append(message)
                if message.copy_of is not None:
                    self._copied.add(message.copy_of)
            return
        if message.pinned and message.generation < self.generation:
            self._pinned.append((seq, message))
        if message.generation == self.generation - 1 and message.kind != "summary":
            self._previous.append((seq, message))

    def extend(self, first_seq: int, messages: Iterable[Message]) -> None:
        """Fold in consecutive messages, the first of which is ``first_seq``."""
        for seq, message in enumerate(messages, first_seq):
            self.add(seq, message)

    def snapshot(self) -> ViewSnapshot:
        """The messages the model must be sent now, in order."""
        kept = self._kept
        head: tuple[Message, ...] = ()
        if self._pinned:
            held = {seq for seq, _ in kept} | self._copied
            head = tuple(
                message
                for seq, message in self._pinned
                if seq not in held and message.copy_of not in held
            )
        if self._summary is not None:
            head = (*head, self._summary, *(message for _, message in kept))
        return ViewSnapshot(head, self._after, len(self._after))


def fold_from(start: int, first: Message | None, session: int, generation: int) -> int:
    """Where the view of (``session``, ``generation``) is folded from, given ``start`` (the
    seq of its first message, ``Store.generation_start``) and ``first``, the message there (if
    any): a summary of this generation keeps the previous generation's last ``kept_messages``
    verbatim, which lie just before it (one more, in case the previous generation's own
    summary is among them). The transcript before that is never read again: only its pinned
    messages are (``Store.pinned_messages``)."""
    if (
        first is not None
        and first.kind == "summary"
        and first.session == session
        and first.generation == generation
        and first.kept_messages
    ):
        return max(1, start - first.kept_messages - 1)
    return start


def current_view(transcript: Sequence[Message], session: int, generation: int) -> list[Message]:
    """The messages the model must be sent for ``session``/``generation``, in order."""
    view = TranscriptView(session, generation)
    view.extend(1, transcript)
    return list(view.snapshot())


def split_for_compaction(
    view: Sequence[Message],
    generation: int,
    keep_recent: int = DEFAULT_KEEP_RECENT,
    budget: int | None = None,
) -> tuple[list[Message], list[Message]]:
    """Split a view into (to summarise, to keep verbatim).

    The tail is taken from the current generation only (so ``current_view`` can find it again
    from the summary's ``kept_messages``), never starts with a ``tool_result`` (that would cut a
    tool call from its result) and never includes a summary (summaries are summarised again).
    With a ``budget`` (tokens), the tail is shortened from its start until its estimate fits:
    in a small window a few long messages kept verbatim would leave the compacted context above
    the threshold, and the compaction would be found ineffective.
    """
    own = [i for i, m in enumerate(view) if m.generation == generation and m.kind != "summary"]
    start = _tail_start(view, own, max(0, len(own) - keep_recent))
    if budget is not None:
        while start < len(own) and _estimate(view, own[start:]) > budget:
            start = _shorter(view, own, start)
    kept = set(own[start:])
    head = [m for i, m in enumerate(view) if i not in kept]
    tail = [view[i] for i in sorted(kept)]
    return head, tail


def _tail_start(view: Sequence[Message], own: Sequence[int], start: int) -> int:
    """``start``, moved back so the tail does not open with a tool result (its call comes
    too); past the end when only tool results are left (keep nothing rather than orphan
    them)."""
    while 0 < start < len(own) and view[own[start]].kind == "tool_result":
        start -= 1
    if start < len(own) and view[own[start]].kind == "tool_result":
        return len(own)
    return start


def _shorter(view: Sequence[Message], own: Sequence[int], start: int) -> int:
    """The tail one message shorter, moved on past tool results whose call it no longer
    keeps."""
    start += 1
    while start < len(own) and view[own[start]].kind == "tool_result":
        start += 1
    return start


def _estimate(view: Sequence[Message], indices: Sequence[int]) -> int:
    return sum(
        estimate_content(view[i].text, view[i].content) + estimate_tool_calls(view[i].tool_calls)
        for i in indices
    )
