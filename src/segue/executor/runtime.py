"""The runtime: what a chat backend calls to run conversations.

``Runtime`` is the facade: create a conversation, send or stream a message, read the state and
the transcript, cancel, pause, resume, continue in a new conversation. It holds the parts that
do the work and owns none of their state: ``Conversations`` (creating, reading, deleting
conversations; the runtime passes those calls on to it), ``Continuing`` (a summary made again,
a compaction taken back, a child started), ``Setup`` (the store, the model, the tools), ``Locks``
(one drive per conversation), ``Signals`` (cancel and pause), ``ViewCache`` (the copy last seen
and the model's view), ``Commits`` (every store call, under one retry policy), ``Claims`` (work
shared with other processes), ``Driver`` (the loop that commits and performs), ``Overtaken`` (work
here that another process cancelled through the store), ``UpdateBus`` and ``Feeds`` (what
watchers hear). ``docs/design.md`` draws them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any, Final, Unpack

from segue.executor._log import get_logger
from segue.executor.bus import Committed, Sink, UpdateBus, Watch
from segue.executor.cache import ViewCache
from segue.executor.claims import DEFAULT_LEASE, Claims
from segue.executor.commits import Commits
from segue.executor.continuing import AUTO_CONTINUE_PROMPT, Continuing
from segue.executor.conversations import Conversations
from segue.executor.delegated import delegated
from segue.executor.drive import Driver, Listener
from segue.executor.errors import ConversationBusyError, InvalidMessageError, NotPausedError
from segue.executor.feed import Feeds
from segue.executor.inputs import check_content, check_key, raise_if_rejected, user_message
from segue.executor.locks import Locks
from segue.executor.model_port import LlmModel
from segue.executor.overtaken import Overtaken
from segue.executor.pausing import PauseRequest
from segue.executor.perform import Performer
from segue.executor.requests import Requests
from segue.executor.setup import RuntimeSettings, Setup
from segue.executor.signals import Signals
from segue.executor.snapshots import context_of
from segue.executor.store_port import Store, reopens
from segue.executor.telemetry import DEFAULT_STORE_METRICS_RATE
from segue.executor.telemetry_setup import for_settings
from segue.executor.tools import Tool, ToolRegistry
from segue.executor.transcript import DEFAULT_KEEP_RECENT
from segue.executor.updates import DoneUpdate, Update
from segue.statemachine import (
    ContentBlock,
    ConversationState,
    ManualContinuation,
    ResumeRequested,
    UserMessage,
)

_log = get_logger("segue.runtime")
_CONVERSATIONS: Final = "_conversations"
_CONTINUING: Final = "_continuing"


class Runtime:
    """Runs conversations: ``send`` a message and get back the state once it waits for input.

    Several runtimes (processes, machines) may share one store. Each model request or tool run
    is claimed in the store by the runtime that performs it, for ``lease`` seconds, renewed
    while it runs: no other runtime performs it meanwhile, and one that needs its outcome waits
    for it. Work whose runtime died is taken over once the lease ends (at once when it was a
    process on this host). See ``RuntimeSettings`` for the rest of what it is set up with.
    """

    def __init__(
        self,
        *,
        store: Store,
        llm: LlmModel,
        tools: ToolRegistry | Iterable[Tool] | None = None,
        **settings: Unpack[RuntimeSettings],
    ) -> None:
        archive_dir = settings.get("archive_dir")
        self._setup = setup = Setup(
            store=store,
            llm=llm,
            tools=tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools or ()),
            archive_dir=Path(archive_dir) if archive_dir is not None else None,
            keep_recent=settings.get("keep_recent", DEFAULT_KEEP_RECENT),
            max_tokens=settings.get("max_tokens"),
            snapshot_context=settings.get("snapshot_context"),
            clock=settings.get("clock", time.time),
            sleep=settings.get("sleep", asyncio.sleep),
            telemetry=for_settings(
                tracer_provider=settings.get("tracer_provider"),
                meter_provider=settings.get("meter_provider"),
                capture_content=settings.get("capture_content", False),
                store_metrics_rate=settings.get("store_metrics_rate", DEFAULT_STORE_METRICS_RATE),
            ),
        )
        self.claims = Claims(
            store=store,
            owner=settings.get("owner"),
            lease=settings.get("lease", DEFAULT_LEASE),
        )
        """This runtime's claims on pending work."""
        self._locks = Locks()
        self._signals = Signals()
        self._cache = ViewCache(store)
        feeds: Feeds | None = None
        self._bus = UpdateBus(unwatched=lambda cid: feeds.stop(cid) if feeds else None)
        self._feeds = feeds = Feeds(store=store, bus=self._bus)
        requests = Requests(setup, self._cache)
        self._commits = Commits(
            setup=setup, cache=self._cache, claims=self.claims, observers=(feeds, self._bus)
        )
        self._performer = performer = Performer(
            setup, requests=requests, cache=self._cache, bus=self._bus
        )
        self._overtaken = Overtaken(store=store, owner=self.claims.owner)
        self._driver = Driver(
            telemetry=setup.telemetry,
            locks=self._locks,
            signals=self._signals,
            commits=self._commits,
            claims=self.claims,
            performer=performer,
            requests=requests,
            bus=self._bus,
            overtaken=self._overtaken,
        )
        self._turns: set[asyncio.Task[None]] = set()
        """Streamed turns running on their own, so a consumer that leaves does not stop them."""
        self._conversations = Conversations(
            setup=setup,
            cache=self._cache,
            locks=self._locks,
            signals=self._signals,
            driver=self._driver,
            claims=self.claims,
        )
        self._continuing = Continuing(
            setup=setup,
            locks=self._locks,
            driver=self._driver,
            performer=performer,
            conversations=self._conversations,
            send=self.send,
        )

    # ------------------------------------------------------------------ setup

    @property
    def store(self) -> Store:
        """Where conversations are kept (given when the runtime is made, for its lifetime)."""
        return self._setup.store

    @property
    def llm(self) -> LlmModel:
        """The model adapter (assigning another takes effect at the next request)."""
        return self._setup.llm

    @llm.setter
    def llm(self, llm: LlmModel) -> None:
        self._setup.llm = llm

    @property
    def tools(self) -> ToolRegistry:
        """The tools ordinary turns may call."""
        return self._setup.tools

    @property
    def owner(self) -> str:
        """Who this runtime is in the store's claims (``claims.default_owner`` unless given)."""
        return self.claims.owner

    @property
    def lease(self) -> float:
        """Seconds a claim of this runtime lasts unless renewed (``claims.DEFAULT_LEASE``)."""
        return self.claims.lease

    @lease.setter
    def lease(self, seconds: float) -> None:
        if not seconds > 0:
            msg = f"lease must be a positive number of seconds, not {seconds!r}"
            raise ValueError(msg)
        self.claims.lease = seconds

    async def __aenter__(self) -> Runtime:
        await self.reopen()
        await self.recover()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Cancel what is in flight and close the store (what was pending stays in the outbox,
        performed again by the next ``recover()``)."""
        self._feeds.stop_all()
        self._signals.stop_all()
        claims = self.claims.in_flight()
        for turn in list(self._turns):
            turn.cancel()
        if self._turns:
            await asyncio.gather(*self._turns, return_exceptions=True)
        await self._overtaken.close()
        # Let go of the work cancelled here, so another runtime takes it at once rather than
        # when its lease ends.
        for cid, effect_id in claims.items():
            await self.claims.let_go(cid, (effect_id,))
        await self._setup.store.close()

    async def reopen(self) -> None:
        """Use the runtime again after ``close()`` (``async with runtime:`` a second time does
        it): the store is opened again when it can be (``Reopenable``, as segue's own stores
        are; a no-op while it is open). A store that cannot keeps raising as its ``close()``
        left it."""
        store = self._setup.store
        if reopens(store):
            await store.reopen()

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(conversation_id, effect)`` for every effect performed (UI hooks)."""
        self._driver.listen(listener)

    async def recover(self) -> None:
        """Perform what a crash left pending, for every conversation with a non-empty outbox."""
        ids = await self._setup.store.with_pending()
        if ids:
            _log.info("recovering", conversations=len(ids))
            await asyncio.gather(*(self._driver.drive(cid, None) for cid in ids))

    # ------------------------------------------------------------------ conversations
    # Passed on to the runtime's ``Conversations``, whose docstrings say what each does.

    create_conversation = delegated(_CONVERSATIONS, Conversations.create_conversation)
    """Create and store a new idle conversation (``Conversations.create_conversation``)."""
    options = delegated(_CONVERSATIONS, Conversations.options)
    """The options the conversation was created with (``Conversations.options``)."""
    state = delegated(_CONVERSATIONS, Conversations.state)
    """The conversation's current state (``Conversations.state``)."""
    conversation = delegated(_CONVERSATIONS, Conversations.conversation)
    """The conversation as stored: its state, system prompt, child, creation time and pending
    work (``Conversations.conversation``)."""
    conversations = delegated(_CONVERSATIONS, Conversations.conversations)
    """Every conversation in the store, newest first (``Conversations.conversations``)."""
    list_conversations = delegated(_CONVERSATIONS, Conversations.list_conversations)
    """A page of conversations, newest first (``Conversations.list_conversations``)."""
    set_metadata = delegated(_CONVERSATIONS, Conversations.set_metadata)
    """Replace the conversation's metadata (``Conversations.set_metadata``)."""
    cancel = delegated(_CONVERSATIONS, Conversations.cancel)
    """Stop the turn now, wherever it runs (``Conversations.cancel``)."""
    delete_conversation = delegated(_CONVERSATIONS, Conversations.delete_conversation)
    """Delete the conversation, or its whole chain (``Conversations.delete_conversation``)."""
    purge = delegated(_CONVERSATIONS, Conversations.purge)
    """Delete the conversations nobody wrote to for a while (``Conversations.purge``)."""
    vacuum = delegated(_CONVERSATIONS, Conversations.vacuum)
    """Rewrite the store's files without deleted text (``Conversations.vacuum``)."""
    export_conversation = delegated(_CONVERSATIONS, Conversations.export_conversation)
    """The conversation as one JSON-ready document (``Conversations.export_conversation``)."""
    import_conversation = delegated(_CONVERSATIONS, Conversations.import_conversation)
    """Store the conversation an export holds (``Conversations.import_conversation``)."""
    messages = delegated(_CONVERSATIONS, Conversations.messages)
    """The whole transcript, in order (``Conversations.messages``)."""
    last_reply = delegated(_CONVERSATIONS, Conversations.last_reply)
    """The text of the latest assistant reply, or None (``Conversations.last_reply``)."""
    lineage = delegated(_CONVERSATIONS, Conversations.lineage)
    """The continuation chain the conversation belongs to (``Conversations.lineage``)."""
    usage = delegated(_CONVERSATIONS, Conversations.usage)
    """What the conversation's requests cost, by purpose and session (``Conversations.usage``)."""

    # ------------------------------------------------------------------ continuing
    # Passed on to the runtime's ``Continuing``, whose docstrings say what each does.

    redo_summary = delegated(_CONTINUING, Continuing.redo_summary)
    """Make the latest compaction's summary again (``Continuing.redo_summary``)."""
    undo_compaction = delegated(_CONTINUING, Continuing.undo_compaction)
    """Take the latest compaction back (``Continuing.undo_compaction``)."""
    start_new_from = delegated(_CONTINUING, Continuing.start_new_from)
    """The one child of an exhausted or failed conversation (``Continuing.start_new_from``)."""

    # ------------------------------------------------------------------ turns

    async def send(
        self,
        conversation_id: str,
        text: str | Sequence[ContentBlock | dict[str, Any]],
        *,
        wait: bool = True,
        idempotency_key: str | None = None,
        pinned: bool = False,
    ) -> ConversationState:
        """Record a user message and run until the conversation waits for input.

        ``text`` is a string, or content blocks (text, images, documents; values or the Messages
        API's dicts) for a message that carries more than text.

        ``last_reply()`` then gives the text the model answered with. Every refusal is a
        ``MessageRejectedError`` (``errors`` draws the tree): ``InvalidMessageError`` (also a
        ``ValueError``) for an empty message, text that cannot be encoded or content the
        model's API cannot take (the adapter's reason); ``ConversationBusyError``,
        ``ConversationPausedError``, ``ConversationFailedError``,
        ``ConversationExhaustedError`` (read-only) or ``MessageTooLargeError`` when the
        conversation does not take it. ``TypeError`` for text that is not a ``str``. In each
        case nothing is stored and nothing is sent.

        A message sent while a turn of the conversation runs (in this runtime or another one
        sharing the store) waits for that turn and is then taken; with ``wait=False`` it raises
        ``ConversationBusyError`` (cause ``busy``, naming the runtime) at once instead, as a
        server answering a second browser tab wants.

        ``idempotency_key``: a message sent again with the key of one already stored in the
        conversation (a client retrying after a lost reply) is not stored again; the call
        returns once that message's turn is over, as the first call would have.

        ``pinned``: the message is never summarised away: every fresh start (a checkpoint
        restart, a compaction, a resume, a seeded new conversation) still sends it, verbatim.
        Pinned messages may hold a quarter of the window together; one that would pass that is
        refused (``MessageTooLargeError``, cause ``too_large``), nothing stored.
        """
        event = self._message(conversation_id, text, pinned=pinned, key=idempotency_key)
        self._refuse_if_busy(conversation_id, wait=wait)
        state, effects = await self._driver.drive(
            conversation_id, event, wait=wait, key=idempotency_key
        )
        raise_if_rejected(conversation_id, state, effects)
        return state

    async def stream(
        self,
        conversation_id: str,
        text: str | Sequence[ContentBlock | dict[str, Any]],
        *,
        wait: bool = True,
        idempotency_key: str | None = None,
        pinned: bool = False,
    ) -> AsyncIterator[Update]:
        """The same turn as ``send()``, yielding ``Update`` values as they happen; ``done`` last.

        Refusals raise before the first update, as ``send()`` raises them. The turn runs in its
        own task: a consumer that stops iterating (a web client that disconnects) does not stop
        it, the turn finishes and is stored; ``cancel()`` stops it. ``wait``,
        ``idempotency_key`` and ``pinned`` are as for ``send()``.
        """
        event = self._message(conversation_id, text, pinned=pinned, key=idempotency_key)
        self._refuse_if_busy(conversation_id, wait=wait)
        sink = Sink(conversation_id)
        self._locks.schedule(conversation_id)
        turn = asyncio.ensure_future(
            self._driver.streamed(sink, event, wait=wait, key=idempotency_key)
        )
        self._turns.add(turn)
        turn.add_done_callback(self._turns.discard)
        try:
            while True:
                item = await sink.get()
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Committed):
                    raise_if_rejected(conversation_id, item.state, item.effects)
                    continue
                yield item
                if isinstance(item, DoneUpdate):
                    return
        finally:
            sink.closed = True

    def _message(
        self,
        conversation_id: str,
        text: str | Sequence[ContentBlock | dict[str, Any]],
        *,
        pinned: bool,
        key: str | None,
    ) -> UserMessage:
        """The message to send, or the caller's mistake (``InvalidMessageError``, naming the
        conversation it was sent to)."""
        try:
            event = user_message(text, pinned=pinned)
            check_content(self._setup.llm, event)
            check_key(key)
        except InvalidMessageError as error:
            error.conversation_id = conversation_id
            raise
        return event

    def _refuse_if_busy(self, conversation_id: str, *, wait: bool) -> None:
        """With ``wait=False``, refuse a message while this runtime holds the conversation.

        Checked and followed by the drive's lock request in the same step of the event loop,
        so no other turn can slip in between."""
        if not wait and self._locks.busy(conversation_id):
            reason = "a turn is running; wait for it to end (or cancel it) and send again"
            raise ConversationBusyError(conversation_id, reason)

    def watch(self, conversation_id: str) -> Watch:
        """Every update of the conversation from this call on (a second browser tab, a
        reconnecting client), until the consumer calls ``aclose()`` or drops it; ``async with
        rt.watch(id) as updates:`` closes it for you.

        Turns this runtime drives are heard as they happen (text deltas included). Turns that
        another runtime sharing the store drives (another process, another machine) are read
        back from the store while the watch lasts: their messages, tools, meter, warnings and
        endings arrive as the same updates, the reply whole rather than in deltas, within a
        fraction of a second, from when the watch starts reading (its first read, or ``await
        watch.start()``: a caller that reads the conversation next awaits it first). A watcher
        that falls too far behind gets ``UpdatesLostError`` and should read the store before
        watching again. An unknown id raises ``ConversationNotFoundError`` on the first read
        (or the start); so does a conversation another process deletes while it is watched,
        once what was delivered is read."""
        return self._bus.watch(conversation_id, lambda: self._feeds.start(conversation_id))

    # ------------------------------------------------------------------ control

    async def continue_manually(
        self, conversation_id: str, focus: str | None = None
    ) -> ConversationState:
        """Take the exhaustion path now (REQ-BED-023); a no-op unless the conversation is idle.

        ``focus`` says what the summary (checkpoint, compaction) must keep above all; it goes
        into that request's instruction (REQ-SEG-041), as Claude Code's ``/compact <focus>``.
        A request or tools in flight in this runtime make it a no-op at once: it never waits
        for the turn to end and then ends the conversation the user was still using.
        """
        event = ManualContinuation(focus=focus)  # a blank focus is refused here, as a ValueError
        if self._locks.is_held(conversation_id):
            return await self.state(conversation_id)
        state, _ = await self._driver.drive(conversation_id, event)
        return state

    async def request_pause(self, conversation_id: str, reason: str = "") -> PauseRequest:
        """Ask the conversation to pause at its turn's next boundary, wherever the turn runs,
        and return the request: ``recorded()``, ``taken(timeout)``, ``forced()``, ``outcome()``
        (see ``pausing``). ``pause()`` is the common use of it."""
        request = PauseRequest(
            conversation_id,
            reason,
            turn=await self._conversations.turn(conversation_id),
            owner=self.owner,
            store=self._setup.store,
            driver=self._driver,
            locks=self._locks,
            signals=self._signals,
            cancel=self._conversations.cancel,
        )
        request.start()
        return request

    async def pause(
        self,
        conversation_id: str,
        reason: str = "",
        *,
        timeout: float | None = None,  # noqa: ASYNC109  # a bound on the wait, then a forced pause
    ) -> ConversationState:
        """Pause at the next turn boundary (at once when idle) and store a snapshot.

        While a turn runs in this runtime the pause is taken at its next boundary, and this
        returns at once; while another runtime sharing the store runs it, the request goes
        through the store, that runtime pauses at the boundary, and this waits for it. With
        ``timeout``, either waits at most ``timeout`` seconds once the request is recorded (a
        commit is never cut short), then ends the turn (what was in
        flight is recorded as cancelled, never lost) and pauses: a forced pause. Where another
        runtime ran the turn, its call is cancelled there too, and its ``send()`` or
        ``stream()`` returns the paused state (within about a second: ``overtaken``).
        """
        request = await self.request_pause(conversation_id, reason)
        return await request.outcome(timeout)

    async def resume(self, conversation_id: str, prompt: str | None = None) -> ConversationState:
        """Resume a paused conversation in a new session with the compiled resume context: from
        its snapshot as stored (what the session did, the application's context), and what the
        ``snapshot_context`` says now (a git HEAD that moved is stated).

        ``NotPausedError`` when the conversation is not paused (nothing is changed)."""
        setup = self._setup
        phase = (await self.state(conversation_id)).phase.kind
        if phase != "paused":
            raise NotPausedError(conversation_id, phase)
        snapshots = await setup.store.snapshots(conversation_id)
        current = await context_of(setup.snapshot_context, conversation_id)
        event = ResumeRequested(
            prompt=prompt,
            snapshot=snapshots[-1] if snapshots else None,
            current_context=current,
            at=setup.clock(),  # the pause triggers count from here (REQ-SEG-054)
        )
        state, _ = await self._driver.drive(conversation_id, event)
        return state


__all__ = ["AUTO_CONTINUE_PROMPT", "Runtime"]  # the prompt is ``continuing``'s, importable here too
