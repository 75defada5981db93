"""What the model is sent: the ``LlmRequest`` of each effect that asks it, built in one place.

A request is the conversation's view (the current session and generation of the transcript,
folded by the view cache), the system prompt (with a resumed session's compiled context), the
tools of an ordinary turn, and the instruction of a request segue sends on its own: the limit's
(continuation summary, checkpoint, compaction summary: the conversation's ``summary_prompt`` in
place of segue's, the user's focus after it, segue's other wording when the first answer was
empty or a refusal) or a turn's last round's. Pre-flight's exact count is the request the next
message would make, counted by the model (``counted``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from segue.effects import (
    RequestCheckpoint,
    RequestCompaction,
    RequestContinuation,
    RequestLlm,
)
from segue.executor.cache import ViewCache
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
from segue.executor.model_port import LlmRequest, Purpose
from segue.executor.setup import Setup
from segue.executor.store_port import StoredConversation
from segue.statemachine import (
    CHECKPOINT_PROMPT,
    Event,
    Message,
    ToolCall,
    ToolExecuting,
    ToolResult,
    UserMessage,
    accepts_message,
    compile_resume_context,
    model_info,
)

LimitRequest = RequestContinuation | RequestCheckpoint | RequestCompaction
"""The tool-less requests the behaviours send at the limit."""
PURPOSES: Final[dict[type[LimitRequest], Purpose]] = {
    RequestContinuation: "continuation",
    RequestCheckpoint: "checkpoint",
    RequestCompaction: "compaction",
}


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
        return await self.build(
            stored,
            PURPOSES[type(effect)],
            instruction=instruction(stored, effect),
            rejected=effect.rejected_tool_calls,
            trim_level=effect.trim_level,
            messages=messages,
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
    ) -> LlmRequest:
        """The request of ``purpose`` on the conversation as ``stored``."""
        state = stored.state
        config = state.config
        model, output = state.model, config.max_output_tokens
        if purpose != "turn" and config.summary_model is not None:  # REQ-SEG-045
            model = config.summary_model
            output = min(output, model_info(model).max_output_tokens)
        cap = self._setup.max_tokens
        return LlmRequest(
            conversation_id=state.id,
            model=model,
            purpose=purpose,
            system=await self._system(stored),
            messages=messages if messages is not None else await self._cache.view(stored),
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
        )

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
