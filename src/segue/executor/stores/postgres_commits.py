"""``PostgresStore``'s commits: one statement per step, or one for many.

Why many in one: conversations of one process that commit in the same turn of the event loop
(a busy server, a worker with many conversations) each paid a round trip, a transaction and a
wake-up of a server process; on a machine short of cores, that is what a step cost most of.
They are now sent together, as one statement (``COMMIT_MANY``) whose input is one JSON
document listing the commits: one round trip, one transaction, one execution of the plan.
Every commit in it is still guarded by its own version and key, so one that is refused (a
version that moved) is left out while the others land, and says why afterwards, as a commit
alone does. A batch whose statement fails (two commits racing with one key, a row in the way)
is committed again one by one, so that only the culprit gets the error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from segue.executor.store_port import StoredConversation
from segue.executor.stores import _outbox
from segue.executor.stores._rows import CommitRows, Counters
from segue.executor.stores.postgres_schema import fast_commit

# ``COMMIT`` (in ``postgres_schema``) for every commit of the document at once: the input is a
# relation of commits (their columns as ``json_to_recordset`` reads them), the version-guarded
# UPDATE joins it, and the inserts take what the UPDATE returned (``n`` numbers the commits). A
# commit whose guard fails returns no row.
COMMIT_MANY: Final = """
WITH input AS (
    SELECT * FROM json_to_recordset(%s::json) AS i (
        n integer, cid text, version integer, state json, phase text, appended integer,
        queued integer, at double precision, key text, owner text, lease double precision,
        completes integer[], effects json, messages json, kinds text[], event_kind text,
        event json, from_phase text, tokens integer, reason text, effect_kinds json,
        session integer
    )
), upd AS (
    UPDATE conversations AS c SET state = i.state, phase = i.phase, version = c.version + 1,
        message_count = c.message_count + i.appended,
        effect_count = c.effect_count + i.queued, updated_at = i.at,
        outbox = (
            SELECT coalesce(json_agg(e.entry ORDER BY e.id), '[]')
            FROM (
                SELECT o.entry, (o.entry->>'id')::integer AS id
                FROM json_array_elements(c.outbox) AS o (entry)
                WHERE (o.entry->>'id')::integer <> ALL(i.completes)
                UNION ALL
                SELECT json_build_object('id', c.effect_count + q.n, 'effect', q.effect,
                    'owner', i.owner, 'lease_until', i.lease),
                    c.effect_count + q.n
                FROM json_array_elements(i.effects) WITH ORDINALITY AS q (effect, n)
            ) AS e
        )
    FROM input AS i
    WHERE c.id = i.cid AND c.version = i.version AND NOT EXISTS (
        SELECT FROM transitions AS t
        WHERE t.conversation_id = i.cid AND t.idempotency_key = i.key)
    RETURNING i.n, c.message_count, c.effect_count, c.system, c.child_id, c.created_at,
        CASE WHEN json_array_length(c.outbox) = i.queued THEN NULL ELSE c.outbox::text END
), appended AS (
    INSERT INTO messages (conversation_id, seq, kind, message)
    SELECT i.cid, upd.message_count - i.appended + m.n, m.kind, m.message
    FROM upd JOIN input AS i ON i.n = upd.n,
        ROWS FROM (json_array_elements(i.messages), unnest(i.kinds))
        WITH ORDINALITY AS m (message, kind, n)
), logged AS (
    INSERT INTO transitions (conversation_id, seq, event_kind, event, from_phase, to_phase,
        context_tokens, reason, effect_kinds, at, session, idempotency_key)
    SELECT i.cid, i.version, i.event_kind, i.event, i.from_phase, i.phase, i.tokens, i.reason,
        i.effect_kinds, i.at, i.session, i.key
    FROM upd JOIN input AS i ON i.n = upd.n
)
SELECT upd.*, (SELECT pg_notify('segue_changes', w.conversation_id) IS NULL
    FROM input AS i JOIN segue_watches AS w ON w.conversation_id = i.cid WHERE i.n = upd.n
    LIMIT 1)
