"""Every exception segue raises, in one tree: ``except SegueError`` catches them all.

A caller's mistake or an unusable setup is a ``SegueError`` (a subclass says which); what the
world does wrong during a turn (a model that fails, a tool that raises) is not an exception at
all but an event the core answers. ``LlmCallError`` is the one an adapter raises for the
executor to turn into such an event. Each carries its facts as attributes, so a caller tells
them apart by type and data, never by reading the message.

The tree (a caller catches a branch, or a leaf; httpx's errors are grouped the same way)::

    SegueError
    ├── MessageRejectedError: the conversation did not take the message; nothing stored or sent
    │   ├── InvalidMessageError (also InvalidInputError): empty, not encodable, refused content
    │   ├── ConversationBusyError: a turn runs (here or in another runtime)
    │   ├── ConversationPausedError: paused; resume() first
    │   ├── ConversationFailedError: failed; start_new_from() continues it
    │   ├── ConversationExhaustedError: read-only (its context is full); start_new_from()
    │   └── MessageTooLargeError: the message alone could never fit
    ├── InvalidInputError (also ValueError): a value the caller passed cannot be used; nothing
    │   │   was stored
    │   ├── InvalidMetadataError, InvalidTextError, InvalidCursorError, InvalidDocumentError
    │   ├── UnsupportedOptionError: an option the model's adapter cannot honour
    │   └── UnsupportedContentError: a block the chosen API cannot take
    ├── ConversationStateError: the conversation is not in a state that allows the call;
    │   │   nothing was changed
    │   ├── NotPausedError
    │   ├── NoCompactionError: no compaction to make again or take back
    │   └── CompactionDoesNotFitError: the history before the compaction does not fit now
    ├── ConversationNotFoundError (also LookupError)
    ├── ConversationExistsError, DuplicateMessageError: the store holds it already
    ├── StoreError: the store could not do what was asked; nothing half-written was kept
    │   ├── StoreLockedError
    │   ├── StoreUnavailableError
    │   │   └── StoreFullError
    │   └── ConcurrentUpdateError
    ├── LlmCallError: raised by model adapters, answered by the executor as an event
    ├── SubAgentFailedError: a sub-agent's child conversation failed
    ├── UpdatesLostError: a watcher fell too far behind
    ├── MissingExtraError (also ModuleNotFoundError): an optional dependency is not installed
    └── UnsafeBindError: a server bound beyond this machine without a token

``MessageRejectedError.cause`` names the leaf as data (``invalid``, ``busy``, ``paused``,
``failed``, ``exhausted``, ``too_large``): a server maps it to a status without a chain of
``except`` clauses.

This module imports nothing of segue, so every layer (the executor, the stores, the server,
the CLI, the lazy loader) raises from the same classes without an import reaching upward.
"""

from __future__ import annotations


class SegueError(Exception):
    """Base of every exception segue raises for a caller's mistake or an unusable setup."""


class InvalidInputError(SegueError, ValueError):
    """A value the caller passed cannot be used (metadata, text, a cursor, a document, an
    option, a message's content): nothing was stored. Also a ``ValueError``."""


class ConversationStateError(SegueError):
    """The conversation is not in a state that allows what was asked (``resume()`` of one not
    paused, ``redo_summary()`` with no compaction, an undo that would not fit): nothing was
    changed."""


class MessageRejectedError(SegueError):
    """The conversation did not accept the message: nothing was stored and nothing was sent.
    ``cause`` says why as data; each cause has its subclass (see the module's tree)."""

    def __init__(self, conversation_id: str, reason: str, cause: str = "busy") -> None:
        super().__init__(f"Conversation {conversation_id} rejected the message: {reason}")
        self.conversation_id = conversation_id
        self.reason = reason
        self.cause = cause


class InvalidMessageError(MessageRejectedError, InvalidInputError):
    """A message the caller sent cannot be a message: empty, only whitespace, text that cannot
    be encoded, content the model's API cannot take, a malformed idempotency key. Nothing was
    stored and nothing was sent. Also a ``ValueError`` (a caller's bad input). Cause
    ``invalid``; ``conversation_id`` is the conversation it was sent to ("" if none yet)."""

    def __init__(self, message: str, conversation_id: str = "") -> None:
        SegueError.__init__(self, message)
        self.conversation_id = conversation_id
        self.reason = message
        self.cause = "invalid"


