"""What this runtime last saw of each conversation: the stored copy and the model's view.

A drive commits on the copy its last commit returned instead of loading the conversation again
(the store's version check catches a copy another writer made stale), and sends the model a view
folded message by message instead of re-reading the transcript (checked against the store's
``last_seq`` on every request: extended with what the store holds beyond it, whoever wrote it,
never served stale). So a step costs the same at any length. This class is the only writer of
both; the most recently used conversations are kept.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Final

from segue.executor.errors import SegueError
from segue.executor.store_port import LogReader, StoredConversation
from segue.executor.transcript import TranscriptView, ViewSnapshot, fold_from
from segue.statemachine import Message

CACHE_SIZE: Final = 256
"""Conversations whose last known copy and view are kept (the most recently used)."""


@dataclasses.dataclass(slots=True)
class _Known:
    stored: StoredConversation | None = None
    view: TranscriptView | None = None


class ViewCache:
    """The last known copy and the folded view of the most recently used conversations."""

    __slots__ = ("_known", "_size", "_store")

    def __init__(self, store: Callable[[], LogReader], *, size: int | None = None) -> None:
        self._store = store
        """Read at each use: the runtime's store may be replaced."""
        self._size = CACHE_SIZE if size is None else size
        self._known: OrderedDict[str, _Known] = OrderedDict()

    def __len__(self) -> int:
        return len(self._known)

    def stored(self, conversation_id: str) -> StoredConversation | None:
        """The copy last loaded or committed here, if any (possibly stale: commit on it, and
        the store's version check says so)."""
        known = self._known.get(conversation_id)
        return None if known is None else known.stored

    def keep(self, stored: StoredConversation) -> None:
        """``stored`` was just loaded or committed: it is the copy to commit on next."""
        self._entry(stored.state.id).stored = stored

    def forget(self, conversation_id: str) -> None:
        """The copy may not be what the store holds (a commit's reply was lost): load next."""
        known = self._known.get(conversation_id)
        if known is not None:
            known.stored = None

    def committed(self, stored: StoredConversation, appended: Sequence[Message]) -> None:
        """This runtime committed ``stored``, appending ``appended`` to its transcript: keep it,
        and fold the messages into the view when they landed right after what it holds
        (otherwise another writer wrote too, and the next request reads the gap)."""
        known = self._entry(stored.state.id)
        known.stored = stored
        view = known.view
        if appended and view is not None and view.last_seq == stored.last_seq - len(appended):
            view.extend(view.last_seq + 1, appended)

    async def view(self, stored: StoredConversation) -> ViewSnapshot:
        """The model's view, exactly as of ``stored`` (its state and ``last_seq``).

        The fold is reused only for the state's session and generation and only while it holds
        no more than the store does; it is brought up to ``stored.last_seq`` with the messages
        after its own ``last_seq``, whoever wrote them. A new session or generation, or a
        transcript the store no longer agrees with, is folded again from where that session or
        generation starts (``_start``): what came before costs nothing, however much of it
        there is.
        """
        state = stored.state
        cid = state.id
        known = self._entry(cid)
        view = known.view
        if (
            view is None
            or view.session != state.session
            or view.generation != state.generation
            or view.last_seq > stored.last_seq
        ):
            known.view = None
            view = known.view = await self._start(stored)
        if view.last_seq < stored.last_seq:
            try:
                for message in await self._store().messages(cid, after_seq=view.last_seq):
                    if message.seq > stored.last_seq:
                        break  # written after ``stored`` was read: not part of this state
                    view.add(message.seq, message.message)
            except ValueError as error:  # a gap in the seqs: the store broke its contract
                known.view = None
                raise SegueError(f"transcript of {cid} is not contiguous: {error}") from error
            if view.last_seq != stored.last_seq:
                known.view = None
                msg = f"the store holds {view.last_seq} messages of {cid}, not {stored.last_seq}"
                raise SegueError(msg)
        return view.snapshot()

    def drop(self, conversation_id: str) -> None:
        """The conversation is gone (deleted): drop its copy and its view."""
        self._known.pop(conversation_id, None)

    async def _start(self, stored: StoredConversation) -> TranscriptView:
        """A view of the state's session and generation, folded from its start: the
        generation's summary and the messages it keeps (``transcript.fold_from``), with the
        pinned messages before them; never the transcript of earlier generations."""
        state = stored.state
        cid, session, generation = state.id, state.session, state.generation
        store = self._store()
        start = min(await store.generation_start(cid, session, generation), stored.last_seq + 1)
        first: Message | None = None
        if 1 < start <= stored.last_seq:  # from 1, there is nothing before it to keep
            head = await store.messages(cid, after_seq=start - 1, before_seq=start + 1)
            first = head[0].message if head else None
        begin = fold_from(start, first, session, generation)
        pinned = await store.pinned_messages(cid, before_seq=begin)
        return TranscriptView(
            session,
            generation,
            first_seq=begin,
            pinned=[(message.seq, message.message) for message in pinned],
        )

    def _entry(self, conversation_id: str) -> _Known:
        """The conversation's entry (made if missing), marked most recently used."""
        known = self._known.get(conversation_id)
        if known is None:
            known = self._known[conversation_id] = _Known()
            while len(self._known) > self._size:
                self._known.popitem(last=False)
        else:
            self._known.move_to_end(conversation_id)
        return known
