"""The window a local OpenAI-compatible server serves (issue 27): asked where each server says
it, once per model, and the provider's smallest window with a warning when nobody says.

``OpenAIModel`` over the real ``openai`` client against ``FakeOpenAIServer`` playing vLLM
(``/v1/models`` with ``max_model_len``), llama.cpp (``/props``) and Ollama (``/api/show``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import openai
import pytest
from openai.types import Model

from segue import ContextExhausted, MemoryStore, Runtime
from segue.executor.models.openai import OpenAIModel
from segue.executor.models.windows import Window, window_of
from segue.testing.logs import capture_logs
from segue.testing.openai_server import (
    OVERFLOWS,
    FakeOpenAIServer,
    Reply,
    Usage,
    llama_cpp_props,
    ollama_show,
)

KEY = "sk-test-served-windows-0123456789"
LOCAL = "my-local-llama"


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(models={}) as fake:
        yield fake


@contextlib.asynccontextmanager
async def adapter(server: FakeOpenAIServer) -> AsyncIterator[OpenAIModel]:
    async with openai.AsyncOpenAI(api_key=KEY, base_url=server.url, max_retries=0) as client:
        yield OpenAIModel(client)


def windows(server: FakeOpenAIServer, *models: str) -> list[Window]:
    async def main() -> list[Window]:
        async with adapter(server) as model:
            return [await model.window(name) for name in models]

    return asyncio.run(main())


def asked(server: FakeOpenAIServer) -> list[str]:
    return [f"{r.method} {r.path}" for r in server.requests]


def test_vllm_reports_max_model_len_in_its_model_list(server: FakeOpenAIServer) -> None:
    server.retrieve = False  # vLLM has no /v1/models/{id}
    server.models[LOCAL] = {"owned_by": "vllm", "max_model_len": 32_768, "root": "/models/x"}
    assert windows(server, LOCAL, LOCAL) == [Window(32_768, "server")] * 2
    assert asked(server) == [f"GET /v1/models/{LOCAL}", "GET /v1/models"]  # once per model


def test_llama_cpp_reports_n_ctx_in_props(server: FakeOpenAIServer) -> None:
    server.props = llama_cpp_props(8_192)
    assert windows(server, LOCAL, LOCAL) == [Window(8_192, "server")] * 2
    assert asked(server) == [f"GET /v1/models/{LOCAL}", "GET /v1/models", "GET /props"]


@pytest.mark.parametrize(
    ("num_ctx", "window"), [(None, 131_072), (8_192, 8_192)], ids=["trained", "num_ctx"]
)
def test_ollama_reports_the_context_in_api_show(
    server: FakeOpenAIServer, num_ctx: int | None, window: int
) -> None:
    """Ollama cuts a longer prompt silently at ``num_ctx``: when the model sets one, it is the
    window, not what the model was trained for."""
    server.shown = {LOCAL: ollama_show("llama", 131_072, num_ctx=num_ctx)}
    assert windows(server, LOCAL) == [Window(window, "server")]
    (show,) = [r for r in server.requests if r.path == "/api/show"]
    assert show.body == {"model": LOCAL}


def test_a_known_openai_model_is_the_tables_without_a_warning(server: FakeOpenAIServer) -> None:
    """gpt-4o logged ``model_window_unknown`` although segue's table knows it (issue 27)."""
    with capture_logs() as logs:
        assert windows(server, "gpt-4o") == [Window(128_000, "table")]
    assert not [e for e in logs if e["event"] == "model_window_unknown"]


def test_an_undescribed_model_gets_openais_smallest_window_and_a_warning(
    server: FakeOpenAIServer,
) -> None:
    """The adapter's provider is OpenAI, whose smallest window is 128,000: not the 200,000 of
    a name no provider owns."""
    with capture_logs() as logs:
        assert windows(server, LOCAL, LOCAL) == [Window(128_000, "assumed")] * 2
    (warning,) = [e for e in logs if e["event"] == "model_window_unknown"]
    assert (warning["model"], warning["assumed_window"], warning["log_level"]) == (
        LOCAL,
        128_000,
        "warning",
    )


def test_an_unreachable_server_is_asked_again_next_time() -> None:
    with FakeOpenAIServer(models={}) as gone:
        url = gone.url

    async def main() -> Window:
        async with openai.AsyncOpenAI(api_key=KEY, base_url=url, max_retries=0) as client:
            return await OpenAIModel(client).window(LOCAL)

    assert asyncio.run(main()) == Window(128_000, "assumed")


def test_window_of_asks_an_adapter_that_cannot_say_where(server: FakeOpenAIServer) -> None:
    class Plain:
        exact_preflight = False

        async def context_window(self, model: str) -> int | None:
            return 32_000 if model == LOCAL else None

    async def main() -> list[Window]:
        async with adapter(server) as model:
            plain = Plain()
            return [
                await window_of(model, "gpt-4o"),
                await window_of(plain, LOCAL),  # type: ignore[arg-type]  # the port's subset
                await window_of(plain, "gpt-4o"),  # type: ignore[arg-type]
            ]

    assert asyncio.run(main()) == [
        Window(128_000, "table"),
        Window(32_000, "server"),
        Window(128_000, "table"),
    ]


def test_the_fakes_model_answers_parse_as_the_sdks_own_types(server: FakeOpenAIServer) -> None:
    server.models[LOCAL] = {"owned_by": "vllm", "max_model_len": 32_768}

    async def main() -> tuple[Model, list[Model]]:
        async with openai.AsyncOpenAI(api_key=KEY, base_url=server.url) as client:
            return await client.models.retrieve(LOCAL), (await client.models.list()).data

    one, listed = asyncio.run(main())
    assert isinstance(one, Model)
    assert (one.id, (one.model_extra or {})["max_model_len"]) == (LOCAL, 32_768)
    assert [m.id for m in listed] == [LOCAL]
    assert all(Model.model_validate(m.model_dump()) == m for m in listed)


# --------------------------------------------------------------------------- at the window


@pytest.mark.parametrize("wording", sorted(OVERFLOWS))
def test_a_local_servers_overflow_continues_the_conversation(
    server: FakeOpenAIServer, wording: str
) -> None:
    """On an 8,192-token llama.cpp (and each other server's wording), the overflow takes the
    exhaustion path: a summary and a continuation, not ``failed/llm_error``."""
    server.props = llama_cpp_props(8_192)
    server.enqueue(OVERFLOWS[wording], Reply(text="Summary: a long paste.", usage=Usage(900, 40)))

    async def main() -> None:
        async with adapter(server) as llm, Runtime(store=MemoryStore(), llm=llm) as rt:
            conversation = await rt.create_conversation(
                model=LOCAL, context_window=await llm.context_window(LOCAL)
            )
            assert conversation.context_window == 8_192
            state = await rt.send(conversation.id, "Here is a long paste.")
            assert isinstance(state.phase, ContextExhausted), state.phase
            assert state.phase.summary == "Summary: a long paste."

    asyncio.run(main())
