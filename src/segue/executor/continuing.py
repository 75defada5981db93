"""What comes after a compaction or at the limit: a summary made again, a compaction taken back
(REQ-SEG-063 to 065), and the child an exhausted or failed conversation continues in.

``Runtime`` holds one ``Continuing`` and passes ``redo_summary``, ``undo_compaction`` and
``start_new_from`` on to it. Each reads the transcript (``redo``, ``chains``) to work out the
event, and drives it through the runtime's driver like any other; none runs while a turn does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from segue.executor.chains import seed_of
from segue.executor.conversations import Conversations
from segue.executor.drive import Driver
from segue.executor.errors import (
    CompactionDoesNotFitError,
    ConversationBusyError,
    LlmCallError,
    NoCompactionError,
)
from segue.executor.locks import Locks
from segue.executor.perform import Performer
from segue.executor.redo import LatestCompaction, copies, estimated, latest_compaction
from segue.executor.setup import Setup
from segue.statemachine import (
    CompactionUndoRequested,
    ContextExhaustionBehavior,
    ConversationState,
    SummaryRedoRequested,
)
from segue.statemachine.options import ConversationOptions
from segue.statemachine.rules import BUSY_PHASES

AUTO_CONTINUE_PROMPT: Final = (
    "Continue from the summary of our earlier conversation above: pick up where we left off."
)
"""The first message of a child started with ``auto_continue``."""
_BUSY: Final = "a turn is running; wait for it to end (or cancel it) and send again"


class Continuing:
    """Summaries made again, compactions taken back, children started (``Runtime`` holds one;
    each method is the runtime's of the same name)."""

    __slots__ = ("_conversations", "_driver", "_locks", "_performer", "_send", "_setup")

    def __init__(
        self,
        *,
        setup: Setup,
        locks: Locks,
        driver: Driver,
        performer: Performer,
        conversations: Conversations,
        send: Callable[[str, str], Awaitable[ConversationState]],
    ) -> None:
        self._setup = setup
        self._locks = locks
        self._driver = driver
        self._performer = performer
        self._conversations = conversations
        self._send = send
        """How the first turn of an ``auto_continue`` child is run (``Runtime.send``)."""

    def _refuse_if_busy(self, conversation_id: str) -> None:
        """Refuse while this runtime runs, waits to run, or has scheduled a turn of it."""
        if self._locks.busy(conversation_id):
            raise ConversationBusyError(conversation_id, _BUSY)

    async def redo_summary(
        self,
        conversation_id: str,
        *,
        focus: str | None = None,
        summary_prompt: str | None = None,
        summary_model: str | None = None,
    ) -> ConversationState:
        """Make the latest compaction's summary again (REQ-SEG-063), under COMPACT_IN_PLACE:
        from the generation it replaced, with ``focus`` (what it must keep above all) and, for
        this summary only, ``summary_prompt`` and ``summary_model`` in place of the
        conversation's. The new summary takes the old one's place in a new generation, with the
        old one's verbatim tail and everything said since; the old one stays in the
        transcript as a version, its tokens counted in ``usage()`` beside the new one's. A
        read-only conversation (THRESHOLD_BASED_CONTINUATION at its limit) gets its
        continuation summary made again the same way, before a child is started from it:
        the new one is what ``start_new_from`` seeds the child with; once a child exists it is
        refused (``NoCompactionError``), and a model that fails raises its ``LlmCallError``,
        the old summary kept.

        ``ConversationBusyError`` while a turn runs; ``NoCompactionError`` when there is no
        compaction to make again (none in this session, the latest taken back, another
        behaviour). A model that fails to answer leaves the old summary in place (the state's
        ``generation`` is then unchanged). Blank or oversized arguments are ``ValueError``s."""
        event = SummaryRedoRequested(
            focus=focus, summary_prompt=summary_prompt, summary_model=summary_model
        )
        if (await self._conversations.state(conversation_id)).phase.kind == "context_exhausted":
            return await self._redo_continuation(conversation_id, event)
        state = await self._idle_for_redo(conversation_id)
        await self._latest_compaction(conversation_id, state)
        state, _ = await self._driver.drive(conversation_id, event)
        return state

    async def _redo_continuation(
        self, conversation_id: str, asked: SummaryRedoRequested
    ) -> ConversationState:
        """A read-only conversation's continuation summary made again, before a child is
        started from it (REQ-SEG-063). Asked for while holding the conversation (a child is
        not started from it meanwhile, in this runtime); one that could not be had changes
        nothing and raises the model's error."""
        async with self._locks.holding(conversation_id):
            stored = await self._setup.store.load(conversation_id)
            if stored.child_id is not None:
                raise NoCompactionError(
                    conversation_id,
                    f"it goes on in {stored.child_id}, which was started from its summary: "
                    "that summary stays (make the child's own summary again instead)",
                )
            if stored.state.phase.kind != "context_exhausted":
                raise NoCompactionError(conversation_id, "it is no longer read-only")
            answer = await self._performer.continuation_again(
                stored,
                focus=asked.focus,
                summary_prompt=asked.summary_prompt,
                summary_model=asked.summary_model,
            )
        if isinstance(answer, LlmCallError):
            raise answer
        state, _ = await self._driver.drive(conversation_id, answer)
        return state

    async def undo_compaction(self, conversation_id: str) -> ConversationState:
        """Take the latest compaction back (REQ-SEG-064): a new generation restores the view
        from before it, with everything said since, when that fits below the continuation
        threshold now (after a move to a model with a larger window, say). Nothing is deleted:
        the summary and its generation stay in the transcript, and a later compaction can be
        taken back or made again as any other. COMPACT_IN_PLACE only.

        ``ConversationBusyError`` while a turn runs; ``NoCompactionError`` when there is none
        to take back; ``CompactionDoesNotFitError`` with the figures (tokens needed, the
        threshold) when it does not fit."""
        state = await self._idle_for_redo(conversation_id)
        stored = await self._setup.store.load(conversation_id)
        latest = await self._latest_compaction(conversation_id, state)
        restored = copies(latest.restored, state.session, latest.summarised)
        needed = estimated(stored.system, [message for _, message in latest.restored])
        threshold = state.config.continuation_tokens
        if needed >= threshold:
            raise CompactionDoesNotFitError(conversation_id, needed, threshold)
        event = CompactionUndoRequested(messages=restored, tokens=needed)
        state, _ = await self._driver.drive(conversation_id, event)
        return state

    async def _idle_for_redo(self, conversation_id: str) -> ConversationState:
        """The conversation's state when a redo or an undo may run on it: never while a turn
        does (REQ-SEG-065), here or in another runtime; only idle, under COMPACT_IN_PLACE."""
        self._refuse_if_busy(conversation_id)
        state = await self._conversations.state(conversation_id)
        if state.phase.kind in BUSY_PHASES:
            raise ConversationBusyError(
                conversation_id, f"a turn is running ({state.phase.kind}); wait for it to end"
            )
        if state.phase.kind != "idle":
            raise NoCompactionError(
                conversation_id, f"the conversation is {state.phase.kind.replace('_', ' ')}"
            )
        behavior = state.config.behavior
        if behavior is not ContextExhaustionBehavior.COMPACT_IN_PLACE:
            raise NoCompactionError(
                conversation_id,
                f"a compaction is made again or taken back only under compact_in_place, "
                f"and it is {behavior.value}",
            )
        return state

    async def _latest_compaction(
        self, conversation_id: str, state: ConversationState
    ) -> LatestCompaction:
        store = self._setup.store
        latest = latest_compaction(
            await store.messages(conversation_id), state.session, state.generation
        )
        if latest is None:
            raise NoCompactionError(
                conversation_id,
                "its current generation was not made by a compaction (none yet in this "
                "session, or the latest was taken back)",
            )
        return latest

    async def start_new_from(
        self,
        conversation_id: str,
        *,
        seed_with_summary: bool = True,
        auto_continue: bool = False,
        recent_turns: int = 0,
    ) -> ConversationState:
        """The one child of an exhausted or failed conversation (asking twice returns the same
        child), with the parent's options (``ConversationOptions``) whole.

        An exhausted conversation's child is seeded with its continuation summary; one whose
        context ran out otherwise (a sub-agent, a checkpoint that could not fit) with the last
        summary or checkpoint it wrote, if any; one that failed for another reason (an error
        the adapter did not recognise) with nothing but what is asked for here. Pinned messages
        always go on; ``recent_turns`` carries the last exchanges too, as plain text (the
        user's choice where there is no summary). ``auto_continue`` starts the child's first
        turn with the summary at once, so the user lands in a conversation that already
        answered (only the first time: asking again returns the child as it is).
        """
        if auto_continue and not seed_with_summary:
            msg = "auto_continue needs the summary to continue from (seed_with_summary=True)"
            raise ValueError(msg)
        store = self._setup.store
        async with self._locks.holding(conversation_id):
            parent = await store.load(conversation_id)
            if parent.child_id is not None:
                return (await store.load(parent.child_id)).state
            summary, seed = await seed_of(
                store, parent, with_summary=seed_with_summary, recent_turns=recent_turns
            )
            options = ConversationOptions.of(parent.state.config, parent.system)
            child = await self._conversations.create_conversation(
                options, parent_id=conversation_id, seed=seed, metadata=parent.metadata
            )
            winner = await store.link_child(conversation_id, child.id)
        if winner != child.id or not auto_continue or summary is None:
            return (await store.load(winner)).state
        return await self._send(winner, AUTO_CONTINUE_PROMPT)
