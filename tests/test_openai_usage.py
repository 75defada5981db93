"""Property tests: OpenAI's usage, mapped to segue's four fields, never counts a cached token
twice, and the occupancy after a response is exactly its prompt plus its completion."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from openai.types.completion_usage import CompletionUsage
from openai.types.responses.response_usage import ResponseUsage

from segue import LlmResponse, UserMessage, new_conversation, transition
from segue.executor.models.openai_usage import read_usage
from segue.executor.models.replies import usage_from_prompt

counts = st.integers(min_value=0, max_value=2_000_000)


@st.composite
def reports(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """(prompt, cached, cache_write, completion) as a provider reports them: the cached and
    written parts inside the prompt."""
    prompt = draw(counts)
    cached = draw(st.integers(0, prompt))
    written = draw(st.integers(0, prompt - cached))
    return prompt, cached, written, draw(counts)


@given(reports())
def test_the_four_fields_add_up_to_the_prompt_and_the_completion(
    report: tuple[int, int, int, int],
) -> None:
    prompt, cached, written, completion = report
    usage = usage_from_prompt(prompt, completion, cache_read=cached, cache_write=written)
    assert usage is not None
    assert usage.prompt_tokens == prompt  # the cached part once, inside the prompt
    assert usage.context_tokens == prompt + completion
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (cached, written)
    assert usage.input_tokens == prompt - cached - written


@given(counts, counts, counts, counts)
def test_even_an_inconsistent_report_never_counts_more_than_its_prompt(
    prompt: int, cached: int, written: int, completion: int
) -> None:
    """A server that says more was cached than the whole prompt (seen from proxies) cannot make
    the meter read more than the prompt it sent."""
    usage = usage_from_prompt(prompt, completion, cache_read=cached, cache_write=written)
    assert usage is not None
    assert usage.context_tokens == prompt + completion
    assert min(usage.input_tokens, usage.cache_read_input_tokens) >= 0


@given(reports())
def test_chat_completions_usage_as_the_client_parses_it(
    report: tuple[int, int, int, int],
) -> None:
    prompt, cached, written, completion = report
    parsed = CompletionUsage.model_validate(
        {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
            "completion_tokens_details": {"reasoning_tokens": completion // 2},
        }
    )
    usage = read_usage(parsed)
    assert usage is not None
    assert usage.context_tokens == prompt + completion == parsed.total_tokens
    assert usage.cache_read_input_tokens == cached


@given(reports())
def test_responses_usage_as_the_client_parses_it(report: tuple[int, int, int, int]) -> None:
    prompt, cached, written, completion = report
    parsed = ResponseUsage.model_validate(
        {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }
    )
    usage = read_usage(parsed)
    assert usage is not None
    assert usage.context_tokens == prompt + completion == parsed.total_tokens


@given(st.lists(reports(), min_size=1, max_size=6))
def test_the_cores_occupancy_is_the_latest_prompt_plus_completion(
    replies: list[tuple[int, int, int, int]],
) -> None:
    """Fed through the pure core, reply after reply, the meter reads the latest response's
    prompt plus completion: never a sum, never the cached part twice."""
    state = new_conversation(model="gpt-4.1", context_window=100_000_000)
    measured: int | None = None
    for prompt, cached, written, completion in replies:
        state, _ = transition(state, UserMessage(text="next"))
        usage = usage_from_prompt(prompt, completion, cache_read=cached, cache_write=written)
        state, _ = transition(state, LlmResponse(text="ok", usage=usage))
        if usage is not None and usage.is_known:
            measured = prompt + completion
        assert state.context_tokens == measured
