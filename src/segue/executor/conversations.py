"""What a runtime knows of its conversations: creating them, reading them, continuing them.

The conversation-level half of ``Runtime`` (the other half runs turns and steers them): each
method here reads or writes whole conversations through the store, and none of them drives a
turn. ``Runtime`` is built on it; an application calls these as ``rt.create_conversation(...)``,
``rt.state(...)`` and so on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

from segue.executor import documents
from segue.executor._log import get_logger
from segue.executor.bounds import checked_metadata
from segue.executor.cache import ViewCache
from segue.executor.chains import (
    LIMIT_PURPOSES,
    PROVIDER_COMPACTION,
    Link,
    UsageReport,
    lineage,
    usage_from_log,
)
from segue.executor.chains import usage_report as usage_of_messages
from segue.executor.claims import Claims, live_holder
from segue.executor.drive import Driver
from segue.executor.errors import ConversationBusyError, ConversationNotFoundError
from segue.executor.locks import Locks
from segue.executor.models.windows import window_for
from segue.executor.requests import check_prefix_reuse, check_support, support_of
from segue.executor.retention import erase, wait_for_claims
from segue.executor.setup import Setup
from segue.executor.signals import Signals
from segue.executor.store_port import (
    ConversationPage,
    StoredConversation,
    StoredMessage,
    vacuums,
)
from segue.statemachine import ConversationState, Message
from segue.statemachine.options import ConversationOptions, initial_state, options_with

_log = get_logger("segue.runtime")
_BUSY_HERE: Final = "a turn runs in this runtime; cancel it (cancel=True) or wait for it"
_REPLY_SCAN: Final = 64
"""Messages read per step when ``last_reply`` looks back for the latest assistant message."""


class Conversations:
    """Creating and reading conversations (``Runtime`` is one; see its docstring)."""

    _setup: Setup
    _cache: ViewCache
    _locks: Locks
    _signals: Signals
    _driver: Driver
    claims: Claims

    async def create_conversation(
        self,
        options: ConversationOptions | None = None,
        /,
        *,
        conversation_id: str | None = None,
        parent_id: str | None = None,
        seed: Sequence[Message] = (),
        metadata: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> ConversationState:
        """Create and store a new idle conversation with ``options`` (``ConversationOptions``),
        or with its fields as keywords (``model=``, ``behavior=``, ``system=``...): invalid
        values raise ``pydantic.ValidationError`` before anything is stored.

        The window is ``context_window`` when given (a proxy or compatible server often has no
        model endpoint), else what the provider reports, else segue's table of models (with a
        warning in the log: a lookup that fails never fails the conversation). Each answer may
        hold ``max_output_tokens`` (default: ``DEFAULT_OUTPUT_TOKENS``, or room for the thinking
        budget, within the model's limit); a window given below ``MIN_WINDOW`` is refused. The
        core's ``initial_state`` decides all of it, for the server and the CLI too. ``seed``:
        messages the conversation starts with (a summary, pinned messages: what a continued
        conversation carries over). ``metadata``: the application's labels for finding it again
        (``{"user": "u-17", "title": "Tides"}``; ``list_conversations(metadata=...)``), string
        keys and values within ``METADATA_LIMITS``, refused with ``InvalidMetadataError``
        before anything is stored.
        """
        tags = checked_metadata(metadata)
        options = options_with(options, fields)
        now = self._setup.clock()
        state = initial_state(  # the core's one resolution, as the server and the CLI get it
            options,
            conversation_id=conversation_id or uuid.uuid4().hex,
            parent_id=parent_id,
            reported=await window_for(self._setup.llm, options),
            seed=seed,
            started_at=now,  # what pause_after_seconds measures from (REQ-SEG-053)
        )
        # What the options ask of the provider, the adapter must do (REQ-SEG-048, -050).
        check_support(state.config, support_of(self._setup.llm, state.model))
        check_prefix_reuse(state.config, self._setup.llm)  # REQ-SEG-055
        stored = await self._setup.store.create(
            state, system=options.system, messages=seed, at=now, metadata=tags
        )
        self._cache.keep(stored)
        _log.info(
            "conversation_created",
            conversation_id=state.id,
            model=options.model,
            behavior=state.behavior.value,
            context_window=state.context_window,
            parent_id=parent_id,
        )
        return stored.state

    async def options(self, conversation_id: str) -> ConversationOptions:
        """The options the conversation was created with (as ``start_new_from`` passes them
        on: its window and bound on output as they were resolved)."""
        stored = await self._setup.store.load(conversation_id)
        return ConversationOptions.of(stored.state.config, stored.system)

    async def state(self, conversation_id: str) -> ConversationState:
        """The conversation's current state."""
        return (await self._setup.store.load(conversation_id)).state

    async def conversation(self, conversation_id: str) -> StoredConversation:
        """The conversation as stored: its state, system prompt, child (if it was continued in
        a new one), creation time and pending work."""
        return await self._setup.store.load(conversation_id)

    async def conversations(self) -> list[StoredConversation]:
        """Every conversation in the store, newest first (without their pending work)."""
        listed = await self._setup.store.list_conversations()
        return listed[::-1]

    async def list_conversations(
        self,
        *,
        metadata: Mapping[str, str] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> ConversationPage:
        """A page of conversations, newest first: those whose metadata holds every pair of
        ``metadata`` (one user's: ``{"user": "u-17"}``), at most ``limit`` (1 to 1,000), and
        ``next_cursor`` to pass as ``cursor`` for the next page (None on the last). Pages
        neither skip nor repeat while conversations are created, and cost the same however
        many there are (an index, not an offset)."""
        return await self._setup.store.list_page(metadata=metadata, limit=limit, cursor=cursor)

    async def set_metadata(
        self, conversation_id: str, metadata: Mapping[str, str]
    ) -> StoredConversation:
        """Replace the conversation's metadata (``create_conversation`` says what it may
        hold); the conversation as stored now."""
        return await self._setup.store.set_metadata(conversation_id, metadata)

    async def cancel(self, conversation_id: str) -> ConversationState:
        """Stop the turn now; a running ``send`` returns with the cancelled state.

        The cancel lands whether a request is in flight (that request is cancelled) or the drive
        is between two effects (waiting on the store): it never queues behind the turn it is
        meant to stop (see ``signals``). It also drops a pause asked for in the meantime
        (REQ-SEG-021). This call then takes the lock itself, and commits the cancel if no drive
        did; a turn another runtime runs is cancelled through the store (its answer is then
        stale), and that runtime, at its next look at the store (about a second, ``overtaken``),
        cancels its call there, so its ``send()`` returns then too."""
        self._signals.ask_cancel(conversation_id)
        state, _ = await self._driver.drive(conversation_id, None)
        return state

    async def delete_conversation(
        self, conversation_id: str, *, chain: bool = False, cancel: bool = False
    ) -> list[str]:
        """Delete the conversation: its transcript, log, snapshots, pending work, idempotency
        keys, claims and metadata, and its archives and saved tool outputs; the ids deleted.

        With ``chain=True`` its whole continuation chain (``lineage``) goes, in one
        transaction: a crash leaves all of it, and the same call again deletes all of it.
        Otherwise the conversations linked to it lose the link (the parent's ``child_id``, the
        child's ``parent_id``) and keep their own text. A conversation whose turn runs (here,
        or under another runtime's live claim) is refused with ``ConversationBusyError`` (a
        ``MessageRejectedError``, cause ``busy``) before anything is deleted, or cancelled
        first with ``cancel=True``. Another process sees the conversations whole or not at all
        (``ConversationNotFoundError``), and a crash leaves them whole or gone.
        """
        ids = (
            [link.id for link in await self.lineage(conversation_id)]
            if chain
            else [conversation_id]
        )
        for cid in ids:
            await self._settle(cid, cancel=cancel)
        return await self._erase(ids)

    async def _erase(
        self,
        ids: Sequence[str],
        *,
        idle_before: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Delete ``ids`` (``retention.erase``) holding their locks, refusing a turn another
        runtime runs; the neighbours' copies in the cache are read again next time (they
        lost their link to a conversation that went)."""
        async with contextlib.AsyncExitStack() as held:
            for cid in sorted(set(ids)):
                await held.enter_async_context(self._locks.holding(cid))
            neighbours: set[str] = set()
            for cid in ids:
                stored = await self._refuse_if_busy_elsewhere(cid)
                neighbours.update(n for n in (stored.state.parent_id, stored.child_id) if n)
            deleted = await erase(self._setup, ids, idle_before=idle_before, metadata=metadata)
            for cid in deleted:
                self._cache.drop(cid)
            for cid in neighbours.difference(deleted):
                self._cache.forget(cid)
        for cid in deleted:
            _log.info("conversation_deleted", conversation_id=cid)
        return deleted

    async def purge(
        self,
        *,
        older_than: float,
        metadata: Mapping[str, str] | None = None,
        vacuum: bool = False,
    ) -> int:
        """Delete the conversations nobody wrote to for ``older_than`` seconds (by the
        runtime's clock), those whose metadata holds every pair of ``metadata`` only; how many
        were deleted. Each goes as ``delete_conversation`` deletes one (alone, not its chain),
        its age and metadata checked again where it is deleted, with it locked against
        writers: one written to (or relabelled) since the purge listed it stays, and so does
        one whose turn runs (left for the next purge). ``vacuum=True``: then ``vacuum()``."""
        if isinstance(older_than, bool) or not isinstance(older_than, int | float):
            msg = f"older_than is a number of seconds, not {older_than!r}"
            raise TypeError(msg)
        if not older_than >= 0:
            msg = f"older_than is a number of seconds of inactivity, at least 0, not {older_than!r}"
            raise ValueError(msg)
        store = self._setup.store
        before = self._setup.clock() - older_than
        deleted = 0
        for cid in await store.inactive(before=before, metadata=metadata):
            try:
                await self._settle(cid, cancel=False)
                gone = await self._erase([cid], idle_before=before, metadata=metadata)
            except (ConversationBusyError, ConversationNotFoundError):
                continue  # running, or deleted meanwhile by someone else
            deleted += len(gone)
        if vacuum:
            await self.vacuum()
        return deleted

    async def vacuum(self) -> bool:
        """Rewrite the store's files without the text of deleted conversations, where the
        store keeps it after a deletion (PostgreSQL, until a ``VACUUM FULL``: each table locked
        while it is rewritten, see ``PostgresStore.vacuum``); False for a store that leaves
        none to rewrite (SQLite overwrites deleted text as it deletes, ``MemoryStore`` keeps
        no file). ``docs/data.md`` says what is left even then."""
        store = self._setup.store
        if not vacuums(store):
            return False
        await store.vacuum()
        _log.info("store_vacuumed")
        return True

    async def export_conversation(self, conversation_id: str) -> dict[str, Any]:
        """The conversation as one JSON-ready document (``docs/data.md``): its state, whole
        transcript, event log, snapshots, pending work, metadata, lineage ids and usage, read
        in one transaction (one snapshot of the store: every part agrees with the others,
        whatever other processes commit meanwhile). A conversation whose turn runs, here or
        under another runtime's live claim in that snapshot, is refused
        (``ConversationBusyError``): its state would be stale before the document is written;
        work left pending by a crash is exported, and performed by ``recover()`` once
        imported."""
        if self._locks.busy(conversation_id):
            raise ConversationBusyError(conversation_id, _BUSY_HERE)
        async with self._locks.holding(conversation_id):
            whole = await self._setup.store.whole(conversation_id)
            self._refuse_if_claimed(whole.stored)
        transitions = whole.transitions
        usage = usage_from_log(transitions)
        if usage is None:
            usage = usage_of_messages(list(whole.messages))
        try:
            chain = await self.lineage(conversation_id)
        except ConversationNotFoundError:
            chain = []  # deleted since: the document is what the store held when it was read
        exported = documents.Exported(
            stored=whole.stored,
            messages=[m.message for m in whole.messages],
            transitions=transitions,
            snapshots=whole.snapshots,
            lineage=chain,
            usage=dataclasses.replace(usage, models=self._models(whole.stored.state)),
            exported_at=self._setup.clock(),
        )
        return documents.document(exported)

    async def import_conversation(
        self,
        document: Mapping[str, Any] | bytes | bytearray | str,
        *,
        conversation_id: str | None = None,
    ) -> ConversationState:
        """Store the conversation an export holds, in this runtime's store, under
        ``conversation_id`` if given (else its own id): it continues exactly where it was.
        ``document`` is the export parsed, or its JSON text (``bytes`` or ``str``: parsed
        straight into segue's values, which holds far less memory for a large one).
        A document that is not one, or is broken, is refused (``InvalidDocumentError``, which
        says why and names the ``field``), an id taken with ``ConversationExistsError``;
        either way nothing is stored. Pending work it carried is performed by the next
        ``recover()``."""
        record = documents.record(document, conversation_id=conversation_id)
        del document  # its text, freed before the store writes (the caller passed it on)
        stored = await self._setup.store.restore(record)
        _log.info("conversation_imported", conversation_id=stored.state.id)
        return stored.state

    async def _settle(self, conversation_id: str, *, cancel: bool) -> None:
        """Refuse (or with ``cancel``, stop) a turn of the conversation that runs."""
        if not cancel:
            if self._locks.busy(conversation_id):
                raise ConversationBusyError(conversation_id, _BUSY_HERE)
            await self._refuse_if_busy_elsewhere(conversation_id)
            return
        await self.cancel(conversation_id)
        claims = self.claims
        await wait_for_claims(self._setup, conversation_id, owner=claims.owner, within=claims.lease)

    async def _refuse_if_busy_elsewhere(self, conversation_id: str) -> StoredConversation:
        """The conversation as stored, unless another runtime holds a live claim on its work
        (``ConversationBusyError``)."""
        stored = await self._setup.store.load(conversation_id)
        self._refuse_if_claimed(stored)
        return stored

    def _refuse_if_claimed(self, stored: StoredConversation) -> None:
        holder = live_holder(stored.pending)
        if holder is not None and holder != self.claims.owner:
            reason = f"{holder} runs its turn; cancel it (cancel=True) or wait for it"
            raise ConversationBusyError(stored.state.id, reason)

    async def messages(self, conversation_id: str) -> list[StoredMessage]:
        """The whole transcript (every session and generation), in order."""
        return await self._setup.store.messages(conversation_id)

    async def last_reply(self, conversation_id: str) -> str | None:
        """The text of the conversation's latest assistant reply, or None if it has none."""
        store = self._setup.store
        after = (await store.load(conversation_id)).last_seq
        while after > 0:
            start = max(0, after - _REPLY_SCAN)
            messages = await store.messages(conversation_id, after_seq=start)
            for message in reversed(messages[: after - start]):
                if message.kind == "assistant":
                    return message.text
            after = start
        return None

    async def lineage(self, conversation_id: str) -> list[Link]:
        """The continuation chain ``conversation_id`` belongs to, root first, each link with
        its place (``label``: ``root``, ``2``, ``3``...) and the summary it ended with."""
        return await lineage(self._setup.store, conversation_id)

    async def usage(self, conversation_id: str) -> UsageReport:
        """What the conversation's requests cost, by purpose (turn, continuation, checkpoint,
        compaction) and by session: sums of the per-request usage of every answer, read from
        the event log (an answer that was not kept, such as a refused summary asked for again,
        was paid for too)."""
        store = self._setup.store
        stored = await store.load(conversation_id)
        logged = usage_from_log(await store.transitions(conversation_id))
        if logged is None:
            logged = usage_of_messages(await store.messages(conversation_id))
        return dataclasses.replace(logged, models=self._models(stored.state))

    @staticmethod
    def _models(state: ConversationState) -> dict[str, str]:
        """The model each purpose of a usage report was asked of."""
        config = state.config
        limit_model = config.summary_model or config.model
        return {
            "turn": config.model,
            **dict.fromkeys(LIMIT_PURPOSES, limit_model),
            PROVIDER_COMPACTION: config.model,
        }
