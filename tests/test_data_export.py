"""A conversation exported and imported, on SQLite and PostgreSQL: an export from one store
imported into the other continues where it was; a broken document, an id taken or a turn in
flight is refused with nothing half-done. The stores and the gated model are ``test_data``'s.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

import test_data
from segue import ContextExhaustionBehavior, ConversationExistsError, Runtime, ScriptedModel
from segue.executor.cache import ViewCache
from segue.executor.errors import ConversationBusyError, InvalidDocumentError
from segue.testing.postgres import ThrowawayCluster
from test_data import MODEL, Gated, new_database, open_store, running_turn

cluster = test_data.cluster
where = test_data.where
"""``test_data``'s fixtures, asked for by name: a PostgreSQL cluster, and each test's store."""


def _pair(where: str, tmp_path: Path, cluster: Callable[[], ThrowawayCluster]) -> str:
    """The other store: PostgreSQL for SQLite, SQLite for PostgreSQL."""
    if where.startswith("host="):
        return str(tmp_path / "other.db")
    return new_database(cluster())


def test_an_export_imported_into_the_other_store_continues_where_it_was(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    other = _pair(where, tmp_path, lambda: request.getfixturevalue("cluster"))

    async def main() -> None:
        async with Runtime(store=open_store(where), llm=ScriptedModel(window=5_000)) as rt:
            conv = await rt.create_conversation(
                model=MODEL,
                behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE,
                context_window=5_000,
                system="Be brief.",
                metadata={"user": "u-17"},
            )
            await rt.send(conv.id, "Rule: answer in English.", pinned=True)
            state = conv
            while state.generation < 3:
                state = await rt.send(conv.id, "Tell me of tides. " * 10)
            await rt.pause(conv.id, "lunch")
            await rt.resume(conv.id)
            document = await rt.export_conversation(conv.id)
            original = await rt.conversation(conv.id)
            view = list(await ViewCache(rt.store).view(original))
        json.dumps(document)  # JSON through and through
        assert (document["format"], document["version"]) == ("segue.conversation", 1)

        async with Runtime(store=open_store(other), llm=ScriptedModel(window=5_000)) as rt:
            for broken, reason in (
                ({}, "format"),
                ({**document, "version": 2}, "version"),
                ({**document, "messages": [{"kind": "nonsense"}]}, "messages.0.kind"),
                ({**document, "transitions": document["transitions"][1:]}, "seqs"),
                ({**document, "conversation": {**document["conversation"], "id": "x"}}, "id"),
            ):
                with pytest.raises(InvalidDocumentError, match=reason):
                    await rt.import_conversation(broken)
            assert await rt.conversations() == []  # nothing half-imported
            imported = await rt.import_conversation(document)
            with pytest.raises(ConversationExistsError):
                await rt.import_conversation(document)
            copy = await rt.import_conversation(document, conversation_id="copy")
            assert (copy.id, copy.generation) == ("copy", imported.generation)
            stored = await rt.conversation(conv.id)
            assert stored.state == original.state
            assert (stored.version, stored.system, stored.metadata, stored.last_seq) == (
                original.version,
                original.system,
                original.metadata,
                original.last_seq,
            )
            assert list(await ViewCache(rt.store).view(stored)) == view
            assert [s.version for s in await rt.store.snapshots(conv.id)] == [1]
            again = await rt.export_conversation(conv.id)
            assert {k: v for k, v in again.items() if k != "exported_at"} == {
                k: v for k, v in document.items() if k != "exported_at"
            }
            after = await rt.send(conv.id, "Go on.")
            assert after.phase.kind == "idle"
            assert after.generation >= imported.generation
            assert after.session == imported.session == 2
            assert after.pinned_tokens == imported.pinned_tokens > 0

    asyncio.run(main())


def test_a_turn_in_flight_is_not_exported(where: str) -> None:
    async def main() -> None:
        model = Gated()
        async with Runtime(store=open_store(where), llm=model) as rt:
            conv, turn = await running_turn(rt, model)
            with pytest.raises(ConversationBusyError):
                await rt.export_conversation(conv.id)
            model.opened.set()
            await turn
            assert (await rt.export_conversation(conv.id))["pending"] == []

    asyncio.run(main())
