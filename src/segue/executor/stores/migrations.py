"""One migration history for both dialects: a single ordered list of schema versions, each
with the statements SQLite and PostgreSQL run to reach it, so both reach ``SCHEMA_VERSION``.

A database records the last version it ran (SQLite in ``PRAGMA user_version``, PostgreSQL in
the one-row ``segue_schema`` table); opening it for writing runs every later one in one
transaction (``sqlite_schema.migrate``, ``postgres_pool``).

Up to version 7 the two dialects were numbered apart, and a database of that time records how
many steps of ITS dialect it ran: each of those versions keeps both lists exactly as they were,
and the two may do different things (version 3 counted pending effects on SQLite and logged
sessions on PostgreSQL). PostgreSQL had caught up at its 6, so its 7 is empty. From 8 on a
version is one change, written for both; ``tests/test_schema_history.py`` checks that both
dialects then hold the same tables and columns, save the storage details ``DIALECT_ONLY``
declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

Dialect = Literal["sqlite", "postgres"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    """One schema version: what each dialect runs, in order, to reach it from the one before."""

    version: int
    sqlite: tuple[str, ...]
    postgres: tuple[str, ...]

    def statements(self, dialect: Dialect) -> tuple[str, ...]:
        """The statements ``dialect`` runs for this version (none: it has nothing to change)."""
        return self.sqlite if dialect == "sqlite" else self.postgres


HISTORY: Final[tuple[Migration, ...]] = (
    Migration(
        version=1,
        # SQLite: the first schema.
        sqlite=(
            """CREATE TABLE conversations (
                id TEXT PRIMARY KEY,
                parent_id TEXT,
                state TEXT NOT NULL,
                phase TEXT NOT NULL,
                version INTEGER NOT NULL CHECK (version >= 1),
                system TEXT,
                child_id TEXT,
                message_count INTEGER NOT NULL DEFAULT 0 CHECK (message_count >= 0),
                effect_count INTEGER NOT NULL DEFAULT 0 CHECK (effect_count >= 0),
                created_at REAL NOT NULL,
                updated_at REAL NOT NULL
            )""",
            "CREATE INDEX conversations_by_age ON conversations (created_at)",
            """CREATE TABLE messages (
                conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
                seq INTEGER NOT NULL CHECK (seq >= 1),
                kind TEXT NOT NULL,
                message TEXT NOT NULL,
                PRIMARY KEY (conversation_id, seq)
            )""",
            """CREATE TABLE transitions (
                conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
                seq INTEGER NOT NULL CHECK (seq >= 1),
                event_kind TEXT NOT NULL,
                event TEXT NOT NULL,
                from_phase TEXT NOT NULL,
                to_phase TEXT NOT NULL,
                context_tokens INTEGER,
                reason TEXT NOT NULL,
                effect_kinds TEXT NOT NULL,
                at REAL NOT NULL,
                PRIMARY KEY (conversation_id, seq)
            )""",
            """CREATE TABLE outbox (
                conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
                id INTEGER NOT NULL CHECK (id >= 1),
                effect TEXT NOT NULL,
                PRIMARY KEY (conversation_id, id)
            ) WITHOUT ROWID""",
            """CREATE TABLE snapshots (
                conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
                version INTEGER NOT NULL CHECK (version >= 1),
                snapshot TEXT NOT NULL,
                PRIMARY KEY (conversation_id, version)
            )""",
        ),
        # PostgreSQL: the first schema.
        postgres=(
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
    ),
    Migration(
        version=2,
        # SQLite: claims on outbox effects (who performs one, until when), idempotency keys.
        sqlite=(
            "ALTER TABLE outbox ADD COLUMN owner TEXT",
            "ALTER TABLE outbox ADD COLUMN lease_until REAL",
            """CREATE TABLE idempotency (
                conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
                key TEXT NOT NULL,
                version INTEGER NOT NULL,
                PRIMARY KEY (conversation_id, key)
            ) WITHOUT ROWID""",
        ),
        # PostgreSQL: claims on outbox effects (who performs one, until when), idempotency keys.
        postgres=(
            "ALTER TABLE outbox ADD COLUMN owner text, ADD COLUMN lease_until double precision",
            """CREATE TABLE idempotency (
                conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
                key text NOT NULL,
                version integer NOT NULL,
                PRIMARY KEY (conversation_id, key)
            )""",
        ),
    ),
    Migration(
        version=3,
        # SQLite: how many effects each conversation has pending (a commit knows its outbox).
        sqlite=(
            "ALTER TABLE conversations ADD COLUMN pending_count INTEGER NOT NULL DEFAULT 0"
            " CHECK (pending_count >= 0)",
            "UPDATE conversations SET pending_count ="
            " (SELECT count(*) FROM outbox WHERE outbox.conversation_id = conversations.id)",
        ),
        # PostgreSQL: the session each logged event happened in (NULL for events logged before).
        postgres=("ALTER TABLE transitions ADD COLUMN session integer",),
    ),
    Migration(
        version=4,
        # SQLite: the session each logged event happened in (NULL for events logged before).
        sqlite=("ALTER TABLE transitions ADD COLUMN session INTEGER",),
        # PostgreSQL: a step's cost no longer grows with the conversation. The outbox moves into the
        # conversation's row as a JSON array (see ``_outbox``): a step updates the row it updates
        # anyway instead of inserting and deleting outbox rows, whose dead versions piled up until a
        # VACUUM. The update is HOT (no index covers what it changes), so its old versions are
        # pruned within the page; pages keep room for them (fillfactor, for rows written from now
        # on). An idempotency key moves onto the event it came with, unique per conversation.
        postgres=(
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
    ),
    Migration(
        version=5,
        # SQLite: fewer pages per step (each one a WAL frame the COMMIT writes, and the next
        # checkpoint copies). The outbox moves into the conversation's row as a JSON array (see
        # ``_outbox``), which a step rewrites anyway; an idempotency key moves onto the event it
        # came with, unique per conversation. Messages and events are keyed by an integer made of
        # the conversation's ``ordinal`` and the seq (``ordinal * 2**32 + seq``): the rowid itself,
        # so a row is one b-tree entry, not a row and an index entry. The table ``outbox`` stays,
        # empty, because ``segue``'s CLI still recognises a store by it; ``idempotency`` goes.
        sqlite=(
            "ALTER TABLE conversations ADD COLUMN outbox TEXT NOT NULL DEFAULT '[]'",
            """UPDATE conversations SET outbox = (
                SELECT json_group_array(json_object('id', o.id, 'effect', json(o.effect),
                    'owner', o.owner, 'lease_until', o.lease_until))
                FROM (SELECT * FROM outbox WHERE outbox.conversation_id = conversations.id
                    ORDER BY outbox.id) AS o
            ) WHERE id IN (SELECT conversation_id FROM outbox)""",
            "UPDATE conversations SET pending_count = json_array_length(outbox)",
            "DELETE FROM outbox",
            "ALTER TABLE conversations ADD COLUMN ordinal INTEGER",
            "UPDATE conversations SET ordinal = rowid",
            "CREATE UNIQUE INDEX conversations_by_ordinal ON conversations (ordinal)",
            """CREATE TABLE messages_5 (
                rid INTEGER PRIMARY KEY,
                conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
                seq INTEGER NOT NULL CHECK (seq >= 1),
                kind TEXT NOT NULL,
                message TEXT NOT NULL
            )""",
            """INSERT INTO messages_5 (rid, conversation_id, seq, kind, message)
                SELECT c.ordinal * 4294967296 + m.seq, m.conversation_id, m.seq, m.kind, m.message
                FROM messages AS m JOIN conversations AS c ON c.id = m.conversation_id""",
            "DROP TABLE messages",
            "ALTER TABLE messages_5 RENAME TO messages",
            """CREATE TABLE transitions_5 (
                rid INTEGER PRIMARY KEY,
                conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
                seq INTEGER NOT NULL CHECK (seq >= 1),
                event_kind TEXT NOT NULL,
                event TEXT NOT NULL,
                from_phase TEXT NOT NULL,
                to_phase TEXT NOT NULL,
                context_tokens INTEGER,
                reason TEXT NOT NULL,
                effect_kinds TEXT NOT NULL,
                at REAL NOT NULL,
                session INTEGER,
                idempotency_key TEXT
            )""",
            """INSERT INTO transitions_5 (rid, conversation_id, seq, event_kind, event, from_phase,
                    to_phase, context_tokens, reason, effect_kinds, at, session, idempotency_key)
                SELECT c.ordinal * 4294967296 + t.seq, t.conversation_id, t.seq, t.event_kind,
                    t.event, t.from_phase, t.to_phase, t.context_tokens, t.reason, t.effect_kinds,
                    t.at, t.session, i.key
                FROM transitions AS t JOIN conversations AS c ON c.id = t.conversation_id
                LEFT JOIN idempotency AS i
                    ON i.conversation_id = t.conversation_id AND i.version = t.seq + 1""",
            "DROP TABLE transitions",
            "ALTER TABLE transitions_5 RENAME TO transitions",
            "DROP TABLE idempotency",
            "CREATE UNIQUE INDEX transitions_by_key ON transitions (conversation_id,"
            " idempotency_key) WHERE idempotency_key IS NOT NULL",
        ),
        # PostgreSQL: less work per step on the server, and watchers woken by NOTIFY. The foreign
        # keys of the transcript and the event log go: their rows are written only by the statement
        # that updated the conversation's row (which exists, then) and no conversation is ever
        # deleted, yet each check was a query of its own in every step (a tenth of its server time).
        # So do the CHECKs on counters that only the step's statement computes. A conversation
        # someone waits for (``postgres_watch``) has a row in ``segue_watches``, which a step reads
        # to know whether to NOTIFY.
        postgres=(
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
    ),
    Migration(
        version=6,
        # SQLite: the system prompt moves out of the conversation's row, which every step rewrites
        # whole (SQLite writes a new record, overflow pages and all): a prompt of a few kilobytes
        # cost every step its overflow pages (4 KB of prompt: a fifth more CPU per step). It is
        # written once, keyed by the conversation's ordinal; ``conversations.system`` stays, NULL.
        sqlite=(
            "CREATE TABLE prompts (ordinal INTEGER PRIMARY KEY, system TEXT NOT NULL)",
            "INSERT INTO prompts (ordinal, system)"
            " SELECT ordinal, system FROM conversations WHERE system IS NOT NULL",
            "UPDATE conversations SET system = NULL WHERE system IS NOT NULL",
        ),
        # PostgreSQL: a conversation's age costs nothing, and a chat backend finds its conversations
        # (as SQLite's schema 7 says): ``landmarks`` (the first message of each session and
        # generation, and the pinned ones), filled once from the transcripts here; ``tags``, the
        # application's metadata, one row a pair, indexed by value and age.
        postgres=(
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
    ),
    # The histories are joined here: PostgreSQL's 6 had reached SQLite's 7.
    Migration(
        version=7,
        # SQLite: a conversation's age costs nothing, and a chat backend finds its conversations.
        # ``landmarks`` holds the messages a view is folded from without reading the transcript
        # (the first of each session and generation: ``_rows.landmark``) and the pinned ones, keyed
        # by their message's rid; a usual step writes none. ``tags`` holds the application's
        # metadata, one row a pair, indexed by value and age for a user's pages; listings page by
        # (created_at, ordinal). Existing transcripts are read once to fill ``landmarks``.
        sqlite=(
            """CREATE TABLE landmarks (
                rid INTEGER PRIMARY KEY,
                session INTEGER NOT NULL,
                generation INTEGER NOT NULL,
                start INTEGER NOT NULL,
                pinned INTEGER NOT NULL
            )""",
            "CREATE INDEX landmarks_pinned ON landmarks (rid) WHERE pinned",
            """INSERT INTO landmarks (rid, session, generation, start, pinned)
                SELECT rid, s, g, start, pinned FROM (
                    SELECT rid, s, g, pinned, CASE
                        WHEN kind = 'summary' THEN 2
                        WHEN lag(s) OVER w IS NULL OR lag(s) OVER w <> s OR lag(g) OVER w <> g
                            THEN 1
                        ELSE 0 END AS start
                    FROM (SELECT rid, conversation_id, seq, kind,
                            coalesce(json_extract(message, '$.session'), 1) AS s,
                            coalesce(json_extract(message, '$.generation'), 1) AS g,
                            coalesce(json_extract(message, '$.pinned'), 0) AS pinned
                        FROM messages)
                    WINDOW w AS (PARTITION BY conversation_id ORDER BY seq)
                ) WHERE start > 0 OR pinned""",
            """CREATE TABLE tags (
                ordinal INTEGER NOT NULL,
                key TEXT NOT NULL,
                value TEXT NOT NULL,
                created_at REAL NOT NULL,
                PRIMARY KEY (ordinal, key)
            ) WITHOUT ROWID""",
            "CREATE INDEX tags_by_value ON tags (key, value, created_at, ordinal)",
            "DROP INDEX conversations_by_age",
            "CREATE INDEX conversations_by_age ON conversations (created_at, ordinal)",
        ),
        # PostgreSQL: nothing; it took ``landmarks`` and ``tags`` at 6.
        postgres=(),
    ),
    # From here on a version is one change on both dialects.
    Migration(
        version=8,
        # SQLite: the ``outbox`` table goes, empty since its 5 (the outbox is a JSON array in
        # the conversation's row) and gone from PostgreSQL since its 4. Nothing reads it (the
        # CLI knows a store by its conversations, messages and transitions).
        sqlite=("DROP TABLE outbox",),
        # PostgreSQL: ``tags`` names its conversation by ordinal alone, as SQLite's does (its
        # ``conversation_id`` repeated what the ordinal says), and a conversation is found by its
        # ordinal through a unique index, as on SQLite. The ordinal never changes, so a step's
        # update of the row stays HOT.
        postgres=(
            "CREATE UNIQUE INDEX conversations_by_ordinal ON conversations (ordinal)",
            "ALTER TABLE tags DROP CONSTRAINT tags_pkey",
            "ALTER TABLE tags ADD PRIMARY KEY (ordinal, key)",
            "ALTER TABLE tags DROP COLUMN conversation_id",
        ),
    ),
)

SCHEMA_VERSION: Final = HISTORY[-1].version
"""The version both dialects reach: what a database records once every migration has run."""

DIALECT_ONLY: Final[Mapping[Dialect, Mapping[str, frozenset[str]]]] = {
    "sqlite": {
        # Rows keyed by ``ordinal * 2**32 + seq``, the rowid itself (one b-tree entry a row).
        "messages": frozenset({"rid"}),
        "transitions": frozenset({"rid"}),
        "landmarks": frozenset({"rid"}),
        # The outbox's length, which the step's guard compares without parsing the JSON.
        "conversations": frozenset({"pending_count"}),
        # The system prompt out of the row every step rewrites (PostgreSQL TOASTs a long one).
        "prompts": frozenset({"ordinal", "system"}),
    },
    "postgres": {
        # Keyed by the conversation's id and seq, as its transcript is (no rowid to borrow).
        "landmarks": frozenset({"conversation_id", "seq"}),
        # Who waits for a conversation (LISTEN/NOTIFY; SQLite has no notifications).
        "segue_watches": frozenset({"conversation_id", "pid"}),
        # The version record (SQLite keeps it in ``PRAGMA user_version``).
        "segue_schema": frozenset({"version"}),
    },
}
"""The tables and columns only one dialect has, each one how that dialect stores what both
keep (the physical key, a table of its own): everything else, both hold alike."""


def statements(dialect: Dialect) -> tuple[tuple[str, ...], ...]:
    """Every version's statements for ``dialect``, in order (index ``v - 1``: version ``v``)."""
    return tuple(m.statements(dialect) for m in HISTORY)
