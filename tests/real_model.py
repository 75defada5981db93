"""The real-model tier's pieces: llama.cpp's ``llama-server`` serving SmolLM2-135M-Instruct for
the whole session, and a runtime that talks to it through segue's ``OpenAIModel`` and the
official ``openai`` client.

The server is ``real_model_server``'s fixture. What a 135M model says is not asserted
anywhere: tests read states, counts and the server's own token counts. Generations are short
and windows small, so that limits come in seconds on 2 cores.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from openai import AsyncOpenAI

from segue import (
    ContextExhaustionBehavior,
    ConversationState,
    DoneUpdate,
    MemoryStore,
    OpenAIModel,
    Runtime,
    TextUpdate,
    failure_of,
)
from segue.executor.updates import Update
from segue.testing.llama_server import LlamaServer

MODEL = "smollm2"
"""The name conversations give the model (llama-server serves one, whatever it is called)."""
REPLY_TOKENS = 24
"""A turn's bound on output: short answers, so a turn takes about a second."""
SUMMARY_TOKENS = 48
"""The bound of the limit's requests (summary, checkpoint, compaction)."""
WINDOW = 1_024
"""The window the behaviours' tests give (the server's is 2048; segue's smallest is 1,000): a limit
in about eight turns."""
REQUEST_TIMEOUT = 120.0
"""Seconds one request may take: a loaded machine computes a token at a fraction of the speed."""
TURNS_PER_LIMIT = 40
"""Turns after which a conversation that never reached its limit is a failure."""
FILLER = (
    "The harbour's tide table lists the time and the height of each high and low water, "
    "and the pilot reads it before every passage through the narrow channel."
)


def note(number: int) -> str:
    """A user message of about 80 tokens that asks for a short answer."""
    return f"Note {number}. {FILLER} {FILLER} Answer in one short sentence."


def text_of(server: LlamaServer, tokens: int) -> str:
    """Filler of about ``tokens`` tokens by the server's own tokenizer."""
    each = server.tokens(FILLER + " ")
    return " ".join([FILLER] * max(1, tokens // each))


def client_of(server: LlamaServer) -> AsyncOpenAI:
    """The official client pointed at the server (it takes any key)."""
    return AsyncOpenAI(base_url=server.base_url, api_key="local", timeout=REQUEST_TIMEOUT)


@contextlib.asynccontextmanager
async def runtime(
    server: LlamaServer, *, max_tokens: int | None = REPLY_TOKENS
) -> AsyncIterator[Runtime]:
    """A runtime on a memory store whose model is the real one, through ``OpenAIModel``
    (``max_tokens`` None: each conversation's own bound on a reply)."""
    client = client_of(server)
    model = OpenAIModel(client, max_tokens=max_tokens, summary_max_tokens=SUMMARY_TOKENS)
    try:
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            yield rt
    finally:
        await client.close()


async def conversation(
    rt: Runtime, behavior: ContextExhaustionBehavior, **options: Any
) -> ConversationState:
    """A conversation on the real model with short replies, a small window and quick retries."""
    fields: dict[str, Any] = {
        "context_window": WINDOW,
        "max_output_tokens": REPLY_TOKENS,
        "retry_base_delay": 0.2,
        "retry_max_delay": 2.0,
    }
    return await rt.create_conversation(model=MODEL, behavior=behavior, **(fields | options))


def finished(updates: list[Update]) -> DoneUpdate:
    """A streamed turn's last update, which must be ``done``."""
    last = updates[-1]
    assert isinstance(last, DoneUpdate), last
    return last


def texts(updates: list[Update]) -> list[str]:
    """The text deltas of a streamed turn, in order."""
    return [u.text for u in updates if isinstance(u, TextUpdate)]


async def send_until(
    rt: Runtime,
    conversation_id: str,
    done: Callable[[ConversationState], bool],
    *,
    first: int = 0,
) -> tuple[ConversationState, int]:
    """Send notes (numbered from ``first``) until ``done(state)``; the state it held for and the
    next note's number. Fails if it never comes within ``TURNS_PER_LIMIT`` turns."""
    for number in range(first, first + TURNS_PER_LIMIT):
        state = await rt.send(conversation_id, note(number))
        if done(state):
            return state, number + 1
        assert failure_of(state) is None, failure_of(state)
    pytest.fail(f"not reached in {TURNS_PER_LIMIT} turns: {state.context_tokens} tokens")
