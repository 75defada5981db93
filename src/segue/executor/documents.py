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
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictInt,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WrapValidator,
)

from segue.effects import Effect, SaveSnapshot
from segue.executor.bounds import ID_PATTERN, MAX_ID_LENGTH, checked_metadata
from segue.executor.chains import Link, UsageReport
from segue.executor.document_checks import check_log, check_messages, invalid, refuse
from segue.executor.errors import InvalidDocumentError, InvalidMetadataError
from segue.executor.json_spans import spans_of, too_deep
from segue.executor.store_port import ConversationRecord, StoredConversation, TransitionRecord
from segue.executor.stores.codec import dump_event
from segue.statemachine import ConversationState, Event, Message, PhaseKind
from segue.statemachine.checkpoint import SessionSnapshot
from segue.statemachine.content import ENTERING

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


_INT_MAX: Final = 2**31 - 1
"""The largest count a store's integer columns hold (PostgreSQL's ``integer``): versions,
seqs, sessions, generations, token counts."""
_BUSY: Final = frozenset(
    {
        "llm_requesting",
        "tool_executing",
        "awaiting_continuation",
        "awaiting_checkpoint",
        "compacting",
    }
)
"""Phases that wait for work the outbox holds; imported without it, nothing would answer."""
_WORK: Final = frozenset(
    {
        "request_llm",
        "execute_tools",
        "request_continuation",
        "request_checkpoint",
        "request_compaction",
        "schedule_retry",
    }
)
"""The pending effects whose outcome moves a busy phase on."""
_EVENT: Final[TypeAdapter[Event]] = TypeAdapter(Event)


def _not_a_bool(value: object) -> object:
    """A number that JSON wrote as ``true`` is not one (Python's ``True == 1``)."""
    if isinstance(value, bool):
        msg = f"is a number, not {value!r}"
        raise ValueError(msg)
    return value


Count = Annotated[StrictInt, Field(ge=0, le=_INT_MAX)]
Ordinal = Annotated[StrictInt, Field(ge=1, le=_INT_MAX)]
Time = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=False)]
Name = Annotated[str, Field(max_length=200)]


class _Schema(BaseModel):
    """A part of the document, as this segue reads version 1 (unknown fields are ignored, as
    a later segue may add some)."""

    model_config = ConfigDict(frozen=True)


def _event_text(value: object, _handler: Any, info: ValidationInfo) -> str:
    """An event log line's event, validated as the core's ``Event`` and kept as the JSON text
    the store writes (the parsed event is not held: a large import keeps one copy)."""
    event = _EVENT.validate_python(value, context=info.context)
    if info.data.get("event_kind") != event.kind:
        msg = (
            f"is a {event.kind!r} event, not the line's event_kind {info.data.get('event_kind')!r}"
        )
        raise ValueError(msg)
    return dump_event(event)


class _Line(_Schema):
    seq: Ordinal
    event_kind: Name
    event: Annotated[str, WrapValidator(_event_text)]
    from_phase: PhaseKind
    to_phase: PhaseKind
    context_tokens: Count | None = None
    reason: str = ""
    effect_kinds: list[Name] = []
    at: Time
    session: Ordinal | None = None


_LINE: Final[TypeAdapter[_Line]] = TypeAdapter(_Line)


def _logged(value: object, info: ValidationInfo) -> TransitionRecord:
    """An event log line validated, as the record a store writes (the small record is what
    is held, not the validated model: a log of a hundred thousand lines costs its text)."""
    line = _LINE.validate_python(value, context=info.context)
    return TransitionRecord(
        seq=line.seq,
        event_kind=line.event_kind,
        event_json=line.event,
        from_phase=line.from_phase,
        to_phase=line.to_phase,
        context_tokens=line.context_tokens,
        reason=line.reason,
        effect_kinds=tuple(line.effect_kinds),
        at=line.at,
        session=line.session,
    )


class _Head(_Schema):
    id: str
    version: Ordinal
    created_at: Time
    updated_at: Time
    system: str | None = None
    metadata: dict[str, str] = {}
    child_id: str | None = None
    state: ConversationState


class _Document(_Schema):
    format: Literal["segue.conversation"]
    version: Annotated[Literal[1], BeforeValidator(_not_a_bool)]
    exported_at: Time | None = None
    conversation: _Head
    lineage: list[str] = []
    messages: list[Message]
    transitions: list[Annotated[TransitionRecord, PlainValidator(_logged)]]
    snapshots: list[SessionSnapshot] = []
    pending: list[Effect] = []


