"""Reading one streamed OpenAI answer into segue's ``LlmReply``: the server-sent events of Chat
Completions (chunks) or of the Responses API (typed events), read as JSON.

``OpenAIModel`` takes the raw lines from the client (``with_streaming_response``: the client's
own HTTP, headers, retries policy and status errors) and reads each event's JSON here rather
than letting the client build a typed object per chunk, which cost about four times what
reading the Anthropic stream costs per text delta (``bench/bench_runtime.py``).

* **Complete or not.** A Chat Completions stream is a reply only once its ``finish_reason``
  came; a Responses stream only with ``response.completed`` (``response.incomplete`` is a reply
  cut by its token bound, ``max_tokens`` to the core, as ``finish_reason: length`` is). A stream
  that ends before, or with ``response.failed`` or an ``error`` event, is an ``LlmCallError``,
  never a reply.
* **Tool calls** are joined from their fragments by index (``replies.ToolCallParts``); a call
  whose arguments are not a JSON object is an error, never a call to run (in a reply cut by its
  token bound such a call is dropped, as the core drops every call of a cut reply).
* **Usage**: ``prompt_tokens`` / ``input_tokens`` hold the whole prompt with the cached part
  inside, mapped by ``replies.usage_from_prompt`` so nothing is counted twice. No usage chunk
  (a server that does not count, or ``include_usage`` ignored) is unknown usage: the core keeps
  its last figure.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final

from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmReply, TextSink
from segue.executor.models.call_errors import says_overflow
from segue.executor.models.openai_context import compaction_of
from segue.executor.models.openai_usage import read_usage
from segue.executor.models.replies import ToolCallParts
from segue.statemachine import ToolCall, Usage

FINISH_REASONS: Final = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}
"""OpenAI's ``finish_reason`` as the stop reason the core knows (others pass as they are)."""

_OVERFLOW_CODES: Final = frozenset({"context_length_exceeded"})
_RETRYABLE_CODES: Final = frozenset(
    {"rate_limit_exceeded", "server_error", "server_is_overloaded", "slow_down"}
)


def _field(value: Any, name: str) -> Any:
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


def _text_or_none(value: object) -> str | None:
    """A field a compatible server may leave out, or send empty: a string, else None."""
    return value if isinstance(value, str) and value else None


def failure(code: str | None, message: str, *, where: str) -> LlmCallError:
    """An error the stream itself carried (an ``error`` chunk or event, ``response.failed``)."""
    shown = f"{where}{f' {code}' if code else ''}: {message}"
    if code in _OVERFLOW_CODES or says_overflow(None, code, message):
        return LlmCallError(
            f"the prompt does not fit the context window ({shown})", context_overflow=True
        )
    if code in _RETRYABLE_CODES or code is None:
        return LlmCallError(f"the OpenAI API failed while answering ({shown})", retryable=True)
    return LlmCallError(f"the OpenAI API refused the request ({shown})")


@dataclass(slots=True)
class _Reader:
    on_text: TextSink | None = None
    texts: list[str] = field(default_factory=list)
    calls: ToolCallParts = field(default_factory=ToolCallParts)
    usage: Usage | None = None
    stop_reason: str | None = None
    response_id: str | None = None
    """The provider's id of the response (a chunk's ``id``, the Responses API's response's),
    for tracing (``gen_ai.response.id``)."""
    response_model: str | None = None
    """The model that answered, as the server names it (a chunk's or response's ``model``)."""

    def _named(self, answer: dict[str, Any]) -> None:
        """Keep the id and served model an answer carries (the first that say them)."""
        if self.response_id is None:
            self.response_id = _text_or_none(answer.get("id"))
        if self.response_model is None:
            self.response_model = _text_or_none(answer.get("model"))

    def _text(self, piece: str | None) -> None:
        if piece:
            self.texts.append(piece)
            if self.on_text is not None:
                self.on_text(piece)

    def _reply(self) -> LlmReply:
        stop = self.stop_reason or "end_turn"
        calls = self._finished_calls(truncated=stop == "max_tokens")
        if calls and stop == "end_turn":
            stop = "tool_use"  # some compatible servers say "stop" after a tool call
        return LlmReply(
            text="".join(self.texts),
            tool_calls=calls,
            usage=self.usage,
            stop_reason=stop,
            response_id=self.response_id,
            response_model=self.response_model,
        )

    def _finished_calls(self, *, truncated: bool) -> tuple[ToolCall, ...]:
        if not truncated:
            return self.calls.finish()
        kept: list[ToolCall] = []
        for index in sorted(self.calls.calls):
            single = ToolCallParts({index: self.calls.calls[index]})
            try:
                kept += single.finish()
            except LlmCallError:
                continue  # cut off mid-arguments by the token bound: the core drops it anyway
        return tuple(kept)


