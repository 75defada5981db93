"""The reference server's REST API over real HTTP: uvicorn on a free port, a real SQLite store,
and behind the runtime either the offline scripted model or a provider's real client (the
``anthropic`` and ``openai`` SDKs, as ``ServerConfig(provider=...)`` builds them) pointed at the
provider's fake API. Every route, every error code, the SSE stream of a turn and of a
conversation, the bearer token, and what a client can never do to the server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

import backends
from api import create, error, gated_app, held_turn, send, sse
from backends import PROVIDERS, chat
from segue.errors import UnsafeBindError
from segue.executor.models.providers import Provider
from segue.server.run import ServerConfig, build_app
from segue.testing import live_server
from segue.testing.conformance import Call, Said

pytestmark = pytest.mark.slow

TOKEN = "t0ken-for-the-test"  # noqa: S105  # a test token, not a secret


@pytest.fixture(params=["scripted", *PROVIDERS])
def backend(request: pytest.FixtureRequest) -> str:
    """What answers behind the runtime: the offline scripted model, or a provider's real
    client pointed at its fake API."""
    return str(request.param)


@pytest.fixture
def offline(backend: str, tmp_path: Path) -> Iterator[str]:
    """The server as a fresh clone runs it (no key: the scripted model, streaming at once), and
    as it runs with a key (the provider's real client, at its fake API); the URL it serves at."""
    if backend == "scripted":
        app = build_app(ServerConfig(db=tmp_path / "server.db", chunk_delay=0.0))
        with live_server(app) as url:
            yield url
        return
    provider: Provider = "openai" if backend == "openai" else "anthropic"
    with backends.backend(provider) as fake:
        fake.respond(chat)
        with live_server(fake.app(tmp_path / "server.db")) as url:
            yield url


@pytest.fixture
def client(offline: str) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=offline, timeout=30) as http:
        yield http


# --------------------------------------------------------------------------- routes


def test_a_conversation_is_created_listed_read_and_streamed(
    client: httpx2.Client, backend: str
) -> None:
    assert client.get("/api/info").json()["offline"] is (backend == "scripted")
    first = create(client)
    second = create(client, behavior="compact_in_place", system="Be brief.", context_window=50_000)
    keys = {"id", "phase", "context_tokens", "context_window", "behavior", "parent_id", "child_id"}
    assert keys <= set(first)
    assert (second["behavior"], second["context_window"], second["phase"]) == (
        "compact_in_place",
        50_000,
        "idle",
    )
    listed = [c["id"] for c in client.get("/api/conversations").json()]
    assert listed[:2] == [second["id"], first["id"]]  # newest first
    assert client.get(f"/api/conversations/{first['id']}").json()["id"] == first["id"]

    events = send(client, first["id"], "Hello <script>alert(1)</script>")
    names = [name for name, _ in events]
    assert names[0] == "user_message"
    assert names[-1] == "done"
    assert all(data["kind"] == name for name, data in events)
    done = events[-1][1]
    assert done["state"]["id"] == first["id"]
    assert done["state"]["phase"] == "idle"
    streamed = "".join(data["text"] for name, data in events if name == "text")
    messages = client.get(f"/api/conversations/{first['id']}/messages").json()
    assert [m["kind"] for m in messages] == ["user", "assistant"]
    assert messages[0]["text"] == "Hello <script>alert(1)</script>"  # kept as sent, as data
    assert streamed == messages[1]["text"] == done["reply"]


