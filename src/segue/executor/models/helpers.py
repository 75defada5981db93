"""What every LLM adapter needs and no provider owns: public helpers, so that an adapter for
another provider is a page of code (``docs/adapters.md`` walks through one).

* **The tool-less requests** (``purpose`` continuation, checkpoint, compaction): ``text_turns``
  gives the history as alternating plain-text turns, every tool block turned into a bounded
  line of prose (so nothing is left unpaired and no tool can be called), images and documents
  named rather than sent, the oldest ``trim_level`` quarters dropped after an overflow, the
  rejected tool calls named (``rejected_prose``) and the request's ``instruction`` last. An
  adapter maps each ``TextTurn`` to its provider's message shape.
* **Usage** (``usage_from_prompt``): for providers that report the whole prompt with the cached
  part inside it (OpenAI's ``prompt_tokens`` and ``cached_tokens``), the four fields segue keeps,
  each token counted once: the occupancy after the response is prompt plus output, exactly.
* **Errors**: ``http_error`` classifies an HTTP failure as the ``LlmCallError`` the core acts
  on (retry, trim, or give up) from the status, whether the provider said the prompt overflowed,
  and its ``Retry-After`` (``retry_after``); ``redact`` and ``scrub_secrets`` keep an API key out
  of messages and out of every exception chained below the error raised.
* **Tool calls streamed in pieces** (``ToolCallParts``): argument fragments joined, and a call
  whose arguments are not a JSON object is never returned to be run.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmRequest
from segue.statemachine import Message, ToolCall, Usage

Role = Literal["user", "assistant"]

TRIM_FRACTION: Final = 0.25
"""Share of the history each ``trim_level`` drops, oldest first."""
MIN_KEPT_MESSAGES: Final = 4
"""Trimming never drops the last few messages: they are what the summary must not miss."""
TOOL_INPUT_CHARS: Final = 500
"""Bound on a tool call's JSON input when written as prose."""
TOOL_RESULT_CHARS: Final = 2_000
"""Bound on a tool result when written as prose: one huge output must not overflow a summary."""
REJECTED_INPUT_CHARS: Final = 200
MAX_RETRY_AFTER: Final = 3600.0
"""A server's Retry-After is honoured up to an hour; longer is taken as an hour."""
START_PLACEHOLDER: Final = "(The conversation continues below.)"
"""The first turn when the history starts with the model's words (providers want a user first)."""
CONTINUE: Final = "Continue."
"""The last turn when the history would end with the model's words (that would be a prefill)."""
MIN_SECRET: Final = 8
"""A credential shorter than this is not redacted: a test's ``"k"`` would blank out letters."""

RETRYABLE_STATUS: Final = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


# --------------------------------------------------------------------------- prose


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters]"