FROM upd
"""


def _fields(rows: CommitRows) -> dict[str, Any]:
    """What a commit writes, by ``COMMIT``'s parameter names (the documents as JSON texts)."""
    commit = rows.commit
    (
        _,
        version,
        event_kind,
        event,
        from_phase,
        phase,
        tokens,
        reason,
        effect_kinds,
        at,
        session,
        key,
    ) = rows.transition
    return {
        "cid": commit.conversation_id,
        "version": version,
        "state": rows.state,
        "phase": phase,
        "appended": len(rows.appended),
        "queued": len(rows.queued),
        "at": at,
        "key": key,
        "owner": commit.owner,
        "lease": commit.lease_until,
        "event_kind": event_kind,
        "event": event,
        "from_phase": from_phase,
        "tokens": tokens,
        "reason": reason,
        "effect_kinds": effect_kinds,
        "session": session,
    }


def params(rows: CommitRows) -> dict[str, Any]:
    """``COMMIT``'s parameters. The documents go as JSON arrays of the texts as they are (each
    a JSON object already), kinds and ids as array literals: text parameters, which psycopg
    sends as they are (its list adapters would examine every element and, in text form,
    escape every quote of the JSON inside)."""
    return {
        **_fields(rows),
        "messages": f"[{','.join(text for _, text in rows.appended)}]",
        "kinds": f"{{{','.join(kind for kind, _ in rows.appended)}}}",  # plain words
        "effects": f"[{','.join(text for _, text in rows.queued)}]",
        "completes": f"{{{','.join(map(str, sorted(rows.completes)))}}}",
    }


_DOCUMENTS: Final = frozenset({"state", "event", "effect_kinds"})
"""Fields that are JSON texts already: written into the document as they are."""


def document(batch: Sequence[CommitRows]) -> str:
    """``COMMIT_MANY``'s input: a JSON array with one object per commit (``n`` its place in
    ``batch``), built around the JSON texts the commits already hold (nothing is parsed or
    encoded again but the plain fields)."""
    records = []
    for n, rows in enumerate(batch):
        parts = [f'"n":{n}']
        for name, value in _fields(rows).items():
            text = value if name in _DOCUMENTS else json.dumps(value)
            parts.append(f'"{name}":{text}')
        parts.append(f'"messages":[{",".join(text for _, text in rows.appended)}]')
        parts.append(f'"kinds":{json.dumps([kind for kind, _ in rows.appended])}')
        parts.append(f'"effects":[{",".join(text for _, text in rows.queued)}]')
        parts.append(f'"completes":{json.dumps(sorted(rows.completes))}')
        records.append(f"{{{','.join(parts)}}}")
    return f"[{','.join(records)}]"


def fast(rows: CommitRows) -> tuple[str, dict[str, Any]] | None:
    """``fast_commit``'s statement for ``rows`` and its parameters, when the step has its
    shape (see there); else None."""
    appended, queued, completes = rows.appended, rows.queued, rows.completes
    if len(appended) > 1 or len(queued) > 1 or len(completes) > 1:
        return None
    commit = rows.commit
    key = commit.idempotency_key
    values = _fields(rows)
    if appended:
        values["kind"], values["message"] = appended[0]
    if queued:
        values["effect"] = queued[0][1]
    if completes:
        (values["completed"],) = completes
    return fast_commit(len(appended), len(queued), len(completes), key is not None), values


def stored(rows: CommitRows, returned: Sequence[Any]) -> StoredConversation:
    """The conversation as committed, from what ``COMMIT`` (or a row of ``COMMIT_MANY``, its
    ``n`` left out) returned: the counters, and the outbox when it holds more than what the
    step queued (then whether watchers were notified, which is not needed here)."""
    message_count, effect_count, system, child_id, created_at, outbox = returned[:6]
    counters = Counters(message_count, effect_count, system, child_id, created_at)
    first_new = effect_count - len(rows.queued) + 1
    older = (
        []
        if outbox is None
        else [entry for entry in _outbox.parse(outbox) if entry["id"] < first_new]
    )
    return rows.stored(counters, older)
