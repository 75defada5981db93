"""What ``/metrics`` shows from the start and how far it grows (issues 35 and 36): the gauges
and the counters whose labels are known exist at 0 before any turn; a model name the client
makes up labels no series of its own; the store's commit durations are a sample.

Read through ``segue serve``'s own ``/metrics`` (the app ``build_app`` makes, served for real)
and through the OpenTelemetry SDK's in-memory reader, never through segue's own parts.
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families

from api import create, send
from segue import MemoryStore, Runtime, ScriptedModel
from segue.executor.models.openai import OpenAIModel
from segue.executor.otel_terms import MAX_MODEL_LABELS, OTHER_MODEL, ModelLabels
from segue.server.run import ServerConfig, build_app
from segue.testing import live_server
from segue.testing import openai_server as fake_openai


def scrape(http: httpx2.Client) -> dict[str, Any]:
    answered = http.get("/metrics")
    assert answered.status_code == 200
    return {family.name: family for family in text_string_to_metric_families(answered.text)}


def test_metrics_show_the_gauges_and_counters_at_zero_before_any_turn(tmp_path: Path) -> None:
    config = ServerConfig(db=tmp_path / "fresh.db", chunk_delay=0.0, metrics=True)
    with live_server(build_app(config)) as url, httpx2.Client(base_url=url) as http:
        families = scrape(http)
    (active,) = families["segue_conversations_active"].samples
    assert active.value == 0
    retries = {
        s.labels["segue_request"]: s.value
        for s in families["segue_retries"].samples
        if s.name == "segue_retries_total"
    }
    assert retries == {"llm": 0, "continuation": 0, "checkpoint": 0, "compaction": 0}
    refusals = {
        s.labels["segue_cause"]: s.value
        for s in families["segue_refusals"].samples
        if s.name == "segue_refusals_total"
    }
    assert refusals == {"too_large": 0, "busy": 0, "exhausted": 0, "paused": 0, "failed": 0}


def test_made_up_model_names_leave_a_bounded_number_of_series(tmp_path: Path) -> None:
    """120 conversations, each with a model name of its client's making (half of them a known
    model with a made-up suffix): the series stay as few as for two conversations."""
    config = ServerConfig(db=tmp_path / "many.db", chunk_delay=0.0, metrics=True)
    made_up = [f"model-{secrets.token_hex(6)}" for _ in range(60)]
    suffixed = [f"claude-sonnet-4-6-x{secrets.token_hex(4)}" for _ in range(60)]
    with live_server(build_app(config)) as url, httpx2.Client(base_url=url) as http:
        send(http, create(http, model="claude-sonnet-4-6")["id"], "Hello.")
        send(http, create(http, model="a-first-made-up-model")["id"], "Hello.")
        few = scrape(http)
        for model in made_up + suffixed:
            send(http, create(http, model=model)["id"], "Hello.")
        many = scrape(http)

    def series(families: dict[str, Any]) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        # The commit durations are a sample (labelled by the store's class alone): whether the
        # first scrape has any is chance.
        return {
            (s.name, tuple(sorted(s.labels.items())))
            for name, family in families.items()
            if name != "segue_store_commit_duration_seconds"
            for s in family.samples
        }

    assert series(many) == series(few)
    assert sum(len(family.samples) for family in many.values()) < 400
    labelled = {
        s.labels["gen_ai_request_model"]
        for family in many.values()
        for s in family.samples
        if "gen_ai_request_model" in s.labels
    }
    assert labelled == {"claude-sonnet-4-6", OTHER_MODEL}


def test_model_labels_are_known_names_as_given_else_the_tables_names() -> None:
    labels = ModelLabels(limit=3)
    assert labels("claude-sonnet-4-6") == "claude-sonnet-4-6"
    assert labels("claude-sonnet-4-6-20260101") == "claude-sonnet-4-6-20260101"
    bedrock = "us.anthropic.claude-sonnet-4-6-20260101-v1:0"
    assert labels(bedrock) == bedrock
    assert labels("gpt-4o-2024-08-06") == "gpt-4o"  # a fourth exact name: past the limit
    assert labels("claude-sonnet-4-6-20260101") == "claude-sonnet-4-6-20260101"  # kept
    assert labels("claude-sonnet-4-6-made-up") == "claude-sonnet-4-6"
    assert labels("ft:gpt-4o-mini-2024-07-18:org::abc") == "gpt-4o-mini"
    assert labels("Qwen/Qwen3-8B") == OTHER_MODEL
    assert MAX_MODEL_LABELS >= 16  # room for every model a deployment really runs


def test_made_up_dates_fill_no_more_than_the_limit() -> None:
    labels = ModelLabels()
    given = {labels(f"claude-sonnet-4-6-2026{n:04d}") for n in range(300)}
    given |= {labels(f"gpt-4o-{n}") for n in range(300)}
    given |= {labels(f"made-up-{n}") for n in range(300)}
    assert len(given) <= MAX_MODEL_LABELS + 3
    assert {"claude-sonnet-4-6", "gpt-4o", OTHER_MODEL} <= given


def commits_recorded(rate: float | None, turns: int) -> int:
    """How many commit durations a runtime recorded over ``turns`` turns (two commits each)."""
    reader = InMemoryMetricReader()
    settings: dict[str, Any] = {} if rate is None else {"store_metrics_rate": rate}

    async def main() -> None:
        runtime = Runtime(
            store=MemoryStore(),
            llm=ScriptedModel(),
            meter_provider=MeterProvider(metric_readers=[reader]),
            **settings,
        )
        async with runtime as rt:
            cid = (await rt.create_conversation(model="claude-sonnet-4-6")).id
            for index in range(turns):
                await rt.send(cid, f"Message {index}.")

    asyncio.run(main())
    data = reader.get_metrics_data()
    assert data is not None
    points: list[Any] = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "segue.store.commit.duration"
        for point in metric.data.data_points
    ]
    return sum(int(point.count) for point in points)


def test_commit_durations_are_a_sample_of_one_in_ten_unless_asked() -> None:
    assert commits_recorded(1.0, 20) == 40
    assert commits_recorded(0.0, 20) == 0
    sampled = commits_recorded(None, 200)  # 400 commits, 0.1 each: 40 expected, sd 6
    assert 8 <= sampled <= 90


@pytest.mark.parametrize("rate", [-0.1, 1.5, float("nan"), True])
def test_a_rate_that_is_not_a_share_is_refused(rate: Any) -> None:
    with pytest.raises(ValueError, match="store_metrics_rate"):
        Runtime(store=MemoryStore(), llm=ScriptedModel(), store_metrics_rate=rate)


GLOBAL_AFTER = """
import asyncio
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from segue import MemoryStore, Runtime, ScriptedModel

