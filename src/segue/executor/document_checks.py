"""The checks an imported document's transcript and event log pass before anything is stored,
and the error that names the field that failed one (``documents`` reads the document)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from segue.executor.errors import InvalidDocumentError
from segue.executor.store_port import TransitionRecord
from segue.statemachine import ConversationState, Message


def check_messages(messages: Sequence[Message], state: ConversationState) -> None:
    """Sessions and generations that exist; each tool result answering a call made before it;
    no two calls of one reply under one id."""
    called: set[str] = set()
    for place, message in enumerate(messages):
        where = f"messages.{place}"
        if message.session > state.session:
            refuse(
                f"{where} is in session {message.session}; the state is in {state.session}",
                f"{where}.session",
            )
        if message.generation > state.generation:
            refuse(
                f"{where} is in generation {message.generation}; the state is in "
                f"{state.generation}",
                f"{where}.generation",
            )
        ids = [call.id for call in message.tool_calls]
        for index, call_id in enumerate(ids):
            if call_id in ids[:index]:
                refuse(
                    f"{where} calls two tools under id {call_id[:80]!r}",
                    f"{where}.tool_calls.{index}.id",
                )
        called.update(ids)
        if message.kind == "tool_result" and message.tool_call_id not in called:
            refuse(
                f"{where} answers a tool call no message before it made "
                f"({str(message.tool_call_id)[:80]!r})",
                f"{where}.tool_call_id",
            )


def check_log(lines: Sequence[TransitionRecord], version: int, state: ConversationState) -> None:
    """Seqs 1, 2, 3... in sessions that exist, and a version that follows the last line."""
    for place, line in enumerate(lines):
        where = f"transitions.{place}"
        if line.seq != place + 1:
            refuse(
                f"the event log's seqs are not 1, 2, 3... ({where}.seq is {line.seq})",
                f"{where}.seq",
            )
        if line.session is not None and line.session > state.session:
            refuse(
                f"{where} is in session {line.session}; the state is in {state.session}",
                f"{where}.session",
            )
    if version != len(lines) + 1:
        refuse(
            f"version {version} does not follow an event log of {len(lines)} lines",
            "conversation.version",
        )


def invalid(reason: str, field: str) -> InvalidDocumentError:
    return InvalidDocumentError(f"cannot import this document: {reason}", field=field)


def refuse(reason: str, field: str) -> NoReturn:
    raise invalid(reason, field)
