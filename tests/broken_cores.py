"""Deliberately broken transition functions, each breaking one promise of the core, planted in
``test_stateful`` (the shipped hypothesis machine) and ``test_exploration`` (the bounded
exploration) to show that each catches it: a checker that checked nothing would pass a correct
core just the same. Each is the real ``transition`` with one rule bent."""

from __future__ import annotations

from typing import Any

from segue import (
    ConversationState,
    Idle,
    LlmError,
    LlmResponse,
    RequestLlm,
    ToolResult,
    UserCancel,
    UserMessage,
    transition,
)
from segue.effects import AppendMessage, Effect

Result = tuple[ConversationState, tuple[Effect, ...]]


def reopening_exhausted(state: ConversationState, event: Any) -> Result:
    """Lets a read-only conversation take user messages again."""
    if state.phase.kind == "context_exhausted" and isinstance(event, UserMessage):
        return transition(state.with_phase(Idle()), event)
    return transition(state, event)


def forgetting_cancelled_tools(state: ConversationState, event: Any) -> Result:
    """Cancels running tools without recording error results for them."""
    after, effects = transition(state, event)
    if state.phase.kind == "tool_executing" and isinstance(event, UserCancel):
        effects = tuple(effect for effect in effects if not isinstance(effect, AppendMessage))
    return after, effects


def double_request(state: ConversationState, event: Any) -> Result:
    """Sends the first request of a turn twice."""
    after, effects = transition(state, event)
    if state.phase.kind == "idle" and after.phase.kind == "llm_requesting":
        effects = (*effects, RequestLlm())
    return after, effects


def unbounded_retries(state: ConversationState, event: Any) -> Result:
    """Retries LLM errors past the configured bound."""
    if isinstance(event, LlmError):
        loose = state.config.model_copy(update={"max_attempts": 20})
        after, effects = transition(state.model_copy(update={"config": loose}), event)
        return after.model_copy(update={"config": state.config}), effects
    return transition(state, event)


def tools_despite_threshold(state: ConversationState, event: Any) -> Result:
    """Reads the threshold only on responses without tool calls."""
    if isinstance(event, LlmResponse) and event.tool_calls:
        return transition(state, event.model_copy(update={"usage": None}))
    return transition(state, event)


def raising_on_stale_results(state: ConversationState, event: Any) -> Result:
    """Looks a tool result's call up without checking it is still pending."""
    if isinstance(event, ToolResult) and state.phase.kind != "tool_executing":
        raise KeyError(event.tool_call_id)
    return transition(state, event)
