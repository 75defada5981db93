"""The reference model: ``specs/transitions.toml`` rebuilt as a machine with the
``transitions`` library, beside ``transition()``.

Why a second machine: the rows say what happens (target, effects); this model adds the counters
the guards read (occupancy and what was appended since, the warning, attempts and retry timers,
tool calls awaiting results, continuations, the pause, the session, the last snapshot), written
from the guards' meanings, never from the handlers' helpers. ``tests/test_table.py`` runs it
beside ``transition()`` row by row and on random event sequences; ``tests/test_exploration.py``
runs it on every edge of the bounded exhaustive exploration. A disagreement is a drift of the
code, of the table, or of this model's reading of the requirements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, cast

from transitions import Machine

from segue import (
    ConversationState,
    ErrorKind,
    Failed,
    Paused,
    SessionSnapshot,
    Usage,
    checkpoint_sections,
    compile_resume_context,
    continuation_prompt,
    estimate_tokens,
    extract_checkpoint,
)
from segue.statemachine.checkpoint import extract_decisions
from segue.statemachine.machine import (
    OPAQUE_SUMMARY,
    RESUME_PROMPT,
    TOOL_NOT_RUN_CANCELLED,
    TOOL_NOT_RUN_LIMIT,
)
from segue.statemachine.pacing import duration_words, turns_words
from segue.statemachine.spec import PHASE_KINDS, Row


def _tokens(text: str, counted: int | None) -> int:
    return counted if counted is not None else estimate_tokens(text)


def _reported(usage: Usage | None) -> int | None:
    """Occupancy a usage report states: its four fields summed, ``None`` when it says nothing
    (absent, or no prompt tokens: every prompt holds at least one message)."""
    if usage is None:
        return None
    if usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens == 0:
        return None
    total = (
        usage.input_tokens
        + usage.output_tokens
        + usage.cache_creation_input_tokens
        + usage.cache_read_input_tokens
    )
    return total or None


def _checkpoint_text(event: Any) -> str:
    return str(event.text) if event.kind == "checkpoint_response" else ""


class _PhaseModel:
    """What ``transitions`` drives: it only holds the phase kind (``state``)."""

    state: str


class Reference:
    """The machine rebuilt from the table's rows, with its own simple counters.

    States are phase kinds, triggers are event kinds, each row is a transition whose condition
    is the guard predicate below (written from the guard's meaning, never from the handlers'
    helpers) and whose ``before`` callback keeps the counters: occupancy and what was appended
    since, the warning, the attempt and its retry timer, the tool calls awaiting results, the
    continuations used, the pause flag, the session and the last snapshot.
    """

    def __init__(self, state: ConversationState, rows: Sequence[Row]) -> None:
        self.behavior = state.config.behavior.value
        self.rows = tuple(row for row in rows if not row.is_noop and row.applies_to(self.behavior))
        self.by_pair: dict[tuple[str, str], list[Row]] = {}
        for row in self.rows:
            self.by_pair.setdefault(row.pair, []).append(row)
        self.model = _PhaseModel()
        self.taken: Row | None = None
        self.machine = Machine(
            model=self.model,
            states=list(PHASE_KINDS),
            initial=state.phase.kind,
            auto_transitions=False,
            ignore_invalid_triggers=True,
            send_event=True,
        )
        for row in self.rows:
            self.machine.add_transition(
                row.event,
                row.phase,
                row.target,
                conditions=[self._condition(row)],
                before=[self._action(row)],
            )
        self.load(state)

    def load(self, state: ConversationState) -> Reference:
        """Take the phase and every counter from ``state`` (a conversation of the same
        behaviour): the model as it stands had it followed that conversation from its start.

        Building the machine costs far more than stepping it, so the exploration keeps one per
        behaviour and loads each state it steps from.
        """
        config = state.config
        assert config.behavior.value == self.behavior, "one reference model per behaviour"
        self.conversation_id = config.id
        self.window = config.context_window
        self.warning = config.warning_tokens
        self.threshold = config.continuation_tokens
        self.max_attempts = config.max_attempts
        self.max_continuations = config.max_continuations
        self.system = config.system_tokens
        self.budget = config.context_window // 4  # what pinned messages may hold (REQ-SEG-042)
        self.cap = config.tool_output_cap  # what one tool result may hold (REQ-SEG-043)
        self.max_run = config.max_run_seconds  # a restarting run's time (REQ-SEG-044)
        self.pinned = state.pinned_tokens
        self.provider = config.compaction == "provider"  # the provider compacts (REQ-SEG-048)
        self.fallback = state.compaction_fallback  # ... until it failed once (REQ-SEG-049)
        self.context = state.context_tokens
        self.pending = state.pending_tokens
        self.warned = state.warned
        self.continuations = state.continuations
        self.pause = state.pause_requested
        self.reason = state.pause_reason
        self.session = state.session
        self.snapshots = state.snapshots
        self.rounds = state.tool_rounds
        self.max_rounds = config.max_tool_rounds
        self.turns = state.turns_since_resume  # the pause triggers (REQ-SEG-052 to 054)
        self.since = state.active_since
        self.pause_turns = config.pause_after_turns
        self.pause_seconds = config.pause_after_seconds
        phase: Any = state.phase
        fields = _fields(phase)
        self.final: bool = fields.get("final", False)
        self.alternate: bool = fields.get("alternate", False)
        self.exhausted: bool = fields.get("exhausted", False)
        self.attempt: int = fields.get("attempt", 1)
        self.trim: int = fields.get("trim_level", 0)
        self.retry: bool = fields.get("retry_pending", False)
        self.purpose: str = fields.get("purpose", "restart")
        self.resume_after: bool = fields.get("resume_after", False)
        self.summary_request: str = config.summary_request  # REQ-SEG-055
        self.shape: str = fields.get("shape", self.summary_request)
        self.tool_answers: int = fields.get("tool_answers", 0)
        self.redo: bool = fields.get("redo", False)  # a summary made again (REQ-SEG-063)
        self.waiting: list[str] = list(fields.get("pending", ()))
        self.recoverable: bool = isinstance(phase, Failed) and phase.error_kind in _RECOVERABLE
        self.snapshot: SessionSnapshot | None = (
            phase.snapshot if isinstance(phase, Paused) else None
        )
        self.machine.set_state(phase.kind)
        return self

    # ------------------------------------------------------------------ driving

    @property
    def phase(self) -> str:
        """The phase kind the reference is in."""
        return str(self.model.state)

    def step(self, event: Any) -> bool:
        """Feed ``event``; whether a row fired (``False``: nothing changed). The row that fired
        is ``taken`` afterwards."""
        self.taken = None
        if (self.phase, event.kind) not in self.by_pair:
            return False  # no row for the pair: nothing changes (and transitions logs nothing)
        if event.kind == "llm_response" and not self.retry:
            # The provider's compactions of the same call come first, in the same step.
            for compaction in event.compactions:
                cast(Any, self.model).trigger(compaction.kind, event=compaction)
        return bool(cast(Any, self.model).trigger(event.kind, event=event))

    def select(self, event: Any) -> Row | None:
        """The row ``event`` would take now, without taking it."""
        for row in self.by_pair.get((self.phase, event.kind), ()):
            if GUARDS[row.guard](self, event):
                return row
        return None

    def observed(self) -> tuple[object, ...]:
        """What is compared with a ``ConversationState`` (see ``observed()``)."""
        phase = self.phase
        requesting = phase in _REQUESTS
        return (
            phase,
            self.attempt if requesting else None,
            self.retry if requesting else None,
            self.trim if requesting and phase != "llm_requesting" else None,
            self.purpose if phase == "awaiting_checkpoint" else None,
            self.exhausted if phase == "awaiting_checkpoint" else None,
            self.resume_after if phase in ("awaiting_checkpoint", "compacting") else None,
            tuple(self.waiting) if phase == "tool_executing" else None,
            self.context,
            self.pending,
            self.warned,
            self.continuations,
            self.pause,
            self.session,
            self.snapshots,
            self.rounds,
            self.final if phase == "llm_requesting" else None,
            self.alternate if phase in ("awaiting_continuation", "compacting") else None,
            self.pinned,
            self.fallback,
            self.shape if phase in _SUMMARISING else None,
            self.tool_answers if phase in _SUMMARISING else None,
            self.turns,
            self.since,
        )

    def books(self) -> tuple[object, ...]:
        """What the model keeps beyond ``observed()`` that a later guard may read, masked by
        phase: the pause's reason, whether a failure is recoverable, the snapshot a resume
        compiles. ``books(state)`` reads the same from a state, as ``load`` would."""
        phase = self.phase
        return _books(
            self.reason if self.pause else None,
            self.recoverable if phase == "failed" else None,
            self.snapshot if phase == "paused" else None,
        )

    def _condition(self, row: Row) -> Callable[[Any], bool]:
        guard = GUARDS[row.guard]
        return lambda event_data: guard(self, event_data.kwargs["event"])

    def _action(self, row: Row) -> Callable[[Any], None]:
        def act(event_data: Any) -> None:
            self.taken = row
            self._apply(row, event_data.kwargs["event"])

        return act

    # ------------------------------------------------------------------ figures guards read

    @property
    def projected(self) -> int:
        return (self.context or 0) + self.pending

    @property
    def at_bound(self) -> bool:
        return self.continuations >= self.max_continuations

    @property
    def limit(self) -> int:
        """Where segue takes the path at the limit: the threshold, or the window while the
        provider compacts the conversation itself (REQ-SEG-048)."""
        if self.provider and not self.fallback and not self.at_bound:
            return self.window
        return self.threshold

    def projected_after_response(self, event: Any) -> int:
        """The projected prompt once the response is measured (its occupancy when usable,
        else what it adds to the projection)."""
        known = self.known(event)
        if known is not None:
            return known
        return (
            self.projected
            + estimate_tokens(event.text)
            + sum(estimate_tokens(call.name + repr(call.input)) for call in event.tool_calls)
        )

    def refuses_compaction(self, event: Any) -> bool:
        """The provider cannot compact a conversation that asked it to (REQ-SEG-049)."""
        return bool(event.compaction_refused) and self.provider and not self.fallback

    def paused_after_compacting(self, event: Any) -> bool:
        """The provider stopped after its compaction, as asked (REQ-SEG-048)."""
        return event.stop_reason == "compaction" and not event.tool_calls and self.provider

    def at_bound_after(self, event: Any) -> bool:
        """At the bound once ``event`` is taken: resuming a pause taken at the limit is itself a
        continuation (REQ-SEG-027), counted before the new session's pre-flight."""
        resumed = (
            event.kind == "resume_requested"
            and self.snapshot is not None
            and self.snapshot.trigger == "exhaustion"
        )
        return self.continuations + resumed >= self.max_continuations

    def projected_after(self, event: Any) -> int:
        """The projected prompt once ``event``'s part is appended (a new session's, on resume)."""
        if event.kind == "resume_requested":
            assert self.snapshot is not None
            prompt = event.prompt if event.prompt and event.prompt.strip() else RESUME_PROMPT
            context = compile_resume_context(self.snapshot)
            return self.system + self.pinned + estimate_tokens(context) + estimate_tokens(prompt)
        if event.kind == "user_message":
            return self.projected + _tokens(event.text, event.token_count)
        if event.kind == "tool_result":
            return self.projected + self.result_tokens(event)
        return self.projected

    def result_tokens(self, event: Any) -> int:
        """What a tool result adds: its tokens, at most the cap (what is past it is cut,
        REQ-SEG-043)."""
        return min(_tokens(event.output, event.token_count), self.cap)

    def pinned_over(self, event: Any) -> bool:
        """A pinned message that would take the pinned messages past their budget."""
        return bool(event.pinned) and self.pinned + _tokens(event.text, event.token_count) > (
            self.budget
        )

    def out_of_time(self, event: Any) -> bool:
        """A restart's answer after the run's time bound (REQ-SEG-044)."""
        elapsed = getattr(event, "elapsed_seconds", None)
        return (
            self.purpose == "restart"
            and self.max_run is not None
            and elapsed is not None
            and elapsed >= self.max_run
        )

    def over_the_limit(self, event: Any) -> bool:
        """The response asks for tools and the turn has used its tool rounds."""
        return bool(event.tool_calls) and self.rounds >= self.max_rounds

    def projected_after_limit(self, event: Any) -> int:
        """The projected prompt once the response is measured and its calls answered as not
        run: what the grace request's pre-flight compares with the threshold."""
        known = self.known(event)
        if known is not None:
            base = known
        else:
            base = (
                self.projected
                + estimate_tokens(event.text)
                + sum(estimate_tokens(call.name + repr(call.input)) for call in event.tool_calls)
            )
        return base + len(event.tool_calls) * estimate_tokens(TOOL_NOT_RUN_LIMIT)

    def seed_tokens(self, text: str) -> int:
        """A restarted session's first prompt: system tokens, the pinned messages and the
        continuation prompt."""
        seed = continuation_prompt(extract_checkpoint(text))
        return self.system + self.pinned + estimate_tokens(seed)

    def ends_turn(self, row: Row, event: Any) -> bool:
        """The response answers its turn for good: no tools asked for (or none that will run),
        and no path at the limit that goes on with the task (REQ-SEG-052)."""
        base = row.guard.removesuffix("_at_bound")
        if base in ("crosses_continuation", "window_exceeded"):
            return not (event.tool_calls or event.stop_reason in _MID_TASK_STOPS)
        return row.guard in _ENDS_TURN

    def due(self, event: Any) -> str | None:
        """Why a response that ends its turn pauses the conversation (the count of turns, this
        one included, or the time since it was created or last resumed, reached their trigger:
        REQ-SEG-052, 053), in words; None when neither did."""
        reasons = []
        if self.pause_turns is not None and self.turns + 1 >= self.pause_turns:
            reasons.append(turns_words(self.pause_turns))
        since = self.since if self.since is not None else event.at
        if (
            self.pause_seconds is not None
            and event.at is not None
            and since is not None
            and event.at - since >= self.pause_seconds
        ):
            reasons.append(duration_words(self.pause_seconds))
        return "after " + " and ".join(reasons) if reasons else None

    def pausing(self, event: Any) -> bool:
        """A pause is pending at the end of this turn: asked for, or due (REQ-SEG-052)."""
        return self.pause or self.due(event) is not None

    def gives_up(self, event: Any) -> bool:
        return self.attempt >= self.max_attempts or not (event.retryable or event.context_overflow)

    def known(self, event: Any) -> int | None:
        """The response's occupancy when it is usable: stated, and within the window."""
        reported = _reported(event.usage)
        return reported if reported is not None and reported <= self.window else None

    # ------------------------------------------------------------------ counters

    def _apply(self, row: Row, event: Any) -> None:
        if row.guard in ("retry_pending", "stale_retry", "unknown_tool_call"):
            return  # answers nobody waits for any more
        if row.guard == "summary_called_tool":  # REQ-SEG-056: never run, asked again
            self.tool_answers += 1
            # Two asks with the turn's prefix at most, then the tool-less request.
            self.shape = "reuse_prefix" if self.tool_answers < 2 else "tool_less"
            self.attempt = 1
            if row.event == "continuation_response" and self.known(event) is not None:
                self.context, self.pending = self.known(event), 0  # its answer measured all
            return
        if row.guard == "summary_unusable_first":
            self.alternate, self.attempt = True, 1  # the same request, asked another way
            if row.event == "continuation_response" and self.known(event) is not None:
                self.context, self.pending = self.known(event), 0  # its answer measured all
            return
        self._record(row, event)
        self._fresh_start(row, event)
        self._enter(row, event)

    def _record(self, row: Row, event: Any) -> None:
        """What the event itself adds: its tokens, its measurement, a flag, a timer, an attempt."""
        kind = row.event
        if kind == "user_message" and row.guard in _TAKES_MESSAGE:
            self.pending += _tokens(event.text, event.token_count)
            self.rounds = 0
            if event.pinned:
                self.pinned += _tokens(event.text, event.token_count)
        elif kind == "llm_response":
            self._measure(event)
            self._count_turn(row, event)
            if row.guard.startswith(("tool_round_limit", "final_tool_calls")):
                self.pending += len(event.tool_calls) * estimate_tokens(TOOL_NOT_RUN_LIMIT)
            elif row.guard == "has_tool_calls":
                self.rounds += 1
        elif kind == "tool_result":
            self.pending += self.result_tokens(event)
            self.waiting.remove(event.tool_call_id)
        elif kind == "user_cancel" and row.phase == "tool_executing":
            self.pending += len(self.waiting) * estimate_tokens(TOOL_NOT_RUN_CANCELLED)
        elif kind == "pause_requested" and not self.pause:
            self.pause, self.reason = True, event.reason
        elif kind == "retry_due":
            self.attempt, self.retry = event.attempt, False
        elif kind == "continuation_response" and self.known(event) is not None:
            self.context, self.pending = self.known(event), 0
        self.fallback = self.fallback or row.guard in _FALLS_BACK
        if row.guard == "retryable_attempts_left":
            self.retry = True
        elif row.guard == "overflow_attempts_left":
            self.attempt, self.trim = self.attempt + 1, self.trim + 1
            self.shape = "tool_less"  # a trimmed history is not the turn's prefix

    def _count_turn(self, row: Row, event: Any) -> None:
        """A response that ends its turn counts it, and makes a pause pending when a trigger is
        due (REQ-SEG-052, 053); a pause asked for keeps its reason."""
        if not self.ends_turn(row, event):
            return
        reason = None if self.pause else self.due(event)
        self.turns += 1
        if self.since is None:
            self.since = event.at
        if reason is not None:
            self.pause, self.reason = True, reason

    def _fresh_start(self, row: Row, event: Any) -> None:
        """A new session (restart, resume) or a new generation (compaction)."""
        if row.event == "resume_requested":
            assert self.snapshot is not None
            if self.snapshot.trigger == "exhaustion":
                self.continuations += 1
            self.turns, self.since = 0, event.at  # the triggers count from the resume
            self._new_session(self.projected_after(event))
        elif (
            row.phase == "awaiting_checkpoint"
            and row.guard in _RESTARTS
            and (row.event in _CHECKPOINT_OUTCOMES)
        ):
            self._new_session(self.seed_tokens(_checkpoint_text(event)))
            self.continuations += 1
        elif row.event == "compaction_undo_requested" and row.effects:
            self.context, self.pending = None, event.tokens  # a generation of copies
        elif row.event == "compaction_response" and row.target != "failed":
            self.continuations += not self.redo  # a summary made again adds none
            self.context, self.pending = None, event.retained_tokens
        elif row.event == "provider_compacted" and row.guard in ("always", "holds_history"):
            summary = event.summary
            if row.guard == "holds_history":  # segue holds the history: one of its compactions
                self.continuations = min(self.continuations + 1, self.max_continuations)
                summary = summary.strip() or OPAQUE_SUMMARY
            self.context = None
            self.pending = (
                self.system + estimate_tokens(summary)
                if event.post_tokens is None
                else event.post_tokens
            )

    def _measure(self, event: Any) -> None:
        known = self.known(event)
        if known is None:
            self.pending += estimate_tokens(event.text) + sum(
                estimate_tokens(call.name + repr(call.input)) for call in event.tool_calls
            )
        else:
            self.context, self.pending = known, 0
            self.warned = self.warned or known >= self.warning

    def _new_session(self, pending: int) -> None:
        self.session += 1
        self.context, self.pending, self.warned = None, pending, False
        self.rounds = 0

    def _enter(self, row: Row, event: Any) -> None:
        source, target = row.phase, row.target
        if row.event == "user_cancel":
            self.reason = ""  # a cancel abandons a pending pause, and its reason with it
        if target == "tool_executing" and source != target:
            self.waiting = list(dict.fromkeys(call.id for call in event.tool_calls))
        elif target == "failed" and (source != target or row.behavior != "*"):
            self.recoverable = row.event == "llm_error" and row.guard in (
                "retryable_attempts_spent",
                "not_retryable",
            )
        elif target == "paused" and source != target:
            checkpoint = extract_checkpoint(_checkpoint_text(event))
            self.snapshots += 1
            self.snapshot = SessionSnapshot(
                conversation_id=self.conversation_id,
                version=self.snapshots,
                session=self.session,
                trigger="exhaustion" if self.exhausted else "pause",
                reason=self.reason,
                checkpoint=checkpoint,
                sections=checkpoint_sections(checkpoint),
                context_tokens=self.context,
                context_window=self.window,
                decisions=extract_decisions(checkpoint),
            )
            self.reason = ""
        if target in ("idle", "failed", "context_exhausted", "paused"):
            self.pause = False
        grace = row.guard == "tool_round_limit" and target == "llm_requesting"
        asked_again = row.guard in ("compaction_paused", "compaction_refused") and (
            target == "llm_requesting"  # the turn's request, asked again (final if it was)
        )
        new_request = target in _REQUESTS and (
            source != target
            or grace
            or asked_again
            or (source == "awaiting_checkpoint" and "pause_pending" in row.guard)
        )
        if not new_request:
            return
        self.attempt, self.retry, self.trim = 1, False, 0
        self.shape, self.tool_answers = self.summary_request, 0
        self.redo = row.event == "summary_redo_requested"
        self.final, self.alternate = (self.final if asked_again else grace), False
        self.exhausted = False
        if row.guard in _PAUSE_BEFORE_A_REQUEST:  # a pause taken where the turn asks again
            self.purpose, self.resume_after = "pause", True
        elif row.behavior != "*":  # the exhaustion path: a restart checkpoint or a compaction
            self.purpose = "restart"
            if row.behavior == "checkpoint_pause":  # or a pause at the limit
                self.purpose, self.exhausted = "pause", True
            # Mid-task (resume at once): tools were asked for, the turn stopped mid-task
            # (pause_turn, REQ-SEG-034), the provider overflowed, or pre-flight stopped a
            # request; not after a finished turn or a manual trigger.
            base = row.guard.removesuffix("_at_bound")
            mid_task = getattr(event, "stop_reason", "") in _MID_TASK_STOPS
            self.resume_after = (
                bool(event.tool_calls) or mid_task
                if base == "crosses_continuation"
                else base
                in (
                    "preflight_over",
                    "context_overflow",
                    "window_exceeded",
                    "tool_round_limit_preflight_over",
                    "retry_over_threshold",
                    "compaction_refused_preflight_over",
                    "compaction_paused_preflight_over",
                )
            )
        elif target == "awaiting_checkpoint":  # a pause taken at a turn boundary
            self.purpose = "pause"
            if source == "tool_executing":
                self.resume_after = True
            elif source in ("idle", "llm_requesting") or row.event in (
                "user_cancel",
                "compaction_failed",
            ):
                self.resume_after = False


