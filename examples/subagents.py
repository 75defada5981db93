"""A coordinator delegates to sub-agents that fail fast at their context limit.

Runs offline: ``python examples/subagents.py``. A coordinating agent must list the safety
warnings of a 900-page manual. It hands the whole manual to one sub-agent first; the sub-agent's
window cannot hold 900 pages, and since sub-agents run ``INTENTIONALLY_UNHANDLED`` it does not
summarise or compact: it fails at once with the typed error ``context_exhausted``. The
coordinator gets that failure as the result of its tool call, and goes on with narrower
sub-agents of 200 pages each, each a fresh child conversation with a fresh window.

The model here is a stand-in that behaves as a real one would (the coordinator plans, a reader's
context fills with the pages it reads); with Claude, pass ``AnthropicModel(AsyncAnthropic())``
to ``Runtime`` instead.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from segue import MemoryStore, Runtime, Usage, failure_of, subagent_tool
from segue.adapters import LlmReply, LlmRequest
from segue.core import ToolCall

MODEL = "claude-sonnet-4-5"
PAGES = 900
TOKENS_PER_PAGE = 400
READER_WINDOW = 100_000  # about 225 pages fit below a reader's 90% threshold
CHUNK = 200
COORDINATOR = "You coordinate readers. Delegate reading; report what they found."
READER = "You are a reader. Read the pages you are given and list their safety warnings."
_RANGE = re.compile(r"pages (\d+)-(\d+)")


class StandInModel:
    """Answers as a coordinator or a reader would, offline (an ``LlmModel``)."""

    exact_preflight = False

    def __init__(self) -> None:
        self.calls = 0

    async def context_window(self, model: str) -> int | None:
        return None

    async def count_tokens(self, request: LlmRequest) -> int | None:
        return None

    async def complete(self, request: LlmRequest) -> LlmReply:
        self.calls += 1
        if request.system == READER:
            return self._read(request)
        return self._coordinate(request)

    @staticmethod
    def _read(request: LlmRequest) -> LlmReply:
        """A reader's context holds the pages it read: many pages fill its window."""
        found = _RANGE.search(request.messages[-1].text)
        first, last = (int(found.group(1)), int(found.group(2))) if found else (1, 1)
        pages = last - first + 1
        held = min(pages * TOKENS_PER_PAGE + 500, READER_WINDOW - 1_000)  # a window holds no more
        warnings = ", ".join(f"p.{page}" for page in range(first, last + 1, 97))
        return LlmReply(
            text=f"Pages {first}-{last}: safety warnings on {warnings}.",
            usage=Usage(input_tokens=held, output_tokens=40),
        )

    @staticmethod
    def _coordinate(request: LlmRequest) -> LlmReply:
        """Delegate the whole manual; after a context_exhausted failure, 200 pages at a time."""
        results = [m for m in request.messages if m.kind == "tool_result"]
        usage = Usage(input_tokens=2_000 + 200 * len(results), output_tokens=30)
        if not results:
            return _delegate(1, PAGES, usage)
        done = [m for m in results if not m.is_error]
        read_up_to = max((_last_page(m.text) for m in done), default=0)
        if read_up_to < PAGES:
            return _delegate(read_up_to + 1, min(PAGES, read_up_to + CHUNK), usage)
        found = "\n".join(f"- {m.text}" for m in done)
        return LlmReply(text=f"Safety warnings of the manual, by part:\n{found}", usage=usage)


_RANGE_DONE = re.compile(r"^Pages \d+-(\d+):")


def _last_page(answer: str) -> int:
    """The last page a reader's answer covers (0 for an answer that names none)."""
    found = _RANGE_DONE.search(answer)
    return int(found.group(1)) if found else 0


def _delegate(first: int, last: int, usage: Usage) -> LlmReply:
    task = f"Read pages {first}-{last} of the manual and list their safety warnings."
    call = ToolCall(id=f"toolu_{first}_{last}", name="subagent", input={"task": task})
    return LlmReply(text="", tool_calls=(call,), usage=usage, stop_reason="tool_use")


async def main() -> None:
    model = StandInModel()
    async with Runtime(store=MemoryStore(), llm=model) as rt:
        rt.tools.add(subagent_tool(rt, model=MODEL, system=READER, context_window=READER_WINDOW))
        coordinator = await rt.create_conversation(model=MODEL, system=COORDINATOR)
        state = await rt.send(coordinator.id, "List every safety warning of the manual.")

        children = [c for c in await rt.conversations() if c.state.parent_id == coordinator.id]
        print(f"The coordinator started {len(children)} sub-agents:")
        for child in reversed(children):  # oldest first
            task: Any = (await rt.messages(child.state.id))[0].text
            failure = failure_of(child.state)
            used = f"{child.state.context_tokens or 0:,} of {READER_WINDOW:,} tokens"
            if failure is None:
                outcome = f"answered, {used}"
            else:
                outcome = f"failed with {failure.error_kind.value} at {used}; the parent was told"
            print(f"- {task[:44]}... {outcome}")
        print(f"\nThe coordinator is {state.phase.kind}; its answer:")
        print(await rt.last_reply(coordinator.id))
        print(f"\n{model.calls} model calls in all.")


if __name__ == "__main__":
    asyncio.run(main())
