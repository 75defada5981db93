"""What a long conversation costs: segue against LangChain v1's agent, on one fake Anthropic
server that bills prompt caching by the provider's documented rules.

The money in a long conversation is tokens. One conversation of ``--turns`` turns (a tool
called every third turn) crosses the limit of a ``--window``-token window several times,
through:

- **segue**, one run per behaviour that keeps going: ``COMPACT_IN_PLACE``,
  ``CHECKPOINT_RESTART``, and ``THRESHOLD_BASED_CONTINUATION`` continued each time in a child
  seeded with the summary (``start_new_from``); ``AnthropicModel`` on a ``SqliteStore``. Each
  runs twice, once per ``summary_request``: ``tool_less`` (the default: the turn's tools and
  system prompt with ``tool_choice`` none, REQ-SEG-047) and ``reuse_prefix`` (the turn's
  request repeated with the instruction appended, REQ-SEG-055).
- **LangChain v1**: ``create_agent`` with ``SummarizationMiddleware`` and
  ``AnthropicPromptCachingMiddleware`` on a ``SqliteSaver`` through ``langchain-anthropic``,
  configured alike (the same trigger at 90% of the window, 20 messages kept, segue's token
  estimate as its counter, the whole older history summarised), and with its own defaults
  (``count_tokens_approximately``, the summary's input trimmed to 4,000 tokens) for the reader.

Both sides talk to the same fake (``segue.testing.anthropic_server``), which answers by what it
is asked (a tool call on every third question, a summary to any request with no callable tool
or ending with one of segue's instructions at the limit) and counts usage with segue's
estimate. Every third summary request whose tools are callable is answered with a tool call, as
a model that calls a tool while summarising would: segue refuses it and asks again
(REQ-SEG-056), and the bill counts both answers. Printed per run: the bill (relative to one uncached
input token: input x1, cache writes x1.25, reads x0.1, output x5), the share of the input read
from the cache (over the run, and over the limit's requests), the tokens spent on summaries,
the model calls, and the median wall time of a turn. LangChain is the ``bench`` extra
(``pip install -e ".[bench]"``); without it segue runs alone and the report says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anthropic

from segue import CHECKPOINT_PROMPT, ContextExhausted, ContextExhaustionBehavior, SqliteStore
from segue.executor.instructions import COMPACTION_INSTRUCTION, CONTINUATION_INSTRUCTION
from segue.executor.models.anthropic import AnthropicModel
from segue.executor.runtime import Runtime
from segue.executor.tools import Tool
from segue.statemachine import estimate_tokens
from segue.testing.anthropic_server import FakeAnthropicServer, MessageReply, ToolUse
from segue.testing.prompt_cache import Accounted, Bill

MODEL = "claude-sonnet-4-6"
TRIGGER = 0.9
KEEP = 20
INSTALL = 'pip install -e ".[bench]"'
SYSTEM = "You are a careful research assistant. Cite what each answer rests on. " * 30
QUESTION = "Question {i}: what does the archive say about topic {i}? Be thorough. "
ANSWER = "From the notes gathered so far, the answer about this topic is as follows. "
RESULT = "Archive record: dated entries, a summary paragraph and the sources behind it. "
SUMMARY = "Summary: the user asked about numbered topics; each answer cited the archive. "
Behavior = ContextExhaustionBehavior
BEHAVIORS = (
    Behavior.COMPACT_IN_PLACE,
    Behavior.THRESHOLD_BASED_CONTINUATION,
    Behavior.CHECKPOINT_RESTART,
)


async def _lookup(tool_input: dict[str, Any]) -> str:
    return (RESULT * 12)[:900] + f" (topic {tool_input.get('topic')})"


TOOL = Tool(
    name="lookup",
    description="Look a topic up in the archive and return its record. " * 8,
    function=_lookup,
    input_schema={"type": "object", "properties": {"topic": {"type": "integer"}}},
)


def question(i: int) -> str:
    return (QUESTION.format(i=i) * 9)[:600]


# --------------------------------------------------------------------------- the fake's answers


LIMIT_MARKERS = tuple(
    text[:60] for text in (CONTINUATION_INSTRUCTION, COMPACTION_INSTRUCTION, CHECKPOINT_PROMPT)
)


def is_limit_request(body: dict[str, Any]) -> bool:
    """A summary or a checkpoint: no callable tool (none declared, or ``tool_choice`` none), or
    one of segue's instructions at the limit last (the variant that keeps the tool choice)."""
    choice = body.get("tool_choice") or {}
    if not body.get("tools") or choice.get("type") == "none":
        return True
    last = json.dumps(body["messages"][-1])
    return any(json.dumps(marker)[1:-1] in last for marker in LIMIT_MARKERS)