_MID_TASK_STOPS: Final = frozenset({"model_context_window_exceeded", "pause_turn"})
"""Stop reasons of a response that ended in the middle of the agent's work: the window ran out
(REQ-SEG-007), or the provider or an adapter paused the turn (REQ-SEG-034)."""
_FALLS_BACK: Final = frozenset(
    {
        "compaction_refused",
        "compaction_refused_preflight_over",
        "compaction_refused_preflight_over_at_bound",
        "compaction_refused_pause_pending",
        "compaction_failed",
    }
)
"""The guards under which the provider failed a conversation's compaction (REQ-SEG-049)."""
_ENDS_TURN: Final = frozenset(
    {
        "truncated_pause_pending",
        "truncated",
        "final_tool_calls_pause_pending",
        "final_tool_calls",
        "ends_turn_pause_pending",
        "crosses_warning",
        "usage_unknown",
        "accounting_anomaly",
        "ends_turn",
    }
)
"""The llm_response guards of a response that ends its turn where it stands (REQ-SEG-052)."""
_PAUSE_BEFORE_A_REQUEST: Final = frozenset(
    {
        "tool_round_limit_pause_pending",
        "compaction_paused_pause_pending",
        "compaction_refused_pause_pending",
    }
)
"""Pauses taken where the turn was about to ask the model (so the session resumes asking)."""
_TAKES_MESSAGE: Final = frozenset({"preflight_over", "preflight_over_at_bound", "fits"})
"""The user_message guards under which the message is recorded (the rest reject it)."""
_RESTARTS: Final = frozenset(
    {
        "pause_pending",
        "resume_after",
        "no_resume_after",
        "always",
        "gives_up_pause_pending",
        "gives_up_resume_after",
        "gives_up_no_resume_after",
    }
)
"""The guards under which a restart checkpoint's outcome (in awaiting_checkpoint) starts a new
session."""
_CHECKPOINT_OUTCOMES: Final = ("checkpoint_response", "checkpoint_failed", "user_cancel")
_SUMMARISING: Final = ("awaiting_continuation", "awaiting_checkpoint", "compacting")
_REQUESTS: Final = ("llm_requesting", "awaiting_continuation", "awaiting_checkpoint", "compacting")

