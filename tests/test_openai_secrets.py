"""An API key a provider echoes in its error body never reaches the exception segue raises: not
its message, and not any exception chained below it (``__cause__``, ``__context__``, their args),
as ``str``, ``repr`` or a formatted traceback would show it. Both adapters, both OpenAI APIs."""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anthropic
import openai
import pytest

from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmModel, LlmRequest
from segue.executor.models.anthropic import AnthropicModel
from segue.executor.models.call_errors import scrub_secrets
from segue.executor.models.openai import OpenAIModel
from segue.statemachine import Message
from segue.testing import anthropic_server, openai_server

KEY = "sk-proj-ECHOED-BACK-Zq81Xy27Ab94Cd56Ef03"


def everything_shown(error: BaseException) -> str:
    """What any reader of the error could see: the formatted traceback (which follows both
    chains), and str, repr and args of every exception reachable from it."""
    shown = ["".join(traceback.format_exception(error))]
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        shown += [str(current), repr(current), repr(current.args)]
        shown += [repr(getattr(current, name, None)) for name in ("message", "body")]
        pending += [current.__cause__, current.__context__]
    return "\n".join(shown)


def request() -> LlmRequest:
    return LlmRequest(
        conversation_id="c1",
        model="gpt-4o",
        purpose="turn",
        system=None,
        messages=(Message(kind="user", text="Hi."),),
    )


Connect = Callable[[str], AbstractAsyncContextManager[LlmModel]]


@asynccontextmanager
async def claude(url: str) -> AsyncIterator[LlmModel]:
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=url, max_retries=0) as client:
        yield AnthropicModel(client)


def gpt(api: Any) -> Connect:
    @asynccontextmanager
    async def connect(url: str) -> AsyncIterator[LlmModel]:
        async with openai.AsyncOpenAI(api_key=KEY, base_url=url, max_retries=0) as client:
            yield OpenAIModel(client, api=api)

    return connect


def raised(connect: Connect, url: str) -> LlmCallError:
    async def main() -> LlmCallError:
        async with connect(url) as model:
            with pytest.raises(LlmCallError) as caught:
                await model.complete(request())
            return caught.value

    return asyncio.run(main())


@pytest.mark.parametrize(
    "status", [401, 400, 429, 500], ids=["auth", "bad-request", "rate-limit", "server"]
)
def test_an_echoed_key_is_in_no_part_of_anthropics_error_chain(status: int) -> None:
    echo = anthropic_server.ErrorReply(
        status, "authentication_error", f"invalid x-api-key: {KEY}", {"retry-after": "0"}
    )
    with anthropic_server.FakeAnthropicServer(default=echo) as server:
        error = raised(claude, server.url)
    assert error.__cause__ is not None  # the chain is kept, only the key is gone
    shown = everything_shown(error)
    assert KEY not in shown
    assert "[redacted]" in shown


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize(
    "status", [401, 400, 429, 500], ids=["auth", "bad-request", "rate-limit", "server"]
)
def test_an_echoed_key_is_in_no_part_of_openais_error_chain(api: str, status: int) -> None:
    echo = openai_server.ErrorReply(
        status, f"Incorrect API key provided: {KEY}.", headers={"retry-after": "0"}
    )
    with openai_server.FakeOpenAIServer(default=echo) as server:
        error = raised(gpt(api), server.url)
    assert error.__cause__ is not None
    shown = everything_shown(error)
    assert KEY not in shown
    assert "[redacted]" in shown
    if status == 401:
        assert error.fatal
        assert "OPENAI_API_KEY" in error.message


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_key_echoed_in_an_error_event_mid_stream_is_redacted(api: str) -> None:
    echo = openai_server.ErrorReply(
        500, f"upstream rejected {KEY}", "server_error", mid_stream=True
    )
    with openai_server.FakeOpenAIServer(default=echo) as server:
        error = raised(gpt(api), server.url)
    assert KEY not in everything_shown(error)


def test_scrubbing_walks_both_chains_args_notes_and_bodies() -> None:
    inner = ValueError("inner", {"detail": [f"key={KEY}"]})

    def fail() -> None:
        try:
            raise inner
        except ValueError:
            outer = KeyError(f"lookup with {KEY}")
            outer.add_note(f"note {KEY}")
            raise outer from RuntimeError(f"cause {KEY}")

    with pytest.raises(KeyError) as caught:
        fail()
    scrub_secrets(caught.value, (KEY,))
    assert KEY not in everything_shown(caught.value)
    assert caught.value.__context__ is inner
    assert inner.args == ("inner", {"detail": ["key=[redacted]"]})


def test_scrubbing_reaches_the_file_names_an_os_error_shows() -> None:
    """``str(OSError)`` is built from its ``filename``, which is not in its args: a path that
    holds the key (a CLI's, a credentials file's) must not show it either."""
    missing = FileNotFoundError(2, "No such file or directory", f"/keys/{KEY}/claude")
    error = RuntimeError("the CLI cannot start")
    error.__cause__ = missing
    scrub_secrets(error, (KEY,))
    assert KEY not in everything_shown(error)
    assert missing.filename == "/keys/[redacted]/claude"
