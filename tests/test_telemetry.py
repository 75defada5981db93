"""segue seen through OpenTelemetry: the spans and metrics an operator reads, checked with the
SDK's in-memory exporter and metric reader (issue: traces and metrics in production).

Every attribute the GenAI conventions name is read off a real span the runtime made while it
ran a real turn, never off a mock of segue's own parts.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from segue import (
    ContextExhaustionBehavior,
    LlmCallError,
    LlmReply,
    MemoryStore,
    Runtime,
    ScriptedModel,
    Tool,
    ToolCall,
    Usage,
)
from segue.testing.logs import capture_logs

MODEL = "claude-sonnet-4-5"
WINDOW = 10_000


@dataclass
class Seen:
    """What one runtime emitted: its finished spans and its metrics' data points."""

    spans: InMemorySpanExporter
    reader: InMemoryMetricReader

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name.startswith(prefix)]

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        found = []
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for each in scope.metrics:
                    if each.name == metric:
                        found += list(each.data.data_points)
        return found


@pytest.fixture
def seen() -> Seen:
    return Seen(InMemorySpanExporter(), InMemoryMetricReader())


def runtime(seen: Seen, llm: Any, **settings: Any) -> Runtime:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(seen.spans))
    return Runtime(
        store=MemoryStore(),
        llm=llm,
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[seen.reader]),
        **settings,
    )


async def lookup(arguments: dict[str, Any]) -> str:
    return f"found {arguments.get('query', '')}"


LOOKUP = Tool(
    name="lookup", description="Look up.", input_schema={"type": "object"}, function=lookup
)


def test_a_turn_with_a_tool_is_a_turn_span_over_two_inference_spans_and_a_tool_span(
    seen: Seen,
) -> None:
    usage = Usage(
        input_tokens=100, cache_read_input_tokens=2_000, cache_creation_input_tokens=300,
        output_tokens=40,
    )  # fmt: skip
    script = [
        LlmReply(
            tool_calls=(ToolCall(id="t1", name="lookup", input={"query": "tides"}),),
            usage=usage,
            stop_reason="tool_use",
            response_id="msg_1",
            response_model="claude-sonnet-4-5-20250929",
        ),
        LlmReply(text="High tide at noon.", usage=usage),
    ]

    async def main() -> str:
        llm = ScriptedModel(script)
        async with runtime(seen, llm, tools=[LOOKUP], store_metrics_rate=1.0) as rt:
            conv = await rt.create_conversation(model=MODEL, context_window=WINDOW)
            await rt.send(conv.id, "When is high tide?")
            return conv.id

    cid = asyncio.run(main())
    (turn,) = seen.named("segue.turn")
    calls = seen.named("chat ")
    (tool,) = seen.named("execute_tool")
    assert [c.name for c in calls] == [f"chat {MODEL}"] * 2
    assert all(c.parent is not None and c.parent.span_id == turn.context.span_id for c in calls)
    assert tool.parent is not None
    assert tool.parent.span_id == turn.context.span_id
    first = dict(calls[0].attributes or {})
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.request.model"] == MODEL
    assert first["gen_ai.response.model"] == "claude-sonnet-4-5-20250929"
    assert first["gen_ai.response.id"] == "msg_1"
    assert first["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert first["gen_ai.conversation.id"] == cid
    assert first["segue.purpose"] == "turn"
    # The conventions count the cached part as input; Anthropic's input_tokens does not.
    assert first["gen_ai.usage.input_tokens"] == 2_400
    assert first["gen_ai.usage.output_tokens"] == 40
    assert first["gen_ai.usage.cache_read.input_tokens"] == 2_000
    assert first["gen_ai.usage.cache_creation.input_tokens"] == 300
    assert "gen_ai.input.messages" not in first  # no content unless asked
    assert dict(tool.attributes or {})["gen_ai.tool.name"] == "lookup"
    assert dict(tool.attributes or {})["gen_ai.tool.call.id"] == "t1"
    ended = dict(turn.attributes or {})
    assert (ended["segue.phase.start"], ended["segue.phase.end"]) == ("idle", "idle")
    assert ended["segue.occupancy.after"] == pytest.approx(usage.context_tokens / WINDOW)
    assert ended["segue.behavior"] == "threshold_based_continuation"
    tokens: dict[str, int] = {}
    for point in seen.points("gen_ai.client.token.usage"):
        kind = str(point.attributes["gen_ai.token.type"])
        tokens[kind] = tokens.get(kind, 0) + point.sum
    assert tokens == {"input": 4_800, "output": 80}
    assert sum(p.count for p in seen.points("gen_ai.client.operation.duration")) == 2
    (occupancy,) = seen.points("segue.context.occupancy")
    assert occupancy.count == 2
    assert occupancy.max == pytest.approx(2_440 / WINDOW)
    assert sum(p.count for p in seen.points("segue.store.commit.duration")) >= 4
    (active,) = seen.points("segue.conversations.active")
    assert active.value == 0  # up, then down again


def test_content_goes_into_spans_only_when_asked(seen: Seen) -> None:
    async def main() -> None:
        async with runtime(seen, ScriptedModel(), capture_content=True) as rt:
            conv = await rt.create_conversation(model=MODEL, system="Be brief.")
            await rt.send(conv.id, "What is a tide?")

    asyncio.run(main())
    (call,) = seen.named("chat ")
    asked = json.loads(str(dict(call.attributes or {})["gen_ai.input.messages"]))
    assert asked[0] == {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]}
    assert asked[-1]["parts"][0]["content"] == "What is a tide?"
    answered = json.loads(str(dict(call.attributes or {})["gen_ai.output.messages"]))
    assert answered[0]["role"] == "assistant"


