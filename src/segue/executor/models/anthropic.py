"""The Anthropic adapter: segue's ``LlmModel`` over the real ``anthropic.AsyncAnthropic`` client.

Three jobs, each kept apart so it can be read and tested on its own:

* **Payload.** segue's transcript becomes a Messages API payload. A normal turn keeps tool blocks
  (every ``tool_use`` answered by a ``tool_result`` in the very next user turn, roles alternating,
  a user turn first). The tool-less requests (continuation summary, checkpoint, compaction) send
  the history *repaired*: every tool block turned into prose, so nothing can be left unpaired,
  the oldest ``trim_level`` quarters dropped after an overflow, the rejected tool calls named and
  the instruction last.
* **Reply.** The per-request usage is copied field by field (a null cache field is 0,
  ``docs/design.md`` section 1); ``stop_reason`` passes through untouched because the core
  decides what ``max_tokens`` or ``model_context_window_exceeded`` mean.
* **Errors.** Every failure becomes an ``LlmCallError`` that says whether retrying, trimming or
  nothing can help. The SDK already retried the retryable statuses ``max_retries`` times.

Calls always stream (``messages.stream`` + ``get_final_message``): the SDK refuses a non-streaming
call whose ``max_tokens`` could outlast its timeout, and long outputs are exactly what the large
models allow. The API key never appears in a log entry or an error message.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import anthropic
import httpx2
from anthropic.types import (
    AssistantMessageParam,
    ContentBlockParam,
    MessageParam,
    TextBlockParam,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlockParam,
    UserMessageParam,
)
from pydantic import ValidationError

from segue.executor._log import get_logger
from segue.executor.ports import LlmCallError, LlmReply, LlmRequest
from segue.statemachine import Message, ToolCall, Usage

log = get_logger(__name__)

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

_START_PLACEHOLDER: Final = "(The conversation continues below.)"
_NOT_RECORDED: Final = "Not run: no result was recorded for this tool call."
_CONTINUE: Final = "Continue."
_OVERFLOW_MARKERS: Final = ("prompt is too long", "exceed context limit", "exceeds context limit")
_RETRYABLE_STATUS: Final = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
# A stream that already got HTTP 200 carries its failure as an SSE ``error`` event: the SDK raises
# a plain APIStatusError with status 200, so only the error type says what happened.
_RETRYABLE_TYPES: Final = frozenset({"rate_limit_error", "overloaded_error", "api_error"})
_AUTH_TYPES: Final = frozenset({"authentication_error", "permission_error"})


# --------------------------------------------------------------------------- payload


@dataclass(slots=True)
class _Turn:
    """One API message under construction; ``results`` counts its leading tool_result blocks."""

    role: Role
    blocks: list[ContentBlockParam] = field(default_factory=list)
    results: int = 0


@dataclass(frozen=True, slots=True)
class Payload:
    """What is sent for one request (besides ``model``): built once, used to call or to count."""

    system: str | None
    messages: list[MessageParam]
    tools: list[ToolParam]
    max_tokens: int


class _Turns:
    """Accumulates blocks into alternating turns, merging consecutive same-role blocks."""

    def __init__(self) -> None:
        self.turns: list[_Turn] = []

    def add(self, role: Role, block: ContentBlockParam) -> None:
        if not self.turns or self.turns[-1].role != role:
            self.turns.append(_Turn(role))
        self.turns[-1].blocks.append(block)

    def add_text(self, role: Role, text: str) -> None:
        # The API refuses empty text blocks, so an empty message contributes nothing.
        if text.strip():
            self.add(role, _text(text))

    def add_result(self, block: ToolResultBlockParam) -> None:
        """A tool_result must precede any text in its user turn, so insert it after the others."""
        if not self.turns or self.turns[-1].role != "user":
            self.turns.append(_Turn("user"))
        turn = self.turns[-1]
        turn.blocks.insert(turn.results, block)
        turn.results += 1

    def params(self) -> list[MessageParam]:
        """The finished messages, a user turn first as the API requires."""
        if not self.turns or self.turns[0].role != "user":
            self.turns.insert(0, _Turn("user", [_text(_START_PLACEHOLDER)]))
        messages: list[MessageParam] = []
        for turn in self.turns:
            if turn.role == "user":
                messages.append(UserMessageParam(role="user", content=turn.blocks))
            else:
                messages.append(AssistantMessageParam(role="assistant", content=turn.blocks))
        return messages


def _text(text: str) -> TextBlockParam:
    return TextBlockParam(type="text", text=text)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters]"


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _role_text(message: Message) -> tuple[Role, str]:
    """The role and text a non-tool message is sent as."""
    if message.kind == "summary":
        return "user", f"Summary of the earlier conversation: {message.text}"
    if message.kind in ("assistant", "continuation", "checkpoint"):
        return "assistant", message.text  # the model wrote these
    return "user", message.text


def turn_messages(messages: Sequence[Message]) -> list[MessageParam]:
    """The history with tool blocks, for a normal turn.

    The core pairs every ``tool_use`` outside ``ToolExecuting``; this still holds the line the API
    enforces, so one bad transcript entry costs a sentence, not a failed conversation: a result
    whose call is not in the preceding assistant turn becomes text, and a call left without a
    result gets an error result before the next assistant turn.
    """
    turns = _Turns()
    open_calls: dict[str, ToolCall] = {}

    def close_open_calls() -> None:
        for call_id in open_calls:
            turns.add_result(
                ToolResultBlockParam(
                    type="tool_result", tool_use_id=call_id, content=_NOT_RECORDED, is_error=True
                )
            )
        open_calls.clear()

    for message in messages:
        if message.kind == "tool_result":
            call = open_calls.pop(message.tool_call_id or "", None)
            if call is None:
                turns.add_text("user", f"[tool result: {_clip(message.text, TOOL_RESULT_CHARS)}]")
                continue
            block = ToolResultBlockParam(type="tool_result", tool_use_id=call.id)
            if message.text:
                block["content"] = message.text
            if message.is_error:
                block["is_error"] = True
            turns.add_result(block)
            continue
        role, text = _role_text(message)
        if role == "assistant":
            close_open_calls()
        turns.add_text(role, text)
        for call in message.tool_calls if message.kind == "assistant" else ():
            if call.id in open_calls:
                continue  # the API refuses duplicate ids; the first one is the one answered
            turns.add(
                "assistant",
                ToolUseBlockParam(type="tool_use", id=call.id, name=call.name, input=call.input),
            )
            open_calls[call.id] = call
    close_open_calls()
    return turns.params()


def trim(messages: Sequence[Message], trim_level: int) -> tuple[Sequence[Message], int]:
    """Drop the oldest ``TRIM_FRACTION * trim_level`` of ``messages``; return (kept, dropped)."""
    count = len(messages)
    if trim_level <= 0 or count <= MIN_KEPT_MESSAGES:
        return messages, 0
    dropped = min(count - MIN_KEPT_MESSAGES, math.ceil(count * TRIM_FRACTION * trim_level))
    return messages[dropped:], dropped


def rejected_prose(calls: Iterable[ToolCall]) -> str:
    """One sentence naming tool calls that were asked for but never run."""
    named = [f"{c.name}({_clip(_json(c.input), REJECTED_INPUT_CHARS)})" for c in calls]
    if not named:
        return ""
    return f"You were about to call: {', '.join(named)}; they were not run."


def text_messages(request: LlmRequest) -> list[MessageParam]:
    """The history as plain text, for the tool-less requests (see the module docstring).

    With no tools declared the API refuses any tool block, and an overflowing history may have
    lost the call a result answers, so no tool block can survive: each becomes a bounded line.
    """
    kept, dropped = trim(request.messages, request.trim_level)
    names = {c.id: c.name for m in request.messages for c in m.tool_calls}
    turns = _Turns()
    if dropped:
        omitted = f"[{dropped} earlier messages were omitted to fit the context window.]"
        turns.add_text("user", omitted)
    for message in kept:
        if message.kind == "tool_result":
            name = names.get(message.tool_call_id or "", "a tool")
            label = "tool error" if message.is_error else "tool result"
            text = _clip(message.text, TOOL_RESULT_CHARS)
            turns.add_text("user", f"[{label} from {name}: {text}]")
            continue
        role, text = _role_text(message)
        turns.add_text(role, text)
        for call in message.tool_calls:
            arguments = _clip(_json(call.input), TOOL_INPUT_CHARS)
            turns.add_text("assistant", f"[called tool {call.name} with {arguments}]")
    final = [rejected_prose(request.rejected_tool_calls), request.instruction or ""]
    for text in final:
        turns.add_text("user", text)
    if turns.turns and turns.turns[-1].role == "assistant":
        turns.add_text("user", _CONTINUE)  # never end on an assistant turn (that is a prefill)
    return turns.params()


def build_payload(request: LlmRequest, *, max_tokens: int) -> Payload:
    """The Messages API payload for ``request`` (tools only for a normal turn)."""
    if request.purpose == "turn":
        messages = turn_messages(request.messages)
        if request.instruction:
            messages = _with_final_user_text(messages, request.instruction)
        tools = [
            ToolParam(name=t.name, description=t.description, input_schema=dict(t.input_schema))
            for t in request.tools
        ]
    else:
        messages = text_messages(request)
        tools = []
    return Payload(
        system=request.system or None,
        messages=messages,
        tools=tools,
        max_tokens=max(1, max_tokens),
    )


def _with_final_user_text(messages: list[MessageParam], text: str) -> list[MessageParam]:
    last = messages[-1]
    if last["role"] == "user" and not isinstance(last["content"], str):
        blocks: list[Any] = [*last["content"], _text(text)]
        return [*messages[:-1], UserMessageParam(role="user", content=blocks)]
    return [*messages, UserMessageParam(role="user", content=[_text(text)])]


# --------------------------------------------------------------------------- replies and errors


def usage_of(raw: anthropic.types.Usage | None) -> Usage | None:
    """segue's ``Usage`` from the SDK's: the four fields exactly, null cache fields as 0."""
    if raw is None:
        return None
    try:
        return Usage(
            input_tokens=raw.input_tokens or 0,
            output_tokens=raw.output_tokens or 0,
            cache_creation_input_tokens=raw.cache_creation_input_tokens or 0,
            cache_read_input_tokens=raw.cache_read_input_tokens or 0,
        )
    except ValidationError:
        return None  # a malformed report says nothing; the core keeps its last known figure


def reply_of(message: anthropic.types.Message) -> LlmReply:
    """segue's ``LlmReply`` from the SDK's accumulated final message."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            arguments = block.input if isinstance(block.input, dict) else {"input": block.input}
            calls.append(ToolCall(id=block.id, name=block.name, input=arguments))
    return LlmReply(
        text="".join(texts),
        tool_calls=tuple(calls),
        usage=usage_of(message.usage),
        stop_reason=message.stop_reason or "end_turn",
    )


