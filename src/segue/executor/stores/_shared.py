"""What the stores share, so that ``MemoryStore``, ``SqliteStore`` and ``PostgresStore`` keep
only what differs between them (driver, SQL dialect, locking, connection handling).

- **The contract's refusals**, worded once: an unknown id, an id taken, a commit carrying another
  conversation's state, a version that moved, a snapshot saved again with other content.
- **Ids no store can hold** (a NUL, more characters than a conversation's id may have): every
  call about one is answered as about an unknown id, before any driver sees it (PostgreSQL's
  refuses a NUL with an error of its own).
- **The event log line** every store writes for a commit and reads back as a
  ``TransitionRecord``.

The rows of the two SQL stores are in ``_rows``, their outbox in ``_outbox``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Self, TypeVar

from segue.executor.bounds import MAX_ID_LENGTH
from segue.executor.bounds import checked_metadata as checked_metadata  # noqa: PLC0414  # the stores'
from segue.executor.errors import (
    ConcurrentUpdateError,
    ConversationExistsError,
    ConversationNotFoundError,
    InvalidCursorError,
    InvalidTextError,
    SegueError,
)
from segue.executor.store_port import (
    Commit,
    ConversationPage,
    PendingEffect,
    StoredConversation,
    TransitionRecord,
)
from segue.statemachine import ConversationState
from segue.statemachine.checkpoint import SessionSnapshot

T = TypeVar("T")

# --------------------------------------------------------------------------- refusals


def not_found(conversation_id: str) -> ConversationNotFoundError:
    shown = conversation_id if len(conversation_id) <= MAX_ID_LENGTH else conversation_id[:40]
    more = "" if shown is conversation_id else f" (and {len(conversation_id) - 40:,} more)"
    return ConversationNotFoundError(f"no conversation {shown!r}{more} in this store")


def already_exists(conversation_id: str) -> ConversationExistsError:
    return ConversationExistsError(f"conversation {conversation_id!r} already exists")


def holdable(conversation_id: str) -> bool:
    """Whether some conversation could have this id (a store holds none that could not)."""
    return len(conversation_id) <= MAX_ID_LENGTH and "\x00" not in conversation_id


def require_holdable(conversation_id: str) -> None:
    """``ConversationNotFoundError`` for an id no conversation can have, before any query."""
    if not holdable(conversation_id):
        raise not_found(conversation_id)


MAX_PAGE: Final = 1000
"""The most conversations one listing page holds."""


def page_limit(limit: int) -> int:
    """``limit`` checked: 1 to ``MAX_PAGE`` conversations a page."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        msg = f"limit is a number of conversations from 1 to {MAX_PAGE}, not {limit!r}"
        raise ValueError(msg)
    return limit


@dataclass(frozen=True, slots=True)
class PageRequest:
    """A listing's arguments, checked: the metadata pairs (sorted), the limit, the keyset."""

    pairs: list[tuple[str, str]]
    limit: int
    after: tuple[float, int] | None

    @classmethod
    def of(cls, metadata: Mapping[str, str] | None, limit: int, cursor: str | None) -> Self:
        """``InvalidMetadataError``, ``ValueError`` or ``InvalidCursorError`` for what is off."""
        return cls(
            sorted(checked_metadata(metadata).items()),
            page_limit(limit),
            None if cursor is None else decode_cursor(cursor),
        )

    def page(
        self,
        found: Sequence[T],
        listed: Callable[[T], StoredConversation],
        key: Callable[[T], tuple[float, int]],
    ) -> ConversationPage:
        """The page of ``found`` (up to ``limit`` + 1 of them, newest first): the first
        ``limit`` as ``listed`` makes them, and the cursor after the last if there were more."""
        shown = found[: self.limit]
        more = len(found) > self.limit
        return ConversationPage(
            conversations=tuple(listed(item) for item in shown),
            next_cursor=encode_cursor(*key(shown[-1])) if more else None,
        )


_MIN_KEY: Final = -(2**63)
_MAX_KEY: Final = 2**63 - 1
"""A cursor's place is a 64-bit integer in every store (an ordinal, a row's place)."""


