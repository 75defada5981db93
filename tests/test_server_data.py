"""A chat backend's conversations over the REST API, on a SQLite file and on PostgreSQL: labels
set at creation and replaced later, a user's conversations paged through with the ``Link``
header (the body the same JSON list as before), deletion (alone, with its chain, refused while
a turn runs here or in another server, or after cancelling it), export and import (into the
other store too), and retention. Nothing of it needs the application to keep anything.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

import clusters
from api import create, error, held_turn, send
from gated import Gated
from segue import Runtime, ScriptedModel, SqliteStore
from segue.executor.bounds import MAX_ID_LENGTH
from segue.executor.store_port import Store
from segue.executor.stores.postgres import PostgresStore
from segue.server import create_app
from segue.testing import live_server
from segue.testing.postgres import ThrowawayCluster

pytestmark = pytest.mark.slow
cluster = clusters.cluster
_databases = itertools.count()
NEXT = re.compile(r'^<(?P<address>[^>]+)>; rel="next"$')


class Stores:
    """Stores of one kind for a test: a SQLite file, or a database on the module's cluster
    (``again`` opens the same one a second time, as a second server process would)."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.db = tmp_path / "data.db"
        self.url: str | None = None
        self._tmp_path, self._request = tmp_path, request
        if kind == "postgres":
            self.url = self._database()

    def _database(self) -> str:
        running: ThrowawayCluster = self._request.getfixturevalue("cluster")
        return running.create_database(f"data_{next(_databases)}")

    def again(self) -> Store:
        return SqliteStore(self.db) if self.url is None else PostgresStore(self.url)

    def other_kind(self) -> Store:
        """A new store of the other kind (an export moved between deployments)."""
        if self.url is None:
            return PostgresStore(self._database())
        return SqliteStore(self._tmp_path / "other.db")


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    return Stores(str(request.param), tmp_path, request)


@pytest.fixture
def url(stores: Stores) -> Iterator[str]:
    with live_server(create_app(Runtime(store=stores.again(), llm=ScriptedModel()))) as served:
        yield served


@pytest.fixture
def http(url: str) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=url, timeout=60) as client:
        yield client


def next_page(response: httpx2.Response) -> str | None:
    """The address the ``Link`` header gives for the next page, or None on the last."""
    link = response.headers.get("link")
    if link is None:
        return None
    found = NEXT.match(link)
    assert found is not None, link
    return found["address"]