_READER: Final = TypeAdapter(_Document)
_ENTERING: Final = {ENTERING: True}


def record(
    document: Mapping[str, Any] | bytes | bytearray | str, *, conversation_id: str | None = None
) -> ConversationRecord:
    """The conversation ``document`` holds (its JSON text, or the text parsed), checked whole
    (``InvalidDocumentError`` says what is wrong and names the field), under
    ``conversation_id`` when given.

    JSON text is validated straight into the typed document (no dicts in between): a large
    import holds little more than the document's own values."""
    parsed = _parsed(document)
    head = parsed.conversation
    state = head.state
    _check_head(parsed, head, state)
    check_messages(parsed.messages, state)
    check_log(parsed.transitions, head.version, state)
    _check_pending(parsed, state)
    try:
        metadata = checked_metadata(head.metadata)
    except InvalidMetadataError as error:
        refuse(str(error), "conversation.metadata")
    snapshots, pending = tuple(parsed.snapshots), tuple(parsed.pending)
    if conversation_id is not None and conversation_id != state.id:
        state, snapshots, pending = _renamed(conversation_id, state, snapshots, pending)
    return ConversationRecord(
        state=state,
        version=head.version,
        system=head.system,
        created_at=head.created_at,
        updated_at=head.updated_at,
        metadata=metadata,
        messages=tuple(parsed.messages),
        transitions=tuple(parsed.transitions),
        snapshots=snapshots,
        pending=pending,
    )


def _parsed(document: Mapping[str, Any] | bytes | bytearray | str) -> _Document:
    """The typed document, or ``InvalidDocumentError`` naming the first field that is wrong
    (a wrong ``format`` or ``version`` first: then nothing else is this format's to judge)."""
    try:
        if isinstance(document, bytes | bytearray | str):
            sectioned = _sectioned(document.encode() if isinstance(document, str) else document)
            if sectioned is not None:
                return sectioned
            return _READER.validate_json(document, context=_ENTERING)
        if not isinstance(document, Mapping):
            refuse("the document is not a JSON object", "")
        return _READER.validate_python(document, context=_ENTERING)
    except ValidationError as error:
        problems = error.errors(include_url=False)
    if isinstance(document, bytes | bytearray | str) and too_deep(problems):
        # Past the JSON parser's recursion limit: parsed by Python's json (whose limit is far
        # higher), so the field that nests too deep is named like any other.
        try:
            return _parsed(json.loads(document))
        except RecursionError:
            refuse("the document nests deeper than any JSON parser here reads", "")
    raise _reported(problems)


def _reported(problems: Sequence[Any]) -> InvalidDocumentError:
    """``InvalidDocumentError`` for pydantic's ``problems`` (a wrong format or version first)."""
    for problem in problems:
        where = problem["loc"][:1]
        if where == ("format",):
            found = problem.get("input")
            reason = f"not a segue conversation export (format {found!r}, not {FORMAT!r})"
            return invalid(reason, "format")
        if where == ("version",):
            found = problem.get("input")
            return invalid(
                f"export format version {found!r}; this segue reads {VERSION}", "version"
            )
    first = problems[0]
    field = ".".join(str(part) for part in first["loc"])
    if first["type"] == "json_invalid" or (first["type"] == "model_type" and not field):
        return invalid(f"the document is not a JSON object ({first['msg']})", "")
    return invalid(f"{field or 'the document'}: {first['msg']}", field)


_LISTS: Final = {b'"messages"': "messages", b'"transitions"': "transitions"}
_MESSAGE: Final[TypeAdapter[Message]] = TypeAdapter(Message)
_LOGGED: Final[TypeAdapter[TransitionRecord]] = TypeAdapter(
    Annotated[TransitionRecord, PlainValidator(_logged)]
)


