"""A conversation as one JSON document: what ``Runtime.export_conversation`` writes and
``Runtime.import_conversation`` reads back, into any store (``docs/data.md`` documents it).

The document holds everything a store holds of the conversation, as the core's values dump
themselves: the state (so an import continues exactly where the export stood: phase,
occupancy, generation, pinned messages), the whole transcript, the event log, the pause
snapshots, the work that was pending, the metadata; and, for people, its lineage's ids and its
usage. Import checks all of it before anything is written, and writes it in one transaction:
a document that is not one, of another version, or whose parts disagree is refused with the
reason (``InvalidDocumentError``), nothing stored.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, NoReturn

from pydantic import ValidationError

from segue.effects import Effect, SaveSnapshot
from segue.executor.chains import Link, UsageReport
from segue.executor.errors import InvalidDocumentError, InvalidMetadataError
from segue.executor.store_port import ConversationRecord, StoredConversation, TransitionRecord
from segue.executor.stores._shared import checked_metadata
from segue.executor.stores.codec import load_effect, load_event, load_snapshot, load_state
from segue.statemachine import ConversationState, Message
from segue.statemachine.checkpoint import SessionSnapshot

FORMAT: Final = "segue.conversation"
VERSION: Final = 1
"""The document's format version: an import refuses any other (a later segue that changes the
format reads this one still, and says so in ``docs/data.md``)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Exported:
    """What an export reads from the store (``document`` makes it JSON)."""

    stored: StoredConversation
    messages: Sequence[Message]
    transitions: Sequence[TransitionRecord]
    snapshots: Sequence[SessionSnapshot]
    lineage: Sequence[Link]
    usage: UsageReport
    exported_at: float


def document(exported: Exported) -> dict[str, Any]:
    """The JSON document (plain dicts, lists, strings and numbers) of ``exported``."""
    stored = exported.stored
    transitions = exported.transitions
    updated_at = transitions[-1].at if transitions else stored.created_at
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": exported.exported_at,
        "conversation": {
            "id": stored.state.id,
            "version": stored.version,
            "created_at": stored.created_at,
            "updated_at": updated_at,
            "system": stored.system,
            "metadata": dict(stored.metadata),
            "child_id": stored.child_id,
            "state": stored.state.model_dump(mode="json"),
        },
        "lineage": [link.id for link in exported.lineage],
        "messages": [message.model_dump(mode="json") for message in exported.messages],
        "transitions": [
            {
                "seq": line.seq,
                "event_kind": line.event_kind,
                "event": json.loads(line.event_json),
                "from_phase": line.from_phase,
                "to_phase": line.to_phase,
                "context_tokens": line.context_tokens,
                "reason": line.reason,
                "effect_kinds": list(line.effect_kinds),
                "at": line.at,
                "session": line.session,
            }
            for line in transitions
        ],
        "snapshots": [snapshot.model_dump(mode="json") for snapshot in exported.snapshots],
        "pending": [pending.effect.model_dump(mode="json") for pending in stored.pending],
        "usage": {
            "requests": exported.usage.requests,
            "total": exported.usage.total.model_dump(mode="json"),
            "by_purpose": {
                purpose: usage.model_dump(mode="json")
                for purpose, usage in exported.usage.by_purpose.items()
            },
        },
    }