def test_a_failed_call_is_an_error_span_and_a_retry_an_event_and_a_count(seen: Seen) -> None:
    script: list[LlmReply | LlmCallError] = [
        LlmCallError("overloaded", retryable=True, status_code=529),
        LlmReply(text="Back."),
    ]

    async def main() -> None:
        async with runtime(seen, ScriptedModel(script), sleep=lambda _s: asyncio.sleep(0)) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.send(conv.id, "Hello?")

    asyncio.run(main())
    failed, answered = seen.named("chat ")
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert dict(failed.attributes or {})["error.type"] == "529"
    assert answered.status.status_code is trace.StatusCode.UNSET
    (turn,) = seen.named("segue.turn")
    (retry,) = [e for e in turn.events if e.name == "segue.retry"]
    assert dict(retry.attributes or {})["segue.request"] == "llm"
    delay = dict(retry.attributes or {})["segue.delay_seconds"]
    assert isinstance(delay, float)
    assert delay > 0
    retries = {p.attributes["segue.request"]: p.value for p in seen.points("segue.retries")}
    assert retries == {"llm": 1, "continuation": 0, "checkpoint": 0, "compaction": 0}
    durations = seen.points("gen_ai.client.operation.duration")
    errors = [p.attributes["error.type"] for p in durations if "error.type" in p.attributes]
    assert errors == ["529"]


def crossing(tokens: int) -> Usage:
    return Usage(input_tokens=tokens - 50, output_tokens=50)


@pytest.mark.parametrize(
    ("behavior", "outcome", "event"),
    [
        ("threshold_based_continuation", "summarised", "segue.exhausted"),
        ("compact_in_place", "compacted", "segue.compaction"),
        ("checkpoint_restart", "restarted", "segue.session"),
        ("intentionally_unhandled", "failed", None),
    ],
)
def test_each_behaviour_at_the_limit_is_counted_by_what_came_of_it(
    seen: Seen, behavior: str, outcome: str, event: str | None
) -> None:
    script = [
        LlmReply(text="Noted.", usage=crossing(8_200)),  # the warning
        LlmReply(text="Noted again.", usage=crossing(9_100)),  # the threshold
    ]

    async def main() -> None:
        model = ScriptedModel(script)
        async with runtime(seen, model) as rt:
            conv = await rt.create_conversation(
                model=MODEL, behavior=ContextExhaustionBehavior(behavior), context_window=WINDOW
            )
            await rt.send(conv.id, "One.")
            await rt.send(conv.id, "Two.")

    asyncio.run(main())
    (reached,) = seen.points("segue.limit.reached")
    assert dict(reached.attributes) == {"segue.behavior": behavior, "segue.outcome": outcome}
    assert reached.value == 1
    first, second = seen.named("segue.turn")
    assert [e.name for e in first.events] == ["segue.warning"]
    names = [e.name for e in second.events]
    if event is not None:
        assert "segue.limit" in names
        assert event in names
        (took,) = seen.points("segue.limit.duration")
        assert took.count == 1
    purposes = [dict(s.attributes or {})["segue.purpose"] for s in seen.named("chat ")]
    limit = {"summarised": "continuation", "compacted": "compaction", "restarted": "checkpoint"}
    if outcome in limit:
        assert limit[outcome] in purposes


