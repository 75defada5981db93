"""Each real adapter names its provider and carries the provider's response id and served model
into the spans and metrics (issue 35: every span said ``gen_ai.provider.name="unknown"`` and
none had ``gen_ai.response.id``).

Every case runs a real turn: the runtime, ``AnthropicModel`` or ``OpenAIModel`` over the SDK's
own client (``AsyncAnthropic``, ``AsyncAnthropicBedrock``, ``AsyncAnthropicVertex``,
``AsyncOpenAI``, ``AsyncAzureOpenAI``) pointed at segue's fake servers, and the attributes read
off the spans the OpenTelemetry SDK's in-memory exporter received and the data points its
in-memory reader collected. The fakes answer with ids and models as the real APIs do: a served
model that is not the name asked (OpenAI's dated snapshot, Bedrock's Messages API name).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from segue import MemoryStore, Runtime
from segue.executor.model_port import LlmModel
from segue.executor.models.anthropic import AnthropicModel
from segue.executor.models.openai import OpenAIModel
from segue.executor.otel_terms import ModelLabels
from segue.testing import anthropic_server as fake_anthropic
from segue.testing import openai_server as fake_openai

KEY = "sk-test-0123456789abcdef"


@dataclass(frozen=True)
class Case:
    """One provider as a user would configure it, and what its answer must say."""

    server: Callable[[], Any]
    adapter: Callable[[str], tuple[Any, LlmModel]]
    """The SDK client (closed after the turn) and the adapter over it, given the fake's
    origin."""
    model: str
    """The model the conversation asks for."""
    reply: Any
    provider: str
    id_prefix: str
    served: str


def _bedrock(origin: str) -> tuple[Any, LlmModel]:
    pytest.importorskip("botocore", reason='Bedrock needs pip install "segue[bedrock]"')
    client = anthropic.AsyncAnthropicBedrock(
        aws_access_key="AKIDEXAMPLE", aws_secret_key="s" * 20, aws_region="us-east-1",
        base_url=origin,
    )  # fmt: skip
    return client, AnthropicModel(client)


def _vertex(origin: str) -> tuple[Any, LlmModel]:
    client = anthropic.AsyncAnthropicVertex(
        access_token="ya29.token-0123456789",  # noqa: S106  # a test credential
        project_id="p",
        region="us-east5",
        base_url=origin,
    )
    return client, AnthropicModel(client)


def _anthropic(origin: str) -> tuple[Any, LlmModel]:
    client = anthropic.AsyncAnthropic(api_key=KEY, base_url=origin)
    return client, AnthropicModel(client)


def _openai(api: Any, name: str | None = None) -> Callable[[str], tuple[Any, LlmModel]]:
    def make(origin: str) -> tuple[Any, LlmModel]:
        client = openai.AsyncOpenAI(api_key=KEY, base_url=f"{origin}/v1")
        return client, OpenAIModel(client, api=api, provider_name=name)

    return make


def _azure(api: Any) -> Callable[[str], tuple[Any, LlmModel]]:
    def make(origin: str) -> tuple[Any, LlmModel]:
        client = openai.AsyncAzureOpenAI(
            api_key=KEY, api_version="2024-10-21", azure_endpoint=origin
        )
        return client, OpenAIModel(client, api=api)

    return make


CASES: dict[str, Case] = {
    "anthropic": Case(
        fake_anthropic.FakeAnthropicServer,
        _anthropic,
        "claude-sonnet-4-6",
        fake_anthropic.MessageReply(text="Hi.", model="claude-sonnet-4-6-20260101"),
        "anthropic",
        "msg_",
        "claude-sonnet-4-6-20260101",
    ),
    "bedrock": Case(
        fake_anthropic.FakeAnthropicServer,
        _bedrock,
        "us.anthropic.claude-sonnet-4-6-20260101-v1:0",
        fake_anthropic.MessageReply(text="Hi."),
        "aws.bedrock",
        "msg_bdrk_",
        "claude-sonnet-4-6-20260101",
    ),
    "vertex": Case(
        fake_anthropic.FakeAnthropicServer,
        _vertex,
        "claude-sonnet-4-6@20260101",
        fake_anthropic.MessageReply(text="Hi."),
        "gcp.vertex_ai",
        "msg_vrtx_",
        "claude-sonnet-4-6-20260101",
    ),
    "openai-chat": Case(
        fake_openai.FakeOpenAIServer,
        _openai("chat"),
        "gpt-4o",
        fake_openai.Reply(text="Hi.", model="gpt-4o-2024-08-06"),
        "openai",
        "chatcmpl-",
        "gpt-4o-2024-08-06",
    ),
    "openai-responses": Case(
        fake_openai.FakeOpenAIServer,
        _openai("responses"),
        "gpt-4o",
        fake_openai.Reply(text="Hi.", model="gpt-4o-2024-08-06"),
        "openai",
        "resp_",
        "gpt-4o-2024-08-06",
    ),
    "azure-chat": Case(
        fake_openai.FakeOpenAIServer,
        _azure("chat"),
        "my-gpt4o-deployment",
        fake_openai.Reply(text="Hi.", model="gpt-4o-2024-11-20"),
        "azure.ai.openai",
        "chatcmpl-",
        "gpt-4o-2024-11-20",
    ),
    "azure-responses": Case(
        fake_openai.FakeOpenAIServer,
        _azure("responses"),
        "my-gpt4o-deployment",
        fake_openai.Reply(text="Hi.", model="gpt-4o-2024-11-20"),
        "azure.ai.openai",
        "resp_",
        "gpt-4o-2024-11-20",
    ),
    "vllm": Case(
        fake_openai.FakeOpenAIServer,
        _openai("chat", "vllm"),
        "Qwen/Qwen3-8B",
        fake_openai.Reply(text="Hi."),
        "vllm",
        "chatcmpl-",
        "Qwen/Qwen3-8B",
    ),
}


@dataclass
class Seen:
    spans: list[ReadableSpan]
    points: list[Any]
    path: str


def turn(case: Case, *, streamed: bool) -> Seen:
    """One turn of a new conversation through ``case``'s client, sent or streamed."""
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    with case.server() as server:
        server.enqueue(case.reply)

        async def main() -> None:
            client, llm = case.adapter(server.origin)
            async with client:
                runtime = Runtime(
                    store=MemoryStore(),
                    llm=llm,
                    tracer_provider=tracing,
                    meter_provider=MeterProvider(metric_readers=[reader]),
                )
                async with runtime as rt:
                    conversation = await rt.create_conversation(
                        model=case.model, context_window=100_000
                    )
                    if streamed:
                        async for _ in rt.stream(conversation.id, "Hello"):
                            pass
                    else:
                        await rt.send(conversation.id, "Hello")

        asyncio.run(main())
        (asked,) = [r for r in server.requests if r.method == "POST"]
    data = reader.get_metrics_data()
    assert data is not None
    points = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "gen_ai.client.operation.duration"
        for point in metric.data.data_points
    ]
    return Seen(list(exporter.get_finished_spans()), points, asked.path)


