"""An offline, deterministic model: for the demo and for tests that need no HTTP.

It behaves like a provider where it matters to segue: usage is per request and describes the
whole prompt it was sent (so it grows as the conversation grows, mostly as cache reads), tool
calls come back as ``tool_use``, the summary, checkpoint and compaction requests get plausible
answers, an overlong prompt is refused the way the real API refuses it, and a reply's text is
streamed in pieces to whoever watches the turn.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace

from segue.executor.errors import LlmCallError
from segue.executor.model_port import BaseLlmModel, LlmReply, LlmRequest, TextSink
from segue.executor.models.windows import Window, table_window
from segue.statemachine import ToolCall, Usage, estimate_tokens

Step = LlmReply | LlmCallError | Callable[[LlmRequest], LlmReply]


def prompt_tokens(request: LlmRequest) -> int:
    """What the scripted provider counts for a prompt (segue's own estimate, deterministically)."""
    total = estimate_tokens(request.system or "")
    total += sum(estimate_tokens(tool.name + tool.description) for tool in request.tools)
    for message in request.messages:
        total += estimate_tokens(message.text)
        for call in message.tool_calls:
            total += estimate_tokens(call.name + repr(call.input))
    if request.instruction:
        total += estimate_tokens(request.instruction)
    return total


class ScriptedModel(BaseLlmModel):
    """Answers from a script, then from a deterministic default.

    ``script`` items are replies, errors to raise, or callables that build a reply from the
    request. A reply without usage gets the usage a provider would report for that prompt.
    ``window`` makes prompts larger than it fail with the provider's overflow error.
    ``exact_preflight`` makes ``count_tokens`` answer (as ``AnthropicModel``'s does).
    ``chunk_chars`` and ``chunk_delay`` shape the stream: text goes out in pieces of about that
    many characters, ``chunk_delay`` seconds apart (0: as fast as the loop allows). ``default``
    answers once the script is used up; where it returns None (or without one) the built-in
    deterministic answers do.
    ``remember``: how many of the latest requests ``requests`` and ``counted`` keep (a test reads
    them; an offline server or a soak answering millions must not keep every prompt it saw).
    """

    reuses_prefix: bool = True
    """Nothing is sent anywhere: a request at the limit is answered whatever its shape, so a
    conversation may ask for ``summary_request="reuse_prefix"`` offline (``PrefixReusing``)."""

    def __init__(
        self,
        script: Iterable[Step] = (),
        *,
        window: int | None = None,
        reply_chars: int = 400,
        tool_every: int = 0,
        delay: float = 0.0,
        exact_preflight: bool = False,
        chunk_chars: int = 24,
        chunk_delay: float = 0.0,
        default: Callable[[LlmRequest], LlmReply | None] | None = None,
        remember: int = 1_000,
    ) -> None:
        if chunk_chars < 1:
            raise ValueError("chunk_chars must be at least 1")
        if remember < 1:
            raise ValueError("remember must be at least 1")
        self._remember = remember
        self._script: deque[Step] = deque(script)
        self._window = window
        self._reply_chars = reply_chars
        self._tool_every = tool_every
        self._delay = delay
        self.exact_preflight = exact_preflight
        self._chunk_chars = chunk_chars
        self._chunk_delay = chunk_delay
        self._fallback = default
        self.counted: list[LlmRequest] = []
        """The requests ``count_tokens`` answered, in order (the latest ``remember`` of them)."""
        self._turns = 0
        self.requests: list[LlmRequest] = []
        """The requests ``complete`` was given, in order (the latest ``remember`` of them)."""

    def extend(self, steps: Iterable[Step]) -> None:
        """Queue more scripted steps."""
        self._script.extend(steps)

    async def complete(self, request: LlmRequest) -> LlmReply:
        """Answer one request (see the class docstring), streaming its text to
        ``request.on_text``."""
        self._keep(self.requests, request)
        on_text = request.on_text
        if self._delay:
            await asyncio.sleep(self._delay)
        if request.trim_level and request.purpose != "turn":
            messages = list(request.messages)
            drop = min(len(messages) - 4, len(messages) * request.trim_level // 4)
            if drop > 0:
                request = replace(request, messages=messages[drop:])
        prompt = prompt_tokens(request)
        if self._window is not None and prompt > self._window:
            msg = f"prompt is too long: {prompt} tokens > {self._window} maximum"
            raise LlmCallError(msg, context_overflow=True, status_code=400)
        if self._script:
            step = self._script.popleft()
            if isinstance(step, LlmCallError):
                raise step
            reply = step if isinstance(step, LlmReply) else step(request)
        else:
            reply = (self._fallback and self._fallback(request)) or self._default(request)
        if on_text is not None:
            await self._stream(reply.text, on_text)
        if reply.usage is not None:
            return reply
        output = estimate_tokens(reply.text) + sum(
            estimate_tokens(call.name + repr(call.input)) for call in reply.tool_calls
        )
        fresh = min(prompt, 40 + prompt // 50)
        usage = Usage(
            input_tokens=fresh,
            cache_read_input_tokens=prompt - fresh,
            output_tokens=output,
        )
        return replace(reply, usage=usage)  # everything else the script said stays as it said

    async def _stream(self, text: str, on_text: TextSink) -> None:
        size = self._chunk_chars
        for start in range(0, len(text), size):
            if self._chunk_delay:
                await asyncio.sleep(self._chunk_delay)
            on_text(text[start : start + size])

    def _default(self, request: LlmRequest) -> LlmReply:
        if request.purpose == "continuation":
            return LlmReply(text=_summary(request, "Continuation summary"))
        if request.purpose == "compaction":
            return LlmReply(text=_summary(request, "Summary of the earlier conversation"))
        if request.purpose == "checkpoint":
            return LlmReply(text=_checkpoint(request))
        self._turns += 1
        last_user = next(
            (m.text for m in reversed(request.messages) if m.kind == "user"), "(nothing yet)"
        )
        last = request.messages[-1] if request.messages else None
        wants_tool = (
            self._tool_every
            and request.tools
            and self._turns % self._tool_every == 0
            and (last is None or last.kind != "tool_result")
        )
        if wants_tool:
            tool = request.tools[0]
            call = ToolCall(id=f"toolu_{self._turns:04d}", name=tool.name, input={"query": "x"})
            return LlmReply(text="Let me check that.", tool_calls=(call,), stop_reason="tool_use")
        body = f"Answer {self._turns} to {_quoted(last_user, 80)}. "
        filler = "This is a detailed, deterministic answer from the scripted model. "
        text = (body + filler * (self._reply_chars // len(filler) + 1))[: self._reply_chars]
        return LlmReply(text=text)

    async def context_window(self, model: str) -> int | None:  # one window for all
        """The window given at construction (None: use segue's static table)."""
        return self._window

    async def window(self, model: str) -> Window:
        """The window given at construction (``given``), else segue's table's."""
        if self._window is not None:
            return Window(self._window, "given")
        return table_window(model, None)

    async def count_tokens(self, request: LlmRequest) -> int | None:
        """The scripted provider's exact count of ``request``, if exact pre-flight is on."""
        if not self.exact_preflight:
            return None
        self._keep(self.counted, request)
        return prompt_tokens(request)

    def _keep(self, kept: list[LlmRequest], request: LlmRequest) -> None:
        """Append ``request``, forgetting the oldest past twice ``remember`` (a list stays a
        list for the tests that compare it; the trim is paid once per ``remember`` requests)."""
        kept.append(request)
        if len(kept) >= 2 * self._remember:
            del kept[: len(kept) - self._remember]


def _quoted(text: str, limit: int) -> str:
    """``text`` as a short quotation, so its own punctuation never doubles the sentence's."""
    clipped = text if len(text) <= limit else f"{text[:limit]}..."
    return f'"{clipped}"'


def _summary(request: LlmRequest, title: str) -> str:
    users = [_quoted(m.text, 60) for m in request.messages if m.kind == "user"]
    topics = ", ".join(users[-5:]) or "no user messages"
    rejected = ", ".join(call.name for call in request.rejected_tool_calls)
    lines = [f"{title}: {len(request.messages)} messages.", f"Recent requests: {topics}."]
    if rejected:
        lines.append(f"Not run because the context was full: {rejected}.")
    return "\n".join(lines)


def _checkpoint(request: LlmRequest) -> str:
    users = [m.text[:60] for m in request.messages if m.kind == "user"]
    goal = users[0] if users else "unknown"
    return (
        "<checkpoint>\n## Goal\n"
        f"{goal}\n\n## Completed Work\n- {len(request.messages)} messages of work\n\n"
        "## Remaining Tasks\n1. Continue the task\n\n## Do Not Redo\n- Completed steps\n\n"
        "## Key Decisions\n- Keep going\n</checkpoint>"
    )
