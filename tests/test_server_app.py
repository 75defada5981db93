"""``create_app`` as an application embeds it (its defaults, mounted under a prefix in another
FastAPI app, its startup work run however it is served) and the API's answers a client reads:
a manual continuation refused when the state does not allow it, the smallest window, messages a
person can read for bad input, 405.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Final

import httpx2
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from api import create, error, gated_app, held_turn, send
from segue import (
    AnthropicModel,
    MemoryStore,
    OpenAIModel,
    Runtime,
    ScriptedModel,
    SqliteStore,
    Watch,
)
from segue.executor.models.offline import OfflineModel
from segue.server import create_app
from segue.server.conversations import StateViews
from segue.server.ending import StreamsEnd
from segue.server.relay import relayed
from segue.server.run import ServerConfig, build_app, build_model
from segue.server.streams import Encoder, _watched  # the stream behind /events
from segue.testing import live_server

pytestmark = pytest.mark.slow


@pytest.fixture
def http(tmp_path: Path) -> Iterator[httpx2.Client]:
    app = build_app(ServerConfig(db=tmp_path / "app.db", chunk_delay=0.0))
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as client:
        yield client


# --------------------------------------------------------------------------- the API


def test_continue_is_409_unless_the_conversation_is_idle(http: httpx2.Client) -> None:
    paused = create(http)["id"]
    send(http, paused, "Start.")
    assert http.post(f"/api/conversations/{paused}/pause", json={}).json()["phase"] == "paused"
    refused = http.post(f"/api/conversations/{paused}/continue", json={})
    assert "paused" in error(refused, 409, "conflict")
    assert http.get(f"/api/conversations/{paused}").json()["phase"] == "paused"  # untouched

    idle = create(http)["id"]
    send(http, idle, "Hello.")
    done = http.post(f"/api/conversations/{idle}/continue", json={})
    assert done.json()["phase"] == "context_exhausted"
    again = http.post(f"/api/conversations/{idle}/continue", json={})
    assert "context_exhausted" in error(again, 409, "conflict")


def test_continue_while_a_turn_runs_is_409_busy(tmp_path: Path) -> None:
    app, model = gated_app(tmp_path / "busy.db")
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as client:
        cid = create(client)["id"]
        with held_turn(client, cid, model) as events:
            busy = client.post(f"/api/conversations/{cid}/continue", json={})
            error(busy, 409, "busy")
        assert events[-1][1]["state"]["phase"] == "idle"  # the turn went on, not continued


def test_the_smallest_window_is_the_pages_and_the_clis(http: httpx2.Client) -> None:
    for window in (5, 999):
        refused = http.post("/api/conversations", json={"context_window": window})
        assert "context_window" in error(refused, 422, "invalid_request")
    assert create(http, context_window=1_000)["context_window"] == 1_000


def test_bad_input_says_what_is_wrong_in_words(http: httpx2.Client) -> None:
    cid = create(http)["id"]
    path = f"/api/conversations/{cid}/messages"
    as_json = {"content-type": "application/json"}
    broken = error(http.post(path, content=b"{not json", headers=as_json), 422, "invalid_request")
    assert broken.startswith("the body is not valid JSON"), broken
    assert "body.1" not in broken
    missing = error(http.post(path, json={}), 422, "invalid_request")
    assert missing == "text: Field required"
    wrong = error(http.post(path, json={"text": "hi", "urgent": True}), 422, "invalid_request")
    assert wrong == "urgent: Extra inputs are not permitted"


def test_a_method_a_route_does_not_take_is_405(http: httpx2.Client) -> None:
    cid = create(http)["id"]
    error(http.get(f"/api/conversations/{cid}/continue"), 405, "method_not_allowed")
    refused = http.patch(f"/api/conversations/{cid}", json={})
    error(refused, 405, "method_not_allowed")
    assert refused.headers["allow"] == "DELETE, GET"  # every method the path takes


def test_the_server_wide_window_applies_to_new_conversations(tmp_path: Path) -> None:
    app = build_app(ServerConfig(db=tmp_path / "w.db", context_window=3_000))
    with live_server(app) as url, httpx2.Client(base_url=url) as client:
        assert client.get("/api/info").json()["context_window"] == 3_000
        assert create(client)["context_window"] == 3_000
        assert create(client, context_window=5_000)["context_window"] == 5_000


# --------------------------------------------------------------------------- embedding


def test_create_app_needs_only_the_runtime() -> None:
    runtime = Runtime(store=MemoryStore(), llm=ScriptedModel(window=20_000))
    with live_server(create_app(runtime)) as url, httpx2.Client(base_url=url) as client:
        info = client.get("/api/info").json()
        assert info["offline"] is True  # the scripted model answers
        assert info["behavior"] == "threshold_based_continuation"
        cid = create(client)["id"]
        assert send(client, cid, "Hello.")[-1][1]["state"]["phase"] == "idle"


def interrupted_turn(db: Path) -> str:
    """A conversation whose turn a stopped process left pending in the store's outbox."""

    async def run() -> str:
        model = ScriptedModel(window=20_000, reply_chars=2_000, chunk_delay=0.05)
        async with Runtime(store=SqliteStore(db), llm=model) as runtime:
            state = await runtime.create_conversation(model="claude-sonnet-4-6")
            async for update in runtime.stream(state.id, "Tell me a long story."):
                if update.kind == "text":
                    break  # the process stops here, mid-reply
            return state.id

    cid = asyncio.run(run())

    async def pending() -> list[str]:
        store = SqliteStore(db)
        try:
            return await store.with_pending()
        finally:
            await store.close()

    assert asyncio.run(pending()) == [cid]
    return cid