def _redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "[redacted]")
    return text


def call_error(exc: BaseException, *, model: str, secrets: Sequence[str] = ()) -> LlmCallError:
    """Classify any failure of a call as an ``LlmCallError`` (see ``LlmCallError``'s fields)."""
    if isinstance(exc, LlmCallError):
        return exc
    if isinstance(exc, anthropic.APIStatusError):
        return _status_error(exc, model=model, secrets=secrets)
    if isinstance(exc, anthropic.APIConnectionError | httpx2.TransportError):
        detail = _redact(getattr(exc, "message", None) or str(exc) or type(exc).__name__, secrets)
        return LlmCallError(f"cannot reach the Anthropic API: {detail}", retryable=True)
    detail = _redact(str(exc) or type(exc).__name__, secrets)
    return LlmCallError(f"unexpected {type(exc).__name__} from the Anthropic client: {detail}")


def _status_error(
    exc: anthropic.APIStatusError, *, model: str, secrets: Sequence[str]
) -> LlmCallError:
    status = exc.status_code if exc.status_code >= 400 else None
    kind = exc.type or ""
    detail = _redact(exc.api_message or exc.message, secrets)
    shown = f"HTTP {status}" if status is not None else "stream error"
    if kind:
        shown += f" {kind}"
    lowered = detail.lower()
    if (status in (400, None) and any(m in lowered for m in _OVERFLOW_MARKERS)) or status == 413:
        # 413: the body is over the API's request size limit, far beyond any window; trimming
        # the history is the only remedy, exactly as for "prompt is too long".
        return LlmCallError(
            f"the prompt does not fit the context window ({shown}): {detail}",
            context_overflow=True,
            status_code=status,
        )
    if status in (401, 403) or kind in _AUTH_TYPES:
        return LlmCallError(
            f"authentication failed: check ANTHROPIC_API_KEY ({shown}: {detail})",
            fatal=True,
            status_code=status,
        )
    if status == 404 or kind == "not_found_error":
        return LlmCallError(
            f"unknown model {model!r} ({shown}: {detail})", fatal=True, status_code=status
        )
    if (
        status in _RETRYABLE_STATUS
        or (status is not None and status >= 500 and status != 501)
        or (status is None and kind in _RETRYABLE_TYPES)
    ):
        return LlmCallError(
            f"the Anthropic API is unavailable ({shown}): {detail}",
            retryable=True,
            status_code=status,
        )
    return LlmCallError(
        f"the Anthropic API refused the request ({shown}): {detail}", status_code=status
    )