Guard = Callable[[Reference, Any], bool]

GUARDS: Final[dict[str, Guard]] = {
    "always": lambda r, e: True,
    "unhandled": lambda r, e: True,
    "undo_over_limit": lambda r, e: not e.messages or e.tokens >= r.threshold,
    "message_too_large": lambda r, e: _tokens(e.text, e.token_count) >= r.threshold,
    "pin_over_budget": lambda r, e: r.pinned_over(e),
    "run_time_spent": lambda r, e: r.out_of_time(e),
    "gives_up_run_time_spent": lambda r, e: r.gives_up(e) and r.out_of_time(e),
    "preflight_over": lambda r, e: r.projected_after(e) >= r.limit,
    "preflight_over_at_bound": lambda r, e: r.projected_after(e) >= r.limit and r.at_bound_after(e),
    "fits": lambda r, e: r.projected_after(e) < r.limit,
    "at_bound": lambda r, e: r.at_bound,
    "pause_pending": lambda r, e: r.pause,
    "retry_pending": lambda r, e: r.retry,
    "retry_over_threshold": lambda r, e: (
        r.retry and e.attempt == r.attempt + 1 and r.projected >= r.limit
    ),
    "retry_over_threshold_at_bound": lambda r, e: (
        r.retry and e.attempt == r.attempt + 1 and r.projected >= r.limit and r.at_bound
    ),
    "retry_due_current": lambda r, e: r.retry and e.attempt == r.attempt + 1,
    "stale_retry": lambda r, e: not (r.retry and e.attempt == r.attempt + 1),
    "context_overflow": lambda r, e: e.context_overflow,
    "context_overflow_at_bound": lambda r, e: e.context_overflow and r.at_bound,
    "retryable_attempts_left": lambda r, e: e.retryable and r.attempt < r.max_attempts,
    "retryable_attempts_spent": lambda r, e: e.retryable and r.attempt >= r.max_attempts,
    "not_retryable": lambda r, e: not (e.retryable or e.context_overflow),
    "crosses_continuation": lambda r, e: (r.known(e) or 0) >= r.limit,
    "crosses_continuation_at_bound": lambda r, e: (r.known(e) or 0) >= r.limit and r.at_bound,
    "window_exceeded": lambda r, e: e.stop_reason == "model_context_window_exceeded",
    "window_exceeded_at_bound": lambda r, e: (
        e.stop_reason == "model_context_window_exceeded" and r.at_bound
    ),
    "truncated_pause_pending": lambda r, e: e.stop_reason == "max_tokens" and r.pausing(e),
    "truncated": lambda r, e: e.stop_reason == "max_tokens",
    "final_tool_calls_pause_pending": lambda r, e: r.final and bool(e.tool_calls) and r.pausing(e),
    "final_tool_calls": lambda r, e: r.final and bool(e.tool_calls),
    "tool_round_limit": lambda r, e: r.over_the_limit(e),
    "tool_round_limit_preflight_over": lambda r, e: (
        r.over_the_limit(e) and r.projected_after_limit(e) >= r.limit
    ),
    "tool_round_limit_preflight_over_at_bound": lambda r, e: (
        r.over_the_limit(e) and r.projected_after_limit(e) >= r.limit and r.at_bound
    ),
    "tool_round_limit_pause_pending": lambda r, e: r.over_the_limit(e) and r.pause,
    "has_tool_calls": lambda r, e: bool(e.tool_calls),
    "ends_turn_pause_pending": lambda r, e: not e.tool_calls and r.pausing(e),
    "crosses_warning": lambda r, e: not r.warned and (r.known(e) or 0) >= r.warning,
    "usage_unknown": lambda r, e: _reported(e.usage) is None,
    "accounting_anomaly": lambda r, e: (_reported(e.usage) or 0) > r.window,
    "ends_turn": lambda r, e: (
        not e.tool_calls and r.known(e) is not None and (r.warned or (r.known(e) or 0) < r.warning)
    ),
    "unknown_tool_call": lambda r, e: e.tool_call_id not in r.waiting,
    "other_tools_pending": lambda r, e: bool(set(r.waiting) - {e.tool_call_id}),
    "summary_unusable_first": lambda r, e: _unusable(e) and not r.alternate,
    "summary_unusable": lambda r, e: _unusable(e),
    "summary_usable": lambda r, e: bool(e.summary.strip()) and e.stop_reason != "refusal",
    "summary_called_tool": lambda r, e: bool(e.tool_calls) and r.shape == "reuse_prefix",
    "gives_up": lambda r, e: r.gives_up(e),
    "overflow_attempts_left": lambda r, e: e.context_overflow and r.attempt < r.max_attempts,
    "exhausted_pause": lambda r, e: r.purpose == "pause" and r.exhausted,
    "pause_purpose": lambda r, e: r.purpose == "pause",
    "seed_too_large": lambda r, e: r.seed_tokens(_checkpoint_text(e)) >= r.threshold,
    "resume_after": lambda r, e: r.resume_after,
    "no_resume_after": lambda r, e: not r.resume_after,
    "gives_up_pause_purpose": lambda r, e: r.gives_up(e) and r.purpose == "pause",
    "gives_up_seed_too_large": lambda r, e: r.gives_up(e) and r.seed_tokens("") >= r.threshold,
    "gives_up_pause_pending": lambda r, e: r.gives_up(e) and r.pause,
    "gives_up_resume_after": lambda r, e: r.gives_up(e) and r.resume_after,
    "gives_up_no_resume_after": lambda r, e: r.gives_up(e) and not r.resume_after,
    "retained_too_large": lambda r, e: e.retained_tokens >= r.threshold,
    "unrecoverable": lambda r, e: not r.recoverable,
    # REQ-SEG-049: the provider refused to compact; the request is asked again, the
    # projection now compared with the threshold (fallen back, the limit is the threshold).
    "compaction_refused_preflight_over_at_bound": lambda r, e: (
        r.refuses_compaction(e) and r.projected >= r.threshold and r.at_bound
    ),
    "compaction_refused_preflight_over": lambda r, e: (
        r.refuses_compaction(e) and r.projected >= r.threshold
    ),
    "compaction_refused_pause_pending": lambda r, e: r.refuses_compaction(e) and r.pause,
    "compaction_refused": lambda r, e: r.refuses_compaction(e),
    # REQ-SEG-048: the provider paused after compacting; the turn asks again at once.
    "compaction_paused_preflight_over_at_bound": lambda r, e: (
        r.paused_after_compacting(e) and r.projected_after_response(e) >= r.limit and r.at_bound
    ),
    "compaction_paused_preflight_over": lambda r, e: (
        r.paused_after_compacting(e) and r.projected_after_response(e) >= r.limit
    ),
    "compaction_paused_pause_pending": lambda r, e: r.paused_after_compacting(e) and r.pause,
    "compaction_paused": lambda r, e: r.paused_after_compacting(e),
    "compaction_failed": lambda r, e: _failed_block(e) and not r.fallback,
    "compaction_failed_again": lambda r, e: _failed_block(e),
    "holds_history": lambda r, e: e.block is not None,
}
"""Each guard of the table as a predicate over the reference's counters and the event, read
"given that no earlier row of the pair matched" as the table says."""


