"""Values at the boundary: validation, immutability, the model table and exact thresholds.

Everything that enters the core from outside is validated once by pydantic; these tests pin what
"invalid" means (and that the error names the field) so the core may trust what it gets. What
every value promises besides (its methods, equality, how the core builds it) is
``test_value_contract``.
"""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from segue import (
    CheckpointResponse,
    CompactionResponse,
    ContextExhaustionBehavior,
    ContinuationResponse,
    ConversationConfig,
    ErrorKind,
    LlmError,
    LlmResponse,
    Message,
    RetryDue,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
    model_info,
    new_conversation,
    threshold_tokens,
    transition,
)
from segue.effects import RequestContinuation, ScheduleRetry

# --------------------------------------------------------------------------- validation


def _field_error(error: pydantic.ValidationError) -> tuple[str, str]:
    """The (field path, error type) of a one-error ``ValidationError``."""
    errors = error.errors()
    assert len(errors) == 1, errors
    return ".".join(str(part) for part in errors[0]["loc"]), errors[0]["type"]


# The wrong types below are on purpose (hence ``type: ignore[arg-type]``): a constructor's
# annotations say what a caller should pass; validation is for those who do not.
@pytest.mark.parametrize(
    ("build", "field", "error_type"),
    [
        (lambda: Usage(input_tokens=-1), "input_tokens", "greater_than_equal"),
        (lambda: Usage(output_tokens=-5), "output_tokens", "greater_than_equal"),
        (
            lambda: Usage(cache_creation_input_tokens=-1),
            "cache_creation_input_tokens",
            "greater_than_equal",
        ),
        (
            lambda: Usage(cache_read_input_tokens=-1),
            "cache_read_input_tokens",
            "greater_than_equal",
        ),
        (lambda: Usage(input_tokens=True), "input_tokens", "int_type"),
        (lambda: Usage(input_tokens="5"), "input_tokens", "int_type"),  # type: ignore[arg-type]
        (lambda: Usage(input_tokens=5.0), "input_tokens", "int_type"),  # type: ignore[arg-type]
        (lambda: Usage(input_tokens=None), "input_tokens", "int_type"),  # type: ignore[arg-type]
        (
            lambda: Usage.model_validate({"prompt_tokens": 5}),
            "prompt_tokens",
            "unexpected_keyword_argument",
        ),
        (lambda: UserMessage(text=""), "text", "string_too_short"),
        (lambda: UserMessage(text="hi", token_count=-1), "token_count", "greater_than_equal"),
        (lambda: UserMessage(text="hi", token_count=False), "token_count", "int_type"),
        (
            lambda: UserMessage.model_validate({"text": "hi", "urgent": True}),
            "urgent",
            "unexpected_keyword_argument",
        ),
        (lambda: ToolCall(id="", name="bash"), "id", "string_too_short"),
        (lambda: ToolCall(id="t1", name=""), "name", "string_too_short"),
        (lambda: ToolCall(id="t1", name="bash", input="ls"), "input", "dict_type"),  # type: ignore[arg-type]
        (lambda: ToolResult(tool_call_id="", output="x"), "tool_call_id", "string_too_short"),
        (
            lambda: ToolResult(tool_call_id="t1", output="x", token_count=-3),
            "token_count",
            "greater_than_equal",
        ),
        (
            lambda: LlmResponse(usage={"input_tokens": -1}),  # type: ignore[arg-type]
            "usage.input_tokens",
            "greater_than_equal",
        ),
        (
            lambda: LlmResponse(tool_calls=[{"id": "", "name": "x"}]),  # type: ignore[arg-type]
            "tool_calls.0.id",
            "string_too_short",
        ),
        (lambda: LlmError(message="x", retryable="maybe"), "retryable", "bool_parsing"),  # type: ignore[arg-type]
        (
            lambda: ContinuationResponse.model_validate({"summary": "s", "tokens": 1}),
            "tokens",
            "unexpected_keyword_argument",
        ),
        (lambda: CheckpointResponse(text=3), "text", "string_type"),  # type: ignore[arg-type]
        (
            lambda: CompactionResponse(summary="s", retained_tokens=-1),
            "retained_tokens",
            "greater_than_equal",
        ),
        (lambda: RetryDue(attempt=0), "attempt", "greater_than_equal"),
        (lambda: RetryDue(attempt=True), "attempt", "int_type"),
        (lambda: RequestContinuation(trim_level=-1), "trim_level", "greater_than_equal"),
        (
            lambda: ScheduleRetry(request="llm", attempt=2, delay_seconds=-1.0),
            "delay_seconds",
            "greater_than_equal",
        ),
        (lambda: Message(kind="robot"), "kind", "literal_error"),  # type: ignore[arg-type]
        (lambda: Message(kind="user", session=0), "session", "greater_than_equal"),
    ],
)
def test_bad_input_raises_validation_error_naming_the_field(
    build: Any, field: str, error_type: str
) -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        build()
    assert _field_error(caught.value) == (field, error_type)
    assert field.rsplit(".", maxsplit=1)[-1] in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"context_window": -1}, "context_window"),
        ({"context_window": 0}, "context_window"),
        ({"context_window": True}, "context_window"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_continuations": -1}, "max_continuations"),
        ({"warning_threshold": 0.0}, "warning_threshold"),
        ({"continuation_threshold": 1.5}, "continuation_threshold"),
        ({"conversation_id": ""}, "id"),
        ({"behavior": "explode"}, "behavior"),
    ],
)
def test_new_conversation_refuses_bad_settings(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        new_conversation(model="claude-sonnet-4-5", **kwargs)
    assert _field_error(caught.value)[0] == field


def test_warning_threshold_above_continuation_threshold_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        new_conversation(
            model="claude-sonnet-4-5", warning_threshold=0.95, continuation_threshold=0.9
        )
    message = str(caught.value)
    assert "warning_threshold" in message
    assert "continuation_threshold" in message


def test_equal_warning_and_continuation_thresholds_are_allowed() -> None:
    state = new_conversation(
        model="claude-sonnet-4-5", warning_threshold=0.9, continuation_threshold=0.9
    )
    assert state.config.warning_tokens == state.config.continuation_tokens == 180_000


def test_derived_threshold_tokens_cannot_be_set_to_a_different_value() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        ConversationConfig(
            id="c",
            model="m",
            context_window=200_000,
            max_output_tokens=8_192,
            continuation_tokens=150_000,
        )
    assert "continuation_tokens" in str(caught.value)


def test_behavior_accepts_values_and_constant_names() -> None:
    by_name = new_conversation(model="claude-sonnet-4-5", behavior="COMPACT_IN_PLACE")
    by_value = new_conversation(model="claude-sonnet-4-5", behavior="compact_in_place")
    assert by_name.behavior is by_value.behavior is ContextExhaustionBehavior.COMPACT_IN_PLACE


def test_error_kind_values() -> None:
    assert ErrorKind.CONTEXT_EXHAUSTED.value == "context_exhausted"
    assert ErrorKind("CONTEXT_EXHAUSTED") is ErrorKind.CONTEXT_EXHAUSTED
    assert {kind.value for kind in ErrorKind} >= {
        "context_exhausted",
        "llm_error",
        "retries_exhausted",
        "continuation_limit",
        "checkpoint_overflow",
        "compaction_ineffective",
    }


# --------------------------------------------------------------------------- immutability


@pytest.mark.parametrize(
    ("value", "field", "new"),
    [
        (Usage(input_tokens=5), "input_tokens", 6),
        (ToolCall(id="t1", name="bash"), "name", "sh"),
        (UserMessage(text="hi"), "text", "bye"),
        (new_conversation(model="claude-sonnet-4-5"), "context_tokens", 5),
        (new_conversation(model="claude-sonnet-4-5").config, "context_window", 1),
    ],
)
def test_values_are_frozen(value: object, field: str, new: object) -> None:
    before = getattr(value, field)
    with pytest.raises(pydantic.ValidationError) as caught:
        setattr(value, field, new)
    assert caught.value.errors()[0]["type"] == "frozen_instance"
    assert getattr(value, field) == before


def test_usage_context_tokens_sums_the_four_fields() -> None:
    usage = Usage(
        input_tokens=1,
        output_tokens=20,
        cache_creation_input_tokens=300,
        cache_read_input_tokens=4_000,
    )
    assert usage.context_tokens == 4_321
    assert usage.is_known
    assert usage.prompt_tokens == 4_301
    assert not Usage().is_known
    assert Usage().context_tokens == 0
    assert not Usage(output_tokens=50).is_known  # no prompt is empty: this says nothing
    assert Usage(cache_read_input_tokens=1).is_known


def test_valid_json_from_a_provider_is_accepted() -> None:
    response = LlmResponse.model_validate(
        {
            "text": "ok",
            "tool_calls": [{"id": "t1", "name": "bash", "input": {"cmd": "ls"}}],
            "usage": {"input_tokens": 10, "output_tokens": 2},
        }
    )
    assert response.tool_calls == (ToolCall(id="t1", name="bash", input={"cmd": "ls"}),)
    assert response.usage == Usage(input_tokens=10, output_tokens=2)


# --------------------------------------------------------------------------- the model table


@pytest.mark.parametrize(
    ("model", "window", "max_output"),
    [
        ("claude-haiku-4-5", 200_000, 64_000),
        ("claude-sonnet-4-5", 200_000, 64_000),
        ("claude-opus-4-5", 200_000, 64_000),
        ("claude-sonnet-4", 200_000, 64_000),
        ("claude-opus-4-1", 200_000, 32_000),
        ("claude-3-5-haiku", 200_000, 8_192),
        ("claude-3-7-sonnet", 200_000, 64_000),
        ("claude-sonnet-4-6", 1_000_000, 64_000),
        ("claude-opus-4-6", 1_000_000, 128_000),
        ("claude-opus-4-7", 1_000_000, 128_000),
        ("claude-opus-5", 1_000_000, 128_000),
        ("claude-sonnet-5-1", 1_000_000, 128_000),
        ("claude-haiku-6", 1_000_000, 128_000),
    ],
)
def test_model_info_known_models(model: str, window: int, max_output: int) -> None:
    info = model_info(model)
    assert (info.context_window, info.max_output_tokens, info.known) == (window, max_output, True)
    assert info.name == model


@pytest.mark.parametrize(
    ("model", "window", "max_output"),
    [
        ("claude-sonnet-4-5-20250929", 200_000, 64_000),
        ("claude-sonnet-4-20250514", 200_000, 64_000),
        ("claude-opus-4-1-20250805", 200_000, 32_000),
        ("claude-3-5-sonnet-latest", 200_000, 8_192),
        ("claude-sonnet-4-5@20250929", 200_000, 64_000),
        ("claude-opus-4-6-20260101", 1_000_000, 128_000),
        ("  Claude-Opus-4-6  ", 1_000_000, 128_000),
    ],
)
def test_model_info_ignores_dates_case_and_spaces(model: str, window: int, max_output: int) -> None:
    info = model_info(model)
    assert (info.context_window, info.max_output_tokens, info.known) == (window, max_output, True)


def test_longest_prefix_wins() -> None:
    # claude-opus-4 (200k, 32k out) is a prefix of claude-opus-4-6 (1M, 128k out).
    assert model_info("claude-opus-4").context_window == 200_000
    assert model_info("claude-opus-4-6").context_window == 1_000_000


@pytest.mark.parametrize("model", ["llama-3-70b", "claude-unknown", "", "claude-opus"])
def test_unknown_model_gets_the_smallest_known_window(model: str) -> None:
    info = model_info(model)
    assert info.context_window == 200_000
    assert info.known is False
    assert info.max_output_tokens > 0


def test_conversation_thresholds_follow_the_model_window() -> None:
    small = new_conversation(model="claude-sonnet-4-5")
    large = new_conversation(model="claude-opus-4-6")
    unknown = new_conversation(model="mystery-model")
    assert (small.context_window, small.config.continuation_tokens) == (200_000, 180_000)
    assert (large.context_window, large.config.continuation_tokens) == (1_000_000, 900_000)
    assert (large.config.warning_tokens, unknown.config.warning_tokens) == (800_000, 160_000)
    assert unknown.context_window == 200_000


def test_context_window_override_wins_over_the_table() -> None:
    state = new_conversation(model="claude-sonnet-4-5", context_window=1_000_000)
    assert (state.context_window, state.config.continuation_tokens) == (1_000_000, 900_000)


# --------------------------------------------------------------------------- exact thresholds


@pytest.mark.parametrize(
    ("ratio", "window", "tokens"),
    [
        (0.9, 200_000, 180_000),
        (0.8, 200_000, 160_000),
        (0.9, 1_000_000, 900_000),
        (0.8, 1_000_000, 800_000),
        (0.7, 100, 70),  # 0.7 * 100 == 70.00000000000001 in floats
        (0.07, 100, 7),  # 0.07 * 100 == 7.000000000000001 in floats
        (0.57, 100, 57),  # 0.57 * 100 == 56.99999999999999 in floats
        (0.9, 333, 300),  # 299.7 rounds up: the smallest count AT OR ABOVE 90%
        (0.85, 333, 284),
        (1.0, 200_000, 200_000),
        (0.5, 1, 1),
    ],
)
def test_threshold_tokens_is_exact(ratio: float, window: int, tokens: int) -> None:
    assert threshold_tokens(ratio, window) == tokens


def test_config_derives_exact_threshold_tokens() -> None:
    state = new_conversation(
        model="x", context_window=100, warning_threshold=0.07, continuation_threshold=0.7
    )
    assert (state.config.warning_tokens, state.config.continuation_tokens) == (7, 70)


def test_core_built_values_support_model_copy_with_update() -> None:
    state, effects = transition(new_conversation(model="claude-sonnet-4-5"), UserMessage(text="hi"))
    assert state.model_copy(update={"warned": True}).warned
    assert effects[0].model_copy(update={"kind": "append_message"}) == effects[0]
