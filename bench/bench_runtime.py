"""Runtime benchmarks: what ``Runtime`` itself costs per event, per commit and per conversation.

Run ``python bench/bench_runtime.py [--quick]``. The model answers at once (``InstantModel``: a
fixed reply with usage), so everything measured is the runtime's own work: the core's
``transition()``, the commit, the outbox loop, building the request, logging. Each ``send`` is
two committed events (the user message, then the response).

- Overhead: microseconds per event through ``Runtime.send`` on ``MemoryStore``; target <= 100.
- Streaming support: what it adds to the per-event overhead of ``send`` (nobody watching), against
  the same runtime with its update bus replaced by one that never listens, in the same run,
  interleaved; target: at most 10%. The time from calling ``stream()`` to the first text delta;
  target < 2 ms. And, for information, a turn streamed (every update consumed) against the same
  turn sent: with an instant model and an in-memory store ``send`` never yields to the event loop,
  while a streamed turn runs in its own task and wakes its consumer, so this ratio is the most
  streaming can cost; with any real I/O the two come close.
- Adapter streaming: what reading one streamed reply costs ``OpenAIModel`` (Chat Completions
  and Responses) per text delta, against ``AnthropicModel``'s, in the same run, interleaved:
  each adapter over its real client, a local fake server sending the same reply as one prepared
  body of server-sent events (so the server costs the same and nothing), ``on_text`` called per
  delta; target: OpenAI within 1.10x of Anthropic.
- Throughput: committed transitions per second through ``Runtime.send`` on ``SqliteStore`` (a
  real file, WAL); target >= 3,000/s. And, for information, the same with 100 conversations
  sending at once (where commits queued together share a transaction); run this script with
  ``PYTHONPATH=<an older checkout>/src`` to compare with that code on the same machine.
- Growth: the cost per event with 10 messages in the conversation and with 10,000 (1,000 with
  ``--quick``), on both stores; target: within 1.5x.
- Idle conversations: memory held by 10,000 conversations (1,000 with ``--quick``, scaled to
  10,000) that each had one exchange, on both stores; target <= 100 MB. Measured with
  ``tracemalloc`` (Python allocations: runtime, store objects, the SQLite driver's Python side),
  with the process's RSS growth printed beside it (it also counts SQLite's page cache).

Logging is as an embedding application leaves it by default (not configured: the ``segue``
logger's events are dropped before anything is built); what rendering them costs depends on the
deployment's logging setup, not on segue. The best of
several timed batches is reported, which filters out a busy machine's pauses. Prints PASS/FAIL
per target; the full run exits 1 if any target is missed, while ``--quick`` (a smoke run whose
sizes are too small to judge by) exits 0 whenever it completes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
import sys
import tempfile
import time
import tracemalloc
import unittest.mock
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from segue import Message, Usage
from segue.executor.bus import UpdateBus
from segue.executor.model_port import LlmReply, LlmRequest
from segue.executor.runtime import Runtime
from segue.executor.store_port import Store
from segue.executor.stores.memory import MemoryStore
from segue.executor.stores.sqlite import SqliteStore

MODEL = "claude-sonnet-4-5"  # 200k window; the instant model's usage stays far below it
OVERHEAD_TARGET_US = 100.0
STREAM_OVERHEAD_TARGET = 1.10
FIRST_TEXT_TARGET_MS = 2.0
THROUGHPUT_TARGET = 3_000.0
GROWTH_TARGET = 1.5
MEMORY_TARGET_MB = 100.0
ADAPTER_TARGET = 1.10
ADAPTER_DELTAS = 400
SMALL = 10
IDLE_TARGET_COUNT = 10_000
EVENTS_PER_SEND = 2
REPLY = LlmReply(
    text="Noted.",
    usage=Usage(input_tokens=40, output_tokens=5, cache_read_input_tokens=1_000),
)


class InstantModel:
    """An ``LlmModel`` that answers every request at once with the same reply."""

    exact_preflight = False

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: LlmRequest) -> LlmReply:
        on_text = request.on_text
        self.calls += 1
        if on_text is not None:
            on_text(REPLY.text)  # the whole reply as one delta: a model that answers at once
        return REPLY

    async def context_window(self, model: str) -> int | None:
        return None  # the static table's window

    async def count_tokens(self, request: LlmRequest) -> int | None:
        return None


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each measurement does (``--quick`` shrinks everything)."""

    overhead_sends: int
    batches: int
    throughput_sends: int
    large: int
    growth_sends: int
    idle: int
    adapter_rounds: int