def titles(response: httpx2.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [conversation["title"] for conversation in response.json()]


# --------------------------------------------------------------------------- metadata, pages


def test_metadata_labels_a_conversation_and_its_title_wins(http: httpx2.Client) -> None:
    created = create(http, metadata={"user": "u-17", "title": "  Tides\n of March "})
    assert created["metadata"] == {"user": "u-17", "title": "  Tides\n of March "}
    assert created["title"] == "Tides of March"  # the application's, on one line
    cid = created["id"]
    send(http, cid, "What makes the tides turn twice a day?")
    assert http.get(f"/api/conversations/{cid}").json()["title"] == "Tides of March"

    changed = http.put(f"/api/conversations/{cid}/metadata", json={"user": "u-17"})
    assert changed.status_code == 200, changed.text
    assert changed.json()["metadata"] == {"user": "u-17"}
    # Without a title of its own, the first words of its first message.
    assert changed.json()["title"] == "What makes the tides turn twice a day?"
    listed = http.get("/api/conversations").json()
    assert [(c["id"], c["metadata"]) for c in listed] == [(cid, {"user": "u-17"})]


def test_metadata_out_of_bounds_is_refused_before_anything_is_stored(
    http: httpx2.Client,
) -> None:
    for metadata in ({"": "empty key"}, {"k" * 65: "v"}, {"key": "v" * 1_025}, {"nul": "a\x00"}):
        error(http.post("/api/conversations", json={"metadata": metadata}), 422, "invalid_request")
    too_many = {f"k{i}": "v" for i in range(65)}
    error(http.post("/api/conversations", json={"metadata": too_many}), 422, "invalid_request")
    assert http.get("/api/conversations").json() == []
    cid = create(http, metadata={"user": "u-1"})["id"]
    surrogate = b'{"user": "\\ud800"}'
    refused = http.put(
        f"/api/conversations/{cid}/metadata",
        content=surrogate,
        headers={"content-type": "application/json"},
    )
    error(refused, 422, "invalid_request")
    assert http.get(f"/api/conversations/{cid}").json()["metadata"] == {"user": "u-1"}
    error(http.put("/api/conversations/nope/metadata", json={}), 404, "not_found")
    form = http.put(f"/api/conversations/{cid}/metadata", content=b"user=u-2")
    error(form, 415, "unsupported_media_type")


def test_a_users_conversations_page_through_the_link_header(http: httpx2.Client) -> None:
    for number in range(7):
        user = "u-17" if number % 2 == 0 else "u-2"
        create(http, metadata={"user": user, "title": f"Chat {number}"})
    first = http.get("/api/conversations", params={"limit": 3, "metadata.user": "u-17"})
    assert titles(first) == ["Chat 6", "Chat 4", "Chat 2"]  # newest first, only theirs
    address = next_page(first)
    assert address is not None
    assert address.startswith("/api/conversations?")
    assert "metadata.user=u-17" in address
    assert "limit=3" in address
    create(http, metadata={"user": "u-17", "title": "Chat 7"})  # a new one skips nothing
    second = http.get(address)
    assert titles(second) == ["Chat 0"]
    assert next_page(second) is None  # the last page says so by having none

    everyone = http.get("/api/conversations")
    assert len(everyone.json()) == 8  # the default page holds them all, as before
    assert next_page(everyone) is None
    two = {"metadata.user": "u-17", "metadata.title": "Chat 4"}
    assert titles(http.get("/api/conversations", params=two)) == ["Chat 4"]


def test_a_listing_refuses_what_it_cannot_read(http: httpx2.Client) -> None:
    misspelt = http.get("/api/conversations", params={"metdata.user": "u-17"})
    assert "metdata.user" in error(misspelt, 422, "invalid_request")
    error(http.get("/api/conversations", params={"cursor": "not-one"}), 422, "invalid_cursor")
    for limit in (0, 1_001, "ten"):
        error(http.get("/api/conversations", params={"limit": limit}), 422, "invalid_request")
    twice = http.get("/api/conversations?metadata.user=a&metadata.user=b")
    assert "twice" in error(twice, 422, "invalid_request")
    long_key = {f"metadata.{'k' * 65}": "v"}
    error(http.get("/api/conversations", params=long_key), 422, "invalid_metadata")


# --------------------------------------------------------------------------- deletion


def test_a_deleted_conversation_is_gone_and_its_chain_goes_with_chain(
    http: httpx2.Client,
) -> None:
    parent = create(http, context_window=24_000)["id"]
    send(http, parent, "Summarise this.")
    assert http.post(f"/api/conversations/{parent}/continue", json={}).status_code == 200
    child = http.post(f"/api/conversations/{parent}/children", json={}).json()["id"]
    alone = create(http)["id"]

    assert http.delete(f"/api/conversations/{alone}").status_code == 204
    for path in ("", "/messages", "/export"):
        error(http.get(f"/api/conversations/{alone}{path}"), 404, "not_found")
    error(http.delete(f"/api/conversations/{alone}"), 404, "not_found")

    gone = http.delete(f"/api/conversations/{child}", params={"chain": "true"})
    assert gone.status_code == 204
    assert gone.content == b""
    error(http.get(f"/api/conversations/{parent}"), 404, "not_found")
    assert http.get("/api/conversations").json() == []


def test_deleting_a_conversation_whose_turn_runs_is_409_then_cancel_deletes_it(
    stores: Stores,
) -> None:
    model = Gated()
    app = create_app(Runtime(store=stores.again(), llm=model))
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as http:
        cid = create(http)["id"]
        with held_turn(http, cid, model) as events:
            busy = error(http.delete(f"/api/conversations/{cid}"), 409, "busy")
            assert "?cancel=true" in busy
            error(http.get(f"/api/conversations/{cid}/export"), 409, "busy")
            assert http.get(f"/api/conversations/{cid}").json()["phase"] == "llm_requesting"
            stopped = http.delete(f"/api/conversations/{cid}", params={"cancel": "true"})
            assert stopped.status_code == 204, stopped.text
        assert events[-1][0] == "done"  # the turn's stream ended, cancelled
        error(http.get(f"/api/conversations/{cid}"), 404, "not_found")


def test_another_server_on_the_same_store_refuses_to_delete_a_turn_it_does_not_run(
    stores: Stores,
) -> None:
    model = Gated()
    running = create_app(Runtime(store=stores.again(), llm=model))
    other = create_app(Runtime(store=stores.again(), llm=ScriptedModel()))
    with (
        live_server(running) as url,
        live_server(other) as other_url,
        httpx2.Client(base_url=url, timeout=60) as http,
        httpx2.Client(base_url=other_url, timeout=60) as elsewhere,
    ):
        cid = create(http)["id"]
        with held_turn(http, cid, model):
            error(elsewhere.delete(f"/api/conversations/{cid}"), 409, "busy")
            assert elsewhere.get(f"/api/conversations/{cid}").status_code == 200
        assert elsewhere.delete(f"/api/conversations/{cid}").status_code == 204
        error(http.get(f"/api/conversations/{cid}"), 404, "not_found")


# --------------------------------------------------------------------------- export, import


def test_an_export_imports_into_the_other_store_and_goes_on(
    stores: Stores, http: httpx2.Client
) -> None:
    cid = create(http, metadata={"user": "u-17", "title": "Moving house"})["id"]
    send(http, cid, "Remember: the blue boxes go upstairs.")
    document = http.get(f"/api/conversations/{cid}/export").json()
    assert (document["format"], document["version"]) == ("segue.conversation", 1)

    exists = error(http.post("/api/conversations/import", json=document), 409, "exists")
    assert "conversation_id" in exists
    copied = http.post(
        "/api/conversations/import", params={"conversation_id": "copy-1"}, json=document
    )
    assert copied.status_code == 201, copied.text
    assert (copied.json()["id"], copied.json()["title"]) == ("copy-1", "Moving house")

    elsewhere = create_app(Runtime(store=stores.other_kind(), llm=ScriptedModel()))
    with live_server(elsewhere) as url, httpx2.Client(base_url=url, timeout=60) as moved:
        imported = moved.post("/api/conversations/import", json=document)
        assert imported.status_code == 201, imported.text
        view = imported.json()
        original = http.get(f"/api/conversations/{cid}").json()
        same = ("id", "phase", "context_tokens", "metadata", "title", "generation", "session")
        assert {k: view[k] for k in same} == {k: original[k] for k in same}
        texts = [m["text"] for m in moved.get(f"/api/conversations/{cid}/messages").json()]
        assert texts[0] == "Remember: the blue boxes go upstairs."
        done = send(moved, cid, "Where do the blue boxes go?")[-1]
        assert done[1]["state"]["phase"] == "idle"


def test_a_document_that_is_not_an_export_is_422_with_the_reason(http: httpx2.Client) -> None:
    cid = create(http)["id"]
    send(http, cid, "Hello.")
    document = http.get(f"/api/conversations/{cid}/export").json()
    broken: dict[str, Any] = {**document, "transitions": document["transitions"][1:]}
    reason = error(http.post("/api/conversations/import", json=broken), 422, "invalid_document")
    assert "seqs" in reason
    other = error(
        http.post("/api/conversations/import", json={"format": "x"}), 422, "invalid_document"
    )
    assert "not a segue conversation export" in other
    for bad_id in ("a/b", "", "x" * (MAX_ID_LENGTH + 1), "../etc"):
        answer = http.post(
            "/api/conversations/import", params={"conversation_id": bad_id}, json=document
        )
        error(answer, 422, "invalid_request")
    assert [c["id"] for c in http.get("/api/conversations").json()] == [cid]  # nothing stored


# --------------------------------------------------------------------------- retention


def test_a_purge_deletes_the_labelled_conversations_nobody_wrote_to(http: httpx2.Client) -> None:
    kept = create(http, metadata={"user": "u-2"})["id"]
    old = [create(http, metadata={"user": "u-17"})["id"] for _ in range(3)]
    ignored = http.post("/api/purge", json={"older_than": 3_600, "metadata": {"user": "u-17"}})
    assert ignored.json() == {"deleted": 0}  # none is an hour old
    purged = http.post("/api/purge", json={"older_than": 0, "metadata": {"user": "u-17"}})
    assert purged.status_code == 200, purged.text
    assert purged.json() == {"deleted": 3}
    assert [c["id"] for c in http.get("/api/conversations").json()] == [kept]
    for cid in old:
        error(http.get(f"/api/conversations/{cid}"), 404, "not_found")
    for body in ({}, {"older_than": -1}, {"older_than": "30d"}, {"older_than": 1, "user": "x"}):
        error(http.post("/api/purge", json=body), 422, "invalid_request")


def test_a_purge_leaves_a_running_turn_for_the_next_one(stores: Stores) -> None:
    model = Gated()
    app = create_app(Runtime(store=stores.again(), llm=model))
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as http:
        cid = create(http)["id"]
        idle = create(http)["id"]
        with held_turn(http, cid, model):
            assert http.post("/api/purge", json={"older_than": 0}).json() == {"deleted": 1}
        error(http.get(f"/api/conversations/{idle}"), 404, "not_found")
        assert http.get(f"/api/conversations/{cid}").json()["phase"] == "idle"


def test_every_data_route_is_behind_the_token(stores: Stores) -> None:
    app = create_app(Runtime(store=stores.again(), llm=ScriptedModel()), token="t0ken")  # noqa: S106
    with live_server(app) as url:
        with httpx2.Client(
            base_url=url, timeout=60, headers={"authorization": "Bearer t0ken"}
        ) as ok:
            cid = create(ok)["id"]
        calls = [
            ("PUT", f"/api/conversations/{cid}/metadata", {}),
            ("DELETE", f"/api/conversations/{cid}", None),
            ("GET", f"/api/conversations/{cid}/export", None),
            ("POST", "/api/conversations/import", {}),
            ("POST", "/api/purge", {"older_than": 0}),
            ("GET", "/api/conversations?limit=1", None),
        ]
        with httpx2.Client(base_url=url, timeout=60) as anyone:
            for method, path, body in calls:
                error(anyone.request(method, path, json=body), 401, "unauthorized")
        with httpx2.Client(
            base_url=url, timeout=60, headers={"authorization": "Bearer t0ken"}
        ) as ok:
            assert ok.get(f"/api/conversations/{cid}").status_code == 200  # nothing happened
            schema = ok.get("/openapi.json").json()
    paths = schema["paths"]
    assert set(paths["/api/conversations/{conversation_id}"]) == {"get", "delete"}
    assert "409" in paths["/api/conversations/{conversation_id}"]["delete"]["responses"]
    assert "Link" in paths["/api/conversations"]["get"]["responses"]["200"]["headers"]
    for path in ("/metadata", "/export"):
        assert f"/api/conversations/{{conversation_id}}{path}" in paths
    assert {"/api/conversations/import", "/api/purge"} <= set(paths)