def callable_tools(body: dict[str, Any]) -> bool:
    """Whether the model could call a tool with this request."""
    return bool(body.get("tools")) and (body.get("tool_choice") or {}).get("type") != "none"


CALL_EVERY: Final = 3
"""Every third summary request with callable tools is answered with a tool call."""


@dataclass
class Model:
    """What the model says, from what it is asked (the same for both sides): it counts the
    summary requests whose tools it could call, to answer every ``CALL_EVERY``-th with a call."""

    summaries_with_tools: int = 0

    def __call__(self, body: dict[str, Any]) -> MessageReply:
        if is_limit_request(body) and callable_tools(body):
            self.summaries_with_tools += 1
            if self.summaries_with_tools % CALL_EVERY == 0:
                call = ToolUse("lookup", {"topic": 0})
                return MessageReply(text="", tool_uses=[call], stop_reason="tool_use")
        return answer(body)


def answer(body: dict[str, Any]) -> MessageReply:
    """What the model says to a summary request it answers, or to a question."""
    if is_limit_request(body):
        text = (SUMMARY * 20)[:1500]
        if "<checkpoint>" in json.dumps(body["messages"][-1]):
            text = f"<checkpoint>\n## Goal\n{text}\n</checkpoint>"
        return MessageReply(text=text)
    last = json.dumps(body["messages"][-1])
    asked = re.findall(r"Question (\d+):", last)
    if '"tool_result"' not in last and asked and int(asked[-1]) % 3 == 0:
        call = ToolUse("lookup", {"topic": int(asked[-1])})
        return MessageReply(text="Let me look that up.", tool_uses=[call], stop_reason="tool_use")
    return MessageReply(text=(ANSWER * 14)[:900])


# --------------------------------------------------------------------------- one run


@dataclass
class Run:
    """One side's run: what the fake billed, which requests were the limit's, the turns' times."""

    name: str
    bill: Bill
    limit: list[bool]
    seconds: list[float] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return self.bill.requests

    def share(self, limit_only: bool) -> float:
        """The share of the input read from the cache (of the limit's requests only)."""
        chosen = [
            prompt
            for (prompt, _), limit in zip(self.bill.entries, self.limit, strict=True)
            if limit or not limit_only
        ]
        total = sum(_prompt(p) for p in chosen)
        return sum(p.cache_read_input_tokens for p in chosen) / total if total else 0.0

    @property
    def summary_tokens(self) -> int:
        """Input and output of the limit's requests."""
        return sum(
            _prompt(prompt) + output
            for (prompt, output), limit in zip(self.bill.entries, self.limit, strict=True)
            if limit
        )

    @property
    def ms_per_turn(self) -> float:
        return statistics.median(self.seconds) * 1000


def _prompt(prompt: Accounted) -> int:
    return prompt.input_tokens + prompt.cache_read_input_tokens + prompt.cache_creation_input_tokens


def limit_flags(server: FakeAnthropicServer) -> list[bool]:
    return [is_limit_request(r.body) for r in server.message_requests()]


SUMMARY_REQUESTS = ("tool_less", "reuse_prefix")
"""segue's two ways of sending the limit's requests (``summary_request``), run each."""


