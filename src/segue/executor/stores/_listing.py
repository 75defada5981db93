"""The listings' SQL, written once for both dialects: a page by keyset, the inactive ones.

A page is the next ``limit`` conversations after the last one seen, newest first by
(``created_at``, ``ordinal``), read backwards along the index on age, or along the index on a
metadata value and age when a pair filters them (one user's conversations among everyone's):
it costs the same whatever came before it, and pages neither skip nor repeat while
conversations are created. Each further pair is a look-up of the conversation's tags (which
name it by ordinal on both dialects). What differs between the dialects is the placeholder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Dialect:
    """What a store's listings need to know of its SQL."""

    mark: str
    """The placeholder: ``?`` or ``%s``."""
    listed: str
    """``_rows.LISTED_COLUMNS`` and then ``c.ordinal``, of ``conversations AS c``."""


def _also(dialect: Dialect, pairs: Sequence[tuple[str, str]], owner: str) -> tuple[str, list[str]]:
    """SQL requiring every pair of ``pairs`` of the conversation ``owner`` names."""
    mark = dialect.mark
    clause = "".join(
        f" AND EXISTS (SELECT 1 FROM tags AS o WHERE o.ordinal = {owner}"  # noqa: S608
        f" AND o.key = {mark} AND o.value = {mark})"
        for _ in pairs
    )
    return clause, [part for pair in pairs for part in pair]


def page(
    dialect: Dialect,
    pairs: Sequence[tuple[str, str]],
    limit: int,
    after: tuple[float, int] | None,
) -> tuple[str, tuple[Any, ...]]:
    """A page's statement and values."""
    mark = dialect.mark
    if pairs:
        (key, value), rest = pairs[0], pairs[1:]
        source = "tags AS t JOIN conversations AS c ON c.ordinal = t.ordinal"
        where = f" WHERE t.key = {mark} AND t.value = {mark}"
        values: list[Any] = [key, value]
        order = "t.created_at DESC, t.ordinal DESC"
        keyset = f"(t.created_at, t.ordinal) < ({mark}, {mark})"
        clause, more = _also(dialect, rest, "t.ordinal")
    else:
        source, where, values = "conversations AS c", "", []
        order = "c.created_at DESC, c.ordinal DESC"
        keyset = f"(c.created_at, c.ordinal) < ({mark}, {mark})"
        clause, more = "", []
    if after is not None:
        where = f"{where} AND {keyset}" if where else f" WHERE {keyset}"
        values.extend(after)
    statement = (
        f"SELECT {dialect.listed} FROM {source}{where}{clause}"  # noqa: S608
        f" ORDER BY {order} LIMIT {mark}"
    )
    return statement, (*values, *more, limit)


def inactive(
    dialect: Dialect, before: float, pairs: Sequence[tuple[str, str]]
) -> tuple[str, tuple[Any, ...]]:
    """The ids of the conversations last written before ``before`` with every pair, oldest
    first: a scan (an index on the time of the last write would cost every step an entry)."""
    clause, more = _also(dialect, pairs, "c.ordinal")
    statement = (
        f"SELECT c.id FROM conversations AS c WHERE c.updated_at < {dialect.mark}{clause}"  # noqa: S608
        " ORDER BY c.updated_at, c.ordinal"
    )
    return statement, (before, *more)


def still_matches(
    dialect: Dialect, conversation_id: str, before: float | None, pairs: Sequence[tuple[str, str]]
) -> tuple[str, tuple[Any, ...]]:
    """Whether the conversation is still what a purge chose (last written before ``before``,
    with every pair): a row when it is, read where it is deleted, with it locked."""
    clause, more = _also(dialect, pairs, "c.ordinal")
    mark = dialect.mark
    idle = "" if before is None else f" AND c.updated_at < {mark}"
    statement = f"SELECT 1 FROM conversations AS c WHERE c.id = {mark}{idle}{clause}"  # noqa: S608
    values = (conversation_id,) if before is None else (conversation_id, before)
    return statement, (*values, *more)