class ConversationExhaustedError(MessageRejectedError):
    """A message was sent to a conversation that reached its context limit (it is read-only);
    cause ``exhausted``."""

    def __init__(self, conversation_id: str, reason: str) -> None:
        SegueError.__init__(
            self,
            f"Conversation {conversation_id} is read-only: {reason} "
            f"Call start_new_from({conversation_id!r}) to continue in a new conversation.",
        )
        self.conversation_id = conversation_id
        self.reason = reason
        self.cause = "exhausted"


class ConversationPausedError(MessageRejectedError):
    """The conversation is paused: ``resume()`` it, then send. Cause ``paused``."""

    def __init__(self, conversation_id: str, reason: str) -> None:
        super().__init__(conversation_id, reason, "paused")


class ConversationFailedError(MessageRejectedError):
    """The conversation failed: ``start_new_from()`` continues it in a new one. Cause
    ``failed``."""

    def __init__(self, conversation_id: str, reason: str) -> None:
        super().__init__(conversation_id, reason, "failed")


class MessageTooLargeError(MessageRejectedError):
    """The message alone could never fit the conversation's window (or, pinned, the share
    pinned messages may hold): shorten or split it. Cause ``too_large``."""

    def __init__(self, conversation_id: str, reason: str) -> None:
        super().__init__(conversation_id, reason, "too_large")


class NotPausedError(ConversationStateError):
    """``resume()`` was asked of a conversation that is not paused: nothing was changed."""

    def __init__(self, conversation_id: str, phase: str) -> None:
        super().__init__(f"conversation {conversation_id} is {phase}, not paused")
        self.conversation_id = conversation_id
        self.phase = phase


class NoCompactionError(ConversationStateError):
    """``redo_summary()`` or ``undo_compaction()`` found no compaction to make again or take
    back in the conversation's current session (none yet, or the latest was already taken
    back), or the conversation is not idle in a behaviour that has one: nothing was changed."""

    def __init__(self, conversation_id: str, reason: str) -> None:
        super().__init__(f"conversation {conversation_id}: {reason}")
        self.conversation_id = conversation_id
        self.reason = reason


class CompactionDoesNotFitError(ConversationStateError):
    """``undo_compaction()`` refused: the history before the latest compaction, with what came
    after it, needs ``needed_tokens`` (estimated, with the system prompt and the pinned
    messages), and the conversation's continuation threshold is ``threshold_tokens``; a move
    to a model with a larger window makes room. Nothing was changed."""

    def __init__(self, conversation_id: str, needed_tokens: int, threshold_tokens: int) -> None:
        super().__init__(
            f"conversation {conversation_id}: taking the compaction back needs about "
            f"{needed_tokens:,} tokens, and the continuation threshold is {threshold_tokens:,}; "
            "it would be compacted again at once (a model with a larger window makes room)"
        )
        self.conversation_id = conversation_id
        self.needed_tokens = needed_tokens
        self.threshold_tokens = threshold_tokens


class ConversationNotFoundError(SegueError, LookupError):
    """No conversation has this id in the store."""


class ConversationExistsError(SegueError):
    """``Store.create`` was given an id the store already holds; the first one is kept."""


class StoreError(SegueError):
    """The store could not do what was asked (locked, unreachable, full, moved on by another
    writer); nothing half-written was kept."""


class ConcurrentUpdateError(StoreError):
    """Another writer committed to this conversation first (optimistic versioning)."""


class StoreLockedError(StoreError):
    """Another connection held the store's write lock for longer than the store waits
    (``SqliteStore``'s ``busy_timeout``, ``PostgresStore``'s ``lock_timeout``)."""


class StoreUnavailableError(StoreError):
    """The store could not be used (a dropped database session, a server restart, a disk
    error): the driver's own error is the ``__cause__``. Nothing half-written was kept; the
    call may be retried once the store is back."""


class StoreFullError(StoreUnavailableError):
    """The store has no room left (SQLite's ``SQLITE_FULL``, PostgreSQL's ``disk full``):
    nothing of the call was written; free space and call again, the conversation is as it
    was."""


class InvalidMetadataError(InvalidInputError):
    """Metadata that is not string keys and values within the bounds
    (``conversations.METADATA_LIMITS``): refused before anything is stored."""