async def segue_run(behavior: Behavior, turns: int, window: int, summary_request: str) -> Run:
    """One conversation of ``turns`` through segue, continued in a child at each exhaustion."""
    with (
        FakeAnthropicServer(default=Model()) as server,
        tempfile.TemporaryDirectory() as scratch,
    ):
        client = anthropic.AsyncAnthropic(api_key="bench", base_url=server.url, max_retries=0)
        store = SqliteStore(Path(scratch) / "cost.db")
        seconds: list[float] = []
        async with (
            client,
            Runtime(store=store, llm=AnthropicModel(client), tools=[TOOL], keep_recent=KEEP) as rt,
        ):
            state = await rt.create_conversation(
                model=MODEL,
                behavior=behavior,
                system=SYSTEM,
                context_window=window,
                max_continuations=10_000,
                summary_request=summary_request,
            )
            cid = state.id
            for i in range(1, turns + 1):
                started = time.perf_counter()
                state = await rt.send(cid, question(i))
                seconds.append(time.perf_counter() - started)
                if isinstance(state.phase, ContextExhausted):
                    cid = (await rt.start_new_from(cid, seed_with_summary=True)).id
        name = f"segue {behavior.name} {summary_request}"
        return Run(name, server.bill, limit_flags(server), seconds)


def langchain_run(turns: int, window: int, *, alike: bool) -> Run:
    """The same conversation through LangChain v1's agent (see the module docstring)."""
    # The optional bench extra, imported by name: mypy checks this file the same whether the
    # extra is installed or not (CI does not install it).
    agents = importlib.import_module("langchain.agents")
    create_agent = agents.create_agent
    summarization = importlib.import_module("langchain.agents.middleware")
    SummarizationMiddleware = summarization.SummarizationMiddleware  # noqa: N806
    ChatAnthropic = importlib.import_module("langchain_anthropic").ChatAnthropic  # noqa: N806
    caching = importlib.import_module("langchain_anthropic.middleware")
    AnthropicPromptCachingMiddleware = caching.AnthropicPromptCachingMiddleware  # noqa: N806
    tool: Any = importlib.import_module("langchain_core.tools").tool
    SqliteSaver = importlib.import_module("langgraph.checkpoint.sqlite").SqliteSaver  # noqa: N806

    def lookup(topic: int) -> str:
        """Look a topic up in the archive and return its record."""
        return asyncio.run(_lookup({"topic": topic}))

    lookup_tool = tool(lookup)  # LangChain's tool from the function's signature and docstring

    summarize: dict[str, Any] = {"trigger": ("tokens", int(window * TRIGGER))}
    if alike:
        summarize |= {
            "keep": ("messages", KEEP),
            "token_counter": segue_counter,
            "trim_tokens_to_summarize": None,
        }
    with FakeAnthropicServer(default=Model()) as server, contextlib.ExitStack() as stack:
        scratch = stack.enter_context(tempfile.TemporaryDirectory())
        saver = stack.enter_context(SqliteSaver.from_conn_string(str(Path(scratch) / "lc.db")))
        model = ChatAnthropic(
            model=MODEL, base_url=server.url, api_key="bench", max_retries=0, max_tokens=8192
        )
        agent = create_agent(
            model,
            tools=[lookup_tool],
            system_prompt=SYSTEM,
            middleware=[
                SummarizationMiddleware(model, **summarize),
                AnthropicPromptCachingMiddleware(),
            ],
            checkpointer=saver,
        )
        config: Any = {"configurable": {"thread_id": "bench"}, "recursion_limit": 50}
        seconds: list[float] = []
        for i in range(1, turns + 1):
            started = time.perf_counter()
            agent.invoke({"messages": [{"role": "user", "content": question(i)}]}, config)
            seconds.append(time.perf_counter() - started)
        name = "LangChain (alike)" if alike else "LangChain (its defaults)"
        return Run(name, server.bill, limit_flags(server), seconds)


def segue_counter(messages: Any) -> int:
    """LangChain's token counter, made segue's estimate: the same counting on both sides."""
    total = 0
    for message in messages:
        content = message.content
        total += estimate_tokens(content if isinstance(content, str) else json.dumps(content))
        calls = getattr(message, "tool_calls", None) or ()
        total += sum(estimate_tokens(call["name"] + repr(call["args"])) for call in calls)
    return total


# --------------------------------------------------------------------------- the report


def langchain_missing() -> str | None:
    names = ("langchain", "langchain_anthropic", "langgraph.checkpoint.sqlite")
    for name in names:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):
            return name
    return None