def recovered(client: httpx2.Client, path: str) -> list[str]:
    """The kinds of the conversation's messages once its pending turn is over."""
    deadline = time.monotonic() + 30
    while client.get(path).json()["phase"] != "idle":
        assert time.monotonic() < deadline, "the pending turn was never recovered"
        time.sleep(0.05)
    return [m["kind"] for m in client.get(f"{path}/messages").json()]


@pytest.mark.parametrize("lifespan", ["included", "left_out"])
def test_mounted_under_a_prefix_it_serves_and_recovers(lifespan: str, tmp_path: Path) -> None:
    """``parent.mount("/segue", app)``: the page's addresses are under the prefix, and the work
    a crash left pending is finished with the parent's lifespan or, left out, the first request."""
    db = tmp_path / "mounted.db"
    cid = interrupted_turn(db)
    runtime = Runtime(store=SqliteStore(db), llm=ScriptedModel(window=20_000))
    segue_app = create_app(runtime)
    parent = FastAPI(lifespan=segue_app.router.lifespan_context if lifespan == "included" else None)

    @parent.get("/")
    async def own_home() -> dict[str, str]:
        return {"app": "the parent's own"}

    parent.mount("/segue", segue_app)
    with live_server(parent) as url, httpx2.Client(base_url=url, timeout=30) as client:
        assert client.get("/").json() == {"app": "the parent's own"}
        page = client.get("/segue/c/" + cid)
        assert '<base href="/segue/">' in page.text
        assert 'src="static/' in page.text  # relative to the base: under the prefix
        assert client.get("/segue/static/app.css").status_code == 200
        assert recovered(client, f"/segue/api/conversations/{cid}") == ["user", "assistant"]
        fresh = client.post("/segue/api/conversations", json={})
        assert fresh.status_code == 201
    if lifespan == "left_out":
        asyncio.run(runtime.close())  # the application's runtime: the application closes it


# --------------------------------------------------------------------------- the provider


