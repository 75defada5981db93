"""A long autonomous Claude Agent SDK session hosted by segue, across its context limit.

Run ``python examples/agent_sdk_autonomous.py`` (needs ``pip install "segue[agent-sdk]"``). By
default it is offline: the SDK's bundled Claude Code CLI talks to segue's fake Anthropic server,
whose scripted "model" works through a task one Bash command at a time, each step filling the
session's context a little more. With ``--live`` it uses the real API instead
(``ANTHROPIC_API_KEY``), on a real task in a temporary directory.

segue stops the SDK's query when a response reaches 90% of the window, then does what the
conversation's behaviour says: ``checkpoint_restart`` (the default) asks the same session for a
checkpoint and goes on at once in a new SDK session; ``compact_in_place`` has the SDK compact
(after archiving its transcript). At the end it prints, for each restart or compaction, the
occupancy segue measured (one response's usage) beside the SDK's own aggregate for the same
query (``ResultMessage.usage``, which sums every API call and is not the context).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
from pathlib import Path
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions

from segue import ContextExhaustionBehavior, MemoryStore, Runtime
from segue.agent_sdk import AgentSdkModel
from segue.testing.anthropic_server import FakeAnthropicServer, MessageReply, ToolUse, Usage

MODEL = "claude-sonnet-4-6"
WINDOW = 200_000  # the CLI's window for this model
STEP_TOKENS = 23_000
"""How much each step adds to the offline session's context."""


class ScriptedAgent:
    """The offline model: one Bash step per request, each session filling up as it goes; a
    checkpoint, a summary or the final answer when asked for one."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.done = 0
        self.calls_in_session: dict[str, int] = {}

    def __call__(self, body: dict[str, Any]) -> MessageReply:
        asked = _last_user_text(body)
        small = Usage(input_tokens=3_000, output_tokens=300)
        session = str(body.get("metadata", {}).get("user_id", ""))  # names the SDK session
        if "Your task is to create a detailed summary of the conversation so far" in asked:
            self.calls_in_session[session] = 0  # the compacted session starts small again
            summary = f"Steps 1 to {self.done} of {self.steps} are done; continue with the next."
            return MessageReply(text=f"<summary>{summary}</summary>", usage=small)
        if "CHECKPOINT REQUIRED" in asked:
            checkpoint = (
                f"<checkpoint>\n## Goal\nRun the {self.steps} steps.\n## Completed Work\n"
                f"Steps 1 to {self.done}.\n## Remaining Tasks\nSteps {self.done + 1} to "
                f"{self.steps}.\n</checkpoint>"
            )
            return MessageReply(text=checkpoint, usage=small)
        calls = self.calls_in_session[session] = self.calls_in_session.get(session, 0) + 1
        tokens = 8_000 + STEP_TOKENS * calls
        usage = Usage(input_tokens=2_000, cache_read_input_tokens=tokens - 2_050, output_tokens=50)
        if self.done >= self.steps:
            return MessageReply(text=f"All {self.steps} steps are done.", usage=usage)
        self.done += 1
        command = f"echo step {self.done}"
        tool = ToolUse("Bash", {"command": command, "description": f"step {self.done}"})
        return MessageReply(text="", tool_uses=[tool], usage=usage, stop_reason="tool_use")


def _last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            return "\n".join(b.get("text", "") for b in content or () if b.get("type") == "text")
    return ""


class Queries(logging.Handler):
    """Collects segue's ``sdk_query`` log events (one per SDK query)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "segue_event", None)
        if isinstance(event, dict) and event.get("event") == "sdk_query":
            self.events.append(event)


async def run(behavior: ContextExhaustionBehavior, steps: int, live: bool) -> None:
    work = Path(tempfile.mkdtemp(prefix="segue-agent-"))
    queries = Queries()
    logger = logging.getLogger("segue.agent_sdk")
    logger.addHandler(queries)
    logger.setLevel(logging.INFO)
    env = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}
    server = None
    if not live:
        server = FakeAnthropicServer(default=ScriptedAgent(steps)).start()
        env |= {
            "ANTHROPIC_BASE_URL": server.url,
            "ANTHROPIC_API_KEY": "offline",
            "HOME": str(work),
            "CLAUDE_CODE_TMPDIR": str(work / "tmp"),
            "CLAUDE_CODE_DISABLE_THINKING": "1",
        }
    options = ClaudeAgentOptions(cwd=str(work), env=env, allowed_tools=["Bash"], setting_sources=[])
    model = AgentSdkModel(options, archive_dir=work / "archives", context_window=WINDOW)
    task = f"Run `echo step N` for N from 1 to {steps}, one command at a time, then say so."
    try:
        async with Runtime(store=MemoryStore(), llm=model, archive_dir=work / "segue") as rt:
            agent = await rt.create_conversation(
                model=MODEL, behavior=behavior, max_continuations=20
            )
            state = await rt.send(agent.id, task)
            print(
                f"ended {state.phase.kind} in session {state.session}, "
                f"generation {state.generation}: {await rt.last_reply(agent.id)}"
            )
    finally:
        if server is not None:
            server.stop()
        logger.removeHandler(queries)
    print(f"segue stops a query at {int(0.9 * WINDOW):,} tokens (90% of {WINDOW:,}):")
    for event in queries.events:
        aggregate = event["sdk_aggregate_tokens"] or 0
        sdk = f"the SDK's ResultMessage.usage said {aggregate:,} ({aggregate / WINDOW:.0%})"
        if event["stopped_at_threshold"]:
            measured = event["context_tokens"]
            print(
                f"  stopped: segue measured {measured:,} ({measured / WINDOW:.0%}); {sdk} "
                f"over {event['api_calls']} API calls"
            )
        for compaction in event["compactions"]:
            measured, pre = compaction["measured"] or 0, compaction["sdk_pre_tokens"] or 0
            print(
                f"  the SDK compacted ({compaction['trigger']}): segue had measured {measured:,} "
                f"({measured / WINDOW:.0%}), the SDK's own pre_tokens {pre:,}; {sdk}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--behavior",
        default="checkpoint_restart",
        choices=["checkpoint_restart", "compact_in_place"],
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--live", action="store_true", help="the real API (ANTHROPIC_API_KEY)")
    args = parser.parse_args()
    asyncio.run(run(ContextExhaustionBehavior(args.behavior), args.steps, args.live))


if __name__ == "__main__":
    main()
