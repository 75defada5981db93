"""Scenario tests that read like a script: ``Playbook(state) >> event << [expected effects]``.

In the spirit of mitmproxy's ``Playbook``: a scenario is the list of events that go into
``transition()`` and, after each, the effects that must come out. ``>>`` feeds one event and
keeps the effects it produced; ``<<`` checks them, in order, against a list whose items are
either an effect kind (``"request_llm"``), an effect class (``RequestLlm``) or a whole effect
value (``RequestLlm(attempt=2)``, compared field by field). A mismatch fails with a diff of the
two lists rather than a bare ``assert``, so a broken scenario says what happened.

Effects that were produced but never checked are a mistake, not a shortcut: feeding the next
event while the previous one's effects are unchecked fails, unless the event was fed with
``given()`` (setup steps whose effects other tests pin down).

``requirement()`` tags a test with the requirement ids of ``specs/requirements.md`` it proves,
so the spec and the tests can be held together mechanically.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from segue import ConversationState, Message, transition
from segue.effects import AppendMessage, Effect

F = TypeVar("F", bound=Callable[..., Any])

REQUIREMENT_ATTR = "__requirements__"
"""The attribute ``requirement()`` sets on a test: the tuple of ids it proves."""

Expected = Any
"""One expected effect: its ``kind`` (a ``str``), its class, or the effect value itself."""


def requirement(*ids: str) -> Callable[[F], F]:
    """Record which requirement ids a test proves (read back with ``requirements_of``)."""
    if not ids:
        msg = "requirement() needs at least one id"
        raise ValueError(msg)

    def tag(test: F) -> F:
        setattr(test, REQUIREMENT_ATTR, (*requirements_of(test), *ids))
        return test

    return tag


def requirements_of(test: object) -> tuple[str, ...]:
    """The requirement ids recorded on ``test`` by ``requirement()`` (``()`` when untagged)."""
    ids: tuple[str, ...] = getattr(test, REQUIREMENT_ATTR, ())
    return ids


def _describe(effect: object) -> str:
    return repr(effect)


def _render(expected: Expected) -> str:
    if isinstance(expected, str):
        return expected
    if isinstance(expected, type):
        return f"<{expected.__name__}>"
    return _describe(expected)


def _matches(expected: Expected, actual: object) -> bool:
    if isinstance(expected, str):
        return getattr(actual, "kind", None) == expected
    if isinstance(expected, type):
        return isinstance(actual, expected)
    return bool(expected == actual)


def _render_actual(expected: Expected | None, actual: object) -> str:
    """Show ``actual`` the way its expected counterpart is written, so the diff lines up."""
    if isinstance(expected, str):
        return str(getattr(actual, "kind", actual))
    if isinstance(expected, type):
        return f"<{type(actual).__name__}>"
    return _describe(actual)


def effects_diff(expected: Sequence[Expected], actual: Sequence[object]) -> str | None:
    """``None`` when ``actual`` matches ``expected`` item by item; otherwise a readable diff."""
    if len(expected) == len(actual) and all(
        _matches(want, got) for want, got in zip(expected, actual, strict=True)
    ):
        return None
    want_lines = [_render(want) for want in expected]
    got_lines = [
        _render_actual(expected[index] if index < len(expected) else None, got)
        for index, got in enumerate(actual)
    ]
    diff = difflib.ndiff(want_lines, got_lines)
    return "\n".join(["effects differ (- expected, + actual):", *diff])


class Playbook:
    """A conversation driven event by event, with the effects of each step checked.

    ``>>`` applies an event and remembers its effects; ``<<`` checks them. ``state`` is the
    state after the last event, ``effects`` the effects of the last event, ``log`` every
    ``(event, effects)`` so far, ``messages`` every message the core asked to record.
    """

    def __init__(self, state: ConversationState) -> None:
        self.state = state
        self.effects: tuple[Effect, ...] = ()
        self.log: list[tuple[object, tuple[Effect, ...]]] = []
        self._unchecked = False

    # ------------------------------------------------------------------ feeding events

    def __rshift__(self, event: object) -> Playbook:
        if self._unchecked and self.effects:
            last_event = self.log[-1][0]
            msg = f"the effects of {last_event!r} were never checked with <<:\n" + "\n".join(
                f"  {_describe(effect)}" for effect in self.effects
            )
            raise AssertionError(msg)
        self._apply(event)
        self._unchecked = True
        return self

    def given(self, *events: object) -> Playbook:
        """Feed setup events whose effects this scenario does not check."""
        for event in events:
            self._apply(event)
        self._unchecked = False
        return self

    def _apply(self, event: object) -> None:
        before = self.state
        self.state, self.effects = transition(before, event)
        self.log.append((event, self.effects))

    # ------------------------------------------------------------------ checking effects

    def __lshift__(self, expected: Iterable[Expected]) -> Playbook:
        wanted = list(expected)
        problem = effects_diff(wanted, self.effects)
        if problem is not None:
            event = self.log[-1][0] if self.log else None
            msg = (
                f"after {event!r} (now in phase {self.state.phase.kind!r}):\n{problem}\n"
                "actual effects in full:\n"
                + "\n".join(f"  {_describe(effect)}" for effect in self.effects)
            )
            raise AssertionError(msg)
        self._unchecked = False
        return self

    def in_phase(self, kind: str) -> Playbook:
        """Assert the conversation's phase kind now (``"idle"``, ``"context_exhausted"``...)."""
        actual = self.state.phase.kind
        if actual != kind:
            msg = f"expected phase {kind!r}, got {actual!r}: {self.state.phase!r}"
            raise AssertionError(msg)
        return self

    # ------------------------------------------------------------------ reading the history

    @property
    def phase(self) -> Any:
        """The current phase value (typed ``Any``: tests read phase-specific fields)."""
        return self.state.phase

    @property
    def messages(self) -> list[Message]:
        """Every message the core asked to record, oldest first."""
        return [
            effect.message
            for _event, effects in self.log
            for effect in effects
            if isinstance(effect, AppendMessage)
        ]

    def all_effects(self) -> list[Effect]:
        """Every effect of every step so far, in order."""
        return [effect for _event, effects in self.log for effect in effects]


def unpaired_tool_uses(messages: Sequence[Message]) -> list[str]:
    """Ids of ``tool_use`` blocks with no ``tool_result`` before the next assistant message.

    The provider answers 400 to a history with an unpaired ``tool_use``; the core must answer
    every tool call it records, with a real result or an error result.
    """
    unpaired: list[str] = []
    open_ids: list[str] = []
    for message in messages:
        if message.kind == "assistant":
            unpaired += open_ids
            open_ids = [call.id for call in message.tool_calls]
        elif message.kind == "tool_result" and message.tool_call_id in open_ids:
            open_ids.remove(message.tool_call_id)
    return unpaired + open_ids
