"""What the model is sent: the ``LlmRequest`` of each effect that asks it, built in one place.

A request is the conversation's view (the current session and generation of the transcript,
folded by the view cache), the system prompt (with a resumed session's compiled context), the
tools of an ordinary turn, and the instruction of a request segue sends on its own: the limit's
(continuation summary, checkpoint, compaction summary: the conversation's ``summary_prompt`` in
place of segue's, the user's focus after it, segue's other wording when the first answer was
empty or a refusal) or a turn's last round's. Pre-flight's exact count is the request the next
message would make, counted by the model (``counted``).

A conversation whose provider compacts (REQ-SEG-048) asks it to in every turn: at the
continuation threshold (at least the provider's minimum), with the ``summary_prompt`` as the
provider's instructions, pausing after the compaction when pinned messages must follow it. Its
view starts with the provider's compaction, which the provider reads first and which stands in
for everything before it: the pinned messages come after it. A manual trigger asks the provider
to compact now (``on_demand``) when it can. The conversation's context edits go with every turn
(REQ-SEG-050).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final

from segue.effects import (
    RequestCheckpoint,
    RequestCompaction,
    RequestContinuation,
    RequestLlm,
)
from segue.executor._log import get_logger
from segue.executor.cache import ViewCache
from segue.executor.errors import UnsupportedOptionError
from segue.executor.instructions import (
    ALTERNATE_COMPACTION_INSTRUCTION,
    ALTERNATE_CONTINUATION_INSTRUCTION,
    COMPACTION_INSTRUCTION,
    CONTINUATION_INSTRUCTION,
    FINAL_ANSWER_INSTRUCTION,
    FOCUS_NOTE,
    at_the_limit,
    limit_instruction,
)
from segue.executor.model_port import (
    NO_CONTEXT_SUPPORT,
    CompactionAsk,
    ContextManaging,
    ContextSupport,
    LlmRequest,
    Purpose,
    reuses_prefix,
)
from segue.executor.setup import Setup
from segue.executor.store_port import StoredConversation
from segue.statemachine import (
    CHECKPOINT_PROMPT,
    ConversationConfig,
    ConversationState,
    Event,
    Message,
    ToolCall,
    ToolExecuting,
    ToolResult,
    UserMessage,
    accepts_message,
    compile_resume_context,
    model_info,
    provider_compacts,
)

LimitRequest = RequestContinuation | RequestCheckpoint | RequestCompaction
"""The tool-less requests the behaviours send at the limit."""
PURPOSES: Final[dict[type[LimitRequest], Purpose]] = {
    RequestContinuation: "continuation",
    RequestCheckpoint: "checkpoint",
    RequestCompaction: "compaction",
}


PROVIDER_COMPACTION_INSTRUCTION: Final = (
    "Summarise the conversation so far so that it can go on from your summary alone: the "
    "goal, the facts learned, the decisions, the work completed, and what remains."
)
"""The provider's instructions when only a manual focus was given (the provider replaces its
own prompt with what it is given, so the focus alone would not be enough)."""
ON_DEMAND_NOTE: Final = "(The conversation is compacted here, at the user's request.)"
"""The last user text of a request that asks the provider to compact now: a request must end
with the user's turn, and the provider stops after its compaction."""
_log = get_logger("segue.runtime")


def support_of(llm: object, model: str) -> ContextSupport:
    """What ``llm`` says its provider does to the context of ``model`` on its own side
    (nothing, for an adapter that says nothing)."""
    if isinstance(llm, ContextManaging):
        return llm.context_support(model)
    return NO_CONTEXT_SUPPORT


def check_support(config: ConversationConfig, support: ContextSupport) -> None:
    """Refuse options that ask the provider for what it does not do for the conversation's
    model (REQ-SEG-048, REQ-SEG-050), with ``UnsupportedOptionError`` saying what to change;
    warn (in the log) when the provider's minimum trigger is above the threshold, which the
    provider then compacts at instead."""
    if config.compaction == "provider":
        if not support.compaction:
            msg = (
                f"the model adapter cannot have the provider compact {config.model!r} "
                '(compaction="provider"): leave compaction as "segue", or use an adapter and '
                "model whose provider compacts (docs/providers.md)"
            )
            raise UnsupportedOptionError(msg)
        if config.summary_prompt is not None and not support.instructions:
            msg = (
                "the provider takes no instructions for its compaction, so the summary_prompt "
                'would be ignored: leave it out, or leave compaction as "segue"'
            )
            raise UnsupportedOptionError(msg)
        if support.min_trigger > config.continuation_tokens:
            _log.warning(
                "provider_compaction_trigger_raised",
                conversation_id=config.id,
                continuation_tokens=config.continuation_tokens,
                trigger_tokens=support.min_trigger,
            )
    unknown = [edit["type"] for edit in config.context_edits if edit["type"] not in support.edits]
    if unknown:
        msg = (
            f"the model adapter cannot send the context edits {', '.join(unknown)} for "
            f"{config.model!r}: leave them out, or use an adapter whose provider applies them"
        )
        raise UnsupportedOptionError(msg)


