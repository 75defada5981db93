"""What reading any provider's reply needs: its usage counted once, and its tool calls
joined from the pieces a stream brings them in.

* **Usage** (``usage_from_prompt``): for providers that report the whole prompt with the cached
  part inside it (OpenAI's ``prompt_tokens`` and ``cached_tokens``), the four fields segue keeps,
  each token counted once: the occupancy after the response is prompt plus output, exactly.
  ``token_count`` says whether a report's figure is one at all.
* **Tool calls streamed in pieces** (``ToolCallParts``): argument fragments joined, and a call
  whose arguments are not a JSON object is never returned to be run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from segue.executor.errors import LlmCallError
from segue.statemachine import ToolCall, Usage


def usage_from_prompt(
    prompt_tokens: int | None,
    output_tokens: int | None,
    *,
    cache_read: int | None = None,
    cache_write: int | None = None,
) -> Usage | None:
    """segue's ``Usage`` from a report that counts the WHOLE prompt, cached part included
    (OpenAI's ``prompt_tokens`` / ``input_tokens`` with ``cached_tokens`` inside them).

    ``cache_read_input_tokens`` = the cached part, ``cache_creation_input_tokens`` = what was
    written to the cache, ``input_tokens`` = the rest of the prompt: the three add up to the
    prompt, so the occupancy (``Usage.context_tokens``) is prompt plus output and no cached
    token is counted twice. None when the prompt is not said (the core keeps its last figure);
    a cache figure larger than the prompt is bounded by it.
    """
    prompt = token_count(prompt_tokens)
    if prompt is None:
        return None
    read = min(token_count(cache_read) or 0, prompt)
    written = min(token_count(cache_write) or 0, prompt - read)
    return Usage(
        input_tokens=prompt - read - written,
        cache_read_input_tokens=read,
        cache_creation_input_tokens=written,
        output_tokens=token_count(output_tokens) or 0,
    )


def token_count(value: object) -> int | None:
    """A token count a report really gave: a non-negative int (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


@dataclass(slots=True)
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ToolCallParts:
    """Tool calls streamed in pieces, keyed by the index the provider gives each call: the id
    and name come once, the JSON arguments in fragments to be joined in order."""

    calls: dict[int, _PartialCall] = field(default_factory=dict)

    def add(
        self, index: int, *, id: str | None = None, name: str | None = None, arguments: str = ""
    ) -> None:
        """Take one piece of call ``index`` (any of its id, name, or an argument fragment)."""
        call = self.calls.setdefault(index, _PartialCall())
        if id:
            call.id = id
        if name and not call.name:  # some servers repeat the name on every piece
            call.name = name
        if arguments:
            call.arguments.append(arguments)

    def __bool__(self) -> bool:
        return bool(self.calls)

    def finish(self) -> tuple[ToolCall, ...]:
        """The calls in index order; ``LlmCallError`` (retryable: another attempt may be whole)
        for a call without a name or whose arguments are not a JSON object, so it is never run
        with partial or empty input."""
        finished: list[ToolCall] = []
        for index in sorted(self.calls):
            call = self.calls[index]
            if not call.name:
                raise LlmCallError(f"tool call {index} came without a name", retryable=True)
            raw = "".join(call.arguments)
            try:
                arguments = json.loads(raw)  # "" too is not JSON: never run with empty input
            except ValueError:
                msg = f"the tool call {call.name!r} has arguments that are not JSON"
                raise LlmCallError(msg, retryable=True) from None
            if not isinstance(arguments, dict):
                msg = f"the tool call {call.name!r} has arguments that are not a JSON object"
                raise LlmCallError(msg, retryable=True)
            finished.append(
                ToolCall(id=call.id or f"call_{index}", name=call.name, input=arguments)
            )
        return tuple(finished)


__all__ = ["ToolCallParts", "token_count", "usage_from_prompt"]
