"""The public API as a user writes it, from ``import segue`` alone (the public contract).

Two checks in one file: mypy --strict reads every ``assert_type`` (a changed signature or return
type of a public name fails the type check), and pytest runs the same code (a changed behaviour
fails the test). Nothing here reaches into ``segue.statemachine`` or ``segue.executor``.
"""

from __future__ import annotations

import asyncio
from typing import assert_type

import pydantic
import pytest

import segue
from segue import (
    FALLBACK_SUMMARY,
    AwaitingContinuation,
    ContextExhausted,
    ContextExhaustionBehavior,
    ConversationExhaustedError,
    ConversationState,
    Effect,
    ErrorKind,
    ExecuteTools,
    Failed,
    LlmResponse,
    MemoryStore,
    ModelInfo,
    RequestContinuation,
    RequestLlm,
    Runtime,
    ScriptedModel,
    SegueError,
    ToolCall,
    ToolRegistry,
    ToolResult,
    Usage,
    UserMessage,
    model_info,
    new_conversation,
    transition,
)


def test_the_core_as_a_backend_drives_it() -> None:
    state = new_conversation(model="claude-sonnet-4-5")
    assert_type(state, ConversationState)
    assert_type(state.context_tokens, int | None)
    assert_type(state.id, str)
    assert_type(state.parent_id, str | None)
    assert_type(state.behavior, ContextExhaustionBehavior)

    state, effects = transition(state, UserMessage(text="list the files"))
    assert_type(effects, tuple[Effect, ...])
    assert any(isinstance(effect, RequestLlm) for effect in effects)

    call = ToolCall(id="toolu_1", name="bash", input={"cmd": "ls"})
    state, effects = transition(state, LlmResponse(tool_calls=(call,), usage=Usage(input_tokens=9)))
    (execute,) = [effect for effect in effects if isinstance(effect, ExecuteTools)]
    assert_type(execute.tool_calls, tuple[ToolCall, ...])

    state, _ = transition(state, ToolResult(tool_call_id="toolu_1", output="a.txt"))
    state, effects = transition(state, LlmResponse(usage=Usage(input_tokens=180_000)))
    phase = state.phase
    assert isinstance(phase, AwaitingContinuation)
    (request,) = [effect for effect in effects if isinstance(effect, RequestContinuation)]
    assert_type(request.rejected_tool_calls, tuple[ToolCall, ...])

    info = model_info("claude-opus-4-6")
    assert_type(info, ModelInfo)
    assert (info.context_window, state.context_window) == (1_000_000, 200_000)


def test_a_sub_agent_fails_with_a_typed_error() -> None:
    state = new_conversation(
        model="claude-haiku-4-5",
        behavior=ContextExhaustionBehavior.INTENTIONALLY_UNHANDLED,
        parent_id="parent",
    )
    state, _ = transition(state, UserMessage(text="go"))
    state, _ = transition(state, LlmResponse(usage=Usage(cache_read_input_tokens=190_000)))
    failed = state.phase
    assert isinstance(failed, Failed)
    assert_type(failed.error_kind, ErrorKind)
    assert failed.error_kind is ErrorKind.CONTEXT_EXHAUSTED


def test_bad_input_is_a_validation_error() -> None:
    with pytest.raises(pydantic.ValidationError):
        Usage(input_tokens=-1)
    with pytest.raises(pydantic.ValidationError):
        UserMessage(text="hi", colour="blue")  # type: ignore[call-arg]  # the point of the test


async def _chat() -> tuple[ConversationState, str]:
    tools = ToolRegistry()

    @tools.tool(description="Look a word up.")
    async def lookup(tool_input: dict[str, object]) -> str:
        return f"{tool_input.get('query')}: found"

    model = ScriptedModel(window=20_000, reply_chars=1_500, tool_every=3)
    async with Runtime(store=MemoryStore(), llm=model, tools=tools) as rt:
        created = await rt.create_conversation(model="claude-sonnet-4-6", system="Be brief.")
        assert_type(created, ConversationState)
        state = created
        while not isinstance(state.phase, ContextExhausted):
            state = await rt.send(created.id, "Tell me more.")
            assert_type(state, ConversationState)
        with pytest.raises(ConversationExhaustedError) as refused:
            await rt.send(created.id, "one more")
        assert isinstance(refused.value, SegueError)
        kinds = [message.kind for message in await rt.messages(created.id)]
        assert kinds.count("continuation") == 1
        child = await rt.start_new_from(created.id, seed_with_summary=True)
        assert_type(child, ConversationState)
        assert child.parent_id == created.id
        return state, state.phase.summary


def test_a_chat_backend_runs_to_the_limit_and_continues() -> None:
    state, summary = asyncio.run(_chat())
    assert state.phase.kind == "context_exhausted"
    assert summary
    assert summary != FALLBACK_SUMMARY


def test_every_public_name_resolves() -> None:
    for name in segue.__all__:
        assert getattr(segue, name) is not None, name


def test_every_error_a_caller_may_catch_is_a_segue_error() -> None:
    errors = [
        segue.ConversationExhaustedError,
        segue.ConversationExistsError,
        segue.ConversationNotFoundError,
        segue.ConcurrentUpdateError,
        segue.LlmCallError,
        segue.MessageRejectedError,
        segue.StoreLockedError,
    ]
    assert all(issubclass(error, SegueError) for error in errors)


def test_an_unknown_conversation_is_a_typed_error() -> None:
    async def main() -> None:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel()) as rt:
            with pytest.raises(segue.ConversationNotFoundError):
                await rt.send("no-such-conversation", "hello")

    asyncio.run(main())