FULL = Sizes(
    overhead_sends=2_000,
    batches=7,
    throughput_sends=1_000,
    large=10_000,
    growth_sends=200,
    idle=IDLE_TARGET_COUNT,
    adapter_rounds=15,
)
QUICK = Sizes(
    overhead_sends=200,
    batches=3,
    throughput_sends=100,
    large=1_000,
    growth_sends=50,
    idle=1_000,
    adapter_rounds=3,
)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


async def timed_sends(rt: Runtime, conversation_id: str, sends: int) -> float:
    """Seconds per event for ``sends`` sends to one conversation."""
    start = time.perf_counter()
    for index in range(sends):
        await rt.send(conversation_id, f"Message {index}.")
    return (time.perf_counter() - start) / (sends * EVENTS_PER_SEND)


async def overhead(sizes: Sizes) -> float:
    """Best seconds per event on ``MemoryStore``, on short conversations (10 to 100 messages)."""
    best = float("inf")
    async with Runtime(store=MemoryStore(), llm=InstantModel()) as rt:
        for _ in range(sizes.batches):
            ids = [(await rt.create_conversation(model=MODEL)).id for _ in range(40)]
            per_conversation = max(1, sizes.overhead_sends // len(ids))
            start = time.perf_counter()
            for cid in ids:
                for index in range(per_conversation):
                    await rt.send(cid, f"Message {index}.")
            elapsed = time.perf_counter() - start
            best = min(best, elapsed / (len(ids) * per_conversation * EVENTS_PER_SEND))
    return best


class _DeafBus(UpdateBus):
    """An update bus that never listens: the runtime as if it had no streaming support."""

    def listening(self, conversation_id: str) -> bool:
        return False

    def text_sink(self, conversation_id: str) -> Any:
        return None

    def settle(self, conversation_id: str, stored_text: str) -> None:
        return None


async def streaming_support(sizes: Sizes) -> tuple[float, float]:
    """Best seconds per event through ``send`` with the real bus and with a deaf one."""
    best = {True: float("inf"), False: float("inf")}
    with unittest.mock.patch("segue.executor.runtime.UpdateBus", _DeafBus):  # the reference
        deaf = Runtime(store=MemoryStore(), llm=InstantModel())
    runtimes = {True: Runtime(store=MemoryStore(), llm=InstantModel()), False: deaf}
    for batch in range(sizes.batches * 2):
        real = batch % 2 == 0
        rt = runtimes[real]
        ids = [(await rt.create_conversation(model=MODEL)).id for _ in range(40)]
        per_conversation = max(1, sizes.overhead_sends // len(ids))
        start = time.perf_counter()
        for cid in ids:
            for index in range(per_conversation):
                await rt.send(cid, f"Message {index}.")
        elapsed = time.perf_counter() - start
        best[real] = min(best[real], elapsed / (len(ids) * per_conversation * EVENTS_PER_SEND))
    for rt in runtimes.values():
        await rt.close()
    return best[True], best[False]


async def streamed_versus_sent(sizes: Sizes) -> tuple[float, float]:
    """Best seconds per event through ``stream`` (consuming every update) and through ``send``,
    batch by batch in the same runtime, alternating which goes first."""
    best_stream = best_send = float("inf")
    async with Runtime(store=MemoryStore(), llm=InstantModel()) as rt:
        for batch in range(sizes.batches * 2):
            ids = [(await rt.create_conversation(model=MODEL)).id for _ in range(40)]
            per_conversation = max(1, sizes.overhead_sends // len(ids))
            events = len(ids) * per_conversation * EVENTS_PER_SEND
            streaming = batch % 2 == 0
            start = time.perf_counter()
            for cid in ids:
                for index in range(per_conversation):
                    if streaming:
                        async for _update in rt.stream(cid, f"Message {index}."):
                            pass
                    else:
                        await rt.send(cid, f"Message {index}.")
            per_event = (time.perf_counter() - start) / events
            if streaming:
                best_stream = min(best_stream, per_event)
            else:
                best_send = min(best_send, per_event)
    return best_stream, best_send


async def first_text(sizes: Sizes) -> float:
    """Best seconds from calling ``stream()`` to holding the first text delta."""
    best = float("inf")
    async with Runtime(store=MemoryStore(), llm=InstantModel()) as rt:
        cid = (await rt.create_conversation(model=MODEL)).id
        for index in range(sizes.overhead_sends // 4):
            start = time.perf_counter()
            async for update in rt.stream(cid, f"Message {index}."):
                if update.kind == "text":
                    best = min(best, time.perf_counter() - start)
    return best


async def committed_transitions(store: Store, ids: list[str]) -> int:
    """How many transitions the store holds for ``ids`` (read back, not counted by the bench)."""
    total = 0
    for cid in ids:
        total += len(await store.transitions(cid))
    return total


async def throughput(path: Path, sizes: Sizes) -> float:
    """Committed transitions per second through ``Runtime.send`` on ``SqliteStore``."""
    store = SqliteStore(path)
    async with Runtime(store=store, llm=InstantModel()) as rt:
        ids = [(await rt.create_conversation(model=MODEL)).id for _ in range(10)]
        for cid in ids:
            await rt.send(cid, "Warm up.")
        best = 0.0
        for _ in range(sizes.batches):
            before = await committed_transitions(store, ids)
            start = time.perf_counter()
            for index in range(sizes.throughput_sends // len(ids)):
                for cid in ids:
                    await rt.send(cid, f"Message {index}.")
            elapsed = time.perf_counter() - start
            committed = await committed_transitions(store, ids) - before
            best = max(best, committed / elapsed)
    return best


CONCURRENT = 100


async def concurrent_throughput(path: Path, sizes: Sizes) -> float:
    """Committed transitions per second with ``CONCURRENT`` conversations sending at once
    through one ``Runtime`` on ``SqliteStore`` (a chat backend's busy minute)."""
    store = SqliteStore(path)
    async with Runtime(store=store, llm=InstantModel()) as rt:
        ids = [(await rt.create_conversation(model=MODEL)).id for _ in range(CONCURRENT)]
        await asyncio.gather(*(rt.send(cid, "Warm up.") for cid in ids))
        rounds = max(2, sizes.throughput_sends // CONCURRENT)
        best = 0.0
        for _ in range(sizes.batches):
            before = await committed_transitions(store, ids)
            start = time.perf_counter()

            async def talk(cid: str) -> None:
                for index in range(rounds):
                    await rt.send(cid, f"Message {index}.")

            await asyncio.gather(*(talk(cid) for cid in ids))
            elapsed = time.perf_counter() - start
            committed = await committed_transitions(store, ids) - before
            best = max(best, committed / elapsed)
    return best


async def growth(make: Callable[[], Store], sizes: Sizes) -> tuple[float, float, int]:
    """Best seconds per event near ``SMALL`` messages and near ``sizes.large``; final count."""
    async with Runtime(store=make(), llm=InstantModel()) as rt:
        small = float("inf")
        for _ in range(sizes.batches):  # a fresh conversation per batch: always near SMALL
            cid = (await rt.create_conversation(model=MODEL)).id
            await timed_sends(rt, cid, SMALL // EVENTS_PER_SEND)
            small = min(small, await timed_sends(rt, cid, sizes.growth_sends // 10))
        cid = (await rt.create_conversation(model=MODEL)).id
        await timed_sends(rt, cid, sizes.large // EVENTS_PER_SEND)
        large = float("inf")
        for _ in range(sizes.batches):
            large = min(large, await timed_sends(rt, cid, sizes.growth_sends // 10))
        messages = len(await rt.messages(cid))
    return small, large, messages


async def adapter_streaming(sizes: Sizes) -> dict[str, float]:
    """Best seconds per text delta of one streamed reply read by each adapter (see the module
    docstring): the reply is recorded once from each fake server, then served as those bytes."""
    import anthropic  # noqa: PLC0415  # only this measurement needs the clients
    import httpx2  # noqa: PLC0415
    import openai  # noqa: PLC0415

    from segue.executor.models.anthropic import AnthropicModel  # noqa: PLC0415
    from segue.executor.models.openai import OpenAIModel  # noqa: PLC0415
    from segue.testing import anthropic_server, openai_server  # noqa: PLC0415

    text = "word " * ADAPTER_DELTAS
    request = LlmRequest(
        conversation_id="bench",
        model="gpt-4o",
        purpose="turn",
        system=None,
        messages=(Message(kind="user", text="Go on."),),
    )
    fake_a = anthropic_server.FakeAnthropicServer(
        default=anthropic_server.MessageReply(text=text, pieces=ADAPTER_DELTAS)
    )
    fake_o = openai_server.FakeOpenAIServer(
        default=openai_server.Reply(text=text, pieces=ADAPTER_DELTAS)
    )
    with fake_a, fake_o:
        bodies: dict[str, tuple[Any, str, dict[str, Any]]] = {
            "anthropic": (fake_a, f"{fake_a.url}/v1/messages", {"max_tokens": 10}),
            "openai-chat": (fake_o, f"{fake_o.url}/chat/completions", {"messages": []}),
            "openai-responses": (fake_o, f"{fake_o.url}/responses", {"input": []}),
        }
        recorded: dict[str, bytes] = {}
        for name, (_fake, url, extra) in bodies.items():
            payload = {"model": "m", "messages": [], "stream": True, **extra}
            payload["stream_options"] = {"include_usage": True}
            recorded[name] = httpx2.post(url, json=payload, timeout=30).content
        async with (
            anthropic.AsyncAnthropic(api_key="k", base_url=fake_a.url, max_retries=0) as a,
            openai.AsyncOpenAI(api_key="k", base_url=fake_o.url, max_retries=0) as o,
        ):
            models: dict[str, Any] = {
                "anthropic": AnthropicModel(a, prompt_caching=False),
                "openai-chat": OpenAIModel(o, api="chat"),
                "openai-responses": OpenAIModel(o, api="responses"),
            }
            best = dict.fromkeys(models, float("inf"))
            for _ in range(sizes.adapter_rounds):
                for name, model in models.items():
                    fake = bodies[name][0]
                    fake.default = _raw(fake, recorded[name])
                    deltas: list[str] = []
                    started = time.perf_counter()
                    reply = await model.complete(
                        dataclasses.replace(request, on_text=deltas.append)
                    )
                    elapsed = time.perf_counter() - started
                    assert reply.text == text, name
                    best[name] = min(best[name], elapsed / len(deltas))
    return best


def _raw(fake: Any, body: bytes) -> Any:
    """The fake's own ``RawReply`` holding a recorded event stream."""
    module = sys.modules[type(fake).__module__]
    return module.RawReply(status=200, body=body, content_type="text/event-stream")


def rss_bytes() -> int:
    """The process's resident set size now (Linux ``/proc``; 0 where unavailable)."""
    try:
        fields = Path("/proc/self/statm").read_text(encoding="ascii").split()
    except OSError:
        return 0
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")


async def idle_memory(make: Callable[[], Store], count: int) -> tuple[float, float]:
    """Bytes per idle conversation: (tracemalloc growth, RSS growth), each divided by count."""
    gc.collect()
    rss_before = rss_bytes()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        rt = Runtime(store=make(), llm=InstantModel())
        await rt.__aenter__()
        try:
            for index in range(count):
                conv = await rt.create_conversation(model=MODEL)
                await rt.send(conv.id, f"Hello number {index}.")
            gc.collect()
            after, _ = tracemalloc.get_traced_memory()
            rss_after = rss_bytes()
            assert len(await rt.store.list_conversations()) == count
        finally:
            await rt.__aexit__(None, None, None)
    finally:
        tracemalloc.stop()
    return (after - before) / count, (rss_after - rss_before) / count


async def main(quick: bool) -> int:
    sizes = QUICK if quick else FULL
    failures = 0
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    busy = ": the machine is busy, timings are pessimistic" if load > cpus * 0.75 else ""
    print(f"load average {load:.2f} on {cpus} CPUs{busy}")
    with tempfile.TemporaryDirectory() as tmp:
        counter = iter(range(1_000))

        def sqlite() -> Store:
            return SqliteStore(Path(tmp) / f"bench-{next(counter)}.db")

        per_event = await overhead(sizes)
        ok = per_event * 1e6 <= OVERHEAD_TARGET_US
        failures += not ok
        print(
            f"Runtime overhead (MemoryStore, instant model): {per_event * 1e6:,.1f} us/event "
            f"(target <= {OVERHEAD_TARGET_US:,.0f}) {verdict(ok)}"
        )

        supported, deaf = await streaming_support(sizes)
        ratio = supported / deaf
        ok = ratio <= STREAM_OVERHEAD_TARGET
        failures += not ok
        print(
            f"Streaming support on send() (MemoryStore): {supported * 1e6:,.1f} us/event, "
            f"{deaf * 1e6:,.1f} without it: {ratio:.2f}x "
            f"(target <= {STREAM_OVERHEAD_TARGET:.2f}x) {verdict(ok)}"
        )
        latency = await first_text(sizes)
        ok = latency * 1e3 < FIRST_TEXT_TARGET_MS
        failures += not ok
        print(
            f"Time to first text delta (MemoryStore, instant model): {latency * 1e3:,.3f} ms "
            f"(target < {FIRST_TEXT_TARGET_MS:g} ms) {verdict(ok)}"
        )
        streamed, sent = await streamed_versus_sent(sizes)
        print(
            f"A streamed turn (MemoryStore, instant model, for information): "
            f"{streamed * 1e6:,.1f} us/event through stream(), {sent * 1e6:,.1f} through "
            f"send(): {streamed / sent:.2f}x"
        )

        costs = await adapter_streaming(sizes)
        reference = costs["anthropic"]
        for name in ("openai-chat", "openai-responses"):
            ratio = costs[name] / reference
            ok = ratio <= ADAPTER_TARGET
            failures += not ok
            print(
                f"Adapter streaming ({name} against anthropic): {costs[name] * 1e6:,.1f} "
                f"us/delta, {reference * 1e6:,.1f} us/delta: {ratio:.2f}x "
                f"(target <= {ADAPTER_TARGET:.2f}x) {verdict(ok)}"
            )

        rate = await throughput(Path(tmp) / "throughput.db", sizes)
        ok = rate >= THROUGHPUT_TARGET
        failures += not ok
        print(
            f"Runtime throughput (SqliteStore): {rate:,.0f} committed transitions/s "
            f"(target >= {THROUGHPUT_TARGET:,.0f}) {verdict(ok)}"
        )

        rate = await concurrent_throughput(Path(tmp) / "concurrent.db", sizes)
        print(
            f"Runtime throughput, {CONCURRENT} conversations at once (SqliteStore, for "
            f"information): {rate:,.0f} committed transitions/s"
        )

        for name, make in (("MemoryStore", MemoryStore), ("SqliteStore", sqlite)):
            small, large, messages = await growth(make, sizes)
            ratio = large / small
            ok = ratio <= GROWTH_TARGET
            failures += not ok
            print(
                f"Runtime growth ({name}): {small * 1e6:,.1f} us/event at ~{SMALL} messages, "
                f"{large * 1e6:,.1f} us/event at {messages:,} messages: {ratio:.2f}x "
                f"(target <= {GROWTH_TARGET}x) {verdict(ok)}"
            )

        scale = IDLE_TARGET_COUNT / sizes.idle
        for name, make in (("MemoryStore", MemoryStore), ("SqliteStore", sqlite)):
            traced, rss = await idle_memory(make, sizes.idle)
            projected = traced * IDLE_TARGET_COUNT / 1e6
            ok = projected <= MEMORY_TARGET_MB
            failures += not ok
            measured = f"{sizes.idle:,} measured, x{scale:g}" if scale != 1 else "measured"
            print(
                f"Idle conversations ({name}): {projected:,.1f} MB for "
                f"{IDLE_TARGET_COUNT:,} ({measured}; {traced / 1e3:,.1f} kB each, "
                f"RSS growth {rss * IDLE_TARGET_COUNT / 1e6:,.1f} MB) "
                f"(target <= {MEMORY_TARGET_MB:,.0f} MB) {verdict(ok)}"
            )
    return 1 if failures and not quick else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (CI smoke run)")
    sys.exit(asyncio.run(main(parser.parse_args().quick)))