def record(document: object, *, conversation_id: str | None = None) -> ConversationRecord:
    """The conversation ``document`` holds, checked whole (``InvalidDocumentError`` says what
    is wrong), under ``conversation_id`` when given."""
    data = _mapping(document, "the document")
    if data.get("format") != FORMAT:
        _refuse(f"not a segue conversation export (format {data.get('format')!r}, not {FORMAT!r})")
    if data.get("version") != VERSION:
        _refuse(f"export format version {data.get('version')!r}; this segue reads {VERSION}")
    head = _mapping(data.get("conversation"), "conversation")
    try:
        state = load_state(json.dumps(head.get("state")))
        messages = tuple(Message.model_validate(m) for m in _list(data, "messages"))
        transitions = tuple(_transition(line) for line in _list(data, "transitions"))
        snapshots = tuple(load_snapshot(json.dumps(s)) for s in _list(data, "snapshots"))
        pending = tuple(load_effect(json.dumps(e)) for e in _list(data, "pending"))
        metadata = checked_metadata(_mapping(head.get("metadata") or {}, "metadata"))
    except (ValidationError, InvalidMetadataError, TypeError, ValueError) as error:
        _refuse(f"a part does not validate: {error}")
    version, system = head.get("version"), head.get("system")
    created_at: Any = head.get("created_at")
    updated_at: Any = head.get("updated_at")
    if head.get("id") != state.id:
        _refuse(f"conversation.id {head.get('id')!r} is not the state's id {state.id!r}")
    if [line.seq for line in transitions] != list(range(1, len(transitions) + 1)):
        _refuse("the event log's seqs are not 1, 2, 3...")
    if not isinstance(version, int) or isinstance(version, bool) or version != len(transitions) + 1:
        _refuse(f"version {version!r} does not follow an event log of {len(transitions)} lines")
    if system is not None and not isinstance(system, str):
        _refuse("system is a string or null")
    for name, value in (("created_at", created_at), ("updated_at", updated_at)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            _refuse(f"{name} is a Unix time, not {value!r}")
    if any(snapshot.conversation_id != state.id for snapshot in snapshots):
        _refuse("a snapshot belongs to another conversation")
    if conversation_id is not None and conversation_id != state.id:
        state, snapshots, pending = _renamed(conversation_id, state, snapshots, pending)
    return ConversationRecord(
        state=state,
        version=version,
        system=system,
        created_at=float(created_at),
        updated_at=float(updated_at),
        metadata=metadata,
        messages=messages,
        transitions=transitions,
        snapshots=snapshots,
        pending=pending,
    )


def _renamed(
    conversation_id: str,
    state: ConversationState,
    snapshots: tuple[SessionSnapshot, ...],
    pending: tuple[Effect, ...],
) -> tuple[ConversationState, tuple[SessionSnapshot, ...], tuple[Effect, ...]]:
    """The conversation's values under another id: the state's, its snapshots' and a pending
    snapshot's (nothing else in them names it)."""
    try:
        config = state.config.model_copy(update={"id": conversation_id})
        state = type(state).model_validate({**state.model_dump(), "config": config.model_dump()})
    except ValidationError as error:
        _refuse(f"conversation_id {conversation_id[:80]!r} cannot be an id: {error}")
    moved = tuple(s.model_copy(update={"conversation_id": conversation_id}) for s in snapshots)
    effects = tuple(
        effect.model_copy(
            update={
                "snapshot": effect.snapshot.model_copy(update={"conversation_id": conversation_id})
            }
        )
        if isinstance(effect, SaveSnapshot)
        else effect
        for effect in pending
    )
    return state, moved, effects


def _transition(line: object) -> TransitionRecord:
    data = _mapping(line, "an event log line")
    event = json.dumps(data.get("event"))
    load_event(event)  # validated like every stored value
    kinds = data.get("effect_kinds")
    if not isinstance(kinds, list) or not all(isinstance(kind, str) for kind in kinds):
        _refuse("an event log line's effect_kinds is not a list of strings")
    return TransitionRecord(
        seq=_typed(data, "seq", int),
        event_kind=_typed(data, "event_kind", str),
        event_json=event,
        from_phase=_typed(data, "from_phase", str),
        to_phase=_typed(data, "to_phase", str),
        context_tokens=data.get("context_tokens"),
        reason=_typed(data, "reason", str),
        effect_kinds=tuple(kinds),
        at=float(_typed(data, "at", int | float)),
        session=data.get("session"),
    )


def _typed(data: Mapping[str, Any], name: str, kind: Any) -> Any:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, kind):
        _refuse(f"an event log line's {name} is {value!r}")
    return value


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        _refuse(f"{what} is not a JSON object")
    return value


def _list(data: Mapping[str, Any], name: str) -> list[Any]:
    value = data.get(name)
    if not isinstance(value, list):
        _refuse(f"{name} is not a list")
    return value


def _refuse(reason: str) -> NoReturn:
    raise InvalidDocumentError(f"cannot import this document: {reason}")