# --------------------------------------------------------------------------- the adapter


class AnthropicModel:
    """``LlmModel`` for Anthropic's Messages API.

    ``client``: a configured ``AsyncAnthropic`` (its ``max_retries`` does the HTTP-level retries;
    what is left over the core retries with its own back-off). ``max_tokens``: the output bound
    of a normal turn; None uses the request's ``max_tokens``. ``summary_max_tokens``: the bound
    for the tool-less requests. ``exact_preflight``: let ``count_tokens`` ask the API (one extra
    request per preflight) instead of answering None.
    """

    def __init__(
        self,
        client: anthropic.AsyncAnthropic,
        *,
        max_tokens: int | None = None,
        summary_max_tokens: int = 4096,
        exact_preflight: bool = False,
    ) -> None:
        if max_tokens is not None and max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if summary_max_tokens < 1:
            raise ValueError("summary_max_tokens must be at least 1")
        self._client = client
        self._max_tokens = max_tokens
        self._summary_max_tokens = summary_max_tokens
        self._exact_preflight = exact_preflight
        self._windows: dict[str, int | None] = {}

    @property
    def exact_preflight(self) -> bool:
        """Whether ``count_tokens`` asks the API (see the class docstring)."""
        return self._exact_preflight

    def payload(self, request: LlmRequest) -> Payload:
        """What ``complete`` would send for ``request`` (public so callers can inspect it)."""
        if request.purpose == "turn":
            max_tokens = self._max_tokens if self._max_tokens is not None else request.max_tokens
        else:
            max_tokens = min(request.max_tokens, self._summary_max_tokens)
        return build_payload(request, max_tokens=max_tokens)

    @property
    def _secrets(self) -> tuple[str, ...]:
        candidates = (self._client.api_key, getattr(self._client, "auth_token", None))
        return tuple(s for s in candidates if isinstance(s, str) and s)

    async def complete(self, request: LlmRequest) -> LlmReply:
        """One streamed call; every failure is raised as ``LlmCallError``."""
        started = time.monotonic()
        try:
            payload = self.payload(request)
            log.debug(
                "llm.request",
                conversation_id=request.conversation_id,
                purpose=request.purpose,
                model=request.model,
                messages=len(payload.messages),
                tools=len(payload.tools),
                max_tokens=payload.max_tokens,
                trim_level=request.trim_level,
            )
            async with self._client.messages.stream(
                model=request.model,
                max_tokens=payload.max_tokens,
                messages=payload.messages,
                system=payload.system if payload.system is not None else anthropic.omit,
                tools=payload.tools or anthropic.omit,
            ) as stream:
                message = await stream.get_final_message()
            reply = reply_of(message)
        except Exception as exc:  # the port promises LlmCallError and nothing else
            error = call_error(exc, model=request.model, secrets=self._secrets)
            log.debug(
                "llm.error",
                conversation_id=request.conversation_id,
                purpose=request.purpose,
                model=request.model,
                status_code=error.status_code,
                retryable=error.retryable,
                context_overflow=error.context_overflow,
                fatal=error.fatal,
                error=error.message,
                duration_s=round(time.monotonic() - started, 3),
            )
            raise error from exc
        log.debug(
            "llm.reply",
            conversation_id=request.conversation_id,
            purpose=request.purpose,
            model=request.model,
            usage=reply.usage.model_dump() if reply.usage is not None else None,
            stop_reason=reply.stop_reason,
            tool_calls=len(reply.tool_calls),
            duration_s=round(time.monotonic() - started, 3),
        )
        return reply

    async def context_window(self, model: str) -> int | None:
        """``max_input_tokens`` from ``models.retrieve`` (cached per model); None on any error."""
        if model in self._windows:
            return self._windows[model]
        try:
            info = await self._client.models.retrieve(model)
        except Exception as exc:  # noqa: BLE001  # None means "use the static table"
            error = call_error(exc, model=model, secrets=self._secrets)
            log.debug("llm.context_window_unavailable", model=model, error=error.message)
            return None
        window = info.max_input_tokens
        self._windows[model] = window if isinstance(window, int) and window > 0 else None
        return self._windows[model]

    async def count_tokens(self, request: LlmRequest) -> int | None:
        """The API's exact count of the prompt ``complete`` would send; None if not enabled."""
        if not self._exact_preflight:
            return None
        try:
            payload = self.payload(request)
            counted = await self._client.messages.count_tokens(
                model=request.model,
                messages=payload.messages,
                system=payload.system if payload.system is not None else anthropic.omit,
                tools=payload.tools or anthropic.omit,
            )
        except Exception as exc:  # noqa: BLE001  # None means "use the estimate"
            error = call_error(exc, model=request.model, secrets=self._secrets)
            log.debug("llm.count_tokens_failed", model=request.model, error=error.message)
            return None
        log.debug("llm.count_tokens", model=request.model, input_tokens=counted.input_tokens)
        return counted.input_tokens
