"""The windows of OpenAI's models: the table, an unknown model of each provider, and what a
conversation on them does at the threshold (REQ-BED-022 per provider, not per vendor)."""

from __future__ import annotations

import pytest

from segue import model_info, new_conversation
from segue.statemachine.models import provider_of


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o", 128_000),
        ("gpt-4o-mini", 128_000),
        ("gpt-4o-2024-08-06", 128_000),
        ("gpt-4o-mini-2024-07-18", 128_000),
        ("GPT-4o ", 128_000),
        ("gpt-4.1", 1_047_576),
        ("gpt-4.1-mini", 1_047_576),
        ("gpt-4.1-nano-2025-04-14", 1_047_576),
        ("o3", 200_000),
        ("o3-2025-04-16", 200_000),
        ("o4-mini", 200_000),
        ("o1-mini", 128_000),
        ("gpt-5", 272_000),  # 400,000 in all, 128,000 of them reserved for output
        ("gpt-5-mini", 272_000),
        ("gpt-4-turbo-2024-04-09", 128_000),
        ("gpt-4", 8_192),
        ("gpt-3.5-turbo", 16_385),
        ("ft:gpt-4o-mini-2024-07-18:acme::abc123", 128_000),
    ],
)
def test_openai_models_have_their_own_windows(model: str, window: int) -> None:
    info = model_info(model)
    assert (info.context_window, info.known) == (window, True)


def test_gpt_4o_is_128k_so_its_conversation_continues_at_115200() -> None:
    """The report that started it: gpt-4o was taken for a 200k model, so the provider's hard
    limit came before segue's threshold."""
    state = new_conversation(model="gpt-4o")
    assert (state.context_window, state.config.continuation_tokens) == (128_000, 115_200)


@pytest.mark.parametrize("model", ["gpt-9", "o9-mini", "chatgpt-7"])
def test_an_unknown_openai_model_gets_the_smallest_openai_window(model: str) -> None:
    info = model_info(model)
    assert (info.context_window, info.known) == (128_000, False)


@pytest.mark.parametrize("model", ["claude-unknown", "claude-opus"])
def test_an_unknown_anthropic_model_gets_the_smallest_anthropic_window(model: str) -> None:
    info = model_info(model)
    assert (info.context_window, info.known) == (200_000, False)


def test_a_name_of_no_known_provider_keeps_the_documented_fallback() -> None:
    info = model_info("llama-3.1-70b-instruct")
    assert (info.context_window, info.known) == (200_000, False)


@pytest.mark.parametrize(
    ("model", "provider"),
    [
        ("gpt-4o", "openai"),
        ("o3", "openai"),
        ("o4-mini", "openai"),
        ("claude-sonnet-4-6", "anthropic"),
        ("ollama/llama3", None),
        ("o", None),
        ("omni-moderation", None),
    ],
)
def test_the_provider_is_told_by_the_name(model: str, provider: str | None) -> None:
    assert provider_of(model) == provider
