"""The user's control at the limit through the REST API, checked where it lands: a summary prompt,
a summary model and a focus on the limit's request as each provider's fake API received it, a
pinned message verbatim in a seeded child's first request, bad values refused with a 422, the
pause's snapshot version, one snapshot's JSON, a cancel that ends a pause, and a pause asked of a
server whose conversation another server is running.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

import backends
from api import create, error, gated_app, held_turn, send
from backends import PROVIDERS, SUMMARY_MODELS, Backend, prompt_of
from gated import Gated
from segue import Runtime, ScriptedModel, SqliteStore
from segue.server import create_app
from segue.testing import live_server
from segue.testing.conformance import Said, Sent

pytestmark = pytest.mark.slow

CUSTOM = "Write the hand-over as three bullets: done, doing, next."
PINNED = "Never touch the migrations folder, whatever the plan says."


def answer(sent: Sent) -> Said:
    """A short reply, with the usage of a prompt as large as the request."""
    return Said(text="Noted.", prompt=prompt_of(sent), output=5)


@pytest.fixture(params=PROVIDERS)
def fake(request: pytest.FixtureRequest) -> Iterator[Backend]:
    with backends.backend(request.param) as provider:
        provider.respond(answer)
        yield provider


@pytest.fixture
def http(fake: Backend, tmp_path: Path) -> Iterator[httpx2.Client]:
    """The server with a key, its model the provider's real client at its fake API."""
    app = fake.app(tmp_path / "control.db")
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as client:
        yield client


def last_user_text(sent: Sent) -> str:
    users = [turn for turn in sent.turns if turn.role == "user"]
    return users[-1].text if users else ""


# --------------------------------------------------------------------------- creating


def test_the_settings_of_the_limit_are_taken_and_shown(http: httpx2.Client, fake: Backend) -> None:
    summary_model = SUMMARY_MODELS[fake.provider]
    created = create(
        http,
        behavior="checkpoint_restart",
        context_window=50_000,
        summary_prompt=CUSTOM,
        summary_model=summary_model,
        max_tool_output_tokens=2_000,
        max_run_seconds=3_600,
    )
    assert created["summary_prompt"] == CUSTOM
    assert created["summary_model"] == summary_model
    assert created["max_tool_output_tokens"] == 2_000
    assert created["max_run_seconds"] == 3_600
    plain = create(http, context_window=50_000)
    assert (plain["summary_prompt"], plain["summary_model"], plain["max_run_seconds"]) == (
        None,
        None,
        None,
    )
    assert plain["max_tool_output_tokens"] == 50_000 // 8  # the default cap of a small window


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("summary_prompt", ""),
        ("summary_prompt", "   \n\t"),
        ("summary_prompt", "x" * 20_001),
        ("summary_prompt", 5),
        ("summary_model", ""),
        ("max_tool_output_tokens", 10),
        ("max_tool_output_tokens", 2.5),
        ("max_tool_output_tokens", "many"),
        ("max_run_seconds", 0),
        ("max_run_seconds", -60),
        ("max_run_seconds", "an hour"),
    ],
)
def test_bad_settings_are_422_naming_the_field(
    http: httpx2.Client, field: str, value: object
) -> None:
    before = http.get("/api/conversations").json()
    message = error(http.post("/api/conversations", json={field: value}), 422, "invalid_request")
    assert message.startswith(f"{field}:"), message
    assert http.get("/api/conversations").json() == before  # nothing created


# --------------------------------------------------------------------------- on the wire


def test_the_summary_prompt_model_and_focus_reach_the_limits_request(
    http: httpx2.Client, fake: Backend
) -> None:
    summary_model = SUMMARY_MODELS[fake.provider]
    cid = create(http, context_window=50_000, summary_prompt=CUSTOM, summary_model=summary_model)[
        "id"
    ]
    send(http, cid, "Plan the schema change.")
    path = f"/api/conversations/{cid}/continue"
    for blank in ("", "  \n "):
        error(http.post(path, json={"focus": blank}), 422, "invalid_request")
    error(http.post(path, json={"focus": "x", "urgent": True}), 422, "invalid_request")
    assert len(fake.sent()) == 1  # refused before anything was asked
    assert http.get(f"/api/conversations/{cid}").json()["phase"] == "idle"

    continued = http.post(path, json={"focus": "the index decisions"})
    assert continued.status_code == 200, continued.text
    assert continued.json()["phase"] == "context_exhausted"
    turn, limit = fake.sent()
    assert turn.raw["model"] == fake.model
    assert limit.raw["model"] == summary_model  # only the limit's request
    assert not limit.callable_tools
    asked = last_user_text(limit)
    assert CUSTOM in asked
    assert "the index decisions" in asked


def test_continue_without_a_focus_sends_none(http: httpx2.Client, fake: Backend) -> None:
    for body in ({}, {"focus": None}):
        cid = create(http, context_window=50_000)["id"]
        send(http, cid, "Plan the schema change.")
        done = http.post(f"/api/conversations/{cid}/continue", json=body)
        assert done.json()["phase"] == "context_exhausted"
        limit = fake.sent()[-1]
        assert limit.tools == ()  # the summary's request
        assert "focus above all" not in last_user_text(limit)


