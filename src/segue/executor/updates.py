"""Updates: what a turn tells a watching UI as it happens, as typed, frozen values.

``Runtime.stream()`` yields them for one turn and ``Runtime.watch()`` for every turn of a
conversation. Each has a ``kind`` (``Update`` is a discriminated union on it) and dumps to JSON
with ``model_dump_json()``, which is what the reference server sends as Server-Sent Events.

They are observations, never commands: the state and the transcript in the store are the truth,
and a consumer that misses updates (it connected late, it fell behind) reads them there. What
the updates promise:

- ``text`` deltas of one ``response`` join to exactly the text stored for that response; a
  ``retry`` voids the partial text of the response before it (that attempt failed and its text
  was never stored).
- ``occupancy`` follows every change of the figure a context meter shows, with the level the
  conversation's own thresholds give it.
- ``done`` comes last, once per turn, with the state the turn ended in and the text of its final
  assistant reply.

One fold, ``updates_of``, says what each committed step tells a watcher. The runtime that drives
the turn calls it on each commit (``UpdateBus.committed``); a runtime that reads the turn back
from the store (``feed``) calls it on each step it replays from the event log. So both hear
the same updates, in the same order, with the same reasons. Only what never reaches the store
stays live: the ``text`` deltas of a response as the model writes them (the fold gives the
reply whole, which the driving runtime settles against what it streamed), the tools a
provider's own agent runs, what a provider cleared from its context (``context_edited``), and
the ``done`` that closes a drive which changed nothing (a refused message).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import Field

from segue.effects import Effect, ExecuteTools, RequestKind
from segue.statemachine import (
    WAITING_PHASES,
    ConversationState,
    ErrorKind,
    Event,
    Message,
    ToolExecuting,
    ToolResult,
)
from segue.statemachine._values import Frozen

Level = Literal["ok", "warning", "critical"]
"""Where occupancy stands: below the warning threshold, from it, from the continuation one."""


class UserMessageUpdate(Frozen):
    """A user-role message was recorded (the user's, or a seed or resume prompt)."""

    kind: Literal["user_message"] = "user_message"
    text: str
    pinned: bool = False
    """The message is pinned: never summarised away (REQ-SEG-042)."""


class TextUpdate(Frozen):
    """A piece of the assistant's reply, as the model writes it."""

    kind: Literal["text"] = "text"
    text: str
    response: int
    """Which response of this runtime the text belongs to (a turn with tools has several)."""


class ToolStartedUpdate(Frozen):
    """A tool the model asked for starts running."""

    kind: Literal["tool_started"] = "tool_started"
    id: str
    name: str
    input: dict[str, Any]


class ToolFinishedUpdate(Frozen):
    """A tool finished (``is_error``: it failed, timed out or does not exist)."""

    kind: Literal["tool_finished"] = "tool_finished"
    id: str
    name: str
    is_error: bool
    output: str


class OccupancyUpdate(Frozen):
    """The context meter: ``tokens`` of ``window`` (measured, or projected while unknown)."""

    kind: Literal["occupancy"] = "occupancy"
    tokens: int
    window: int
    level: Level
    measured: bool
    """True when a response reported the figure; False for pre-flight's projection (after a
    fresh session or generation, before the next response)."""

    @property
    def ratio(self) -> float:
        """``tokens`` as a fraction of the window."""
        return self.tokens / self.window


class WarningUpdate(Frozen):
    """Occupancy reached the warning threshold (once per session): the user may continue in a
    new conversation by hand from here."""

    kind: Literal["warning"] = "warning"
    tokens: int
    window: int


class ExhaustedUpdate(Frozen):
    """The conversation is read-only; ``summary`` can seed its continuation."""

    kind: Literal["exhausted"] = "exhausted"
    summary: str


class FailedUpdate(Frozen):
    """The conversation failed."""

    kind: Literal["failed"] = "failed"
    error_kind: ErrorKind
    message: str


class RetryUpdate(Frozen):
    """A request failed and is retried after ``delay_seconds``; the partial text of the response
    before this update is void."""

    kind: Literal["retry"] = "retry"
    request: RequestKind
    attempt: int
    delay_seconds: float


class PausedUpdate(Frozen):
    """The conversation paused with snapshot ``version``."""

    kind: Literal["paused"] = "paused"
    version: int
    reason: str


class SessionUpdate(Frozen):
    """A fresh session started (a checkpoint restart, or a resume)."""

    kind: Literal["session"] = "session"
    session: int
    reason: str


class CompactedUpdate(Frozen):
    """Older history was summarised: the model now sees ``summary`` and the recent tail."""

    kind: Literal["compacted"] = "compacted"
    generation: int
    summary: str


class FallbackUpdate(Frozen):
    """The provider could not compact the conversation (REQ-SEG-049): segue compacts it
    itself from here on, and the turn goes on. ``reason`` says what the provider did."""

    kind: Literal["fallback"] = "fallback"
    reason: str


class ContextEditedUpdate(Frozen):
    """The provider cleared part of the context before answering (REQ-SEG-050): ``cleared``
    tool uses or thinking turns (``strategy`` says which), ``cleared_input_tokens`` tokens.
    The meter follows the response's usage, which no longer counts them."""

    kind: Literal["context_edited"] = "context_edited"
    strategy: str
    cleared: int
    cleared_input_tokens: int


class NoticeUpdate(Frozen):
    """Anything else the core notified (a truncated response, an accounting anomaly, a turn
    that reached its tool-round limit...): ``effect`` is the effect's kind, ``data`` its fields."""

    kind: Literal["notice"] = "notice"
    effect: str
    data: dict[str, Any]


class DoneUpdate(Frozen):
    """The turn is over: the conversation waits for input. Always the last update of a turn."""

    kind: Literal["done"] = "done"
    state: ConversationState
    reply: str | None
    """The text of the turn's final assistant reply, or None when it wrote none."""


Update = Annotated[
    UserMessageUpdate
    | TextUpdate
    | ToolStartedUpdate
    | ToolFinishedUpdate
    | OccupancyUpdate
    | WarningUpdate
    | ExhaustedUpdate
    | FailedUpdate
    | RetryUpdate
    | PausedUpdate
    | SessionUpdate
    | CompactedUpdate
    | FallbackUpdate
    | ContextEditedUpdate
    | NoticeUpdate
    | DoneUpdate,
    Field(discriminator="kind"),
]
"""Every update a turn can produce."""

UPDATE_TYPES: tuple[type[Frozen], ...] = (
    UserMessageUpdate,
    TextUpdate,
    ToolStartedUpdate,
    ToolFinishedUpdate,
    OccupancyUpdate,
    WarningUpdate,
    ExhaustedUpdate,
    FailedUpdate,
    RetryUpdate,
    PausedUpdate,
    SessionUpdate,
    CompactedUpdate,
    FallbackUpdate,
    ContextEditedUpdate,
    NoticeUpdate,
    DoneUpdate,
)


def level(tokens: int, state: ConversationState) -> Level:
    """The meter's level of ``tokens`` under ``state``'s thresholds."""
    config = state.config
    if tokens >= config.continuation_tokens:
        return "critical"
    if tokens >= config.warning_tokens:
        return "warning"
    return "ok"


def effect_update(effect: Any) -> Update | None:
    """The update a performed notification stands for (None for effects no UI needs)."""
    kind = effect.kind
    if kind == "notify_context_warning":
        return WarningUpdate(tokens=effect.context_tokens, window=effect.context_window)
    if kind == "notify_context_exhausted":
        return ExhaustedUpdate(summary=effect.summary)
    if kind == "notify_failed":
        return FailedUpdate(error_kind=effect.error_kind, message=effect.message)
    if kind == "schedule_retry":
        return RetryUpdate(
            request=effect.request, attempt=effect.attempt, delay_seconds=effect.delay_seconds
        )
    if kind == "save_snapshot":
        return PausedUpdate(version=effect.snapshot.version, reason=effect.snapshot.reason)
    if kind == "start_session":
        return SessionUpdate(session=effect.session, reason=effect.reason)
    if kind == "start_generation":
        return CompactedUpdate(generation=effect.generation, summary=effect.summary)
    if kind == "notify_compaction_fallback":
        return FallbackUpdate(reason=effect.reason)
    if kind.startswith(("notify_", "report_")):
        data = effect.model_dump(mode="json", exclude={"kind"})
        return NoticeUpdate(effect=kind, data=data)
    return None


def occupancy_update(before: ConversationState, after: ConversationState) -> Update | None:
    """The meter's new reading if ``after`` shows another figure than ``before``."""
    shown = _shown(after)
    if shown == _shown(before):
        return None
    tokens, measured = shown
    return OccupancyUpdate(
        tokens=tokens, window=after.context_window, level=level(tokens, after), measured=measured
    )


def _shown(state: ConversationState) -> tuple[int, bool]:
    measured = state.context_tokens
    if measured is None:
        return state.projected_tokens, False
    return measured, True


UNNUMBERED: Final = 0
"""The ``response`` of a reply the fold gives whole: numbering responses is the listening
runtime's (the driving one settles it against what it streamed, a reader takes the next)."""


def updates_of(
    before: ConversationState,
    after: ConversationState,
    event: Event | None,
    effects: Sequence[Effect],
    appended: Sequence[Message],
    *,
    reply: str | None = None,
) -> list[Update]:
    """What one committed step tells a watcher, in order: what it recorded (the user's
    message, the reply whole, a tool's result), the meter when it moved, what its effects
    announce (tools starting, the warning, a retry, a new session or generation, the end, a
    pause, notices), and ``done`` when the step left the conversation waiting for input.

    ``event`` is the step's event as committed (None for a change no event explains: only the
    meter and ``done`` are told then); ``appended`` the messages it recorded; ``reply`` the
    text of the turn's last reply before this step (``done`` carries the turn's last). Pure:
    the same step gives the same updates to every runtime that hears of it."""
    updates: list[Update] = []
    for message in appended:
        if message.copy_of is not None:
            continue  # a redo's or an undo's copy: told when it was first recorded
        if message.kind == "user":
            updates.append(UserMessageUpdate(text=message.text, pinned=message.pinned))
        elif message.kind == "assistant":
            reply = message.text
            if message.text:
                updates.append(TextUpdate(text=message.text, response=UNNUMBERED))
        elif message.kind == "tool_result" and isinstance(event, ToolResult):
            updates.append(_finished(before, message))
    meter = occupancy_update(before, after)
    if meter is not None:
        updates.append(meter)
    for effect in effects:
        if isinstance(effect, ExecuteTools):
            updates += _started(after, effect)
        else:
            update = effect_update(effect)
            if update is not None:
                updates.append(update)
    if _turn_over(before, after, appended):
        updates.append(DoneUpdate(state=after, reply=reply))
    return updates


def last_reply(appended: Sequence[Message], reply: str | None) -> str | None:
    """The turn's last reply once ``appended`` is recorded (``reply`` if it holds none)."""
    for message in appended:
        if message.kind == "assistant" and message.copy_of is None:
            reply = message.text
    return reply


@dataclass(slots=True)
class Turn:
    """What a listener to one conversation keeps between its steps: the reply its turn has
    written so far, which the turn's ``done`` carries. Both the driving runtime and a reader
    of the store fold each step through one of these."""

    reply: str | None = None

    def step(
        self,
        before: ConversationState,
        after: ConversationState,
        event: Event | None,
        effects: Sequence[Effect],
        appended: Sequence[Message],
    ) -> list[Update]:
        """``updates_of`` the step, remembering the reply (forgotten once the turn is over)."""
        updates = updates_of(before, after, event, effects, appended, reply=self.reply)
        over = bool(updates) and updates[-1].kind == "done"
        self.reply = None if over else last_reply(appended, self.reply)
        return updates


def _turn_over(
    before: ConversationState, after: ConversationState, appended: Sequence[Message]
) -> bool:
    """Whether the step ended a turn: it left the conversation waiting for input, coming from
    work, from another waiting phase, or recording something (a summary made again)."""
    kind = after.phase.kind
    if kind not in WAITING_PHASES:
        return False
    return before.phase.kind != kind or bool(appended)


def _finished(before: ConversationState, message: Message) -> ToolFinishedUpdate:
    """A tool's recorded result; its name is the call's that the step before waited for."""
    call_id = message.tool_call_id or ""
    phase = before.phase
    calls = phase.tool_calls if isinstance(phase, ToolExecuting) else ()
    name = next((call.name for call in calls if call.id == call_id), "tool")
    return ToolFinishedUpdate(id=call_id, name=name, is_error=message.is_error, output=message.text)


def _started(after: ConversationState, effect: ExecuteTools) -> list[Update]:
    """The tools a step sets running: the calls its new phase waits for."""
    phase = after.phase
    waiting = set(phase.pending) if isinstance(phase, ToolExecuting) else set()
    return [
        ToolStartedUpdate(id=call.id, name=call.name, input=call.input)
        for call in effect.tool_calls
        if call.id in waiting
    ]
