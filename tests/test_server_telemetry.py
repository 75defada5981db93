"""``segue serve`` seen by an operator: ``/metrics`` in Prometheus' text format behind the token,
a caller's trace continued through ``traceparent``, and work another process left orphaned taken
over without waiting for a message (issue: seen and run in production).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx2
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from api import create, send
from gated import Gated
from segue import Runtime, ScriptedModel, SqliteStore
from segue.server import create_app
from segue.server.metrics import prometheus
from segue.server.run import ServerConfig, build_app
from segue.testing import live_server

TOKEN = "s3cret-token"  # noqa: S105  # a test's own
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_metrics_are_served_in_prometheus_text_behind_the_token(tmp_path: Path) -> None:
    exported = prometheus()
    runtime = Runtime(
        store=SqliteStore(tmp_path / "m.db"),
        llm=ScriptedModel(),
        meter_provider=exported.meter_provider,
        store_metrics_rate=1.0,
    )
    app = create_app(runtime, token=TOKEN, metrics=exported)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with live_server(app) as url, httpx2.Client(base_url=url, headers=headers) as http:
        cid = create(http, model="claude-sonnet-4-5")["id"]
        send(http, cid, "Hello there.")
        assert httpx2.get(f"{url}/metrics").status_code == 401
        answered = http.get("/metrics")
    assert answered.status_code == 200
    assert answered.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(answered.text)}
    tokens = families["gen_ai_client_token_usage"]
    kinds = {s.labels.get("gen_ai_token_type") for s in tokens.samples if s.name.endswith("_sum")}
    assert kinds == {"input", "output"}
    assert "segue_store_commit_duration_seconds" in families
    (occupancy,) = [
        s for s in families["segue_context_occupancy"].samples if s.name.endswith("_count")
    ]
    assert occupancy.value == 1  # one response, one reading of the meter
    assert "segue_turn_duration_seconds" in families


def test_a_callers_traceparent_is_continued_into_the_turn(tmp_path: Path) -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    runtime = Runtime(
        store=SqliteStore(tmp_path / "t.db"), llm=ScriptedModel(), tracer_provider=provider
    )
    parent = "00f067aa0ba902b7"
    with live_server(create_app(runtime)) as url, httpx2.Client(base_url=url) as http:
        cid = create(http, model="claude-sonnet-4-5")["id"]
        response = http.post(
            f"/api/conversations/{cid}/messages",
            json={"text": "Hello."},
            headers={"traceparent": f"00-{TRACE}-{parent}-01"},
        )
        assert response.status_code == 200
        send(http, cid, "And without a trace.")
    turns = [s for s in spans.get_finished_spans() if s.name == "segue.turn"]
    traced, untraced = turns
    assert format(traced.context.trace_id, "032x") == TRACE
    assert traced.parent is not None
    assert format(traced.parent.span_id, "016x") == parent
    assert format(untraced.context.trace_id, "032x") != TRACE
    calls = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")]
    assert format(calls[0].context.trace_id, "032x") == TRACE


def test_work_a_stopped_process_left_is_taken_over_without_a_message(tmp_path: Path) -> None:
    """A worker whose runtime closes mid-turn (a drain) lets its claim go; a process already
    serving the same database takes the turn over at its next sweep, though nobody sends
    anything to the conversation and its own startup recovery is long over."""
    db = tmp_path / "shared.db"
    serving = Runtime(store=SqliteStore(db), llm=ScriptedModel(), lease=0.5)

    async def orphan() -> str:
        model = Gated()
        left = Runtime(store=SqliteStore(db), llm=model)
        cid = (await left.create_conversation(model="claude-sonnet-4-5")).id
        turn = asyncio.ensure_future(left.send(cid, "A long task."))
        assert await asyncio.to_thread(model.asked.wait, 60)
        await left.close()  # the request is cancelled, its claim let go at once
        model.gate.set()  # the thread the gate held goes too
        await asyncio.gather(turn, return_exceptions=True)
        return cid

    with live_server(create_app(serving)) as url, httpx2.Client(base_url=url) as http:
        cid = asyncio.run(orphan())
        deadline = time.monotonic() + 30
        state = http.get(f"/api/conversations/{cid}").json()
        while state["phase"] != "idle" and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the API as a client would, bounded by the deadline
            state = http.get(f"/api/conversations/{cid}").json()
        assert state["phase"] == "idle"
        messages = http.get(f"/api/conversations/{cid}/messages").json()
    assert [m["kind"] for m in messages] == ["user", "assistant"]


def test_segue_serve_metrics_exposes_what_its_runtime_records(tmp_path: Path) -> None:
    """``segue serve --metrics``: the runtime it builds records into the registry /metrics
    reads (without the flag there is no such route)."""
    plain = build_app(ServerConfig(db=tmp_path / "plain.db", chunk_delay=0.0))
    with live_server(plain) as url:
        assert httpx2.get(f"{url}/metrics").status_code == 404
    config = ServerConfig(db=tmp_path / "served.db", chunk_delay=0.0, metrics=True)
    with live_server(build_app(config)) as url, httpx2.Client(base_url=url) as http:
        send(http, create(http)["id"], "Hello.")
        exposition = http.get("/metrics").text
    names = {family.name for family in text_string_to_metric_families(exposition)}
    assert {"gen_ai_client_operation_duration_seconds", "segue_turn_duration_seconds"} <= names
