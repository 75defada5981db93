"""What tracing costs a persisted step: segue with and without OpenTelemetry, in one run.

Run ``python bench/bench_telemetry.py [--quick]``. One conversation on a SQLite file (WAL,
``synchronous=NORMAL``, as segue opens it), a model that answers at once, ``Runtime.send`` per
turn (two persisted steps). Three runtimes take turns round by round, batch by batch, so a busy
machine weighs on each alike:

- **without the extra**: the runtime as it runs when ``opentelemetry`` is not installed (its
  observer is ``telemetry.NOTHING``);
- **API, no-op providers**: OpenTelemetry's API installed, no SDK configured (the global
  providers are the API's no-op ones): target at most 1% over the first;
- **SDK tracing**: the SDK's tracer provider with its batch span processor (what a deployment
  runs: spans are exported from a thread of its own) into an in-memory exporter (the metrics
  left to the API's no-op provider): target at most 10% over the first;
- **SDK tracing, 1 in 10 sampled**, for the reader: the same with the SDK's
  ``ParentBased(TraceIdRatioBased(0.1))`` sampler, as a busy deployment samples; a turn not
  sampled costs a non-recording span (a Python SDK span that records costs 15-25 µs of CPU, more
  than a tenth of a persisted step, so the 10% target cannot be met by recording every turn);
- **SDK metrics** and **SDK both**, for the reader: the SDK's meter provider with an in-memory
  reader, alone and with the tracing. The SDK's Python metrics cost 3-5 µs a measurement, and a
  turn records five (the occupancy, the model call's duration and its two token counts, the
  turn's duration), and the duration of one commit in ten (``store_metrics_rate``, 0.1);
- **..., each commit**: the same recording every commit's duration (``store_metrics_rate=1.0``,
  what segue did before the sample: the histogram was the largest single record of a turn);
- **SDK both, no exemplars**: both, with the SDK's exemplar filter off
  (``AlwaysOffExemplarFilter``): what the exemplars the SDK keeps by default cost.

It prints the CPU time of the process per persisted step (every thread of it: SQLite's
included), which other processes on a busy machine move far less than wall time, for each, the
median over rounds, and the ratios. A script that
prints a report: it exits 0 whatever the timings say (``--quick`` is too small to judge by).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
import unittest.mock
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased

from segue import Runtime, SqliteStore
from segue.executor.telemetry import NOTHING
from sides import MODEL, InstantModel

STEPS_PER_TURN = 2


def runtimes(directory: Path) -> dict[str, Runtime]:
    """The runtimes, each on its own SQLite file."""
    with unittest.mock.patch("segue.executor.runtime.for_settings", return_value=NOTHING):
        bare = Runtime(store=SqliteStore(directory / "bare.db"), llm=InstantModel())

    def traced(sampler: Sampler | None = None) -> TracerProvider:
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
        return provider

    def metered(*, exemplars: bool = True) -> MeterProvider:
        if exemplars:
            return MeterProvider(metric_readers=[InMemoryMetricReader()])
        off = AlwaysOffExemplarFilter()
        return MeterProvider(metric_readers=[InMemoryMetricReader()], exemplar_filter=off)

    def on(name: str, **providers: Any) -> Runtime:
        return Runtime(store=SqliteStore(directory / name), llm=InstantModel(), **providers)

    return {
        "without the extra": bare,
        "API, no-op providers": on("noop.db"),
        "SDK tracing": on("tracing.db", tracer_provider=traced()),
        "SDK tracing, 1 in 10": on(
            "sampled.db", tracer_provider=traced(ParentBased(TraceIdRatioBased(0.1)))
        ),
        "SDK metrics": on("metrics.db", meter_provider=metered()),
        "SDK metrics, each commit": on(
            "metrics-each.db", meter_provider=metered(), store_metrics_rate=1.0
        ),
        "SDK both": on("both.db", tracer_provider=traced(), meter_provider=metered()),
        "SDK both, each commit": on(
            "both-each.db",
            tracer_provider=traced(),
            meter_provider=metered(),
            store_metrics_rate=1.0,
        ),
        "SDK both, no exemplars": on(
            "both-plain.db", tracer_provider=traced(), meter_provider=metered(exemplars=False)
        ),
    }


async def batch(rt: Runtime, turns: int) -> float:
    """CPU seconds per persisted step over ``turns`` turns of a new conversation."""
    cid = (await rt.create_conversation(model=MODEL)).id
    await rt.send(cid, "Warm up.")
    gc.disable()
    try:
        start = time.process_time()
        for index in range(turns):
            await rt.send(cid, f"Message {index}.")
        return (time.process_time() - start) / (turns * STEPS_PER_TURN)
    finally:
        gc.enable()


async def measure(rounds: int, turns: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as folder:
        sides = runtimes(Path(folder))
        seen: dict[str, list[float]] = {name: [] for name in sides}
        try:
            for number in range(rounds):
                order = list(sides.items())
                if number % 2:
                    order.reverse()
                for name, rt in order:
                    seen[name].append(await batch(rt, turns))
        finally:
            for rt in sides.values():
                await rt.close()
        return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run for the smoke test")
    parser.add_argument("--rounds", type=int, default=None)
    arguments = parser.parse_args()
    rounds = arguments.rounds or (3 if arguments.quick else 15)
    turns = 20 if arguments.quick else 400
    seen = asyncio.run(measure(rounds, turns))
    print(f"tracing overhead per persisted step, SQLite, {rounds} rounds of {turns} turns")
    targets = {"API, no-op providers": 1.01, "SDK tracing": 1.10}
    for name, figures in seen.items():
        line = f"  {name:24} {statistics.median(figures) * 1e6:8.1f} us of CPU/step"
        if name != "without the extra":
            ratios = [a / b for a, b in zip(figures, seen["without the extra"], strict=True)]
            ratio = statistics.median(ratios)
            line += f"   {ratio:5.3f}x (median of the rounds' ratios"
            if name in targets:
                met = "met" if ratio <= targets[name] else "missed"
                line += f"; target <= {targets[name]:.2f}x: {met}"
            line += ")"
        print(line)


if __name__ == "__main__":
    main()
