"""The finite alphabet of ``segue.testing.explore``: which events the world may deliver, and when.

Why a fixed, small alphabet: exhaustive search multiplies every choice at every step, so each
figure is picked where a rule changes its answer (each threshold exactly, one past the window,
no usage at all) rather than at random. The figures scale with the conversation's own window and
thresholds (``Alphabet.for_config``), so one alphabet serves any configuration. Every other
figure (message sizes, tool outputs, what an unmeasured response adds) is a multiple of one unit,
a sixth of the threshold: what is appended between two measures then takes few values, which
keeps the space small without leaving out any kind of event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from segue.effects import RequestKind
from segue.statemachine import (
    CheckpointFailed,
    CheckpointResponse,
    CompactionBlock,
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
    estimate_tokens,
)
from segue.statemachine.accounting import estimate_tool_calls

if TYPE_CHECKING:
    from segue.testing._explore_world import World

STOP_REASONS: Final = (
    "end_turn",
    "tool_use",
    "max_tokens",
    "pause_turn",
    "model_context_window_exceeded",
    "refusal",
)
TOOL_IDS: Final = ("t1", "t2")
"""The ids of the tool calls responses make: the same two every round, so a result for a call of
an earlier round (after a cancel, or a duplicate) names an id the conversation may know."""
UNKNOWN_TOOL_ID: Final = "t9"
CHECKPOINT: Final = (
    "<checkpoint>\n## Goal\nShip the parser.\n\n## Remaining Tasks\n1. tests\n\n"
    "## Key Decisions\n- keep the lexer\n</checkpoint>"
)
SUMMARY: Final = "What happened so far: the parser is half done."


@dataclass(frozen=True, slots=True)
class Move:
    """One thing the world may do next: deliver ``event``, or (``event is None``) crash and
    recover. ``fires``: the retry timer this move fires (removed from the world's books)."""

    label: str
    event: Event | None
    fires: tuple[RequestKind, int] | None = None


CRASH: Final = Move("crash and recovery", None)


def _usage(tokens: int | None) -> Usage | None:
    """A usage report whose four fields sum to ``tokens``: only their sum is occupancy."""
    if tokens is None:
        return None
    share = tokens // 10
    return Usage(
        input_tokens=tokens - 3 * share,
        output_tokens=share,
        cache_creation_input_tokens=share,
        cache_read_input_tokens=share,
    )


def _sized(stem: str, tokens: int) -> str:
    """``stem`` padded until its estimate is ``tokens`` (``stem`` alone when already larger)."""
    text = stem
    while estimate_tokens(text) < tokens:
        text += "."
    return text


def _call(call_id: str, tokens: int) -> ToolCall:
    """A tool call whose ``tool_use`` block is estimated at ``tokens``."""
    call = ToolCall(id=call_id, name="read_file", input={"path": f"{call_id}.py"})
    while estimate_tool_calls((call,)) < tokens:
        call = call.model_copy(update={"input": {"path": call.input["path"] + "."}})
    return call


def _failures(kind: str, build: Callable[..., Event]) -> tuple[Move, ...]:
    field_name = "message" if kind == "llm_error" else "error"
    return (
        Move(f"{kind}(retryable)", build(**{field_name: "boom"}, retryable=True)),
        Move(f"{kind}(fatal)", build(**{field_name: "boom"})),
        Move(f"{kind}(overflow)", build(**{field_name: "boom"}, context_overflow=True)),
    )


@dataclass(frozen=True)
class _Figures:
    """The token figures of one configuration the alphabet is built from."""

    window: int
    warning: int
    threshold: int

    @property
    def unit(self) -> int:
        return max(1, self.threshold // 6)

    @property
    def below_warning(self) -> int:
        return max(1, self.warning - (self.threshold - self.warning))

    @property
    def occupancies(self) -> tuple[tuple[str, int | None], ...]:
        """What a response may report: below the warning, the warning and the continuation
        threshold exactly, one past the window (an accounting anomaly), and nothing."""
        return (
            ("below warning", self.below_warning),
            ("at warning", self.warning),
            ("at threshold", self.threshold),
            ("over window", self.window + 1),
            ("no usage", None),
        )


def _llm_answers(figures: _Figures, stop_reasons: tuple[str, ...]) -> tuple[Move, ...]:
    """Responses at every occupancy x with and without a tool call x every stop reason, two
    tool calls at three occupancies, the three failures, and the provider's compactions."""
    unit = figures.unit
    text = _sized("The answer", unit)
    one, two = (_call("t1", unit),), (_call("t1", unit), _call("t2", unit))
    moves: list[Move] = []
    for name, tokens in figures.occupancies:
        for calls in ((), one):
            for stop in stop_reasons:
                shown = f"{name}, {len(calls)} tool call{'s' * (len(calls) != 1)}, {stop}"
                event = LlmResponse(
                    text=text, tool_calls=calls, usage=_usage(tokens), stop_reason=stop
                )
                moves.append(Move(f"llm_response({shown})", event))
    for name, tokens in (figures.occupancies[0], figures.occupancies[2], figures.occupancies[4]):
        event = LlmResponse(text=text, tool_calls=two, usage=_usage(tokens), stop_reason="tool_use")
        moves.append(Move(f"llm_response({name}, 2 tool calls, tool_use)", event))
    moves += _failures("llm_error", LlmError)
    moves.append(
        Move(
            "provider_compacted(post_tokens given)",
            ProviderCompacted(summary=SUMMARY, post_tokens=2 * unit),
        )
    )
    moves.append(Move("provider_compacted(no figure)", ProviderCompacted(summary=SUMMARY)))
    moves.append(
        Move(
            "provider_compacted(post_tokens at threshold)",
            ProviderCompacted(summary=SUMMARY, post_tokens=figures.threshold),
        )
    )
    return tuple(moves)


def _provider_compacts(figures: _Figures) -> dict[RequestKind, tuple[Move, ...]]:
    """For a conversation whose provider compacts (REQ-SEG-048, REQ-SEG-049): responses that
    reach the window (its limit), responses after the provider's compaction (which left room,
    failed, or paused the turn), a stop with ``compaction`` and nothing compacted, the
    provider's refusal to compact, its compactions reported alone (with a block, at the
    threshold, failed), and its compaction on demand (done, refused)."""
    unit, threshold = figures.unit, figures.threshold
    block = CompactionBlock(provider="anthropic", content=SUMMARY, signature="sig")
    failed = ProviderCompacted(
        summary="", block=CompactionBlock(provider="anthropic", content=None)
    )
    room = ProviderCompacted(summary=SUMMARY, block=block, post_tokens=2 * unit)
    full = ProviderCompacted(summary=SUMMARY, block=block, post_tokens=threshold)
    text = _sized("The answer", unit)
    below = _usage(figures.below_warning)
    llm = (
        Move(
            "llm_response(at window, 0 tool calls)",
            LlmResponse(text=text, usage=_usage(figures.window)),
        ),
        Move(
            "llm_response(at window, 1 tool call)",
            LlmResponse(text=text, tool_calls=(_call("t1", unit),), usage=_usage(figures.window)),
        ),
        Move(
            "llm_response(after a provider compaction, below warning)",
            LlmResponse(text=text, usage=below, compactions=(room,)),
        ),
        Move(
            "llm_response(after a failed provider compaction, at threshold)",
            LlmResponse(text=text, usage=_usage(threshold), compactions=(failed,)),
        ),
        Move(
            "llm_response(paused after compacting)",
            LlmResponse(text="", stop_reason="compaction", compactions=(room,)),
        ),
        Move("llm_response(stopped with compaction)", LlmResponse(stop_reason="compaction")),
        Move("llm_error(compaction refused)", LlmError(message="boom", compaction_refused=True)),
        Move("provider_compacted(block)", room),
        Move("provider_compacted(block, post_tokens at threshold)", full),
        Move("provider_compacted(failed block)", failed),
    )
    compaction = (
        Move(
            "compaction_response(the provider's block)",
            CompactionResponse(summary=SUMMARY, retained_tokens=unit, block=block),
        ),
        Move(
            "compaction_failed(compaction refused)",
            CompactionFailed(error="boom", compaction_refused=True),
        ),
    )
    return {"llm": llm, "compaction": compaction}


_SUMMARIES: Final = (
    ("usable", SUMMARY, "end_turn"),
    ("empty", "  ", "end_turn"),
    ("refused", "I cannot summarise this.", "refusal"),
)


def _past_the_time_bound(bound: float | None) -> tuple[Move, ...]:
    """For a run with ``max_run_seconds``: a checkpoint answered, and one given up on, once the
    bound has passed (the answers above carry no time: the runtime did not measure one)."""
    if bound is None:
        return ()
    late = bound + 1
    return (
        Move(
            "checkpoint_response(checkpoint, past the time bound)",
            CheckpointResponse(text=CHECKPOINT, elapsed_seconds=late),
        ),
        Move(
            "checkpoint_failed(fatal, past the time bound)",
            CheckpointFailed(error="boom", elapsed_seconds=late),
        ),
    )


def _summary_answers(figures: _Figures) -> dict[RequestKind, tuple[Move, ...]]:
    """Answers to the three requests at the limit: usable, empty and refused summaries (measured
    or not, or over the window), checkpoints (one, none, one too large to seed a session),
    compactions that leave room or retain the threshold, an answer of each that called a tool,
    and the three failures of each."""
    measures = (
        ("no usage", None),
        ("below warning", figures.below_warning),
        ("over window", figures.window + 1),
    )
    continuations = tuple(
        Move(
            f"continuation_response({name}, {measured})",
            ContinuationResponse(summary=summary, usage=_usage(tokens), stop_reason=stop),
        )
        for name, summary, stop in _SUMMARIES
        for measured, tokens in measures
    )
    huge = "<checkpoint>\n## Goal\n" + "x" * (3 * figures.threshold) + "\n</checkpoint>"
    checkpoints: tuple[Move, ...] = (
        Move("checkpoint_response(checkpoint)", CheckpointResponse(text=CHECKPOINT)),
        Move("checkpoint_response(empty)", CheckpointResponse(text="")),
        Move("checkpoint_response(too large to seed)", CheckpointResponse(text=huge)),
    )
    compactions = tuple(
        Move(
            f"compaction_response({name}, retains {retained})",
            CompactionResponse(summary=summary, retained_tokens=retained, stop_reason=stop),
        )
        for name, summary, stop in _SUMMARIES
        for retained in (figures.unit, figures.threshold)
    )
    # A model that called a tool while summarising (REQ-SEG-056): refused where its tools were
    # callable (``reuse_prefix``), read for its text where they were not.
    called = (_call("s1", figures.unit),)
    continuations += (
        Move(
            "continuation_response(called a tool)",
            ContinuationResponse(summary=SUMMARY, tool_calls=called),
        ),
    )
    checkpoints += (
        Move(
            "checkpoint_response(called a tool)",
            CheckpointResponse(text=CHECKPOINT, tool_calls=called),
        ),
    )
    compactions += (
        Move(
            "compaction_response(called a tool)",
            CompactionResponse(summary=SUMMARY, retained_tokens=figures.unit, tool_calls=called),
        ),
    )
    return {
        "continuation": (*continuations, *_failures("continuation_failed", ContinuationFailed)),
        "checkpoint": (*checkpoints, *_failures("checkpoint_failed", CheckpointFailed)),
        "compaction": (*compactions, *_failures("compaction_failed", CompactionFailed)),
    }


def _strays(figures: _Figures) -> dict[RequestKind, tuple[Move, ...]]:
    """One answer and one failure of each request kind, delivered when that request is not in
    flight: late (after a cancel, or while a retry waits) or for nothing at all."""
    return {
        "llm": (
            Move(
                "late llm_response", LlmResponse(text="late", usage=_usage(figures.below_warning))
            ),
            Move("late llm_error", LlmError(message="late", retryable=True)),
            Move("late provider_compacted", ProviderCompacted(summary=SUMMARY)),
        ),
        "continuation": (
            Move("late continuation_response", ContinuationResponse(summary=SUMMARY)),
            Move("late continuation_failed", ContinuationFailed(error="late")),
        ),
        "checkpoint": (
            Move("late checkpoint_response", CheckpointResponse(text=CHECKPOINT)),
            Move("late checkpoint_failed", CheckpointFailed(error="late")),
        ),
        "compaction": (
            Move(
                "late compaction_response",
                CompactionResponse(summary=SUMMARY, retained_tokens=figures.unit),
            ),
            Move("late compaction_failed", CompactionFailed(error="late")),
        ),
    }


def _results(unit: int) -> dict[str, tuple[tuple[Move, ...], Move]]:
    def result(call_id: str, tokens: int) -> ToolResult:
        return ToolResult(tool_call_id=call_id, output="out", token_count=tokens)

    return {
        call_id: (
            (
                Move(f"tool_result({call_id}, {unit} tokens)", result(call_id, unit)),
                Move(f"tool_result({call_id}, {4 * unit} tokens)", result(call_id, 4 * unit)),
            ),
            Move(f"tool_result({call_id}, not running)", result(call_id, unit)),
        )
        for call_id in TOOL_IDS
    }


def _noise(figures: _Figures, *, pinned: bool) -> tuple[Move, ...]:
    """What may arrive in any phase: user messages (small, large, alone at the threshold, and
    with ``pinned`` a pinned one), a cancel, a manual trigger, a pause, a resume, a summary made
    again (asked for, and a continuation's made), a compaction taken back (one that fits, one
    at the threshold), timers for no pending retry, a result for a tool call nobody made, and a
    crash."""
    unit, threshold = figures.unit, figures.threshold
    pins = (
        # One fits the budget (a quarter of the window), a second one does not.
        Move(
            f"user_message({unit} tokens, pinned)",
            UserMessage(text="rules", token_count=unit, pinned=True),
        ),
    )
    return (
        Move(f"user_message({unit} tokens)", UserMessage(text="next", token_count=unit)),
        Move(
            f"user_message({4 * unit} tokens)",
            UserMessage(text="a long paste", token_count=4 * unit),
        ),
        Move(
            f"user_message({threshold} tokens, too large)",
            UserMessage(text="a huge paste", token_count=threshold),
        ),
        *(pins if pinned else ()),
        Move("user_cancel", UserCancel()),
        Move("manual_continuation", ManualContinuation()),
        Move("pause_requested", PauseRequested(reason="nightly stop")),
        Move("resume_requested", ResumeRequested()),
        Move("summary_redo_requested", SummaryRedoRequested()),
        Move("continuation_redone", ContinuationRedone(summary="What happened, kept better.")),
        Move(f"compaction_undo_requested({unit} tokens)", _undo(unit)),
        Move(f"compaction_undo_requested({threshold} tokens, too large)", _undo(threshold)),
        Move("retry_due(attempt 1, stale)", RetryDue(attempt=1)),
        Move("retry_due(attempt 2, stray)", RetryDue(attempt=2)),
        Move(
            f"tool_result({UNKNOWN_TOOL_ID}, unknown)",
            ToolResult(tool_call_id=UNKNOWN_TOOL_ID, output="out", token_count=unit),
        ),
        CRASH,
    )


def _undo(tokens: int) -> CompactionUndoRequested:
    """An undone compaction as the runtime sends it: one restored message, ``tokens`` in all."""
    restored = Message(kind="user", text="restored", copy_of=1)
    return CompactionUndoRequested(messages=(restored,), tokens=tokens)


@dataclass(frozen=True)
class Alphabet:
    """The moves the world may make: ``answers`` to the request in flight (by its kind),
    ``strays`` of every other kind (late, or for nothing), the results of the tools running
    (or one for a tool that is not), the timers the world holds, and ``noise`` delivered in
    every phase."""

    answers: Mapping[RequestKind, tuple[Move, ...]]
    strays: Mapping[RequestKind, tuple[Move, ...]]
    noise: tuple[Move, ...]
    results: Mapping[str, tuple[tuple[Move, ...], Move]]
    """Per tool id: its results while the tool runs (small, large), and one arriving when it
    does not run (after a cancel, a second time, or never asked for)."""
    _timers: dict[tuple[RequestKind, int], Move] = field(default_factory=dict, compare=False)

    @classmethod
    def for_config(
        cls,
        config: ConversationConfig,
        *,
        stop_reasons: tuple[str, ...] = STOP_REASONS,
        pinned: bool = True,
    ) -> Alphabet:
        """The alphabet for a conversation of ``config`` (its window and thresholds);
        ``pinned=False`` leaves pinned messages out (they double the space: every state is
        reached with and without one)."""
        figures = _Figures(config.context_window, config.warning_tokens, config.continuation_tokens)
        answers = {"llm": _llm_answers(figures, stop_reasons), **_summary_answers(figures)}
        answers["checkpoint"] += _past_the_time_bound(config.max_run_seconds)
        if config.compaction == "provider":
            for request, moves in _provider_compacts(figures).items():
                answers[request] += moves
        noise = _noise(figures, pinned=pinned)
        return cls(answers, _strays(figures), noise, _results(figures.unit))

    def timer(self, request: RequestKind, attempt: int) -> Move:
        """The move that fires the world's retry timer for ``request``'s ``attempt``."""
        key = (request, attempt)
        move = self._timers.get(key)
        if move is None:
            move = Move(f"retry_due({request}, attempt {attempt})", RetryDue(attempt=attempt), key)
            self._timers[key] = move
        return move

    def moves(self, world: World) -> list[Move]:
        """Everything the world may do next, in a fixed order (so paths are reproducible): the
        world, not the conversation, decides what can happen."""
        head = world.in_flight[0][0] if world.in_flight else None
        chosen: list[Move] = list(self.answers[head]) if head is not None else []
        for request, strays in self.strays.items():
            if request != head:
                chosen += strays
        chosen += (self.timer(*timer) for timer in sorted(world.timers))
        for call_id, (running, stale) in self.results.items():
            if call_id in world.running:
                chosen += running
            else:
                chosen.append(stale)
        chosen += self.noise
        return chosen