def check_prefix_reuse(config: ConversationConfig, llm: object) -> None:
    """Refuse ``summary_request="reuse_prefix"`` for an adapter that cannot repeat the turn's
    request at the limit (REQ-SEG-055), with ``UnsupportedOptionError`` saying what to change."""
    if config.summary_request == "reuse_prefix" and not reuses_prefix(llm):
        msg = (
            f"the model adapter {type(llm).__name__} cannot repeat the turn's request at the "
            'limit (summary_request="reuse_prefix"): leave summary_request as "tool_less", or '
            "use an adapter that can (PrefixReusing, docs/providers.md)"
        )
        raise UnsupportedOptionError(msg)


def provider_instructions(state: ConversationState, focus: str | None) -> str | None:
    """What the provider's summary must hold: the conversation's ``summary_prompt`` and a
    manual focus (REQ-SEG-040, REQ-SEG-041); None: the provider's own prompt."""
    base = state.config.summary_prompt
    if not focus:
        return base
    return (base or PROVIDER_COMPACTION_INSTRUCTION) + FOCUS_NOTE.format(focus=focus)


def provider_first(view: Sequence[Message]) -> Sequence[Message]:
    """The view with the provider's compaction first (REQ-SEG-048): the provider reads it first
    and drops whatever comes before it, so the pinned messages a view starts with go after it."""
    for index, message in enumerate(view):
        if message.kind == "summary":
            if index == 0 or not any(b.type == "compaction" for b in message.content):
                return view
            return [message, *view[:index], *view[index + 1 :]]
        if not message.pinned:
            return view  # only pinned messages come before a view's summary
    return view


def instruction(stored: StoredConversation, effect: RequestLlm | LimitRequest) -> str | None:
    """The instruction ``effect``'s request ends with (None: an ordinary turn has none)."""
    if isinstance(effect, RequestLlm):
        return FINAL_ANSWER_INSTRUCTION if effect.final else None
    state = stored.state
    if isinstance(effect, RequestCompaction):
        if effect.alternate:
            text = ALTERNATE_COMPACTION_INSTRUCTION  # the conversation's own did not work
        else:
            text = limit_instruction(COMPACTION_INSTRUCTION, state, None)
    elif isinstance(effect, RequestContinuation) and effect.alternate:
        text = ALTERNATE_CONTINUATION_INSTRUCTION
    else:
        default = (
            CONTINUATION_INSTRUCTION
            if isinstance(effect, RequestContinuation)
            else CHECKPOINT_PROMPT
        )
        # An orchestrator's pause asks in segue's words whatever the conversation's prompt.
        text = limit_instruction(default, state, None) if at_the_limit(state, effect) else default
    if effect.focus:
        text += FOCUS_NOTE.format(focus=effect.focus)
    return text


