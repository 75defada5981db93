"""A tool that runs a sub-agent: a child conversation that fails fast at its context limit.

The child uses ``INTENTIONALLY_UNHANDLED``: at the threshold it fails with
``ErrorKind.CONTEXT_EXHAUSTED`` instead of summarising. The tool reports that typed failure to the
parent model as an error result, and the parent decides what to do (typically: call the tool
again with a narrower task, which spawns a fresh replacement child).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from segue.executor.errors import SubAgentFailedError
from segue.executor.tools import Tool
from segue.statemachine import ContextExhaustionBehavior

if TYPE_CHECKING:
    from segue.executor.runtime import Runtime


SUBAGENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"task": {"type": "string", "description": "What the sub-agent must do."}},
    "required": ["task"],
}


def subagent_tool(
    runtime: Runtime,
    *,
    model: str,
    system: str | None = None,
    name: str = "subagent",
    description: str = (
        "Delegate a self-contained task to a sub-agent and get its final answer. If it fails "
        "with context_exhausted, retry with a smaller task."
    ),
    timeout: float | None = 600.0,
    context_window: int | None = None,
    max_tool_rounds: int = 50,
) -> Tool:
    """A ``Tool`` that runs ``input["task"]`` in a new child conversation of ``runtime``.

    ``context_window`` gives each child a window of its own (a cheaper model's, or a budget
    smaller than the model's); ``max_tool_rounds`` bounds each child's turn (past it the child
    fails with ``TOOL_ROUNDS_EXHAUSTED`` for the parent, as it does at its context limit)."""
    from segue.executor.inputs import failure_of  # noqa: PLC0415  # cycle
    from segue.executor.tool_runs import current_conversation_id  # noqa: PLC0415  # cycle

    async def run(tool_input: dict[str, Any]) -> str:
        task = str(tool_input.get("task", "")).strip()
        if not task:
            msg = "the input needs a non-empty 'task'"
            raise ValueError(msg)
        child = await runtime.create_conversation(
            model=model,
            behavior=ContextExhaustionBehavior.INTENTIONALLY_UNHANDLED,
            system=system,
            parent_id=current_conversation_id.get(),
            context_window=context_window,
            max_tool_rounds=max_tool_rounds,
        )
        state = await runtime.send(child.id, task)
        failure = failure_of(state)
        if failure is not None:
            raise SubAgentFailedError(child.id, failure.error_kind.value, failure.message)
        transcript = await runtime.messages(child.id)
        answers = [m.text for m in transcript if m.kind == "assistant" and m.text]
        return answers[-1] if answers else ""

    return Tool(
        name=name,
        description=description,
        function=run,
        input_schema=SUBAGENT_SCHEMA,
        timeout=timeout,
    )