def test_a_pause_is_an_event_of_its_turn(seen: Seen) -> None:
    async def main() -> None:
        async with runtime(seen, ScriptedModel()) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.pause(conv.id, "deploy window")

    asyncio.run(main())
    (turn,) = seen.named("segue.turn")
    (pause,) = [e for e in turn.events if e.name == "segue.pause"]
    assert dict(pause.attributes or {})["segue.reason"] == "deploy window"
    assert dict(turn.attributes or {})["segue.phase.end"] == "paused"


def test_a_refused_message_is_counted_by_its_cause(seen: Seen) -> None:
    async def main() -> None:
        async with runtime(seen, ScriptedModel()) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.pause(conv.id)
            with pytest.raises(Exception, match="paused"):
                await rt.send(conv.id, "Still there?")

    asyncio.run(main())
    refusals = {p.attributes["segue.cause"]: p.value for p in seen.points("segue.refusals")}
    assert refusals == {"paused": 1, "busy": 0, "too_large": 0, "exhausted": 0, "failed": 0}


def test_the_logs_of_a_traced_turn_carry_its_trace(seen: Seen) -> None:
    async def main() -> None:
        async with runtime(seen, ScriptedModel()) as rt:
            conv = await rt.create_conversation(model=MODEL)
            with capture_logs() as logs:
                await rt.send(conv.id, "Hello.")
        transitions = [e for e in logs if e["event"] == "transition"]
        assert transitions
        (turn,) = seen.named("segue.turn")
        assert {e.get("trace_id") for e in transitions} == {format(turn.context.trace_id, "032x")}

    asyncio.run(main())


def test_without_the_extra_nothing_of_opentelemetry_is_imported() -> None:
    """A run with OpenTelemetry absent (its imports refused, as if not installed) works and
    loads nothing of it."""
    code = """
import asyncio, importlib.abc, sys

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(name)
        return None

sys.meta_path.insert(0, Absent())
from segue import MemoryStore, Runtime, ScriptedModel

async def main():
    async with Runtime(store=MemoryStore(), llm=ScriptedModel()) as rt:
        conv = await rt.create_conversation(model="claude-sonnet-4-5")
        state = await rt.send(conv.id, "Hello.")
        assert state.phase.kind == "idle"

asyncio.run(main())
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    done = subprocess.run(  # noqa: S603  # this interpreter, a fixed program
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
    assert done.stderr == ""


def test_a_turn_the_sampler_leaves_out_leaves_its_calls_and_tools_out_and_keeps_its_metrics(
    seen: Seen,
) -> None:
    """Sampled one turn in two, by a sampler that samples every child span: the unsampled turn
    has no span at all, not an inference or tool span of a trace that was not kept (segue
    follows the turn's decision, as ``ParentBased`` samplers do); its metrics are recorded all
    the same."""
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

    class EveryOtherTurn(Sampler):
        def __init__(self) -> None:
            self.turns = 0

        def should_sample(self, parent_context: Any, *args: Any, **kwargs: Any) -> SamplingResult:
            parent = trace.get_current_span(parent_context).get_span_context()
            if parent.is_valid:  # a child is always sampled: segue leaves it out itself
                sampled = True
            else:
                self.turns += 1
                sampled = self.turns % 2 == 1
            return SamplingResult(Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP)

        def get_description(self) -> str:
            return "every other turn"

    script = [
        LlmReply(tool_calls=(ToolCall(id="t1", name="lookup", input={}),), stop_reason="tool_use"),
        LlmReply(text="First."),
        LlmReply(tool_calls=(ToolCall(id="t2", name="lookup", input={}),), stop_reason="tool_use"),
        LlmReply(text="Second."),
    ]
    provider = TracerProvider(sampler=EveryOtherTurn())
    provider.add_span_processor(SimpleSpanProcessor(seen.spans))

    async def main() -> None:
        rt = Runtime(
            store=MemoryStore(),
            llm=ScriptedModel(script),
            tools=[LOOKUP],
            tracer_provider=provider,
            meter_provider=MeterProvider(metric_readers=[seen.reader]),
        )
        async with rt:
            conv = await rt.create_conversation(model=MODEL, context_window=WINDOW)
            await rt.send(conv.id, "one")
            await rt.send(conv.id, "two")

    asyncio.run(main())
    names = sorted(span.name for span in seen.spans.get_finished_spans())
    assert names == [f"chat {MODEL}", f"chat {MODEL}", "execute_tool lookup", "segue.turn"]
    traces = {span.context.trace_id for span in seen.spans.get_finished_spans()}
    assert len(traces) == 1  # all of the sampled turn, none of the other
    assert sum(p.count for p in seen.points("segue.turn.duration")) == 2
    assert sum(p.count for p in seen.points("gen_ai.client.operation.duration")) == 4
