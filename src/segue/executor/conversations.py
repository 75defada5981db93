"""What a runtime knows of its conversations: creating them, reading them, continuing them.

The conversation-level half of ``Runtime`` (the other half runs turns and steers them): each
method here reads or writes whole conversations through the store, and none of them drives a
turn. ``Runtime`` is built on it; an application calls these as ``rt.create_conversation(...)``,
``rt.state(...)`` and so on.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any, Final

from segue.executor._log import get_logger
from segue.executor.cache import ViewCache
from segue.executor.chains import LIMIT_PURPOSES, Link, UsageReport, lineage, usage_from_log
from segue.executor.chains import usage_report as usage_of_messages
from segue.executor.locks import Locks
from segue.executor.setup import Setup
from segue.executor.store_port import StoredConversation, StoredMessage
from segue.statemachine import ConversationState, Message, estimate_tokens, model_info
from segue.statemachine.options import ConversationOptions

_log = get_logger("segue.runtime")
DEFAULT_OUTPUT_TOKENS: Final = 8192
"""A conversation's bound on one answer unless it says otherwise: room for a long reply, while a
prompt at the continuation threshold plus this still fits the smallest window."""
_REPLY_SCAN: Final = 64
"""Messages read per step when ``last_reply`` looks back for the latest assistant message."""


class Conversations:
    """Creating and reading conversations (``Runtime`` is one; see its docstring)."""

    _setup: Setup
    _cache: ViewCache
    _locks: Locks

    async def create_conversation(
        self,
        options: ConversationOptions | None = None,
        /,
        *,
        conversation_id: str | None = None,
        parent_id: str | None = None,
        seed: Sequence[Message] = (),
        **fields: Any,
    ) -> ConversationState:
        """Create and store a new idle conversation with ``options`` (``ConversationOptions``),
        or with its fields as keywords (``model=``, ``behavior=``, ``system=``...): invalid
        values raise ``pydantic.ValidationError`` before anything is stored.

        The window is ``context_window`` when given (a proxy or compatible server often has no
        model endpoint), else what the provider reports, else segue's table of models (with a
        warning in the log: a lookup that fails never fails the conversation). Each answer may
        hold ``max_output_tokens`` (default: ``DEFAULT_OUTPUT_TOKENS``, or room for the thinking
        budget, within the model's limit). ``seed``: messages the conversation starts with (a
        summary, pinned messages: what a continued conversation carries over).
        """
        if options is None:
            options = ConversationOptions(**fields)
        elif fields:
            options = options.model_copy(update=fields)
            options = ConversationOptions.model_validate(options.model_dump())
        window = options.context_window or await self._window(options.model)
        output = options.max_output_tokens
        if output is None:
            wanted = DEFAULT_OUTPUT_TOKENS
            if options.thinking_budget is not None:
                wanted = max(wanted, options.thinking_budget + DEFAULT_OUTPUT_TOKENS)
            output = min(model_info(options.model).max_output_tokens, wanted)
        config = options.config(
            conversation_id=conversation_id or uuid.uuid4().hex,
            parent_id=parent_id,
            context_window=window,
            max_output_tokens=output,
        )
        seeded = sum(estimate_tokens(message.text) for message in seed)
        pinned = sum(estimate_tokens(m.text) for m in seed if m.pinned)
        state = ConversationState(
            config=config, pending_tokens=config.system_tokens + seeded, pinned_tokens=pinned
        )
        stored = await self._setup.store.create(
            state, system=options.system, messages=seed, at=self._setup.clock()
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

    async def _window(self, model: str) -> int:
        """The model's window as the provider reports it, else segue's table (logged)."""
        window = await self._setup.llm.context_window(model)
        if window is not None:
            return window
        info = model_info(model)
        _log.warning(
            "model_window_unknown",
            model=model,
            assumed_window=info.context_window,
            known_model=info.known,
        )
        return info.context_window

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
        config = stored.state.config
        limit_model = config.summary_model or config.model
        models = {"turn": config.model, **dict.fromkeys(LIMIT_PURPOSES, limit_model)}
        logged = usage_from_log(await store.transitions(conversation_id))
        if logged is None:
            logged = usage_of_messages(await store.messages(conversation_id))
        return dataclasses.replace(logged, models=models)
