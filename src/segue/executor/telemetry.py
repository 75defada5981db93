"""What the runtime tells an observer as it works: turns, model calls, tools, commits.

The runtime calls a ``Telemetry`` at a few points of a turn (see each method); this base does
nothing at all, so a runtime nobody observes pays a handful of empty calls per step. With the
``otel`` extra installed (``opentelemetry-api``), ``telemetry_setup.for_settings`` gives
``segue.executor.otel``'s implementation instead, which turns the calls into OpenTelemetry
spans and metrics following the GenAI semantic conventions. Without the extra, nothing of
OpenTelemetry is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from segue.effects import Effect
from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmModel, LlmReply, LlmRequest
from segue.statemachine import ConversationState, Event, ToolCall, ToolResult


class Telemetry:
    """An observer of the runtime that observes nothing (the default without the extra).

    Every ``..._begins`` returns a token the matching ``..._ends`` is given back (None here):
    an implementation keeps what it needs (a span, a start time) in it, so this class keeps no
    state, and the runtime keeps no token beyond the call that made it.
    """

    enabled = False
    """Whether anything is recorded (a caller may skip building what only telemetry reads)."""

    def turn_begins(self, conversation_id: str, event: Event | None) -> Any:
        """A drive of the conversation begins (with ``event``, or none: a recovery); the
        model calls, tools and commits until ``turn_ends`` belong to it."""
        return None

    def turn_ends(
        self, token: Any, state: ConversationState | None, error: BaseException | None
    ) -> None:
        """The drive ended: the conversation in ``state``, or ``error`` raised out of it."""

    def committed(
        self,
        before: ConversationState,
        after: ConversationState,
        event: Event,
        effects: Sequence[Effect],
        *,
        seconds: float,
        store: str,
    ) -> None:
        """A step was committed to ``store`` (its class name) in ``seconds``."""

    def refused(self, conversation_id: str, cause: str) -> None:
        """A message was refused (busy, read-only, paused, failed, too large)."""

    def inference_begins(self, request: LlmRequest, llm: LlmModel) -> Any:
        """``llm`` is asked ``request``."""
        return None

    def inference_ends(self, token: Any, outcome: LlmReply | LlmCallError) -> None:
        """The model answered, or the call failed."""

    def tool_begins(self, conversation_id: str, call: ToolCall) -> Any:
        """One of segue's tools starts running ``call``."""
        return None

    def tool_ends(self, token: Any, result: ToolResult) -> None:
        """The tool finished (``result.is_error``: it failed, timed out or does not exist)."""


NOTHING = Telemetry()
"""The observer of a runtime that observes nothing."""


DEFAULT_STORE_METRICS_RATE = 0.1
"""The share of commits whose duration ``segue.store.commit.duration`` records by default."""
