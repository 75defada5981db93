"""``PostgresStore``'s schema (its migrations are ``migrations.HISTORY``'s PostgreSQL
statements), and the statements a step is (``COMMIT`` for any step, ``fast_commit`` for the
usual shapes).

The database records its schema version in a one-row ``segue_schema`` table; ``PostgresStore``
runs every migration after it in one transaction, under an advisory lock, so two processes
starting together do not both migrate.
"""

from __future__ import annotations

import functools
from typing import Final

from segue.executor.stores.migrations import statements

MIGRATION_LOCK: Final = 0x5E9E_0001
"""Advisory lock key held while migrating (any constant unlikely to clash with an app's)."""

MIGRATIONS: Final = statements("postgres")
"""Each version's statements on this dialect, from ``migrations.HISTORY`` (index ``v - 1``:
version ``v``)."""

METADATA: Final = (
    "(SELECT json_object_agg(t.key, t.value)::text FROM tags AS t"
    " WHERE t.ordinal = conversations.ordinal)"
)
"""A conversation's metadata as a JSON object (NULL when it has none), as a column of its
row."""

NOTIFY: Final = (
    "(SELECT pg_notify('segue_changes', w.conversation_id) IS NULL FROM segue_watches AS w"
    " WHERE w.conversation_id = {cid} LIMIT 1)"
)
"""A column of a step's result: notifies the conversation's watchers if it has any (a look-up
in an index of a table that is empty while nobody watches); one notification reaches every
listener. (False when it notified, NULL when nobody watches: not an aggregate, whose set-up
would cost every step more than the look-up.)"""

# One statement per step. The version-guarded UPDATE writes the conversation's row with its new
# outbox: the entries it had, less those the step completes, then those it queues (``c.outbox``
# and ``c.effect_count`` in SET are the values before the step). Every other clause reads
# ``upd``, so none of them writes unless the UPDATE did. The row comes back with its counters,
# and its outbox only when it holds more than what this step queued (the caller still has
# those as objects).
# The documents a step writes go as one JSON array each, a plain text parameter built by joining
# the JSON texts (``json_array_elements`` hands each back verbatim): psycopg's list adapters
# would examine every element and, in text form, escape every quote of the JSON inside.
COMMIT: Final = """
WITH upd AS (
    UPDATE conversations AS c SET state = %(state)s, phase = %(phase)s, version = c.version + 1,
        message_count = c.message_count + %(appended)s,
        effect_count = c.effect_count + %(queued)s, updated_at = %(at)s,
        outbox = (
            SELECT coalesce(json_agg(e.entry ORDER BY e.id), '[]')
            FROM (
                SELECT o.entry, (o.entry->>'id')::integer AS id
                FROM json_array_elements(c.outbox) AS o (entry)
                WHERE (o.entry->>'id')::integer <> ALL(%(completes)s::integer[])
                UNION ALL
                SELECT json_build_object('id', c.effect_count + q.n, 'effect', q.effect,
                    'owner', %(owner)s::text, 'lease_until', %(lease)s::double precision),
                    c.effect_count + q.n
                FROM json_array_elements(%(effects)s::json) WITH ORDINALITY AS q (effect, n)
            ) AS e
        )
    WHERE c.id = %(cid)s AND c.version = %(version)s AND NOT EXISTS (
        SELECT FROM transitions WHERE conversation_id = %(cid)s AND idempotency_key = %(key)s)
    RETURNING c.message_count, c.effect_count, c.system, c.child_id, c.created_at,
        CASE WHEN json_array_length(c.outbox) = %(queued)s THEN NULL ELSE c.outbox::text END
), appended AS (
    INSERT INTO messages (conversation_id, seq, kind, message)
    SELECT %(cid)s, upd.message_count - %(appended)s + m.n, m.kind, m.message
    FROM upd,
        ROWS FROM (json_array_elements(%(messages)s::json), unnest(%(kinds)s::text[]))
        WITH ORDINALITY AS m (message, kind, n)
), logged AS (
    INSERT INTO transitions (conversation_id, seq, event_kind, event, from_phase, to_phase,
        context_tokens, reason, effect_kinds, at, session, idempotency_key)
    SELECT %(cid)s, %(version)s, %(event_kind)s, %(event)s, %(from_phase)s, %(phase)s,
        %(tokens)s, %(reason)s, %(effect_kinds)s, %(at)s, %(session)s, %(key)s
    FROM upd
)
SELECT upd.*, NOTIFY FROM upd
""".replace("NOTIFY", NOTIFY.format(cid="%(cid)s"))

