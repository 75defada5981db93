"""Hypothesis strategies for segue's single values: usage, tool calls and events.

They aim at the edges of each conversation's own thresholds (``Scale``), so a 1,000-token
window and a 1,000,000-token window are both pushed across their warning and continuation
points. Every event is built through its public constructor. ``strategies`` builds
conversations and their histories on these, and is where an application imports them from.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from hypothesis import strategies as st

from segue.statemachine import (
    CheckpointFailed,
    CheckpointResponse,
    CompactionFailed,
    CompactionResponse,
    CompactionUndoRequested,
    ContinuationFailed,
    ContinuationRedone,
    ContinuationResponse,
    ConversationConfig,
    Event,
    LlmError,
    LlmResponse,
    ManualContinuation,
    Message,
    PauseRequested,
    ProviderCompacted,
    ResumeRequested,
    RetryDue,
    SummaryRedoRequested,
    ToolCall,
    ToolResult,
    Usage,
    UserCancel,
    UserMessage,
)

__all__ = [
    "EVENT_KINDS",
    "TOOL_CALL_IDS",
    "events",
    "tool_calls",
    "usages",
    "weighted",
]

TOOL_CALL_IDS: Final = ("toolu_01", "toolu_02", "toolu_03")
"""A deliberately small pool: ids repeat across responses, so stale and duplicate tool results
name real pending calls often enough to matter."""

EVENT_KINDS: Final = (
    "user_message",
    "llm_response",
    "provider_compacted",
    "llm_error",
    "tool_result",
    "continuation_response",
    "continuation_failed",
    "checkpoint_response",
    "checkpoint_failed",
    "compaction_response",
    "compaction_failed",
    "retry_due",
    "user_cancel",
    "manual_continuation",
    "pause_requested",
    "resume_requested",
    "summary_redo_requested",
    "continuation_redone",
    "compaction_undo_requested",
)
"""Every event kind, in the order ``events()`` shrinks towards (a user message first)."""

_KIND_WEIGHTS: Final[dict[str, int]] = {
    "user_message": 6,
    "llm_response": 8,
    "provider_compacted": 1,
    "llm_error": 2,
    "tool_result": 6,
    "continuation_response": 2,
    "continuation_failed": 1,
    "checkpoint_response": 2,
    "checkpoint_failed": 1,
    "compaction_response": 2,
    "compaction_failed": 1,
    "retry_due": 2,
    "user_cancel": 1,
    "manual_continuation": 1,
    "pause_requested": 1,
    "resume_requested": 1,
    "summary_redo_requested": 1,
    "continuation_redone": 1,
    "compaction_undo_requested": 1,
}
"""Relative frequency in ``events()``: the turn loop (user, response, tools) dominates a real
conversation, so it dominates here too, while every other kind still shows up."""

_TOOL_NAMES: Final = ("read_file", "bash", "search")
_STOP_REASONS: Final = (
    *("end_turn",) * 4,
    *("tool_use",) * 4,
    "max_tokens",
    "model_context_window_exceeded",
    "stop_sequence",
    "refusal",
    "pause_turn",
)
"""Mostly normal ends; truncation, a window-exceeded stop and a paused turn often enough to be
exercised."""
_SAMPLE_TEXTS: Final = (
    "Hello",
    "Fix the failing test in parser.py",
    "  ",
    "",
    "Résumé: 日本語のテキスト 🚀",
    "x" * 300,
)
_CHECKPOINT_TEXTS: Final = (
    "",
    "<checkpoint>\n## Goal\nShip the parser.\n\n## Remaining Tasks\n1. tests\n</checkpoint>",
    "```\n<checkpoint>\n## Goal\nRefactor\n## Do Not Redo\n- lexer\n</checkpoint>\n```",
    "I could not write one.",
    "<checkpoint>\n## Goal\nUnclosed block",
)

# --------------------------------------------------------------------------- building blocks

_texts: st.SearchStrategy[str] = st.one_of(st.sampled_from(_SAMPLE_TEXTS), st.text(max_size=40))
_nonempty_texts: st.SearchStrategy[str] = _texts.filter(bool)


@st.composite
def _pick(
    draw: st.DrawFn, indices: st.SearchStrategy[int], options: tuple[st.SearchStrategy[Any], ...]
) -> Any:
    return draw(options[draw(indices)])


def weighted(choices: Sequence[tuple[int, st.SearchStrategy[Any]]]) -> st.SearchStrategy[Any]:
    """One of ``choices``, picked in proportion to its weight; shrinks towards the first."""
    indices = [index for index, (weight, _) in enumerate(choices) for _ in range(weight)]
    return _pick(st.sampled_from(indices), tuple(strategy for _, strategy in choices))


@dataclass(frozen=True)
class Scale:
    """The token figures that matter to one conversation: its window and its two thresholds."""

    window: int
    warning: int
    continuation: int

    @classmethod
    def of(cls, config: ConversationConfig | None) -> Scale:
        if config is None:
            return cls(window=200_000, warning=160_000, continuation=180_000)
        return cls(config.context_window, config.warning_tokens, config.continuation_tokens)

    @property
    def landmarks(self) -> tuple[int, ...]:
        """Each threshold, the window, and their neighbours: where off-by-one bugs live."""
        points = (0, 1, self.warning, self.continuation, self.window)
        near = {point + delta for point in points for delta in (-1, 0, 1)}
        return tuple(sorted(value for value in near if value >= 0))

    def tokens(self, upper: int) -> st.SearchStrategy[int]:
        """A token figure up to ``upper``, often exactly at a landmark."""
        marks = [mark for mark in self.landmarks if mark <= upper]
        return st.one_of(st.sampled_from(marks), st.integers(0, upper))

    def message_tokens(self) -> st.SearchStrategy[int | None]:
        """Counted tokens of a message or tool output: mostly absent (the core estimates) or a
        small share of the window, sometimes big enough to trip pre-flight or be refused."""
        return weighted(
            [
                (4, st.none()),
                (4, st.integers(0, max(1, self.window // 20))),
                (1, self.tokens(self.window + 1)),
            ]
        )

    def usage(self) -> st.SearchStrategy[Usage | None]:
        """A response's usage: mostly known and below the warning point (conversations grow
        slowly), often exactly at a landmark, sometimes absent, all zeros or over the window."""
        near = (
            self.warning,
            self.continuation - 1,
            self.continuation,
            self.window,
            self.window + 1,
        )
        totals = weighted(
            [
                (5, st.integers(1, max(1, self.warning - 1))),
                (3, st.sampled_from(near)),
                (2, st.integers(0, self.window + self.window // 10 + 1)),
            ]
        )
        return weighted([(1, st.none()), (1, st.just(Usage())), (6, totals.flatmap(_usage_of))])


@st.composite
def _usage_of(draw: st.DrawFn, total: int) -> Usage:
    """A usage report whose four fields sum to ``total``, split as a provider might split it."""
    cache_read = draw(st.integers(0, total))
    cache_creation = draw(st.integers(0, total - cache_read))
    output = draw(st.integers(0, total - cache_read - cache_creation))
    return Usage(
        input_tokens=total - cache_read - cache_creation - output,
        output_tokens=output,
        cache_creation_input_tokens=cache_creation,
        cache_read_input_tokens=cache_read,
    )


def usages(
    max_tokens: int = 220_000, *, landmarks: Collection[int] = ()
) -> st.SearchStrategy[Usage]:
    """Per-request usage reports whose occupancy is at most ``max_tokens``.

    Includes the reports that say nothing about occupancy (all zeros, or output tokens with no
    prompt tokens) and, when ``landmarks`` are given, reports that sum to exactly those figures
    (pass a window and its thresholds).
    """
    totals = st.integers(0, max_tokens)
    marks = sorted(mark for mark in landmarks if 0 <= mark <= max_tokens)
    if marks:
        totals = st.one_of(st.sampled_from(marks), totals)
    output_only = st.builds(Usage, output_tokens=st.integers(1, max(1, max_tokens)))
    return st.one_of(st.just(Usage()), output_only, totals.flatmap(_usage_of))


@st.composite
def _tool_call_list(
    draw: st.DrawFn, ids: tuple[str, ...], min_size: int, max_size: int
) -> tuple[ToolCall, ...]:
    chosen = draw(st.lists(st.sampled_from(ids), min_size=min_size, max_size=max_size, unique=True))
    calls = []
    for call_id in chosen:
        name = draw(st.sampled_from(_TOOL_NAMES))
        arguments = draw(
            st.dictionaries(
                st.sampled_from(("path", "command", "query")),
                st.one_of(st.text(max_size=20), st.integers(-10, 10_000), st.booleans()),
                max_size=2,
            )
        )
        calls.append(ToolCall(id=call_id, name=name, input=arguments))
    return tuple(calls)


def tool_calls(
    *, ids: Sequence[str] = TOOL_CALL_IDS, min_size: int = 0, max_size: int = 3
) -> st.SearchStrategy[tuple[ToolCall, ...]]:
    """The tool calls of one response: ids unique within it (as the API guarantees), drawn from
    the small ``ids`` pool so they repeat across responses."""
    pool = tuple(ids)
    return _tool_call_list(pool, min_size, min(max_size, len(pool)))


# --------------------------------------------------------------------------- events by kind


def _failure_flags() -> st.SearchStrategy[tuple[bool, bool]]:
    """(retryable, context_overflow): mostly retryable, sometimes an overflow, as providers fail."""
    return st.tuples(
        st.sampled_from((True, True, False)), st.sampled_from((False, False, False, True))
    )


_times: Final = st.one_of(
    st.none(), st.sampled_from((0.0, 59.0, 60.0, 1_800.0, 3_600.0)), st.floats(0, 10_000)
)
"""When the runtime took an answer or a resume (Unix time, small: the triggers compare
differences): around the pause triggers ``conversations()`` draws (REQ-SEG-053)."""


def _user_message(scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return st.builds(UserMessage, text=_nonempty_texts, token_count=scale.message_tokens())


def _llm_response(scale: Scale, ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    calls = st.one_of(st.just(()), tool_calls(ids=ids or TOOL_CALL_IDS, min_size=1))
    usage = scale.usage()
    return st.builds(
        LlmResponse,
        text=_texts,
        tool_calls=calls,
        usage=usage,
        stop_reason=st.sampled_from(_STOP_REASONS),
        session_ref=st.sampled_from((None, None, "session-a", "session-b")),
        at=_times,
    )


def _provider_compacted(scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return st.builds(
        ProviderCompacted,
        summary=_texts,
        trigger=st.sampled_from(("auto", "manual")),
        pre_tokens=st.one_of(st.none(), scale.tokens(scale.window)),
        post_tokens=st.one_of(st.none(), st.integers(0, scale.warning)),
    )


def _llm_error(_scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return _failure_flags().map(
        lambda flags: LlmError(message="overloaded", retryable=flags[0], context_overflow=flags[1])
    )


def _tool_result(scale: Scale, ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return st.builds(
        ToolResult,
        tool_call_id=st.sampled_from(ids or TOOL_CALL_IDS),
        output=_texts,
        is_error=st.booleans(),
        token_count=scale.message_tokens(),
    )


_SUMMARY_CALL_IDS: Final = ("s1", "s2")
"""Ids of the calls a summary answer makes (REQ-SEG-056): never run, so never awaited."""


def _summary_calls() -> st.SearchStrategy[tuple[ToolCall, ...]]:
    """Mostly none; now and then the calls of a model that called a tool while summarising."""
    return weighted([(3, st.just(())), (1, tool_calls(ids=_SUMMARY_CALL_IDS, max_size=2))])


def _continuation_response(scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return st.builds(
        ContinuationResponse,
        summary=_texts,
        usage=scale.usage(),
        stop_reason=st.sampled_from(("end_turn", "max_tokens", "refusal")),
        tool_calls=_summary_calls(),
    )


def _continuation_failed(_scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return _failure_flags().map(
        lambda flags: ContinuationFailed(
            error="overloaded", retryable=flags[0], context_overflow=flags[1]
        )
    )


def _checkpoint_response(scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return st.builds(
        CheckpointResponse,
        text=st.one_of(st.sampled_from(_CHECKPOINT_TEXTS), _texts),
        usage=scale.usage(),
        tool_calls=_summary_calls(),
    )


def _checkpoint_failed(_scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return _failure_flags().map(
        lambda flags: CheckpointFailed(
            error="overloaded", retryable=flags[0], context_overflow=flags[1]
        )
    )


def _compaction_response(scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return st.builds(
        CompactionResponse,
        summary=_texts,
        retained_tokens=st.one_of(st.integers(0, scale.warning), scale.tokens(scale.window)),
        usage=scale.usage(),
        tool_calls=_summary_calls(),
    )


def _compaction_failed(_scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return _failure_flags().map(
        lambda flags: CompactionFailed(
            error="overloaded", retryable=flags[0], context_overflow=flags[1]
        )
    )


def _retry_due(_scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return st.builds(RetryDue, attempt=st.integers(1, 6))


def _user_cancel(_scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return st.just(UserCancel())


def _manual_continuation(_scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return st.just(ManualContinuation())


def _pause_requested(_scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return st.builds(PauseRequested, reason=st.sampled_from(("", "nightly stop", "budget")))


def _resume_requested(_scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return st.builds(ResumeRequested, prompt=st.one_of(st.none(), _texts), at=_times)


def _summary_redo_requested(_scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return st.builds(SummaryRedoRequested, focus=st.one_of(st.none(), st.just("the codes")))


def _compaction_undo_requested(scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    """An undo as the runtime sends it: copies of the view before a compaction (empty
    sometimes, which changes nothing), and their size, often at the threshold."""
    copy = st.builds(
        Message,
        kind=st.sampled_from(("user", "assistant")),
        text=st.sampled_from(("restored", "and its answer")),
        copy_of=st.integers(1, 40),
    )
    return st.builds(
        CompactionUndoRequested,
        messages=st.lists(copy, max_size=3).map(tuple),
        tokens=scale.tokens(scale.window),
    )


def _continuation_redone(_scale: Scale, _ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    return st.builds(ContinuationRedone, summary=st.just("What happened, kept better."))


_BUILDERS: Final[dict[str, Callable[[Scale, tuple[str, ...]], st.SearchStrategy[Event]]]] = {
    "user_message": _user_message,
    "llm_response": _llm_response,
    "provider_compacted": _provider_compacted,
    "llm_error": _llm_error,
    "tool_result": _tool_result,
    "continuation_response": _continuation_response,
    "continuation_failed": _continuation_failed,
    "checkpoint_response": _checkpoint_response,
    "checkpoint_failed": _checkpoint_failed,
    "compaction_response": _compaction_response,
    "compaction_failed": _compaction_failed,
    "retry_due": _retry_due,
    "user_cancel": _user_cancel,
    "manual_continuation": _manual_continuation,
    "pause_requested": _pause_requested,
    "resume_requested": _resume_requested,
    "summary_redo_requested": _summary_redo_requested,
    "continuation_redone": _continuation_redone,
    "compaction_undo_requested": _compaction_undo_requested,
}


def events(
    config: ConversationConfig | None = None,
    *,
    kinds: Collection[str] | None = None,
    tool_ids: Sequence[str] = TOOL_CALL_IDS,
) -> st.SearchStrategy[Event]:
    """Any well-typed event, weighted towards the turn loop (user, response, tool results).

    ``config`` scales token figures to its window and thresholds (a 200k window when absent);
    ``kinds`` restricts the event kinds (see ``EVENT_KINDS``); ``tool_ids`` is the pool for tool
    call and tool result ids.
    """
    wanted = EVENT_KINDS if kinds is None else tuple(kind for kind in EVENT_KINDS if kind in kinds)
    unknown = set(kinds or ()) - set(EVENT_KINDS)
    if unknown or not wanted:
        msg = f"kinds must be a non-empty subset of EVENT_KINDS; unknown: {sorted(unknown)}"
        raise ValueError(msg)
    return built(Scale.of(config), wanted, tuple(tool_ids))


@lru_cache(maxsize=512)
def built(scale: Scale, kinds: tuple[str, ...], ids: tuple[str, ...]) -> st.SearchStrategy[Event]:
    """Building a strategy costs far more than drawing from it; conversations reuse a few."""
    return weighted([(_KIND_WEIGHTS[kind], _BUILDERS[kind](scale, ids)) for kind in kinds])
