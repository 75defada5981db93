"""What a caller hands the runtime, checked before anything is stored or sent, and what the
runtime hands back when it refuses.

A message is text or content blocks; a mistake in it (empty, not encodable, not a message at
all, a block the model's API cannot take) is the caller's and raises at once. A refusal by the
conversation (busy, read-only, paused, failed, too large) comes back from the core as
``RejectUserMessage`` and is raised here as the exception a caller can tell apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from pydantic import ValidationError

from segue.effects import Effect, RejectUserMessage
from segue.executor.errors import (
    ConversationBusyError,
    ConversationExhaustedError,
    ConversationFailedError,
    ConversationPausedError,
    InvalidMessageError,
    MessageRejectedError,
    MessageTooLargeError,
)
from segue.executor.model_port import LlmModel, checks_content
from segue.statemachine import ConversationState, ErrorKind, Failed, UserMessage

_REFUSALS: Final[dict[str, Callable[[str, str], MessageRejectedError]]] = {
    "busy": ConversationBusyError,
    "paused": ConversationPausedError,
    "failed": ConversationFailedError,
    "exhausted": ConversationExhaustedError,
    "too_large": MessageTooLargeError,
}
"""The subclass of ``MessageRejectedError`` each cause the core gives is raised as."""
MAX_KEY = 256
"""Longest idempotency key taken (a UUID or a client's request id fits many times over)."""


def user_message(text: object, *, pinned: bool = False) -> UserMessage:
    """The ``UserMessage`` for ``text`` (a string, or content blocks: text, images, documents,
    as values or as the Messages API's dicts), or the caller's mistake as an exception: nothing
    of it reaches the store or the model."""
    if not isinstance(pinned, bool):
        msg = f"pinned is True or False, not {type(pinned).__name__}"
        raise TypeError(msg)
    if isinstance(text, str):
        _check_text(text)
        if not text.strip():
            msg = "the message is empty (or only whitespace); nothing was sent"
            raise InvalidMessageError(msg)
        return UserMessage(text=text, pinned=pinned)
    if not isinstance(text, Sequence) or isinstance(text, bytes | bytearray):
        msg = f"a message is text (str) or a list of content blocks, not {type(text).__name__}"
        raise TypeError(msg)
    for block in text:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            _check_text(block["text"])
    try:
        message = UserMessage.model_validate({"content": tuple(text), "pinned": pinned})
    except ValidationError as error:
        msg = f"the message's content blocks are not valid: {error}"
        raise InvalidMessageError(msg) from None
    if not message.text.strip():
        msg = "the message is empty (or only whitespace); nothing was sent"
        raise InvalidMessageError(msg)
    return message


def check_content(llm: LlmModel, message: UserMessage) -> None:
    """Refuse a message whose blocks the model's API cannot take (a PDF on Chat Completions),
    by the adapter's optional ``check_content(blocks)``, before the message is stored: sent
    anyway, it would fail the turn with the message already in the transcript. The adapter
    raises ``ValueError`` saying why; a message of text alone is not checked."""
    if not message.content or not checks_content(llm):
        return
    try:
        llm.check_content(message.content)
    except ValueError as refused:
        raise InvalidMessageError(str(refused)) from refused


def check_key(key: object) -> None:
    if key is None:
        return
    if not isinstance(key, str) or not key or len(key) > MAX_KEY or "\x00" in key:
        msg = (
            f"an idempotency key is a non-empty string of at most {MAX_KEY} characters without NUL"
        )
        raise InvalidMessageError(msg)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        msg = (
            f"the message holds text that cannot be encoded as UTF-8 ({error.reason} at "
            f"position {error.start}), such as a lone surrogate; nothing was sent"
        )
        raise InvalidMessageError(msg) from None


def raise_if_rejected(
    conversation_id: str, state: ConversationState, effects: Sequence[Effect]
) -> None:
    rejection = next((e for e in effects if isinstance(e, RejectUserMessage)), None)
    if rejection is None:
        return
    if state.phase.kind == "context_exhausted":
        raise ConversationExhaustedError(conversation_id, rejection.reason)
    refusal = _REFUSALS.get(rejection.cause)
    if refusal is None:
        raise MessageRejectedError(conversation_id, rejection.reason, rejection.cause)
    raise refusal(conversation_id, rejection.reason)


class Failure(NamedTuple):
    """Why a conversation failed: its ``ErrorKind`` and the message that says what happened."""

    error_kind: ErrorKind
    message: str


def failure_of(state: ConversationState) -> Failure | None:
    """Why a failed conversation failed (``Failure``), else None."""
    phase = state.phase
    if not isinstance(phase, Failed):
        return None
    return Failure(phase.error_kind, phase.message)