def test_the_config_names_the_provider_whose_model_answers(tmp_path: Path) -> None:
    """With a key, the provider's adapter over its client; without one, the offline model,
    whatever the provider; the model of new conversations is the provider's default."""
    openai = ServerConfig(db=tmp_path / "o.db", provider="openai", api_key="sk-test")
    assert isinstance(build_model(openai), OpenAIModel)
    assert openai.default_model == "gpt-4o"
    claude = ServerConfig(db=tmp_path / "a.db", api_key="sk-ant-test")
    assert isinstance(build_model(claude), AnthropicModel)
    assert claude.default_model == "claude-sonnet-4-6"
    offline = ServerConfig(db=tmp_path / "s.db", provider="openai")
    assert isinstance(build_model(offline), OfflineModel)
    assert ServerConfig(provider="openai", model="gpt-4.1").default_model == "gpt-4.1"
    with pytest.raises(ValueError, match="unknown provider 'mistral'"):
        ServerConfig(provider="mistral")  # type: ignore[arg-type]


def test_a_watch_stream_ends_when_the_server_stops_and_leaves_nothing_running() -> None:
    """``/events`` streams end as the server is told to stop (``StreamsEnd``), and a client
    that goes away (the stream is cancelled) leaves no task waiting for updates."""

    async def settled(others: set[asyncio.Task[Any]]) -> bool:
        """Whether the tasks running come back to ``others`` (cancelled ones finish)."""
        for _ in range(200):
            if asyncio.all_tasks() == others:
                return True
            await asyncio.sleep(0.01)
        return False

    async def scenario() -> None:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel()) as runtime:
            cid = (await runtime.create_conversation(model="claude-sonnet-4-6")).id
            others = asyncio.all_tasks()
            encoder = Encoder(runtime, StateViews(runtime))

            def body(watch: Watch) -> AsyncIterator[bytes]:
                """The body of an ``/events`` response, as the route makes it."""
                return relayed(_watched(encoder, watch))

            end = StreamsEnd()
            watch = runtime.watch(cid)
            await watch.start()
            end.add(watch)
            stream = body(watch)
            reading = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0.05)
            assert not reading.done()  # nothing happened to the conversation
            end()  # the server is stopping
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(reading, 10)
            assert await settled(others)

            late = runtime.watch(cid)  # a stream opened as the server stops ends at once
            await late.start()
            end.add(late)
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(anext(body(late)), 10)
            assert await settled(others)

            gone = body(runtime.watch(cid))
            reading = asyncio.ensure_future(anext(gone))
            await asyncio.sleep(0.05)
            reading.cancel()  # the client went away
            with pytest.raises(asyncio.CancelledError):
                await reading
            assert await settled(others)

    asyncio.run(scenario())


OPEN_ENDS: Final = {"01", "08"}
"""Linux's TCP states of a socket its owner has not closed: established, and close-wait (the
far end closed it, this one not yet)."""


def _open_to(port: int) -> int:
    """Sockets on this machine connected to ``port`` that their owner has not closed (Linux's
    ``/proc/net/tcp``)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].split(":")[1], 16) == port and fields[3] in OPEN_ENDS:
            count += 1
    return count


def _keeping_alive() -> FastAPI:
    """A provider's server that knows no model and keeps every connection open (HTTP/1.1
    keep-alive, as real APIs do): what a server's window lookups leave pooled."""
    upstream = FastAPI()

    @upstream.api_route("/{path:path}", methods=["GET", "POST"])
    async def unknown(path: str) -> JSONResponse:
        return JSONResponse({"error": {"message": f"no {path} here"}}, status_code=404)

    return upstream


def test_a_stopped_server_leaves_no_connection_to_the_provider_open(tmp_path: Path) -> None:
    """The model's pooled connections belong to the server's event loop: as the server stops
    they are closed, not left for the garbage collector (whose ResourceWarning falls wherever
    it runs); served again, the app opens connections of its own."""
    with live_server(_keeping_alive()) as provider:
        port = int(provider.rsplit(":", 1)[1].split("/")[0])
        config = ServerConfig(
            db=tmp_path / "s.db", provider="openai", api_key="sk-test", base_url=f"{provider}/v1"
        )
        app = build_app(config)
        for served in range(2):  # stopped, then served again: its model still reaches the provider
            with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as http:
                made = create(http, model=f"house-model-{served}")  # its window asked upstream
                assert made["context_window_source"] == "assumed"
                assert _open_to(port) >= 1  # the lookups' connection, pooled
            assert _open_to(port) == 0