class Requests:
    """Builds the requests of one runtime, reading its setup (model, tools, bound on output)
    each time, so that a runtime whose ``llm`` or ``tools`` changed is heard at once."""

    __slots__ = ("_cache", "_setup")

    def __init__(self, setup: Setup, cache: ViewCache) -> None:
        self._setup = setup
        self._cache = cache

    async def of(
        self,
        stored: StoredConversation,
        effect: RequestLlm | LimitRequest,
        *,
        messages: Sequence[Message] | None = None,
    ) -> LlmRequest:
        """The request ``effect`` asks for (``messages``: the history to send instead of the
        whole view, for a compaction that keeps its tail)."""
        if isinstance(effect, RequestLlm):
            return await self.build(
                stored,
                "turn",
                instruction=instruction(stored, effect),
                messages=messages,
                final=effect.final,
            )
        reuse = effect.shape == "reuse_prefix" and effect.trim_level == 0
        return await self.build(
            stored,
            PURPOSES[type(effect)],
            instruction=instruction(stored, effect),
            rejected=effect.rejected_tool_calls,
            trim_level=effect.trim_level,
            messages=None if reuse else messages,  # the turn's whole view is its prefix
            reuse_prefix=reuse,
        )

    async def build(
        self,
        stored: StoredConversation,
        purpose: Purpose,
        *,
        instruction: str | None = None,
        rejected: Sequence[ToolCall] = (),
        trim_level: int = 0,
        messages: Sequence[Message] | None = None,
        final: bool = False,
        reuse_prefix: bool = False,
    ) -> LlmRequest:
        """The request of ``purpose`` on the conversation as ``stored`` (``reuse_prefix``: a
        request at the limit sent as the turn's, repeated, REQ-SEG-055)."""
        state = stored.state
        config = state.config
        model, output = state.model, config.max_output_tokens
        if purpose != "turn" and config.summary_model is not None:  # REQ-SEG-045
            model = config.summary_model
            output = min(output, model_info(model).max_output_tokens)
        cap = self._setup.max_tokens
        view = messages if messages is not None else await self._cache.view(stored)
        turn = purpose == "turn"
        return LlmRequest(
            conversation_id=state.id,
            model=model,
            purpose=purpose,
            system=await self._system(stored),
            messages=provider_first(view) if config.compaction == "provider" else view,
            tools=self._setup.tools.specs,  # at the limit too: declared, never callable
            instruction=instruction,
            rejected_tool_calls=tuple(rejected),
            trim_level=trim_level,
            max_tokens=output if cap is None else min(cap, output),
            settings=config.settings,
            final=final,
            behavior=state.behavior,
            context_window=state.context_window,
            stop_at_tokens=config.continuation_tokens,
            provider_session=state.provider_session,
            compaction=self._compaction(state) if turn else None,
            context_edits=config.context_edits if turn or reuse_prefix else (),
            reuse_prefix=reuse_prefix,
        )

    def support(self, state: ConversationState) -> ContextSupport:
        """What the runtime's model adapter says its provider does for the conversation."""
        return support_of(self._setup.llm, state.model)

    def _compaction(self, state: ConversationState) -> CompactionAsk | None:
        """The provider is asked to compact the turn's request at the continuation threshold
        (REQ-SEG-048), raised to its minimum; it pauses after compacting when pinned messages
        must follow the compaction."""
        if not provider_compacts(state):
            return None
        trigger = max(state.config.continuation_tokens, self.support(state).min_trigger)
        return CompactionAsk(
            trigger_tokens=trigger,
            instructions=provider_instructions(state, None),
            pause_after=state.pinned_tokens > 0,
        )

    async def on_demand(
        self, stored: StoredConversation, effect: RequestCompaction
    ) -> LlmRequest | None:
        """The request that asks the provider to compact now (a manual trigger, REQ-SEG-048),
        or None where it cannot be asked and segue compacts: the provider does not compact on
        demand, or takes no instructions and the user gave a focus (which segue's own summary
        keeps)."""
        state = stored.state
        support = self.support(state)
        if not (provider_compacts(state) and support.compaction and support.on_demand):
            return None
        if effect.focus and not support.instructions:
            return None
        request = await self.build(stored, "compaction", instruction=ON_DEMAND_NOTE)
        size = min(state.projected_tokens, state.context_tokens or state.projected_tokens)
        ask = CompactionAsk(
            trigger_tokens=max(1, size),
            instructions=provider_instructions(state, effect.focus),
            pause_after=True,
        )
        return dataclasses.replace(request, compaction=ask)

    async def counted(self, stored: StoredConversation, event: Event) -> Event:
        """``event`` with an exact ``token_count`` when the model can count prompts.

        Pre-flight compares the projected prompt (last occupancy + what was appended since) with
        the threshold. When ``llm.count_tokens`` answers, the message gets the count that makes
        that projection the exact prompt of the next request: counted minus projected, never
        below zero (an estimate above the truth stays, which errs on the safe side). Only a user
        message or tool result the core will record is counted, and only once.
        """
        llm = self._setup.llm
        if (
            not llm.exact_preflight
            or not isinstance(event, UserMessage | ToolResult)
            or event.token_count is not None
        ):
            return event
        state = stored.state
        phase = state.phase
        if isinstance(event, UserMessage):
            if not accepts_message(state):
                return event  # the core refuses it: nothing to count
            message = Message(
                kind="user", text=event.text, session=state.session, generation=state.generation
            )
        else:
            if not isinstance(phase, ToolExecuting) or event.tool_call_id not in phase.pending:
                return event  # a stale result the core ignores
            message = Message(
                kind="tool_result",
                text=event.output,
                tool_call_id=event.tool_call_id,
                is_error=event.is_error,
                session=state.session,
                generation=state.generation,
            )
        view = await self._cache.view(stored)
        request = await self.build(stored, "turn", messages=[*view, message])
        counted = await llm.count_tokens(request)
        if counted is None:
            return event
        return event.model_copy(update={"token_count": max(0, counted - state.projected_tokens)})

    async def _system(self, stored: StoredConversation) -> str | None:
        state = stored.state
        resumed = state.resume_context
        if resumed is not None:
            return f"{stored.system}\n\n{resumed}" if stored.system else resumed
        if state.snapshots == 0 or state.session == 1:
            return stored.system
        # Resumed before the state kept its resume context: compile it from the store.
        snapshots = await self._setup.store.snapshots(state.id)
        latest = snapshots[-1] if snapshots else None
        if latest is None or latest.session + 1 != state.session:
            return stored.system
        context = compile_resume_context(latest)
        return f"{stored.system}\n\n{context}" if stored.system else context
