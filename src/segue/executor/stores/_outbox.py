"""The outbox of the SQL stores: a JSON array held in the conversation's own row.

Why in the row rather than in a table of its own: a step already rewrites the conversation's row
(its state and version), so the effects it queues and completes ride along in that write at no
extra cost, where a table costs an insert and a delete per step. On PostgreSQL those inserts and
deletes leave dead rows and index entries behind until a VACUUM, and a conversation's reads and
writes slowed down as they piled up (350 to 877 us per step over 3,000 turns); an update of the
row in place is HOT (no index covers the columns it changes) and its old versions are pruned
within the page. On SQLite it is one b-tree fewer to touch per step.

An entry is ``{"id": 1, "effect": {...}, "owner": "host/pid/x", "lease_until": 1.5}``: the
effect as ``dump_effect`` wrote it, who claimed it and until when (null when nobody has). Entries
are in id order; an empty outbox is exactly ``[]`` (what a conversation without pending work
holds, so a scan for pending work compares text). The outbox stays small: it holds what is
pending, nearly always one effect or none.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final, TypeVar

from segue.effects import Effect
from segue.executor.store_port import PendingEffect
from segue.executor.stores._shared import may_claim
from segue.executor.stores.codec import load_effect

EMPTY: Final = "[]"

Entry = dict[str, Any]
"""An entry as parsed: id, effect (the parsed JSON object), owner, lease_until."""
T = TypeVar("T")
Change = Callable[[list[Entry]], tuple[T, bool]]
"""A change of the entries, made in place: what it answers, and whether it changed anything
(what ``complete``, ``claim``, ``renew`` and ``release`` of ``_sql`` do)."""


def entry_text(effect_id: int, effect_json: str, owner: str | None, lease: float | None) -> str:
    """One entry as JSON text, around the effect's own text (not parsed, not re-encoded)."""
    return f'{{"id":{effect_id}{entry_tail(effect_json, owner, lease)}'


def entry_tail(effect_json: str, owner: str | None, lease: float | None) -> str:
    """An entry's text after its id (for a writer that knows the id only in SQL)."""
    until = "null" if lease is None else repr(lease) if math.isfinite(lease) else "null"
    return f',"effect":{effect_json},"owner":{_owner_json(owner)},"lease_until":{until}}}'


def head(completes: Collection[int]) -> str | None:
    """What an outbox holding exactly ``completes`` (none or one entry, as ``entry_text`` writes
    them) starts with; None for more than one."""
    if not completes:
        return EMPTY
    if len(completes) > 1:
        return None
    (effect_id,) = completes
    return f'[{{"id":{effect_id},"effect":'


@functools.lru_cache(maxsize=64)
def _owner_json(owner: str | None) -> str:
    """An owner as JSON (a runtime commits under the same one each time)."""
    return json.dumps(owner)


def parse(text: str) -> list[Entry]:
    """The entries of an outbox, in id order."""
    if text == EMPTY:
        return []
    entries: list[Entry] = json.loads(text)
    if any(entries[i]["id"] >= entries[i + 1]["id"] for i in range(len(entries) - 1)):
        entries.sort(key=lambda entry: int(entry["id"]))
    return entries


_ID: Final = re.compile(r'\{"id":(\d+),"effect":')
"""The start of an entry as ``entry_text`` writes it."""


def only(text: str, count: int) -> frozenset[int]:
    """The ids of an outbox known to hold ``count`` entries, read without decoding it, when
    exactly ``count`` entries are found as ``entry_text`` writes them; otherwise (an outbox
    written another way, or an effect whose own JSON looks like an entry) an id no step
    completes, so that the caller decodes it."""
    if text == EMPTY:
        return frozenset()
    ids = _ID.findall(text)
    return frozenset(map(int, ids)) if len(ids) == count else _UNKNOWN


_UNKNOWN: Final = frozenset({-1})
"""What ``only`` answers when it cannot tell: no step completes an id of -1."""


def dump(entries: Sequence[Entry], tail: Sequence[str] = ()) -> str:
    """The outbox holding ``entries`` (parsed) followed by ``tail`` (entry texts)."""
    if not entries and not tail:
        return EMPTY
    texts = [json.dumps(entry, separators=(",", ":")) for entry in entries]
    return f"[{','.join((*texts, *tail))}]"


def apply(text: str, change: Change[T]) -> tuple[T, list[Entry] | None]:
    """``change`` made to the outbox ``text``: what it answers, and the entries to write back
    (None when nothing changed: the row is left alone)."""
    entries = parse(text)
    result, changed = change(entries)
    return result, entries if changed else None


def pending(entry: Entry, effect: Effect | None = None) -> PendingEffect:
    """An entry as a ``PendingEffect``; ``effect`` when the caller still holds it as an object
    (no need to decode it). A parsed effect is validated as JSON, as every stored value is."""
    return PendingEffect(
        id=int(entry["id"]),
        effect=effect if effect is not None else load_effect(json.dumps(entry["effect"])),
        owner=entry["owner"],
        lease_until=entry["lease_until"],
    )


def pending_all(text: str) -> tuple[PendingEffect, ...]:
    """Every entry of an outbox, decoded."""
    return tuple(pending(entry) for entry in parse(text))


def without(entries: list[Entry], effect_ids: Collection[int]) -> list[Entry]:
    """``entries`` less those whose id is in ``effect_ids``."""
    if not effect_ids:
        return entries
    return [entry for entry in entries if entry["id"] not in effect_ids]


def find(entries: list[Entry], effect_id: int) -> Entry | None:
    return next((entry for entry in entries if entry["id"] == effect_id), None)


def claim(
    entries: list[Entry],
    effect_id: int,
    *,
    owner: str,
    lease_until: float,
    now: float,
    take_from: str | None,
) -> tuple[Entry | None, bool]:
    """The entry ``effect_id`` (None if not pending) and whether it was claimed for ``owner``
    now (``entries`` updated in place then); see ``Store.claim`` for when it may be."""
    entry = find(entries, effect_id)
    if entry is None:
        return None, False
    if not may_claim(
        entry["owner"], entry["lease_until"], owner=owner, now=now, take_from=take_from
    ):
        return entry, False
    entry["owner"], entry["lease_until"] = owner, lease_until
    return entry, True


def renew(entries: list[Entry], effect_ids: Collection[int], *, owner: str, lease: float) -> int:
    """Extend ``owner``'s claims on ``effect_ids`` (in place); how many were ``owner``'s."""
    renewed = 0
    for entry in entries:
        if entry["id"] in effect_ids and entry["owner"] == owner:
            entry["lease_until"] = lease
            renewed += 1
    return renewed


def release(entries: list[Entry], effect_ids: Collection[int], *, owner: str) -> bool:
    """Give up ``owner``'s claims on ``effect_ids`` (in place); whether any was let go."""
    released = False
    for entry in entries:
        if entry["id"] in effect_ids and entry["owner"] == owner:
            entry["owner"] = entry["lease_until"] = None
            released = True
    return released