@pytest.mark.parametrize("streamed", [False, True], ids=["sent", "streamed"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_inference_span_names_the_provider_the_response_and_the_served_model(
    name: str, streamed: bool
) -> None:
    case = CASES[name]
    seen = turn(case, streamed=streamed)
    (span,) = [s for s in seen.spans if s.name.startswith("chat ")]
    said = dict(span.attributes or {})
    assert said["gen_ai.provider.name"] == case.provider
    assert said["gen_ai.request.model"] == case.model
    assert said["gen_ai.response.model"] == case.served
    response_id = said["gen_ai.response.id"]
    assert isinstance(response_id, str)
    assert response_id.startswith(case.id_prefix)
    assert len(response_id) > len(case.id_prefix)
    (point,) = seen.points
    assert point.attributes["gen_ai.provider.name"] == case.provider
    # A metric labels the model by segue's table (a bounded set of names), else "other".
    assert point.attributes["gen_ai.response.model"] == ModelLabels()(case.served)
    assert point.attributes["gen_ai.request.model"] == ModelLabels()(case.model)


def test_the_azure_client_went_through_azures_paths() -> None:
    """The Azure cases are Azure's requests, not OpenAI's under another name."""
    assert turn(CASES["azure-chat"], streamed=False).path.startswith(
        "/openai/deployments/my-gpt4o-deployment/chat/completions?api-version="
    )
    assert turn(CASES["azure-responses"], streamed=False).path.startswith(
        "/openai/responses?api-version="
    )


def test_a_blank_provider_name_is_refused() -> None:
    client = openai.AsyncOpenAI(api_key=KEY, base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="provider_name"):
        OpenAIModel(client, provider_name=" ")
    with pytest.raises(ValueError, match="provider_name"):
        AnthropicModel(anthropic.AsyncAnthropic(api_key=KEY), provider_name="")
    assert OpenAIModel(client).provider_name == "openai"
