"""JSON encoding of the core's values for stores: one place, so every store agrees.

Loading validates (a row edited by hand or written by an older version is checked, not
trusted); dumping is pydantic's fast serializer.
"""

from __future__ import annotations

from pydantic import TypeAdapter

from segue.effects import Effect
from segue.statemachine import ConversationState, Event, Message
from segue.statemachine.checkpoint import SessionSnapshot

_STATE: TypeAdapter[ConversationState] = TypeAdapter(ConversationState)
_EFFECT: TypeAdapter[Effect] = TypeAdapter(Effect)
_EVENT: TypeAdapter[Event] = TypeAdapter(Event)
_MESSAGE: TypeAdapter[Message] = TypeAdapter(Message)
_SNAPSHOT: TypeAdapter[SessionSnapshot] = TypeAdapter(SessionSnapshot)


def dump_state(state: ConversationState) -> str:
    """The state as JSON text."""
    return state.model_dump_json()


def load_state(text: str | bytes) -> ConversationState:
    """A state from JSON text, validated."""
    return _STATE.validate_json(text)


def dump_effect(effect: Effect) -> str:
    """An effect as JSON text (its ``kind`` tells which)."""
    return effect.model_dump_json()


def load_effect(text: str | bytes) -> Effect:
    """An effect from JSON text, validated."""
    return _EFFECT.validate_json(text)


def dump_event(event: Event) -> str:
    """An event as JSON text."""
    return event.model_dump_json()


def load_event(text: str | bytes) -> Event:
    """An event from JSON text, validated."""
    return _EVENT.validate_json(text)


def dump_message(message: Message) -> str:
    """A transcript message as JSON text."""
    return message.model_dump_json()


def load_message(text: str | bytes) -> Message:
    """A transcript message from JSON text, validated."""
    return _MESSAGE.validate_json(text)


def dump_snapshot(snapshot: SessionSnapshot) -> str:
    """A pause snapshot as JSON text."""
    return snapshot.model_dump_json()


def load_snapshot(text: str | bytes) -> SessionSnapshot:
    """A pause snapshot from JSON text, validated."""
    return _SNAPSHOT.validate_json(text)