COMMIT_MARKED: Final = COMMIT.replace(
    "), logged AS (",
    """), marked AS (
    INSERT INTO landmarks (conversation_id, seq, session, generation, start, pinned)
    SELECT %(cid)s, upd.message_count - %(appended)s + l.n, l.session, l.generation, l.start,
        l.pinned
    FROM upd, json_to_recordset(%(landmarks)s::json)
        AS l (n integer, session integer, generation integer, start smallint, pinned boolean)
), logged AS (""",
)
"""``COMMIT`` for a step that appends landmarks (``_rows.landmark``: a new session or
generation, a pinned message). Rare, so the usual statements carry no clause for them."""

WHY_REFUSED: Final = """
SELECT version,
    EXISTS (SELECT FROM transitions WHERE conversation_id = %s AND idempotency_key = %s)
FROM conversations WHERE id = %s
"""


@functools.lru_cache(maxsize=32)
def fast_commit(appended: int, queued: int, completed: int, keyed: bool) -> str:
    """``COMMIT`` for a step of the usual shape, with a simpler plan: at most one message, at
    most one effect queued, and an outbox that holds exactly what the step completes (none or
    one entry; the step's guard checks it). The outbox is then what the step queues, built as
    a value; the message and the event are inserted as values. A key used before is not looked
    up first: the unique index on keys refuses the event's insert, and the statement with it
    (the caller hears ``DuplicateMessageError``). A step of another shape, or whose outbox holds
    something else, goes through ``COMMIT``; so does one this refuses, which ``COMMIT`` refuses
    too, and then says why."""
    if appended > 1 or queued > 1 or completed > 1:
        msg = f"no fast statement for {appended} messages, {queued} queued, {completed} done"
        raise ValueError(msg)
    outbox = (
        "json_build_array(json_build_object('id', c.effect_count + 1, 'effect',"
        " %(effect)s::json, 'owner', %(owner)s::text, 'lease_until',"
        " %(lease)s::double precision))"
        if queued
        else "'[]'"
    )
    guard = (
        "json_array_length(c.outbox) = 1 AND (c.outbox->0->>'id')::integer = %(completed)s"
        if completed
        else "json_array_length(c.outbox) = 0"
    )
    message = (
        """, appended AS (
    INSERT INTO messages (conversation_id, seq, kind, message)
    SELECT %(cid)s, upd.message_count, %(kind)s, %(message)s FROM upd
)"""
        if appended
        else ""
    )
    key = "%(key)s" if keyed else "NULL"
    # Literal fragments only (the shape picks them): every value is a parameter.
    return f"""
WITH upd AS (
    UPDATE conversations AS c SET state = %(state)s, phase = %(phase)s, version = c.version + 1,
        message_count = c.message_count + {appended}, effect_count = c.effect_count + {queued},
        updated_at = %(at)s, outbox = {outbox}
    WHERE c.id = %(cid)s AND c.version = %(version)s AND {guard}
    RETURNING c.message_count, c.effect_count, c.system, c.child_id, c.created_at
){message}, logged AS (
    INSERT INTO transitions (conversation_id, seq, event_kind, event, from_phase, to_phase,
        context_tokens, reason, effect_kinds, at, session, idempotency_key)
    SELECT %(cid)s, %(version)s, %(event_kind)s, %(event)s, %(from_phase)s, %(phase)s,
        %(tokens)s, %(reason)s, %(effect_kinds)s, %(at)s, %(session)s, {key}
    FROM upd
)
SELECT upd.*, NULL::text, {NOTIFY.format(cid="%(cid)s")} FROM upd
"""  # noqa: S608