def to_json(value: object) -> str:
    """Compact, stable JSON of a tool input (for prose and for providers that take a string)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def role_text(message: Message) -> tuple[Role, str]:
    """The role and text a non-tool message is sent as (a summary stands in for the user's
    earlier turns; continuations and checkpoints are the model's own words)."""
    if message.kind == "summary":
        return "user", f"Summary of the earlier conversation: {message.text}"
    if message.kind in ("assistant", "continuation", "checkpoint"):
        return "assistant", message.text
    return "user", message.text


def rejected_prose(calls: Iterable[ToolCall]) -> str:
    """One sentence naming tool calls that were asked for but never run ("" for none)."""
    named = [f"{c.name}({clip(to_json(c.input), REJECTED_INPUT_CHARS)})" for c in calls]
    if not named:
        return ""
    return f"You were about to call: {', '.join(named)}; they were not run."


def attachments_prose(message: Message) -> str:
    """A message's images and documents, named in prose (the tool-less requests do not send
    them); "" when it has none."""
    names: list[str] = []
    for block in message.content:
        if block.type == "image":
            names.append("an image")
        elif block.type == "document":
            names.append(f"the document {block.title!r}" if block.title else "a document")
    return f"[attached: {', '.join(names)}]" if names else ""


AGENT_BLOCKS: Final = frozenset({"agent_tool_use", "agent_tool_result"})
"""Blocks that record what another provider's own agent ran: sent as prose (``agent_prose``)."""


def agent_prose(block: Any) -> str:
    """A tool another provider's own agent ran (``agent_tool_use`` / ``agent_tool_result``), as a
    bounded line of the reply's text: no provider can be sent it as a tool block."""
    if block.type == "agent_tool_use":
        return f"[ran tool {block.name} with {clip(to_json(block.input), TOOL_INPUT_CHARS)}]"
    label = "tool error" if block.is_error else "tool result"
    return f"[{label}: {clip(block.output, TOOL_RESULT_CHARS)}]"


def tool_result_prose(text: str, *, name: str = "a tool", is_error: bool = False) -> str:
    """A tool result as a bounded line of text (for a result whose call cannot be sent)."""
    label = "tool error" if is_error else "tool result"
    return f"[{label} from {name}: {clip(text, TOOL_RESULT_CHARS)}]"


def tool_call_prose(call: ToolCall) -> str:
    """A tool call as a bounded line of the model's text."""
    return f"[called tool {call.name} with {clip(to_json(call.input), TOOL_INPUT_CHARS)}]"


# --------------------------------------------------------------------------- a normal turn

NOT_RECORDED: Final = "Not run: no result was recorded for this tool call."


def paired(messages: Sequence[Message]) -> list[Message]:
    """The history of a normal turn with every tool call answered once, right after the reply
    that made it, as every provider requires.

    The core pairs every call outside ``ToolExecuting``; this still holds the line the APIs
    enforce, so one bad transcript entry costs a sentence, not a failed conversation: a result
    whose call is not open becomes a user's line of text, a call left without a result gets an
    error result before the next message, and a call id seen twice is answered once.
    """
    out: list[Message] = []
    open_calls: dict[str, str] = {}
    seen: set[str] = set()
    stray: list[Message] = []  # results without their call, said once the open calls are answered

    def close_open_calls() -> None:
        for call_id in open_calls:
            out.append(
                Message(kind="tool_result", text=NOT_RECORDED, tool_call_id=call_id, is_error=True)
            )
        open_calls.clear()
        out.extend(stray)
        stray.clear()

    for message in messages:
        if message.kind == "tool_result":
            if open_calls.pop(message.tool_call_id or "", None) is None:
                text = tool_result_prose(message.text, is_error=message.is_error)
                stray.append(Message(kind="user", text=text, session=message.session))
                continue
            out.append(message)
            continue
        close_open_calls()
        calls = tuple(c for c in message.tool_calls if c.id not in seen)
        seen.update(c.id for c in calls)
        open_calls.update((c.id, c.name) for c in calls)
        if len(calls) != len(message.tool_calls):
            out.append(message.model_copy(update={"tool_calls": calls}))
        else:
            out.append(message)
    close_open_calls()
    return out


# --------------------------------------------------------------------------- tool-less requests


def offers_tools(request: LlmRequest) -> bool:
    """Whether the request may declare tools at all: only a normal turn does. The requests at
    the limit (continuation, checkpoint, compaction) must offer no callable tool."""
    return request.purpose == "turn" and bool(request.tools)


def trim(messages: Sequence[Message], trim_level: int) -> tuple[Sequence[Message], int]:
    """Drop the oldest ``TRIM_FRACTION * trim_level`` of ``messages``; return (kept, dropped)."""
    count = len(messages)
    if trim_level <= 0 or count <= MIN_KEPT_MESSAGES:
        return messages, 0
    dropped = min(count - MIN_KEPT_MESSAGES, math.ceil(count * TRIM_FRACTION * trim_level))
    return messages[dropped:], dropped


@dataclass(slots=True)
class TextTurn:
    """One turn of a tool-less request: a role and its paragraphs, in order (an adapter sends
    them as separate text blocks or joined with blank lines)."""

    role: Role
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The paragraphs joined with blank lines."""
        return "\n\n".join(self.parts)


def text_turns(request: LlmRequest) -> list[TextTurn]:
    """The history of a tool-less request as alternating plain-text turns, user first and last.

    With no tools declared a provider refuses any tool block, and an overflowing history may
    have lost the call a result answers, so no tool block survives: each becomes a bounded line
    of prose. ``trim_level`` drops the oldest messages (saying how many), the rejected calls are
    named and the ``instruction`` comes last.
    """
    kept, dropped = trim(request.messages, request.trim_level)
    names = {c.id: c.name for m in request.messages for c in m.tool_calls}
    turns: list[TextTurn] = []

    def add(role: Role, text: str) -> None:
        if not text.strip():
            return  # providers refuse empty text, so an empty message contributes nothing
        if not turns or turns[-1].role != role:
            turns.append(TextTurn(role))
        turns[-1].parts.append(text)

    if dropped:
        add("user", f"[{dropped} earlier messages were omitted to fit the context window.]")
    for message in kept:
        if message.kind == "tool_result":
            name = names.get(message.tool_call_id or "", "a tool")
            add("user", tool_result_prose(message.text, name=name, is_error=message.is_error))
            continue
        role, text = role_text(message)
        add(role, text)
        if message.content:
            add(role, attachments_prose(message))
        for call in message.tool_calls:
            add("assistant", tool_call_prose(call))
    add("user", rejected_prose(request.rejected_tool_calls))
    add("user", request.instruction or "")
    if not turns or turns[0].role != "user":
        turns.insert(0, TextTurn("user", [START_PLACEHOLDER]))
    if turns[-1].role == "assistant":
        add("user", CONTINUE)  # never end on the model's words (that is a prefill)
    return turns


# --------------------------------------------------------------------------- usage


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


# --------------------------------------------------------------------------- errors


def secrets_of(*candidates: object) -> tuple[str, ...]:
    """The strings among ``candidates`` long enough to be credentials worth redacting."""
    return tuple(s for s in candidates if isinstance(s, str) and len(s) >= MIN_SECRET)


def redact(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every secret replaced by ``[redacted]``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return text


def _scrubbed(value: Any, secrets: Sequence[str], depth: int = 0) -> Any:
    if isinstance(value, str):
        return redact(value, secrets)
    if depth > 8:
        return value
    if isinstance(value, dict):
        return {k: _scrubbed(v, secrets, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_scrubbed(v, secrets, depth + 1) for v in value)
    return value


_SCRUBBED_ATTRIBUTES: Final = ("message", "body", "api_message", "detail", "doc")
_OS_ERROR_ATTRIBUTES: Final = ("strerror", "filename", "filename2")
"""What an ``OSError`` shows besides its args (a path holding a credential, a CLI's own)."""


def scrub_secrets(exc: BaseException | None, secrets: Sequence[str]) -> None:
    """Redact ``secrets`` in ``exc`` and every exception chained below it (``__cause__`` and
    ``__context__``), in place: their ``args``, notes, the message and body attributes
    clients keep and an ``OSError``'s file names. A provider that echoes the key in an error
    body then shows it in no ``str``, ``repr`` or traceback of the error segue raises."""
    if not secrets:
        return
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        with contextlib.suppress(AttributeError, TypeError):  # a type that pins its args
            current.args = tuple(_scrubbed(arg, secrets) for arg in current.args)
        notes = getattr(current, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [redact(n, secrets) if isinstance(n, str) else n for n in notes]
        for name in _SCRUBBED_ATTRIBUTES:
            value = current.__dict__.get(name) if hasattr(current, "__dict__") else None
            if value is not None:
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(current, name, _scrubbed(value, secrets))
        if isinstance(current, OSError):
            for name in _OS_ERROR_ATTRIBUTES:
                value = getattr(current, name)
                if isinstance(value, str):
                    setattr(current, name, redact(value, secrets))
        pending += [current.__cause__, current.__context__]
        if isinstance(current, BaseExceptionGroup):
            pending += list(current.exceptions)


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds a server asked to wait (``retry-after-ms``, or ``retry-after`` in seconds or as
    an HTTP date), None when it did not say or said something unusable."""
    if headers is None:
        return None
    try:
        milliseconds = headers.get("retry-after-ms")
        if milliseconds is not None:
            return _bounded(float(milliseconds) / 1000)
        seconds = headers.get("retry-after")
        if seconds is None:
            return None
        try:
            return _bounded(float(seconds))
        except ValueError:
            when = email.utils.parsedate_to_datetime(seconds)
            return _bounded(when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def _bounded(seconds: float) -> float | None:
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


Meaning = Literal["retryable", "auth", "not_found"]
"""What a provider's own error type means when its HTTP status alone does not say (an error
event in a stream that had started has no status): try again, a refused key, an unknown model."""


def http_error(
    status: int | None,
    detail: str,
    *,
    provider: str,
    key_variable: str,
    model: str,
    overflow: bool = False,
    kind: str = "",
    means: Meaning | None = None,
    wait: float | None = None,
) -> LlmCallError:
    """The ``LlmCallError`` for a provider's HTTP failure (``status`` None: an error event in
    a stream that had started).

    ``overflow`` (the provider said the prompt does not fit) and 413 take the exhaustion path;
    401/403 are fatal and name ``key_variable``; 404 is an unknown model; 408, 409, 429 and 5xx
    are retried by segue after ``wait`` seconds if the provider said. ``kind`` is the
    provider's error type, shown in the message; ``means`` is what that type says when the
    status does not (``Meaning``). ``detail`` must already be redacted.
    """
    shown = f"HTTP {status}" if status is not None else "stream error"
    if kind:
        shown += f" {kind}"
    if overflow or status == 413:
        # 413: the body is over the API's request size limit, far beyond any window; trimming
        # the history is the only remedy, exactly as for an overflowing prompt.
        return LlmCallError(
            f"the prompt does not fit the context window ({shown}): {detail}",
            context_overflow=True,
            status_code=status,
        )
    if status in (401, 403) or means == "auth":
        return LlmCallError(
            f"authentication failed: check {key_variable} ({shown}: {detail})",
            fatal=True,
            status_code=status,
        )
    if status == 404 or means == "not_found":
        return LlmCallError(
            f"unknown model {model!r} ({shown}: {detail})", fatal=True, status_code=status
        )
    if (
        status in RETRYABLE_STATUS
        or (status is not None and status >= 500 and status != 501)
        or (status is None and means == "retryable")
    ):
        return LlmCallError(
            f"the {provider} API is unavailable ({shown}): {detail}",
            retryable=True,
            status_code=status,
            retry_after=wait,
        )
    return LlmCallError(
        f"the {provider} API refused the request ({shown}): {detail}", status_code=status
    )


# --------------------------------------------------------------------------- streamed tool calls


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


__all__ = [
    "AGENT_BLOCKS",
    "CONTINUE",
    "MAX_RETRY_AFTER",
    "MIN_KEPT_MESSAGES",
    "NOT_RECORDED",
    "REJECTED_INPUT_CHARS",
    "RETRYABLE_STATUS",
    "START_PLACEHOLDER",
    "TOOL_INPUT_CHARS",
    "TOOL_RESULT_CHARS",
    "TRIM_FRACTION",
    "Meaning",
    "TextTurn",
    "ToolCallParts",
    "agent_prose",
    "attachments_prose",
    "clip",
    "http_error",
    "offers_tools",
    "paired",
    "redact",
    "rejected_prose",
    "retry_after",
    "role_text",
    "scrub_secrets",
    "secrets_of",
    "text_turns",
    "to_json",
    "token_count",
    "tool_call_prose",
    "tool_result_prose",
    "trim",
    "usage_from_prompt",
]