def _sectioned(text: bytes | bytearray) -> _Document | None:
    """The document validated a part at a time: its head whole, then each message and each
    log line from its own slice of the text. A document parsed whole is first a tree of JSON
    values in the parser as large as the text; parsed so, only one message's is at a time.
    None when the text is not an object of the expected shape (it is then parsed whole, and
    refused with the reason)."""
    spans = spans_of(text, _LISTS)
    if spans is None:
        return None
    values, items = spans
    head = b",".join(
        key + b":" + (b"[]" if key in _LISTS else bytes(text[start:end]))
        for key, (start, end) in values.items()
    )
    try:
        document = _READER.validate_json(b"{" + head + b"}", context=_ENTERING)
    except ValidationError as error:
        raise _reported(error.errors(include_url=False)) from None
    parts: dict[str, list[Any]] = {"messages": [], "transitions": []}
    for key, name in _LISTS.items():
        reader: TypeAdapter[Any] = _MESSAGE if name == "messages" else _LOGGED
        kept = parts[name]
        for place, (start, end) in enumerate(items.get(key, ())):
            kept.append(_item(reader, text[start:end], (name, place)))
    return document.model_copy(update=parts)


def _item(reader: TypeAdapter[Any], text: bytes | bytearray, where: tuple[Any, ...]) -> Any:
    """One message or log line from its text (past the parser's recursion limit, through
    Python's ``json``), or ``InvalidDocumentError`` naming it."""
    try:
        try:
            return reader.validate_json(text, context=_ENTERING)
        except ValidationError as error:
            if not too_deep(error.errors(include_url=False)):
                raise
        return reader.validate_python(json.loads(text), context=_ENTERING)
    except ValidationError as error:
        problems = error.errors(include_url=False)
        raise _reported([{**p, "loc": (*where, *p["loc"])} for p in problems]) from None
    except (ValueError, RecursionError) as error:
        place = ".".join(str(part) for part in where)
        refuse(f"{place} is not JSON ({str(error)[:200]})", place)


def _check_head(parsed: _Document, head: _Head, state: ConversationState) -> None:
    if head.id != state.id:
        refuse(
            f"conversation.id {head.id[:80]!r} is not the state's id {state.id!r}",
            "conversation.id",
        )
    for name, value in (("id", state.id), ("parent_id", state.config.parent_id)):
        if value is not None and not _is_id(value):
            where = f"conversation.state.config.{name}"
            refuse(f"{where} {value[:80]!r} is not an id ({ID_PATTERN.pattern})", where)
    for name, value in vars(state).items():
        if isinstance(value, int) and not isinstance(value, bool) and value > _INT_MAX:
            refuse(f"conversation.state.{name} is above {_INT_MAX:,}", f"conversation.state.{name}")
    # The state counts the messages its transitions appended; a conversation continued from
    # another starts with its seed (summary, pinned messages, recent turns), stored first and
    # never counted. So the document may hold more than the count, only at its start.
    surplus = len(parsed.messages) - state.message_count
    seeded = all(m.session == 1 and m.generation == 1 for m in parsed.messages[: max(surplus, 0)])
    if surplus < 0 or not seeded:
        refuse(
            f"the state counts {state.message_count} messages; the document holds "
            f"{len(parsed.messages)}",
            "messages",
        )
    if state.phase.kind in _BUSY and not any(e.kind in _WORK for e in parsed.pending):
        refuse(
            f"the state is {state.phase.kind} with no pending work to answer it",
            "conversation.state.phase",
        )


def _check_pending(parsed: _Document, state: ConversationState) -> None:
    seen: set[int] = set()
    for place, snapshot in enumerate(parsed.snapshots):
        where = f"snapshots.{place}"
        if snapshot.conversation_id != state.id:
            refuse(f"{where} belongs to another conversation", f"{where}.conversation_id")
        if snapshot.version in seen:
            refuse(f"{where}: two snapshots are version {snapshot.version}", f"{where}.version")
        if snapshot.version > _INT_MAX:
            refuse(f"{where}.version is above {_INT_MAX:,}", f"{where}.version")
        seen.add(snapshot.version)
    for place, effect in enumerate(parsed.pending):
        if isinstance(effect, SaveSnapshot) and effect.snapshot.conversation_id != state.id:
            where = f"pending.{place}.snapshot.conversation_id"
            refuse(f"pending.{place} saves a snapshot of another conversation", where)


def _is_id(value: str) -> bool:
    return len(value) <= MAX_ID_LENGTH and ID_PATTERN.fullmatch(value) is not None


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
        refuse(
            f"conversation_id {conversation_id[:80]!r} cannot be an id: {error}", "conversation_id"
        )
    if not _is_id(conversation_id):
        refuse(
            f"conversation_id {conversation_id[:80]!r} is not an id ({ID_PATTERN.pattern})",
            "conversation_id",
        )
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