def row(run: Run) -> str:
    return (
        f"  {run.name:<54} bill {run.bill.cost:>12,.0f}  read {run.share(False):6.1%}  "
        f"limit reads {run.share(True):6.1%}  summaries {run.summary_tokens:>9,} tokens  "
        f"calls {run.calls:>4}  {run.ms_per_turn:7.1f} ms/turn"
    )


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


BILL_TARGETS: Final = {
    "tool_less": {
        Behavior.COMPACT_IN_PLACE: 1.0,
        Behavior.THRESHOLD_BASED_CONTINUATION: 0.94,
        Behavior.CHECKPOINT_RESTART: 0.94,
    },
    "reuse_prefix": {
        Behavior.COMPACT_IN_PLACE: 0.9,
        Behavior.THRESHOLD_BASED_CONTINUATION: 0.82,
        Behavior.CHECKPOINT_RESTART: 0.82,
    },
}
"""The most each run may bill, as a multiple of LangChain's configured alike."""


def compare(runs: dict[str, Run], reference: Run) -> Iterator[str]:
    for summary_request, targets in BILL_TARGETS.items():
        for behavior, target in targets.items():
            run = runs[f"segue {behavior.name} {summary_request}"]
            ratio = run.bill.cost / reference.bill.cost
            yield (
                f"  bill, {run.name}: {ratio:.2f}x LangChain's "
                f"(target <= {target:.2f}x) {verdict(ratio <= target)}"
            )
    fastest = min(run.ms_per_turn for run in runs.values())
    speed = reference.ms_per_turn / max(fastest, 1e-9)
    slowest = max(run.ms_per_turn for run in runs.values())
    yield (
        f"  wall time per turn: LangChain {reference.ms_per_turn:.1f} ms, segue "
        f"{fastest:.1f}-{slowest:.1f} ms: {reference.ms_per_turn / slowest:.1f}x-{speed:.1f}x "
        f"(target >= 5x) {verdict(reference.ms_per_turn / slowest >= 5)}"
    )


def targets(runs: dict[str, Run]) -> Iterator[str]:
    for run in runs.values():
        limit, overall = run.share(True), run.share(False)
        # Only reuse_prefix reads the limit's requests from the cache: tool_less is shown for
        # the reader, its target is LangChain's bill alone.
        limit_target = (
            f"(target >= 80%) {verdict(limit >= 0.8)}"
            if run.name.endswith("reuse_prefix")
            else "(no target: tool-less)"
        )
        yield (
            f"  {run.name}: limit's requests read {limit:.1%} of their input from the cache "
            f"{limit_target}; the whole run {overall:.1%} "
            f"(target >= 90%) {verdict(overall >= 0.9)}"
        )


async def segue_runs(turns: int, window: int) -> dict[str, Run]:
    runs: dict[str, Run] = {}
    for behavior in BEHAVIORS:
        for summary_request in SUMMARY_REQUESTS:
            run = await segue_run(behavior, turns, window, summary_request)
            runs[run.name] = run
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short run (a smoke test)")
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--window", type=int, default=None)
    args = parser.parse_args(argv)
    turns = args.turns or (45 if args.quick else 300)
    window = args.window or (16_000 if args.quick else 60_000)
    print(
        f"One conversation of {turns} turns with a tool, window {window:,}, trigger at "
        f"{TRIGGER:.0%}, {KEEP} messages kept ({MODEL}, a fake server billing the prompt cache; "
        "bill in uncached input tokens: input x1, cache writes x1.25, reads x0.1, output x5; "
        f"every {CALL_EVERY}rd summary request with callable tools answered with a tool call):"
    )
    runs = asyncio.run(segue_runs(turns, window))
    for run in runs.values():
        print(row(run))
    missing = langchain_missing()
    if missing is not None:
        print(
            f"LangChain is not installed ({missing}): only segue's side is measured. "
            f"Install it with: {INSTALL}"
        )
        print("Targets:")
        for line in targets(runs):
            print(line)
        return 0
    alike = langchain_run(turns, window, alike=True)
    defaults = langchain_run(turns, window, alike=False)
    print(row(alike))
    print(row(defaults))
    print("Targets (segue against LangChain configured alike, same run):")
    for line in compare(runs, alike):
        print(line)
    for line in targets(runs):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