def encode_cursor(created_at: float, key: int) -> str:
    """The keyset a listing resumes after: the last conversation's creation time and place."""
    text = json.dumps([created_at, key], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, int]:
    """``encode_cursor``'s keyset back, or ``InvalidCursorError``."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created_at, key = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if isinstance(key, bool) or not isinstance(key, int):
            raise TypeError(key)
        if isinstance(created_at, bool) or not isinstance(created_at, int | float):
            raise TypeError(created_at)
        if not _MIN_KEY <= key <= _MAX_KEY:  # SQLite's integers are 64-bit: OverflowError
            raise ValueError(key)
        when = float(created_at)
        if not math.isfinite(when):
            raise ValueError(created_at)
        return when, key
    except (
        binascii.Error,
        UnicodeError,
        ValueError,
        TypeError,
        AttributeError,
        OverflowError,
    ) as error:
        msg = f"not a cursor of this store: {cursor[:60]!r}; pass a page's next_cursor as it is"
        raise InvalidCursorError(msg) from error


def check_storable(state: ConversationState, system: str | None) -> None:
    """Refuse what PostgreSQL's text type cannot hold (a NUL), on every store alike, so a
    conversation that works in tests on SQLite does not fail in production. Message text is
    stored as JSON, where a NUL is an escape, so it round-trips everywhere."""
    config = state.config
    if "\x00" not in f"{config.id}{config.parent_id}{config.model}{system}":
        return  # the usual case, told by one scan
    fields = {"id": config.id, "parent id": config.parent_id, "model": config.model}
    fields["system prompt"] = system
    for name, value in fields.items():
        if value is not None and "\x00" in value:
            msg = f"the conversation's {name} holds a NUL character, which no store can keep"
            raise InvalidTextError(msg)


def claimable(pending: PendingEffect, *, owner: str, now: float, take_from: str | None) -> bool:
    """Whether ``owner`` may claim ``pending``: nobody holds it, its lease is over, ``owner``
    holds it already, or its holder is ``take_from`` (known dead)."""
    return may_claim(pending.owner, pending.lease_until, owner=owner, now=now, take_from=take_from)


def may_claim(
    holder: str | None, lease_until: float | None, *, owner: str, now: float, take_from: str | None
) -> bool:
    """``claimable`` for a claim held by ``holder`` until ``lease_until``."""
    if holder is None or holder in {owner, take_from}:
        return True
    return lease_until is None or lease_until < now


def check_commit_target(commit: Commit) -> None:
    """A commit must carry the state of the conversation it is for, and nothing a store
    cannot keep; an id no conversation can have is an unknown one."""
    require_holdable(commit.conversation_id)
    if commit.state.config.id != commit.conversation_id:
        msg = (
            f"commit for {commit.conversation_id!r} carries the state of {commit.state.config.id!r}"
        )
        raise SegueError(msg)
    check_storable(commit.state, None)
    key = commit.idempotency_key
    if key is not None and "\x00" in key:
        msg = "the idempotency key holds a NUL character, which no store can keep"
        raise InvalidTextError(msg)


def newer_schema(database: str, version: int, understood: int) -> SegueError:
    """A database migrated by a later segue: opening it could write what that one would
    misread, so it is refused."""
    return SegueError(
        f"{database} has schema version {version}, newer than this segue "
        f"understands ({understood}); upgrade segue to open it"
    )


def version_moved(conversation_id: str, version: int, expected: int) -> ConcurrentUpdateError:
    return ConcurrentUpdateError(
        f"conversation {conversation_id!r} is at version {version}, not {expected}: "
        "another writer committed first"
    )


def check_snapshot_unchanged(existing: SessionSnapshot, snapshot: SessionSnapshot) -> None:
    """Saving a snapshot again is harmless (a runtime finishing its outbox after a crash does
    it); saving a different one under a used version would overwrite history, so it is refused."""
    if existing != snapshot:
        msg = (
            f"snapshot v{snapshot.version} of conversation {snapshot.conversation_id!r} "
            "already exists with other content; snapshots are never overwritten"
        )
        raise SegueError(msg)


# --------------------------------------------------------------------------- the event log

LogLine = tuple[int, str, str, str, str, int | None, str, tuple[str, ...], float, int | None]
"""An event log line as written: the fields of a ``TransitionRecord`` in order (seq, event_kind,
event_json, from_phase, to_phase, context_tokens, reason, effect_kinds, at, session). A plain
tuple of strings and numbers holds no containers, so ``MemoryStore`` keeps a long log of them at
no cost to the cyclic GC and builds the record only for the (rare) reader."""


def log_line(commit: Commit, effect_kinds: tuple[str, ...]) -> LogLine:
    """The line ``commit`` adds to the log; its seq is the version it was committed on."""
    state = commit.state
    return (
        commit.expected_version,
        commit.event_kind,
        commit.event_json,
        commit.from_phase,
        state.phase.kind,
        state.context_tokens,
        commit.reason,
        effect_kinds,
        commit.at,
        commit.session,
    )


def line_of(record: TransitionRecord) -> LogLine:
    """A record as the log line it was written from (an import writes it back)."""
    return (
        record.seq,
        record.event_kind,
        record.event_json,
        record.from_phase,
        record.to_phase,
        record.context_tokens,
        record.reason,
        record.effect_kinds,
        record.at,
        record.session,
    )


def transition_record(line: LogLine) -> TransitionRecord:
    seq, event_kind, event_json, from_phase, to_phase, tokens, reason, kinds, at, session = line
    return TransitionRecord(
        seq=seq,
        event_kind=event_kind,
        event_json=event_json,
        from_phase=from_phase,
        to_phase=to_phase,
        context_tokens=tokens,
        reason=reason,
        effect_kinds=kinds,
        at=at,
        session=session,
    )


def transition_from_row(row: Sequence[Any]) -> TransitionRecord:
    """A record from ``transitions`` (seq, event_kind, event, from_phase, to_phase,
    context_tokens, reason, effect_kinds, at, session); ``effect_kinds`` is stored as a JSON
    list."""
    seq, event_kind, event_json, from_phase, to_phase, tokens, reason, kinds, at, session = row
    return transition_record(
        (
            seq,
            event_kind,
            event_json,
            from_phase,
            to_phase,
            tokens,
            reason,
            tuple(json.loads(kinds)),
            at,
            session,
        )
    )
