"""``PostgresStore``'s schema, its migrations from every earlier version, and the statements a
step is (``COMMIT`` for any step, ``fast_commit`` for the usual shapes).

The database records its schema version in a one-row ``segue_schema`` table; ``PostgresStore``
runs every migration after it in one transaction, under an advisory lock, so two processes
starting together do not both migrate.
"""

from __future__ import annotations

import functools
from typing import Final

SCHEMA_VERSION: Final = 6
MIGRATION_LOCK: Final = 0x5E9E_0001
"""Advisory lock key held while migrating (any constant unlikely to clash with an app's)."""

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    # 0 -> 1: the first schema.
    (
        """CREATE TABLE conversations (
            id text PRIMARY KEY,
            parent_id text,
            state json NOT NULL,
            phase text NOT NULL,
            version integer NOT NULL CHECK (version >= 1),
            system text,
            child_id text,
            message_count integer NOT NULL DEFAULT 0 CHECK (message_count >= 0),
            effect_count integer NOT NULL DEFAULT 0 CHECK (effect_count >= 0),
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL,
            ordinal bigint GENERATED ALWAYS AS IDENTITY
        )""",
        "CREATE INDEX conversations_by_age ON conversations (created_at, ordinal)",
        """CREATE TABLE messages (
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq integer NOT NULL CHECK (seq >= 1),
            kind text NOT NULL,
            message json NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )""",
        """CREATE TABLE transitions (
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq integer NOT NULL CHECK (seq >= 1),
            event_kind text NOT NULL,
            event json NOT NULL,
            from_phase text NOT NULL,
            to_phase text NOT NULL,
            context_tokens integer,
            reason text NOT NULL,
            effect_kinds json NOT NULL,
            at double precision NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )""",
        """CREATE TABLE outbox (
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            id integer NOT NULL CHECK (id >= 1),
            effect json NOT NULL,
            PRIMARY KEY (conversation_id, id)
        )""",
        """CREATE TABLE snapshots (
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            version integer NOT NULL CHECK (version >= 1),
            snapshot json NOT NULL,
            PRIMARY KEY (conversation_id, version)
        )""",
    ),
    # 1 -> 2: claims on outbox effects (who performs one, until when), idempotency keys.
    (
        "ALTER TABLE outbox ADD COLUMN owner text, ADD COLUMN lease_until double precision",
        """CREATE TABLE idempotency (
            conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            key text NOT NULL,
            version integer NOT NULL,
            PRIMARY KEY (conversation_id, key)
        )""",
    ),
    # 2 -> 3: the session each logged event happened in (NULL for events logged before).
    ("ALTER TABLE transitions ADD COLUMN session integer",),
    # 3 -> 4: a step's cost no longer grows with the conversation. The outbox moves into the
    # conversation's row as a JSON array (see ``_outbox``): a step updates the row it updates
    # anyway instead of inserting and deleting outbox rows, whose dead versions piled up until a
    # VACUUM. The update is HOT (no index covers what it changes), so its old versions are
    # pruned within the page; pages keep room for them (fillfactor, for rows written from now
    # on). An idempotency key moves onto the event it came with, unique per conversation.
    (
        "ALTER TABLE conversations ADD COLUMN outbox json NOT NULL DEFAULT '[]'",
        """UPDATE conversations AS c SET outbox = o.entries FROM (
            SELECT conversation_id, json_agg(json_build_object('id', id, 'effect', effect,
                'owner', owner, 'lease_until', lease_until) ORDER BY id) AS entries
            FROM outbox GROUP BY conversation_id
        ) AS o WHERE o.conversation_id = c.id""",
        "DROP TABLE outbox",
        "ALTER TABLE transitions ADD COLUMN idempotency_key text",
        """UPDATE transitions AS t SET idempotency_key = i.key FROM idempotency AS i
            WHERE i.conversation_id = t.conversation_id AND i.version = t.seq + 1""",
        "DROP TABLE idempotency",
        "CREATE UNIQUE INDEX transitions_by_key ON transitions (conversation_id,"
        " idempotency_key) WHERE idempotency_key IS NOT NULL",
        "ALTER TABLE conversations SET (fillfactor = 70)",
    ),
    # 4 -> 5: less work per step on the server, and watchers woken by NOTIFY. The foreign keys
    # of the transcript and the event log go: their rows are written only by the statement
    # that updated the conversation's row (which exists, then) and no conversation is ever
    # deleted, yet each check was a query of its own in every step (a tenth of its server
    # time). So do the CHECKs on counters that only the step's statement computes. A
    # conversation someone waits for (``postgres_watch``) has a row in ``segue_watches``,
    # which a step reads to know whether to NOTIFY.
    (
        "ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_conversation_id_fkey",
        "ALTER TABLE transitions DROP CONSTRAINT IF EXISTS transitions_conversation_id_fkey",
        "ALTER TABLE conversations DROP CONSTRAINT IF EXISTS conversations_version_check,"
        " DROP CONSTRAINT IF EXISTS conversations_message_count_check,"
        " DROP CONSTRAINT IF EXISTS conversations_effect_count_check",
        "ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_seq_check",
        "ALTER TABLE transitions DROP CONSTRAINT IF EXISTS transitions_seq_check",
        """CREATE TABLE segue_watches (
            conversation_id text NOT NULL,
            pid integer NOT NULL,
            PRIMARY KEY (conversation_id, pid)
        )""",
    ),
    # 5 -> 6: a conversation's age costs nothing, and a chat backend finds its conversations
    # (as SQLite's schema 7 says): ``landmarks`` (the first message of each session and
    # generation, and the pinned ones), filled once from the transcripts here; ``tags``, the
    # application's metadata, one row a pair, indexed by value and age.
    (
        """CREATE TABLE landmarks (
            conversation_id text NOT NULL,
            seq integer NOT NULL,
            session integer NOT NULL,
            generation integer NOT NULL,
            start smallint NOT NULL,
            pinned boolean NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )""",
        "CREATE INDEX landmarks_pinned ON landmarks (conversation_id, seq) WHERE pinned",
        """INSERT INTO landmarks (conversation_id, seq, session, generation, start, pinned)
            SELECT conversation_id, seq, s, g, start, pinned FROM (
                SELECT conversation_id, seq, s, g, pinned, CASE
                    WHEN kind = 'summary' THEN 2
                    WHEN (lag(s) OVER w, lag(g) OVER w) IS DISTINCT FROM (s, g) THEN 1
                    ELSE 0 END AS start
                FROM (SELECT conversation_id, seq, kind,
                        coalesce((message->>'session')::integer, 1) AS s,
                        coalesce((message->>'generation')::integer, 1) AS g,
                        coalesce((message->>'pinned')::boolean, false) AS pinned
                    FROM messages) AS m
                WINDOW w AS (PARTITION BY conversation_id ORDER BY seq)
            ) AS marked WHERE start > 0 OR pinned""",
        """CREATE TABLE tags (
            conversation_id text NOT NULL,
            key text NOT NULL,
            value text NOT NULL,
            created_at double precision NOT NULL,
            ordinal bigint NOT NULL,
            PRIMARY KEY (conversation_id, key)
        )""",
        "CREATE INDEX tags_by_value ON tags (key, value, created_at, ordinal)",
    ),
)

METADATA: Final = (
    "(SELECT json_object_agg(t.key, t.value)::text FROM tags AS t"
    " WHERE t.conversation_id = conversations.id)"
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
