"""A turn's stream when another server deletes the conversation (``DELETE ?cancel=true`` on a
second server over the same store, a SQLite file or a PostgreSQL database): the stream of the
server that ran the turn ends with a terminal ``deleted`` event, never cut mid-body
(REQ-SEG-062)."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import httpx2
import pytest

import clusters
from api import Event, create, sse
from gated import HOLD_AT_MOST, Gated
from scenario import requirement
from segue import PostgresStore, Runtime, ScriptedModel, SqliteStore, Store
from segue.server import create_app
from segue.testing import live_server

pytestmark = pytest.mark.slow
cluster = clusters.cluster
_databases = itertools.count()


@pytest.fixture(params=["sqlite", "postgres"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "shared.db")
    database: str = request.getfixturevalue("cluster").create_database(
        f"deleted_streams_{next(_databases)}"
    )
    return database


def _store(place: str) -> Store:
    return PostgresStore(place) if place.startswith("host=") else SqliteStore(place)


@requirement("REQ-SEG-062")
def test_seg062_a_turn_whose_conversation_another_server_deletes_ends_with_deleted(
    place: str,
) -> None:
    model = Gated()
    running = create_app(Runtime(store=_store(place), llm=model))
    other = create_app(Runtime(store=_store(place), llm=ScriptedModel()))
    with (
        live_server(running) as url,
        live_server(other) as other_url,
        httpx2.Client(base_url=url, timeout=60) as http,
        httpx2.Client(base_url=other_url, timeout=60) as elsewhere,
    ):
        cid = create(http)["id"]
        events: list[Event] = []
        failures: list[BaseException] = []

        def turn() -> None:
            try:
                answer = http.post(f"/api/conversations/{cid}/messages", json={"text": "Go."})
                assert answer.status_code == 200, answer.text
                events.extend(sse(answer))
            except BaseException as error:  # noqa: BLE001  # reported by the test below
                failures.append(error)

        sending = threading.Thread(target=turn)
        sending.start()
        try:
            assert model.asked.wait(HOLD_AT_MOST), "the model was never asked"
            deleted = elsewhere.delete(f"/api/conversations/{cid}", params={"cancel": "true"})
            assert deleted.status_code == 204, deleted.text
        finally:
            model.gate.set()
            sending.join(HOLD_AT_MOST)
        assert failures == []  # the body was whole: no "incomplete chunked read"
        names = [name for name, _ in events]
        assert names[-1] == "deleted", names
        last: dict[str, Any] = events[-1][1]
        assert last["id"] == cid
        assert "deleted" in last["message"]
        assert http.get(f"/api/conversations/{cid}").status_code == 404


@requirement("REQ-SEG-062")
def test_seg062_a_watch_stream_ends_with_deleted_when_another_server_deletes(place: str) -> None:
    watching = create_app(Runtime(store=_store(place), llm=ScriptedModel()))
    other = create_app(Runtime(store=_store(place), llm=ScriptedModel()))
    with (
        live_server(watching) as url,
        live_server(other) as other_url,
        httpx2.Client(base_url=url, timeout=60) as http,
        httpx2.Client(base_url=other_url, timeout=60) as elsewhere,
    ):
        cid = create(http)["id"]
        events: list[Event] = []
        failures: list[BaseException] = []
        opened = threading.Event()

        def watch() -> None:
            try:
                with http.stream("GET", f"/api/conversations/{cid}/events") as answer:
                    assert answer.status_code == 200
                    opened.set()
                    answer.read()
                    events.extend(sse(answer))
            except BaseException as error:  # noqa: BLE001  # reported by the test below
                failures.append(error)
            finally:
                opened.set()

        reading = threading.Thread(target=watch)
        reading.start()
        assert opened.wait(HOLD_AT_MOST)
        assert elsewhere.delete(f"/api/conversations/{cid}").status_code == 204
        reading.join(HOLD_AT_MOST)
        assert not reading.is_alive(), "the watch stream never ended"
        assert failures == []
        assert [name for name, _ in events][-1:] == ["deleted"], events
