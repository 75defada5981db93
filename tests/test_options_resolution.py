"""One resolution of ``ConversationOptions`` into a new conversation (issue 37, item 3): the
same options given to ``Runtime.create_conversation``, to the server's API and to
``segue chat`` make the same conversation (its window and where it came from, its bound on
output, its behaviour and thresholds), the one the core's ``initial_state`` makes; a model no
table knows gets the table's window on every path; and a window below ``MIN_WINDOW`` is refused
in the same words on every path, before anything is stored.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, Final

import pydantic
import pytest
from fastapi.testclient import TestClient

from cli_run import chat, invoke, plain_output, stored_ids
from segue import Runtime, ScriptedModel, SqliteStore
from segue.server.app import create_app
from segue.server.run import ServerConfig, build_app
from segue.statemachine import ContextExhaustionBehavior, ConversationConfig
from segue.statemachine.options import (
    DEFAULT_OUTPUT_TOKENS,
    MIN_WINDOW,
    ConversationOptions,
    check_window,
    initial_state,
    new_conversation,
    window_in_table,
)
from segue.testing.anthropic_replies import DEFAULT_MODELS, ModelSpec
from segue.testing.anthropic_server import FakeAnthropicServer, MessageReply

MODEL: Final = "claude-sonnet-4-6"
UNKNOWN: Final = "acme-local-7b"
"""A model no table knows, whose name says no provider."""
KEY: Final = "sk-ant-test-options"

OPTIONS: Final[dict[str, Any]] = {
    "model": MODEL,
    "behavior": "compact_in_place",
    "context_window": 50_000,
    "max_attempts": 3,
    "max_continuations": 2,
    "max_tool_rounds": 7,
    "retry_base_delay": 0.5,
    "retry_max_delay": 4.0,
    "pause_after_turns": 9,
    "summary_request": "reuse_prefix",
}
"""Options every path can be given (the CLI's flags among them)."""
FLAGS: Final = [
    "--model",
    MODEL,
    "--behavior",
    "compact_in_place",
    "--context-window",
    "50000",
    "--max-attempts",
    "3",
    "--max-continuations",
    "2",
    "--max-tool-rounds",
    "7",
    "--retry-base-delay",
    "0.5",
    "--retry-max-delay",
    "4",
    "--pause-after-turns",
    "9",
    "--summary-request",
    "reuse_prefix",
]
"""``OPTIONS`` as ``segue chat`` takes them."""


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    plain_output(monkeypatch, "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "SEGUE_DATABASE_URL")


def _configs(db: Path) -> list[ConversationConfig]:
    """The configs of the conversations ``db`` holds."""

    async def read() -> list[ConversationConfig]:
        store = SqliteStore(db, read_only=True)
        try:
            return [(await store.load(cid)).state.config for cid in stored_ids(db)]
        finally:
            await store.close()

    return asyncio.run(read())


def _by_python(db: Path, **fields: Any) -> ConversationConfig:
    async def create() -> ConversationConfig:
        async with Runtime(store=SqliteStore(db), llm=ScriptedModel()) as rt:
            return (await rt.create_conversation(**fields)).config

    return asyncio.run(create())


def _by_rest(db: Path, **body: Any) -> ConversationConfig:
    with TestClient(create_app(Runtime(store=SqliteStore(db), llm=ScriptedModel()))) as client:
        response = client.post("/api/conversations", json=body)
        assert response.status_code == 201, response.text
    (config,) = _configs(db)
    return config


def _by_cli(db: Path, *flags: str) -> ConversationConfig:
    chatted = invoke("chat", "--db", str(db), *flags, stdin="Hello.\n")
    assert chatted.exit_code == 0, chatted.output
    (config,) = _configs(db)
    return config


def _resolved(config: ConversationConfig) -> dict[str, Any]:
    """What the options decided: the config but for the id each path draws."""
    return config.model_dump(exclude={"id"})


def test_the_same_options_make_the_same_conversation_on_every_path(tmp_path: Path) -> None:
    core = initial_state(ConversationOptions(**OPTIONS), conversation_id="c").config
    python = _by_python(tmp_path / "python.db", **OPTIONS)
    rest = _by_rest(tmp_path / "rest.db", **OPTIONS)
    cli = _by_cli(tmp_path / "cli.db", *FLAGS)
    assert _resolved(python) == _resolved(rest) == _resolved(cli) == _resolved(core)
    assert (python.context_window, python.window_source) == (50_000, "given")
    assert python.behavior is ContextExhaustionBehavior.COMPACT_IN_PLACE
    assert (python.warning_tokens, python.continuation_tokens) == (40_000, 45_000)
    assert python.max_tool_rounds == 7
    # One bound on output: room for a long reply, not the model's 64,000.
    assert python.max_output_tokens == DEFAULT_OUTPUT_TOKENS
    assert new_conversation(**OPTIONS).config.max_output_tokens == DEFAULT_OUTPUT_TOKENS


def test_a_thinking_budget_gets_room_in_the_one_bound_on_output(tmp_path: Path) -> None:
    fields: dict[str, Any] = {"model": MODEL, "thinking_budget": 10_000}
    python = _by_python(tmp_path / "python.db", **fields)
    rest = _by_rest(tmp_path / "rest.db", **fields)
    assert python.max_output_tokens == rest.max_output_tokens == 10_000 + DEFAULT_OUTPUT_TOKENS
    assert new_conversation(**fields).config.max_output_tokens == python.max_output_tokens


def test_a_model_no_table_knows_gets_the_tables_window_on_every_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = window_in_table(UNKNOWN)
    assert table.source == "assumed"
    python = _by_python(tmp_path / "python.db", model=UNKNOWN)
    rest = _by_rest(tmp_path / "rest.db", model=UNKNOWN)
    # The CLI against a provider whose server knows the model but not its window.
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    models = {**DEFAULT_MODELS, UNKNOWN: ModelSpec(None, None)}
    with FakeAnthropicServer(default=MessageReply(text="Hi."), models=models) as fake:
        chatted = chat(fake, tmp_path / "cli.db", "Hello.\n", "--model", UNKNOWN)
    assert chatted.exit_code == 0, chatted.output
    (cli,) = _configs(tmp_path / "cli.db")
    core = new_conversation(model=UNKNOWN).config
    for config in (python, rest, cli, core):
        assert (config.context_window, config.window_source) == (table.tokens, "assumed")
    assert _resolved(python) == _resolved(rest) == _resolved(cli)


def _words(text: str) -> str:
    """``text`` without the line breaks and frames a terminal adds."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


@pytest.mark.parametrize("window", [1, MIN_WINDOW - 1])
def test_a_window_below_the_minimum_is_refused_in_the_same_words_on_every_path(
    window: int, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="out of range") as said:
        check_window(window)
    words = str(said.value)
    assert f"{MIN_WINDOW:,}" in words

    async def by_python() -> None:
        async with Runtime(store=SqliteStore(tmp_path / "python.db"), llm=ScriptedModel()) as rt:
            with pytest.raises(pydantic.ValidationError) as refused:
                await rt.create_conversation(model=MODEL, context_window=window)
            assert words in str(refused.value)
            assert refused.value.errors()[0]["loc"] == ("context_window",)
            assert await rt.conversations() == []

    asyncio.run(by_python())

    db = tmp_path / "rest.db"
    with TestClient(create_app(Runtime(store=SqliteStore(db), llm=ScriptedModel()))) as client:
        response = client.post("/api/conversations", json={"context_window": window})
        assert response.status_code == 422
        assert words in response.text
    assert stored_ids(db) == []

    db = tmp_path / "cli.db"
    refused = invoke("chat", "--db", str(db), "--context-window", str(window), stdin="Hi.\n")
    assert refused.exit_code == 2
    assert words in _words(refused.output)
    assert not db.exists() or stored_ids(db) == []


def test_the_minimum_window_itself_is_taken_on_every_path(tmp_path: Path) -> None:
    fields: dict[str, Any] = {"model": MODEL, "context_window": MIN_WINDOW}
    python = _by_python(tmp_path / "python.db", **fields)
    rest = _by_rest(tmp_path / "rest.db", **fields)
    cli = _by_cli(tmp_path / "cli.db", "--model", MODEL, "--context-window", str(MIN_WINDOW))
    assert python.context_window == rest.context_window == cli.context_window == MIN_WINDOW
    assert _resolved(python) == _resolved(rest) == _resolved(cli)


def test_the_core_model_takes_any_window_but_a_created_conversation_does_not() -> None:
    assert new_conversation(model=MODEL, context_window=100).config.context_window == 100
    with pytest.raises(pydantic.ValidationError, match="out of range"):
        initial_state(ConversationOptions(model=MODEL, context_window=100), conversation_id="c")
    # A continued conversation's window was resolved before (the provider's, say): kept.
    carried = ConversationOptions(model=MODEL, context_window=512, window_source="server")
    assert initial_state(carried, conversation_id="c").config.context_window == 512


def test_the_cli_says_the_options_own_check_in_its_flags(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    refused = invoke("chat", "--db", str(db), "--compaction", "provider", stdin="Hi.\n")
    assert refused.exit_code == 2
    said = _words(refused.output)
    # The core's check_compaction, its keywords as the CLI's flags.
    assert "--compaction provider is how a compact_in_place conversation compacts" in said
    assert "--behavior compact_in_place" in said
    assert not db.exists() or stored_ids(db) == []


def _claude_server(db: Path, fake: FakeAnthropicServer, **config: Any) -> Any:
    return build_app(
        ServerConfig(db=db, provider="anthropic", api_key=KEY, base_url=fake.url, **config)
    )


def test_a_request_is_checked_once_with_the_servers_own_options(tmp_path: Path) -> None:
    """How the options fit together is checked on what the server completes them with: a
    request for the provider's compaction, its behaviour left to a ``compact_in_place`` server,
    is sound (the body alone was refused, as if the behaviour were the library's default)."""
    asked = {"compaction": "provider"}
    with FakeAnthropicServer(default=MessageReply(text="Noted.")) as fake:
        compacting = _claude_server(
            tmp_path / "compacting.db", fake, behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE
        )
        with TestClient(compacting) as client:
            made = client.post("/api/conversations", json=asked)
            assert made.status_code == 201, made.text
            assert (made.json()["behavior"], made.json()["compaction"]) == (
                "compact_in_place",
                "provider",
            )
        with TestClient(_claude_server(tmp_path / "plain.db", fake)) as client:
            refused = client.post("/api/conversations", json=asked)
    assert refused.status_code == 422
    with pytest.raises(pydantic.ValidationError) as core:
        ConversationOptions(model=MODEL, compaction="provider")
    said = str(core.value.errors()[0]["msg"]).removeprefix("Value error, ")
    assert said in refused.json()["message"]


def test_a_conversation_stored_before_goes_on_in_a_new_one_whatever_its_window() -> None:
    """A window taken before the smallest was enforced everywhere (one given through the
    library, or stored before configs said where their window came from) is never refused
    when the conversation goes on in a new one: the child inherits it."""
    old = new_conversation(model=MODEL, context_window=600).config
    legacy = old.model_validate(old.model_dump() | {"window_source": None})
    inherited = ConversationOptions.of(legacy, None)
    child = initial_state(inherited, conversation_id="child", parent_id=old.id).config
    assert child.context_window == 600