def test_a_pinned_message_is_carried_verbatim_into_the_seeded_child(
    http: httpx2.Client, fake: Backend
) -> None:
    cid = create(http, context_window=4_000)["id"]
    path = f"/api/conversations/{cid}/messages"
    too_much = http.post(path, json={"text": "keep this " * 400, "pinned": True})
    assert "pinned" in error(too_much, 422, "message_too_large")
    assert http.get(path).json() == []  # nothing stored
    error(http.post(path, json={"text": "hi", "pinned": "yes please"}), 422, "invalid_request")

    sent = http.post(path, json={"text": PINNED, "pinned": True})
    assert sent.status_code == 200, sent.text
    send(http, cid, "An ordinary remark about lunch.")
    kept = http.get(path).json()
    assert [(m["kind"], m["pinned"]) for m in kept if m["kind"] == "user"] == [
        ("user", True),
        ("user", False),
    ]
    assert http.get(f"/api/conversations/{cid}").json()["pinned_tokens"] > 0
    assert http.post(f"/api/conversations/{cid}/continue", json={}).status_code == 200
    child = http.post(f"/api/conversations/{cid}/children", json={"seed_with_summary": True})
    send(http, child.json()["id"], "Where were we?")
    first = json.dumps(fake.sent()[-1].raw)
    assert PINNED in first  # verbatim, though only a summary stands for the rest
    assert "lunch" not in first


# --------------------------------------------------------------------------- pausing


def test_a_pause_names_its_snapshot_and_a_cancel_ends_it(http: httpx2.Client) -> None:
    cid = create(http, context_window=50_000)["id"]
    send(http, cid, "Start the job.")
    paused = http.post(f"/api/conversations/{cid}/pause", json={"reason": "lunch"})
    assert paused.status_code == 200, paused.text
    body = paused.json()
    assert (body["phase"], body["snapshot_version"], body["pause_requested"]) == (
        "paused",
        1,
        False,
    )
    again = http.post(f"/api/conversations/{cid}/pause", json={"reason": "again"})
    assert "already paused" in error(again, 409, "conflict")

    whole = http.get(f"/api/conversations/{cid}/snapshots/1")
    assert whole.status_code == 200, whole.text
    snapshot = whole.json()
    assert (snapshot["version"], snapshot["reason"], snapshot["session"]) == (1, "lunch", 1)
    assert snapshot["checkpoint"]
    assert snapshot["session_seconds"] >= 0
    listed = http.get(f"/api/conversations/{cid}/snapshots").json()
    assert listed[0]["session_seconds"] == snapshot["session_seconds"]
    error(http.get(f"/api/conversations/{cid}/snapshots/2"), 404, "not_found")
    error(http.get(f"/api/conversations/{cid}/snapshots/first"), 422, "invalid_request")
    error(http.get("/api/conversations/nobody/snapshots/1"), 404, "not_found")

    cancelled = http.post(f"/api/conversations/{cid}/cancel", json={})
    assert cancelled.status_code == 200, cancelled.text
    assert (cancelled.json()["phase"], cancelled.json()["session"]) == ("idle", 1)
    assert len(http.get(f"/api/conversations/{cid}/snapshots").json()) == 1  # kept
    assert send(http, cid, "Back again.")[-1][1]["state"]["phase"] == "idle"


def test_nothing_to_pause_is_409(http: httpx2.Client) -> None:
    cid = create(http, context_window=50_000)["id"]
    send(http, cid, "Hello.")
    http.post(f"/api/conversations/{cid}/continue", json={})
    refused = http.post(f"/api/conversations/{cid}/pause", json={})
    assert "context_exhausted" in error(refused, 409, "conflict")


def test_a_pause_during_a_turn_waits_for_its_boundary(tmp_path: Path) -> None:
    app, model = gated_app(tmp_path / "turn.db")
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as client:
        cid = create(client)["id"]
        with held_turn(client, cid, model) as events:
            asked = client.post(f"/api/conversations/{cid}/pause", json={"reason": "at the end"})
            assert asked.status_code == 200, asked.text
            assert asked.json()["snapshot_version"] is None
            assert asked.json()["pause_requested"] is True
            assert asked.json()["phase"] != "paused"
        assert events[-1][1]["state"]["phase"] == "paused"
        listed = client.get(f"/api/conversations/{cid}/snapshots").json()
        assert [(s["version"], s["reason"]) for s in listed] == [(1, "at the end")]


def test_a_pause_asked_of_another_server_is_taken_by_the_one_running_the_turn(
    tmp_path: Path,
) -> None:
    """Two servers on one database: B answers the pause as soon as the request is stored (no
    snapshot yet), A takes it at its turn's boundary and writes the checkpoint."""
    db = tmp_path / "shared.db"
    running, other = Gated(), ScriptedModel(window=50_000)
    app_a = create_app(Runtime(store=SqliteStore(db), llm=running))
    app_b = create_app(Runtime(store=SqliteStore(db), llm=other))
    with (
        live_server(app_a) as url_a,
        live_server(app_b) as url_b,
        httpx2.Client(base_url=url_a, timeout=60) as a,
        httpx2.Client(base_url=url_b, timeout=60) as b,
    ):
        cid = create(a, context_window=50_000)["id"]
        events: list[Any] = []
        turn = threading.Thread(target=lambda: events.extend(send(a, cid, "A slow one.")))
        turn.start()
        try:
            assert running.asked.wait(30)
            # Answered while A's request is held: had B waited for the turn, this would time out.
            asked = b.post(f"/api/conversations/{cid}/pause", json={"reason": "deploy"})
            assert asked.status_code == 200, asked.text
            assert asked.json()["pause_requested"] is True
            assert asked.json()["snapshot_version"] is None
            assert asked.json()["phase"] == "llm_requesting"
        finally:
            running.gate.set()
            turn.join(timeout=60)
        assert events[-1][1]["state"]["phase"] == "paused"
        snapshots = b.get(f"/api/conversations/{cid}/snapshots").json()
        assert [(s["version"], s["reason"]) for s in snapshots] == [(1, "deploy")]
        assert other.requests == []  # the checkpoint was written by the server running the turn