@dataclass(slots=True)
class ChatReader(_Reader):
    """Accumulates the chunks of one Chat Completions stream (choice 0)."""

    finished: bool = False
    error: LlmCallError | None = None

    def feed(self, chunk: dict[str, Any]) -> None:
        """Take one chunk (its JSON)."""
        error = chunk.get("error")
        if error is not None:
            self.error = failure(
                _field(error, "code"), str(_field(error, "message")), where="stream error"
            )
            return
        self._named(chunk)
        usage = chunk.get("usage")
        if usage is not None:
            self.usage = read_usage(usage) or self.usage
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if delta:
                self._text(delta.get("content"))
                self._text(delta.get("refusal"))
                for call in delta.get("tool_calls") or ():
                    function = call.get("function") or {}
                    self.calls.add(
                        call.get("index", 0),
                        id=call.get("id"),
                        name=function.get("name"),
                        arguments=function.get("arguments") or "",
                    )
            reason = choice.get("finish_reason")
            if reason is not None:
                self.finished = True
                self.stop_reason = FINISH_REASONS.get(reason, str(reason))

    def reply(self) -> LlmReply:
        """The reply; ``LlmCallError`` when the stream carried an error, or (retryable) ended
        before its ``finish_reason`` (a dropped connection, a proxy's timeout)."""
        if self.error is not None:
            raise self.error
        if not self.finished:
            msg = "the response stream ended before its finish_reason (the reply is incomplete)"
            raise LlmCallError(msg, retryable=True)
        return self._reply()


@dataclass(slots=True)
class ResponsesReader(_Reader):
    """Accumulates the events of one Responses API stream."""

    ended: str | None = None
    """``completed`` or ``incomplete`` once the response ended."""
    error: LlmCallError | None = None
    compactions: list[dict[str, Any]] = field(default_factory=list)
    """The ``compaction`` items of the output (the provider compacted, REQ-SEG-048)."""

    def feed(self, event: dict[str, Any]) -> None:
        """Take one Responses stream event (its JSON)."""
        kind = event.get("type")
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            self._text(event.get("delta"))
        elif kind == "response.function_call_arguments.delta":
            self.calls.add(event.get("output_index", 0), arguments=event.get("delta") or "")
        elif kind == "response.output_item.added":
            item = event.get("item") or {}
            if item.get("type") == "function_call":
                self.calls.add(
                    event.get("output_index", 0), id=item.get("call_id"), name=item.get("name")
                )
        elif kind == "response.output_item.done":
            self._item_done(event)
        elif kind == "response.created":
            self._named(event.get("response") or {})
        elif kind in ("response.completed", "response.incomplete"):
            self._ended(event.get("response") or {}, kind.removeprefix("response."))
        elif kind == "response.failed":
            error = (event.get("response") or {}).get("error") or {}
            message = error.get("message") or "the response failed"
            self.error = failure(error.get("code"), message, where="response.failed")
        elif kind == "error":
            message = event.get("message") or "error event"
            self.error = failure(event.get("code"), message, where="error event")

    def _item_done(self, event: dict[str, Any]) -> None:
        item = event.get("item") or {}
        if item.get("type") == "compaction":
            self.compactions.append(item)
            return
        if item.get("type") != "function_call":
            return
        index = event.get("output_index", 0)
        arguments = item.get("arguments")
        parts = self.calls.calls.get(index)
        if parts is not None and isinstance(arguments, str):
            parts.arguments[:] = [arguments]  # the whole arguments, as the server has them
        else:
            self.calls.add(
                index, id=item.get("call_id"), name=item.get("name"), arguments=arguments or ""
            )

    def _ended(self, response: dict[str, Any], how: str) -> None:
        self.ended = how
        self._named(response)
        self.usage = read_usage(response.get("usage"))
        if how == "completed":
            self.stop_reason = "end_turn"
            return
        reason = (response.get("incomplete_details") or {}).get("reason")
        self.stop_reason = "refusal" if reason == "content_filter" else "max_tokens"

    def reply(self) -> LlmReply:
        """The reply; ``LlmCallError`` when the stream failed or ended before its end."""
        if self.error is not None:
            raise self.error
        if self.ended is None:
            msg = "the response stream ended before response.completed (the reply is incomplete)"
            raise LlmCallError(msg, retryable=True)
        reply = self._reply()
        if not self.compactions:
            return reply
        made = tuple(compaction_of(item) for item in self.compactions)
        return dataclasses.replace(reply, compactions=made)


__all__ = ["FINISH_REASONS", "ChatReader", "ResponsesReader", "failure", "read_usage"]