async def main():
    async with Runtime(store=MemoryStore(), llm=ScriptedModel()) as rt:
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        cid = (await rt.create_conversation(model="claude-sonnet-4-6")).id
        await rt.send(cid, "Hello.")
    data = reader.get_metrics_data()
    names = {m.name for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics}
    print("segue.turn.duration" in names, "segue.conversations.active" in names)

asyncio.run(main())
"""


def test_a_global_meter_provider_set_after_the_runtime_is_made_is_heard_at_its_first_turn() -> None:
    """The instruments made at the start do not keep the runtime from looking the providers up
    at its first turn (a separate process: a global provider can be set once)."""
    done = subprocess.run(  # noqa: S603  # this interpreter, a script of the test's own
        [sys.executable, "-c", GLOBAL_AFTER],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


def test_a_model_the_server_serves_is_labelled_by_its_name_and_a_made_up_one_is_not() -> None:
    """A vLLM server that reports its model's window: that model's metrics carry its name (the
    adapter knows the server serves it); a name the server does not know is ``other``."""
    served = "Qwen/Qwen3-8B"
    reader = InMemoryMetricReader()
    with fake_openai.FakeOpenAIServer(
        models={served: {"owned_by": "vllm", "max_model_len": 32_768}}, retrieve=False
    ) as server:

        async def main() -> None:
            client = openai.AsyncOpenAI(api_key="sk-test-0123456789", base_url=server.url)
            llm = OpenAIModel(client, provider_name="vllm")
            meters = MeterProvider(metric_readers=[reader])
            async with client, Runtime(store=MemoryStore(), llm=llm, meter_provider=meters) as rt:
                for model in (served, "made-up-model"):
                    cid = (await rt.create_conversation(model=model)).id
                    await rt.send(cid, "Hello.")

        asyncio.run(main())
    data = reader.get_metrics_data()
    assert data is not None
    said: list[Any] = [
        dict(point.attributes or {})
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "gen_ai.client.operation.duration"
        for point in metric.data.data_points
    ]
    labelled = {(a["gen_ai.request.model"], a.get("gen_ai.response.model")) for a in said}
    assert labelled == {(served, served), (OTHER_MODEL, OTHER_MODEL)}