class ConversationBusyError(MessageRejectedError):
    """The conversation is in use (a turn runs here or another runtime holds a live claim on its
    work): it was neither deleted nor changed. Wait for the turn, cancel it, or pass
    ``cancel=True``. A ``MessageRejectedError`` with cause ``busy``, as a busy ``send`` is."""

    def __init__(self, conversation_id: str, reason: str) -> None:
        super().__init__(conversation_id, reason, "busy")


class UnsupportedOptionError(InvalidInputError):
    """A conversation's options ask its provider for what the model adapter cannot do for its
    model (``compaction="provider"``, ``context_edits``, a summary prompt for a provider that
    takes none): nothing was stored. The message says what to change."""


class InvalidCursorError(InvalidInputError):
    """A listing's ``cursor`` that no listing of this store handed out: pass a page's
    ``next_cursor`` as it is, or None for the first page."""


class InvalidDocumentError(InvalidInputError):
    """An export document that segue cannot import (not one, another version, a broken or
    inconsistent part): the message says which, ``field`` names where (``messages.3.session``,
    ``conversation.version``; ``""`` for the document as a whole); nothing was stored."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class InvalidTextError(InvalidInputError):
    """An id, model name or system prompt holds what a store cannot keep (a NUL character),
    refused the same way by every store before anything is written."""


class DuplicateMessageError(SegueError):
    """A message with this idempotency key is already stored in the conversation (the commit
    carrying it again wrote nothing)."""

    def __init__(self, conversation_id: str, key: str) -> None:
        super().__init__(
            f"conversation {conversation_id!r} already holds the message with idempotency key "
            f"{key!r}"
        )
        self.conversation_id = conversation_id
        self.key = key


class LlmCallError(SegueError):
    """An LLM call failed. Adapters raise it; the executor turns it into an event.

    ``retryable``: another attempt may succeed (408/409/429/5xx/529, connection errors).
    ``context_overflow``: the provider said the prompt does not fit the window.
    ``fatal``: a setup problem no retry or trim can fix (401/403, unknown model).
    ``retry_after``: seconds the provider asked to wait before the next attempt, if it said.
    ``compaction_refused``: the provider, asked to compact, cannot (its model or account
    cannot, or it answered what the adapter does not expect of a compaction): the
    conversation falls back to segue's own compaction (REQ-SEG-049).
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        context_overflow: bool = False,
        fatal: bool = False,
        status_code: int | None = None,
        retry_after: float | None = None,
        compaction_refused: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.context_overflow = context_overflow
        self.fatal = fatal
        self.status_code = status_code
        self.retry_after = retry_after
        self.compaction_refused = compaction_refused


class UpdatesLostError(SegueError):
    """A watcher fell more than ``bus.WATCH_BUFFER`` updates behind and was dropped; read the
    state and transcript from the store, then watch again."""


class SubAgentFailedError(SegueError):
    """The child conversation ended in ``Failed``; the message names its ``ErrorKind``."""

    def __init__(self, child_id: str, error_kind: str, message: str) -> None:
        super().__init__(f"sub-agent {child_id} failed ({error_kind}): {message}")
        self.child_id = child_id
        self.error_kind = error_kind


class UnsupportedContentError(InvalidInputError):
    """A message holds a block the chosen API cannot take (a PDF on Chat Completions)."""


class MissingExtraError(SegueError, ModuleNotFoundError):
    """A segue name needs an optional dependency that is not installed: its message names the
    extra to install. Still a ``ModuleNotFoundError``, for code that catches that."""


class UnsafeBindError(SegueError):
    """Binding beyond this machine without a token would let anyone on the network in."""


__all__ = [
    "CompactionDoesNotFitError",
    "ConcurrentUpdateError",
    "ConversationBusyError",
    "ConversationExhaustedError",
    "ConversationExistsError",
    "ConversationFailedError",
    "ConversationNotFoundError",
    "ConversationPausedError",
    "ConversationStateError",
    "DuplicateMessageError",
    "InvalidCursorError",
    "InvalidDocumentError",
    "InvalidInputError",
    "InvalidMessageError",
    "InvalidMetadataError",
    "InvalidTextError",
    "LlmCallError",
    "MessageRejectedError",
    "MessageTooLargeError",
    "MissingExtraError",
    "NoCompactionError",
    "NotPausedError",
    "SegueError",
    "StoreError",
    "StoreFullError",
    "StoreLockedError",
    "StoreUnavailableError",
    "SubAgentFailedError",
    "UnsafeBindError",
    "UnsupportedContentError",
    "UnsupportedOptionError",
    "UpdatesLostError",
]
