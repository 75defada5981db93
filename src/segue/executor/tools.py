"""Tools: async callables with JSON schemas, run so that no failure escapes as an exception.

A tool that raises, times out or does not exist still produces a ``ToolResult`` (with
``is_error``): the model is told what went wrong and the conversation goes on. The core counts
on every ``tool_use`` getting a result.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from segue.executor._log import get_logger
from segue.executor.model_port import ToolSpec
from segue.statemachine import ToolCall, ToolResult
from segue.statemachine.content import ToolResultBlock
from segue.statemachine.events import content_text

ToolFunction = Callable[[dict[str, Any]], Awaitable[Any]]
"""A tool: takes the model's input, returns text, a list of text and image blocks (a screenshot
tool), or any JSON-serialisable value (sent as JSON)."""
_BLOCKS: TypeAdapter[tuple[ToolResultBlock, ...]] = TypeAdapter(tuple[ToolResultBlock, ...])

_log = get_logger(__name__)
_MAX_ERROR_TEXT = 2_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Tool:
    """A tool: what the model is told about it, and the coroutine that runs it."""

    name: str
    description: str
    function: ToolFunction
    input_schema: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    timeout: float | None = 60.0

    @property
    def spec(self) -> ToolSpec:
        """The tool as the LLM sees it."""
        return ToolSpec(
            name=self.name, description=self.description, input_schema=self.input_schema
        )


class ToolRegistry:
    """The tools a runtime offers, by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        """Register ``tool``; a second tool of the same name is a mistake, not an override."""
        if tool.name in self._tools:
            msg = f"a tool named {tool.name!r} is already registered"
            raise ValueError(msg)
        self._tools[tool.name] = tool

    def tool(
        self,
        name: str | None = None,
        *,
        description: str = "",
        input_schema: Mapping[str, Any] | None = None,
        timeout: float | None = 60.0,
    ) -> Callable[[ToolFunction], ToolFunction]:
        """Decorator form of ``add``: ``@registry.tool(description=...)``."""

        def register(function: ToolFunction) -> ToolFunction:
            self.add(
                Tool(
                    name=name or function.__name__,
                    description=description or (function.__doc__ or "").strip(),
                    function=function,
                    input_schema=dict(input_schema or {"type": "object", "properties": {}}),
                    timeout=timeout,
                )
            )
            return function

        return register

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        """Every tool as the LLM sees it, in registration order."""
        return tuple(tool.spec for tool in self._tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    async def run(self, call: ToolCall) -> ToolResult:
        """Run one call; every failure becomes an error result the model can read."""
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            return _error(call, f"Unknown tool {call.name!r}. Available tools: {known}.")
        try:
            output = await asyncio.wait_for(tool.function(dict(call.input)), tool.timeout)
        except TimeoutError:
            return _error(call, f"Tool {call.name!r} timed out after {tool.timeout} s.")
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001  # any tool failure is reported to the model
            _log.warning("tool_failed", tool=call.name, error_type=type(error).__name__)
            text = f"Tool {call.name!r} failed: {type(error).__name__}: {error}"
            return _error(call, text[:_MAX_ERROR_TEXT])
        if isinstance(output, str):
            return ToolResult(tool_call_id=call.id, output=output)
        blocks = _result_blocks(output)
        if blocks is not None:
            return ToolResult(tool_call_id=call.id, output=content_text(blocks), content=blocks)
        return ToolResult(tool_call_id=call.id, output=json.dumps(output, default=str))


def _result_blocks(output: object) -> tuple[Any, ...] | None:
    """``output`` as a tool result's content blocks, if it is a list of text and image blocks
    (values or the Messages API's dicts); None for any other value (sent as JSON)."""
    if not isinstance(output, list | tuple) or not output:
        return None
    kinds = {
        block.get("type") if isinstance(block, dict) else getattr(block, "type", None)
        for block in output
    }
    if not kinds <= {"text", "image"}:
        return None
    try:
        return _BLOCKS.validate_python(list(output))
    except ValidationError:
        return None


def _error(call: ToolCall, text: str) -> ToolResult:
    return ToolResult(tool_call_id=call.id, output=text, is_error=True)
