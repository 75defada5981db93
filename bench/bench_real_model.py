"""What a limit costs on a real model, and where a turn's time goes: segue against llama.cpp's
``llama-server`` serving SmolLM2-135M-Instruct (``segue.testing.llama_server`` finds both; see
its docstring, or README's "Try it with a real local model").

Run ``python bench/bench_real_model.py [--limits N] [--window W] [--threads T]``. One
``THRESHOLD_BASED_CONTINUATION`` conversation at a time talks to the server (2048-token context,
one slot) through ``OpenAIModel`` and the official ``openai`` client, replies bounded to 24
tokens and summaries to 48, a window of W tokens given so the limit comes in a few turns, and
goes on in its seeded child until N limits were reached. Reported:

- an ordinary turn: its wall time (``send`` to return), the server's own time (prompt and
  generation, from the deltas of its ``/metrics`` counters) and the rest (segue, the client,
  HTTP, the store), medians over every turn that did not reach the limit;
- a limit: the turn that reached it (its reply and the continuation summary) in wall time and
  server time, against an ordinary turn; the summary's tokens as the server billed them
  (prompt, of it read from the slot's cache, and written), medians over the limits.

No target: the figures depend on the machine (a shared one computes a token at a fraction of
the speed), so the report says what was measured; the bench exits 1 only if a limit ended
anywhere but in its read-only state.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field

from openai import AsyncOpenAI

from segue import ContextExhaustionBehavior, MemoryStore, OpenAIModel, Runtime
from segue.testing.llama_server import LlamaServer, missing

MODEL = "smollm2"
FILLER = (
    "The harbour's tide table lists the time and the height of each high and low water, "
    "and the pilot reads it before every passage through the narrow channel."
)


@dataclass
class Figures:
    """What the run measured, in seconds and tokens."""

    turn_wall: list[float] = field(default_factory=list)
    turn_server: list[float] = field(default_factory=list)
    limit_wall: list[float] = field(default_factory=list)
    limit_server: list[float] = field(default_factory=list)
    summary_prompt: list[int] = field(default_factory=list)
    summary_cached: list[int] = field(default_factory=list)
    summary_written: list[int] = field(default_factory=list)
    failed: int = 0


def server_seconds(server: LlamaServer) -> float:
    """Seconds the server spent on prompts and on generating, so far."""
    metrics = server.metrics()
    return metrics["prompt_seconds_total"] + metrics["tokens_predicted_seconds_total"]


async def run(server: LlamaServer, limits: int, window: int) -> Figures:
    figures = Figures()
    client = AsyncOpenAI(base_url=server.base_url, api_key="local", timeout=300)
    model = OpenAIModel(client, max_tokens=24, summary_max_tokens=48)
    try:
        async with Runtime(store=MemoryStore(), llm=model) as rt:
            current = await rt.create_conversation(
                model=MODEL,
                behavior=ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION,
                context_window=window,
                max_output_tokens=24,
            )
            number = 0
            while len(figures.limit_wall) < limits:
                number += 1
                before, started = server_seconds(server), time.perf_counter()
                state = await rt.send(current.id, f"Note {number}. {FILLER} Answer briefly.")
                wall = time.perf_counter() - started
                spent = server_seconds(server) - before
                if state.phase.kind == "idle":
                    figures.turn_wall.append(wall)
                    figures.turn_server.append(spent)
                    continue
                if state.phase.kind != "context_exhausted":
                    figures.failed += 1
                    break
                figures.limit_wall.append(wall)
                figures.limit_server.append(spent)
                summary = (await rt.usage(current.id)).by_purpose["continuation"]
                figures.summary_prompt.append(
                    summary.input_tokens + summary.cache_read_input_tokens
                )
                figures.summary_cached.append(summary.cache_read_input_tokens)
                figures.summary_written.append(summary.output_tokens)
                current = await rt.start_new_from(current.id)
    finally:
        await client.close()
    return figures


def median(values: list[float] | list[int]) -> float:
    return statistics.median(values) if values else float("nan")


def report(figures: Figures, *, window: int, threads: int) -> None:
    turn_wall, turn_server = median(figures.turn_wall), median(figures.turn_server)
    limit_wall, limit_server = median(figures.limit_wall), median(figures.limit_server)
    print(f"SmolLM2-135M-Instruct on llama-server, {threads} thread(s), window {window} given")
    print(
        f"ordinary turn ({len(figures.turn_wall)}): {turn_wall * 1000:,.0f} ms wall = "
        f"{turn_server * 1000:,.0f} ms server + {(turn_wall - turn_server) * 1000:,.0f} ms "
        "segue, client and HTTP"
    )
    print(
        f"turn reaching the limit ({len(figures.limit_wall)}): {limit_wall * 1000:,.0f} ms wall "
        f"({limit_server * 1000:,.0f} ms server), {limit_wall / turn_wall:.1f}x an ordinary turn"
    )
    print(
        f"continuation summary: {median(figures.summary_prompt):,.0f} prompt tokens "
        f"({median(figures.summary_cached):,.0f} read from the slot's cache), "
        f"{median(figures.summary_written):,.0f} written"
    )
    verdict = "PASS" if figures.failed == 0 else "FAIL"
    print(f"every limit ended read-only, never failed: {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", type=int, default=3, help="limits to reach (default 3)")
    parser.add_argument("--window", type=int, default=1_024, help="window given (default 1,024)")
    parser.add_argument("--threads", type=int, default=2, help="server threads (default 2)")
    args = parser.parse_args()
    reason = missing()
    if reason is not None:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    with LlamaServer(context=2048, threads=args.threads) as server:
        figures = asyncio.run(run(server, args.limits, args.window))
    report(figures, window=args.window, threads=args.threads)
    return 1 if figures.failed else 0


if __name__ == "__main__":
    sys.exit(main())