def _failed_block(event: Any) -> bool:
    """A compaction whose block holds nothing: an Anthropic block without a summary, an
    OpenAI item without its content."""
    block = event.block
    if block is None:
        return False
    if block.provider == "anthropic":
        return block.content is None or not block.content.strip()
    return not block.encrypted_content


def _unusable(event: Any) -> bool:
    return not event.summary.strip() or event.stop_reason == "refusal"


def observed(state: ConversationState) -> tuple[object, ...]:
    """The figures of a state the reference keeps too: the phase and its request data, then
    occupancy, the warning, continuations, the pause flag, the session and the snapshots."""
    phase: Any = state.phase
    fields = _fields(phase)
    return (
        phase.kind,
        fields.get("attempt"),
        fields.get("retry_pending"),
        fields.get("trim_level"),
        fields.get("purpose"),
        fields.get("exhausted"),
        fields.get("resume_after"),
        fields.get("pending"),
        state.context_tokens,
        state.pending_tokens,
        state.warned,
        state.continuations,
        state.pause_requested,
        state.session,
        state.snapshots,
        state.tool_rounds,
        fields.get("final"),
        fields.get("alternate"),
        state.pinned_tokens,
        state.compaction_fallback,
        fields.get("shape"),
        fields.get("tool_answers"),
        state.turns_since_resume,
        state.active_since,
    )


def books(state: ConversationState) -> tuple[object, ...]:
    """What ``Reference.books()`` holds for a model loaded from ``state``."""
    phase: Any = state.phase
    kind = phase.kind
    return _books(
        state.pause_reason if state.pause_requested else None,
        phase.error_kind in _RECOVERABLE if kind == "failed" else None,
        phase.snapshot if kind == "paused" else None,
    )


def _books(
    reason: str | None, recoverable: bool | None, snapshot: SessionSnapshot | None
) -> tuple[object, ...]:
    if snapshot is None:
        return (reason, recoverable, None)
    resume = (snapshot.trigger, snapshot.context_tokens, compile_resume_context(snapshot))
    return (reason, recoverable, resume)


_RECOVERABLE: Final = frozenset({ErrorKind.LLM_ERROR, ErrorKind.RETRIES_EXHAUSTED})


def _fields(value: Any) -> dict[str, Any]:
    """A model's fields by name: ``getattr`` with a default goes through pydantic's slow
    ``__getattr__`` for every field a phase does not have, and the exploration asks often."""
    return cast(dict[str, Any], value.__dict__)