def test_the_openapi_schema_documents_every_route(client: httpx2.Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    expected = {
        "/api/info",
        "/api/conversations",
        "/api/conversations/{conversation_id}",
        "/api/conversations/{conversation_id}/messages",
        "/api/conversations/{conversation_id}/events",
        "/api/conversations/{conversation_id}/continue",
        "/api/conversations/{conversation_id}/cancel",
        "/api/conversations/{conversation_id}/pause",
        "/api/conversations/{conversation_id}/resume",
        "/api/conversations/{conversation_id}/redo-summary",
        "/api/conversations/{conversation_id}/undo-compaction",
        "/api/conversations/{conversation_id}/snapshots",
        "/api/conversations/{conversation_id}/snapshots/{version}",
        "/api/conversations/{conversation_id}/children",
        "/api/conversations/{conversation_id}/lineage",
    }
    assert expected <= set(paths)
    streamed = paths["/api/conversations/{conversation_id}/messages"]["post"]["responses"]["200"]
    assert "text/event-stream" in streamed["content"]
    assert client.get("/docs").status_code == 404  # its scripts would come from a CDN


def test_the_limit_the_continuation_and_the_one_child(client: httpx2.Client) -> None:
    conversation = create(client, context_window=3_000)
    cid = conversation["id"]
    kinds: list[str] = []
    for turn in range(20):
        events = send(client, cid, f"Tell me more, part {turn}.")
        kinds += [name for name, _ in events]
        if events[-1][1]["state"]["phase"] == "context_exhausted":
            break
    assert "warning" in kinds
    assert kinds.index("warning") < kinds.index("exhausted")
    state = client.get(f"/api/conversations/{cid}").json()
    assert state["phase"] == "context_exhausted"
    assert state["summary"]
    refused = client.post(f"/api/conversations/{cid}/messages", json={"text": "more?"})
    assert "start_new_from" in error(refused, 409, "read_only")
    child = client.post(f"/api/conversations/{cid}/children", json={"seed_with_summary": True})
    assert child.status_code == 200
    again = client.post(f"/api/conversations/{cid}/children", json={"seed_with_summary": False})
    assert again.json()["id"] == child.json()["id"]  # asked twice, the same child
    assert child.json()["parent_id"] == cid
    assert client.get(f"/api/conversations/{cid}").json()["child_id"] == child.json()["id"]
    chain = client.get(f"/api/conversations/{child.json()['id']}/lineage").json()
    assert [(link["id"], link["label"]) for link in chain] == [
        (cid, "root"),
        (child.json()["id"], "2"),
    ]
    seeded = client.get(f"/api/conversations/{child.json()['id']}/messages").json()
    assert [m["kind"] for m in seeded] == ["summary"]


def test_manual_continuation_pause_resume_and_snapshots(client: httpx2.Client) -> None:
    cid = create(client, behavior="checkpoint_restart")["id"]
    send(client, cid, "Start the job.")
    paused = client.post(f"/api/conversations/{cid}/pause", json={"reason": "nightly stop"})
    assert paused.status_code == 200
    assert (paused.json()["phase"], paused.json()["paused_reason"]) == ("paused", "nightly stop")
    refused = client.post(f"/api/conversations/{cid}/messages", json={"text": "hi"})
    error(refused, 409, "paused")
    snapshots = client.get(f"/api/conversations/{cid}/snapshots").json()
    assert [(s["version"], s["reason"], s["session"]) for s in snapshots] == [
        (1, "nightly stop", 1)
    ]
    assert snapshots[0]["created_at"] > 0
    assert snapshots[0]["llm_calls"] == 2
    resumed = client.post(f"/api/conversations/{cid}/resume", json={})
    assert (resumed.json()["phase"], resumed.json()["session"]) == ("idle", 2)
    error(client.post(f"/api/conversations/{cid}/resume", json={}), 409, "not_paused")

    manual = create(client)["id"]
    send(client, manual, "Hello.")
    continued = client.post(f"/api/conversations/{manual}/continue", json={})
    assert continued.json()["phase"] == "context_exhausted"
    cancelled = client.post(f"/api/conversations/{manual}/cancel", json={})
    assert cancelled.json()["phase"] == "context_exhausted"


# --------------------------------------------------------------------------- errors


def test_unknown_ids_are_404_everywhere(client: httpx2.Client) -> None:
    missing = "/api/conversations/no-such-id"
    for method, path, body in [
        ("GET", missing, None),
        ("GET", f"{missing}/messages", None),
        ("POST", f"{missing}/messages", {"text": "hi"}),
        ("GET", f"{missing}/events", None),
        ("POST", f"{missing}/continue", {}),
        ("POST", f"{missing}/cancel", {}),
        ("POST", f"{missing}/pause", {"reason": "x"}),
        ("POST", f"{missing}/resume", {}),
        ("GET", f"{missing}/snapshots", None),
        ("GET", f"{missing}/snapshots/1", None),
        ("POST", f"{missing}/children", {}),
        ("GET", f"{missing}/lineage", None),
    ]:
        response = client.request(method, path, json=body)
        error(response, 404, "not_found")


def test_bad_input_is_422_and_changes_nothing(client: httpx2.Client) -> None:
    cid = create(client, context_window=3_000)["id"]
    path = f"/api/conversations/{cid}/messages"
    error(client.post(path, json={"text": ""}), 422, "invalid_request")
    error(client.post(path, json={"text": "   \n"}), 422, "invalid_request")
    error(client.post(path, json={}), 422, "invalid_request")
    error(client.post(path, json={"text": "hi", "urgent": True}), 422, "invalid_request")
    as_json = {"content-type": "application/json"}
    error(client.post(path, content=b"{not json", headers=as_json), 422, "invalid_request")
    nested = b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    error(client.post(path, content=nested, headers=as_json), 422, "invalid_request")
    live = client.post(f"/api/conversations/{cid}/children", json={})
    assert "only a conversation that ended" in error(live, 409, "conflict")
    too_large = client.post(path, json={"text": "word " * 10_000})
    assert "too large" in error(too_large, 422, "message_too_large")
    error(client.post("/api/conversations", json={"behavior": "sometimes"}), 422, "invalid_request")
    error(client.post("/api/conversations", json={"context_window": -5}), 422, "invalid_request")
    assert client.get(f"/api/conversations/{cid}/messages").json() == []
    huge = client.post(path, content=b"x" * (9 * 1024 * 1024), headers=as_json)
    error(huge, 413, "too_large")


def test_input_the_library_refuses_is_422_and_the_connection_stays_usable(
    client: httpx2.Client,
) -> None:
    """Thresholds in the wrong order pass the schema and are refused by the core (a pydantic
    error): a 422 like any other bad input, and the same keep-alive connection goes on."""
    backwards = {"warning_threshold": 0.95, "continuation_threshold": 0.5}
    for _ in range(3):  # a dropped connection would fail the next request on it
        message = error(client.post("/api/conversations", json=backwards), 422, "invalid_request")
        assert "warning_threshold" in message
    assert client.get("/api/conversations").status_code == 200


def test_a_body_sent_in_chunks_is_bounded_too(client: httpx2.Client) -> None:
    """No Content-Length to refuse it by: the body is counted as it is read, and stopped."""
    cid = create(client)["id"]

    def chunks() -> Iterator[bytes]:
        yield b'{"text": "'
        for _ in range(10):
            yield b"x" * (1024 * 1024)
        yield b'"}'

    response = client.post(
        f"/api/conversations/{cid}/messages",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    error(response, 413, "too_large")
    assert client.get(f"/api/conversations/{cid}/messages").json() == []


def test_a_running_turn_is_cancelled(tmp_path: Path) -> None:
    app, model = gated_app(tmp_path / "cancel.db")
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as http:
        cid = create(http)["id"]
        with held_turn(http, cid, model) as turn:
            cancelled = http.post(f"/api/conversations/{cid}/cancel", json={})
            assert cancelled.status_code == 200
        assert turn[-1][0] == "done"
        assert http.get(f"/api/conversations/{cid}").json()["phase"] == "idle"
        kinds = [m["kind"] for m in http.get(f"/api/conversations/{cid}/messages").json()]
        assert kinds == ["user"]  # the answer was stopped, not stored half-written


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_failed_conversation_says_so(provider: Provider, tmp_path: Path) -> None:
    with backends.backend(provider) as fake:
        fake.respond(chat)
        app = fake.app(tmp_path / "failed.db")
        with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as http:
            # A sub-agent whose first answer fills its small window: it fails for good.
            body = {"behavior": "intentionally_unhandled", "context_window": 1_000}
            sub = create(http, **body)["id"]
            events = send(http, sub, "Hello. " * 350)  # ~630 tokens, and ~300 answered
            assert events[-1][1]["state"]["phase"] == "failed"
            failed = dict(events)["failed"]
            assert failed["error_kind"] == "context_exhausted"
            refused = http.post(f"/api/conversations/{sub}/messages", json={"text": "More?"})
            assert "context_exhausted" in error(refused, 409, "failed")


def test_a_message_while_a_turn_runs_is_409_and_performs_nothing(tmp_path: Path) -> None:
    app, model = gated_app(tmp_path / "slow.db")
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as http:
        cid = create(http)["id"]
        with held_turn(http, cid, model) as first:
            busy = http.post(f"/api/conversations/{cid}/messages", json={"text": "And now?"})
            assert "a turn is running" in error(busy, 409, "busy")
        assert first[-1][0] == "done"
        kinds = [m["kind"] for m in http.get(f"/api/conversations/{cid}/messages").json()]
        assert kinds == ["user", "assistant"]


def test_a_client_that_disconnects_loses_nothing(tmp_path: Path) -> None:
    app = build_app(ServerConfig(db=tmp_path / "gone.db", chunk_delay=0.02))
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as http:
        cid = create(http)["id"]
        with http.stream(
            "POST", f"/api/conversations/{cid}/messages", json={"text": "Tell me a story."}
        ) as response:
            for line in response.iter_lines():
                if line.startswith("event: text"):
                    break  # the browser tab closed
        deadline = time.monotonic() + 30
        while http.get(f"/api/conversations/{cid}").json()["phase"] != "idle":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        messages = http.get(f"/api/conversations/{cid}/messages").json()
        assert [m["kind"] for m in messages] == ["user", "assistant"]
        assert len(messages[1]["text"]) == 1_200  # the whole reply, stored


def test_a_second_tab_sees_every_update_of_the_conversation(
    client: httpx2.Client, offline: str
) -> None:
    cid = create(client)["id"]
    seen: list[str] = []
    ready = threading.Event()

    def second_tab() -> None:
        with (
            httpx2.Client(base_url=offline, timeout=30) as other,
            other.stream("GET", f"/api/conversations/{cid}/events") as response,
        ):
            ready.set()
            for line in response.iter_lines():
                if line.startswith("event:"):
                    seen.append(line[6:].strip())
                    if seen[-1] == "done":
                        return

    tab = threading.Thread(target=second_tab)
    tab.start()
    assert ready.wait(10)  # the watch is in place before the response starts
    events = send(client, cid, "Hello from the first tab.")
    tab.join(timeout=30)
    assert seen == [name for name, _ in events]


# --------------------------------------------------------------------------- security


def test_binding_beyond_this_machine_needs_a_token(tmp_path: Path) -> None:
    with pytest.raises(UnsafeBindError):
        build_app(ServerConfig(db=tmp_path / "x.db", host="0.0.0.0"))  # noqa: S104  # the point
    app = build_app(ServerConfig(db=tmp_path / "y.db", host="0.0.0.0", token=TOKEN))  # noqa: S104
    with live_server(app) as url:
        error(httpx2.get(f"{url}/api/conversations"), 401, "unauthorized")
        wrong = httpx2.get(f"{url}/api/conversations", headers={"Authorization": "Bearer nope"})
        error(wrong, 401, "unauthorized")
        right = httpx2.get(f"{url}/api/conversations", headers={"Authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 200
        foreign = httpx2.get(
            f"{url}/api/conversations", headers={b"Authorization": "Bearer t\u00f6ken".encode()}
        )
        error(foreign, 401, "unauthorized")  # not a 500: compared as bytes
        assert httpx2.get(f"{url}/").status_code == 200  # the page holds no data


@pytest.mark.parametrize("provider", PROVIDERS)
def test_with_a_key_the_provider_answers_and_no_response_ever_holds_it(
    provider: Provider, tmp_path: Path
) -> None:
    with backends.backend(provider) as fake:
        key = fake.key
        fake.script(
            Said(
                text="Checking.",
                calls=[Call("lookup", {"query": "tides"}, id="toolu_1")],
                prompt=500,
                output=20,
            ),
            Said(text=f"Noon. (your key is {key})", prompt=600, output=10),
        )
        with (
            live_server(fake.app(tmp_path / "real.db")) as url,
            httpx2.Client(base_url=url, timeout=30) as http,
        ):
            info = http.get("/api/info").json()
            assert (info["offline"], info["model"]) == (False, fake.model)
            cid = create(http)["id"]
            response = http.post(f"/api/conversations/{cid}/messages", json={"text": "Tide?"})
            bodies = [response.text, http.get(f"/api/conversations/{cid}").text]
            bodies += [http.get("/api/info").text, http.get("/openapi.json").text]
        sent = fake.sent()
    assert [name for name, _ in sse(response)][-1] == "done"
    assert len(sent) == 2
    assert sent[0].raw["model"] == fake.model
    assert [turn.result_for for turn in sent[1].turns if turn.role == "tool"] == ["toolu_1"]
    assert all(key not in body.replace(f"your key is {key}", "") for body in bodies)
