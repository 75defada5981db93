"""JSON encoding of the core's values for stores: one place, so every store agrees.

Loading validates (a row edited by hand or written by an older version is checked, not
trusted); dumping is pydantic's fast serializer. A value nested deeper than pydantic's JSON
parser goes (about 200 levels; its serializer writes up to about 255) is read through Python's
``json`` instead: whatever a store holds can be read back, so one conversation can never make a
read or a listing fail.
"""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import TypeAdapter, ValidationError

from segue.effects import Effect
from segue.statemachine import ConversationState, Event, Message
from segue.statemachine.checkpoint import SessionSnapshot

_STATE: TypeAdapter[ConversationState] = TypeAdapter(ConversationState)
_EFFECT: TypeAdapter[Effect] = TypeAdapter(Effect)
_EVENT: TypeAdapter[Event] = TypeAdapter(Event)
_MESSAGE: TypeAdapter[Message] = TypeAdapter(Message)
_SNAPSHOT: TypeAdapter[SessionSnapshot] = TypeAdapter(SessionSnapshot)
T = TypeVar("T")


def _read(adapter: TypeAdapter[T], text: str | bytes) -> T:
    """``text`` validated as ``adapter``'s type; past the JSON parser's recursion limit,
    parsed by Python's ``json`` (whose limit is far higher) and validated the same."""
    try:
        return adapter.validate_json(text)
    except ValidationError as error:
        if not any("recursion limit" in str(e.get("msg", "")) for e in error.errors()):
            raise
    return adapter.validate_python(json.loads(text))


def dump_state(state: ConversationState) -> str:
    """The state as JSON text."""
    return state.model_dump_json()


def load_state(text: str | bytes) -> ConversationState:
    """A state from JSON text, validated."""
    return _read(_STATE, text)


def dump_effect(effect: Effect) -> str:
    """An effect as JSON text (its ``kind`` tells which)."""
    return effect.model_dump_json()


def load_effect(text: str | bytes) -> Effect:
    """An effect from JSON text, validated."""
    return _read(_EFFECT, text)


def dump_event(event: Event) -> str:
    """An event as JSON text."""
    return event.model_dump_json()


def load_event(text: str | bytes) -> Event:
    """An event from JSON text, validated."""
    return _read(_EVENT, text)


def dump_message(message: Message) -> str:
    """A transcript message as JSON text."""
    return message.model_dump_json()


def load_message(text: str | bytes) -> Message:
    """A transcript message from JSON text, validated."""
    return _read(_MESSAGE, text)


def dump_snapshot(snapshot: SessionSnapshot) -> str:
    """A pause snapshot as JSON text."""
    return snapshot.model_dump_json()


def load_snapshot(text: str | bytes) -> SessionSnapshot:
    """A pause snapshot from JSON text, validated."""
    return _read(_SNAPSHOT, text)
