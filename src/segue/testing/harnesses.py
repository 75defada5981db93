"""The built-in conformance harnesses: segue's own adapters, each against its provider's fake
server (``AnthropicModel`` and ``FakeAnthropicServer``, ``OpenAIModel`` and ``FakeOpenAIServer``
on either API, the offline ``ScriptedModel``), for ``segue.testing.conformance`` and for the
end-to-end tests that run on every provider. Each is also a complete example of a harness for
an adapter of one's own (``docs/adapters.md``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, Self

from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmModel, LlmReply, LlmRequest
from segue.statemachine import ToolCall
from segue.testing._sent import anthropic_raw_arguments, anthropic_sent, openai_sent
from segue.testing.conformance import Answer, Call, Failure, Harness, NotApplicable, Said, Sent

if TYPE_CHECKING:
    from segue.testing._scripted_http import ScriptedServer


@contextlib.asynccontextmanager
async def _closing(client: Any, model: LlmModel) -> AsyncIterator[LlmModel]:
    try:
        yield model
    finally:
        await client.close()


_KEY = "sk-conformance-NEVER-LEAK-0123456789"


class _Base:
    """What the built-in harnesses over a fake server share: the server's lifecycle and the
    translation of a script into the server's replies (``ScriptedHarness``, with no server,
    overrides both)."""

    name = "base"
    wire = True
    server: Any  # the running fake; Any, as each harness calls its own fake's methods

    def __init__(self, *, key: str = _KEY) -> None:
        self.key = key

    def __enter__(self) -> Self:
        self._start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop()

    def _start(self) -> None:
        self.server = self._fake().start()

    def _stop(self) -> None:
        self.server.stop()

    def _fake(self) -> ScriptedServer[Any]:
        """A new, unstarted fake server of this harness's provider."""
        raise NotImplementedError

    def _native(self, answer: Answer) -> Any:
        raise NotImplementedError

    def script(self, *answers: Answer) -> None:
        self.server.enqueue(*(self._native(a) for a in answers))

    def default(self, answer: Answer | Callable[[], Answer]) -> None:
        if callable(answer):
            make = answer
            self.server.default = lambda _body: self._native(make())
        else:
            self.server.default = self._native(answer)

    def respond(self, answer: Callable[[Sent], Answer]) -> None:
        """What the provider answers once the script is used up, decided from each request as
        the fake server received it (a usage as large as the prompt, a tool call on every
        third question): for the end-to-end tests whose provider acts on what it is asked."""

        def native(body: dict[str, Any]) -> Any:
            return self._native(answer(self._sent_of(body)))

        self.server.default = native

    def _sent_of(self, body: dict[str, Any]) -> Sent:
        raise NotImplementedError

    @property
    def pending(self) -> int:
        return int(self.server.pending)


class AnthropicHarness(_Base):
    """``AnthropicModel`` against ``FakeAnthropicServer``."""

    name = "anthropic"
    compacting_model = "claude-sonnet-4-6"
    """A model whose compaction the API documents (the conformance kit's compaction checks)."""

    def _fake(self) -> ScriptedServer[Any]:
        from segue.testing.anthropic_server import FakeAnthropicServer  # noqa: PLC0415

        return FakeAnthropicServer()

    def model(self, **options: Any) -> contextlib.AbstractAsyncContextManager[LlmModel]:
        import anthropic  # noqa: PLC0415

        from segue.executor.models.anthropic import AnthropicModel  # noqa: PLC0415

        retries = options.pop("max_retries", 0)
        client = anthropic.AsyncAnthropic(
            api_key=self.key, base_url=self.server.url, max_retries=retries
        )
        return _closing(client, AnthropicModel(client, **options))

    def _native(self, answer: Answer) -> Any:
        from segue.testing import anthropic_server as fake  # noqa: PLC0415

        if isinstance(answer, Failure):
            return _anthropic_failure(answer)
        usage = None
        if answer.prompt is not None:
            fresh = answer.prompt - answer.cached - answer.cache_write
            usage = fake.Usage(fresh, answer.output, answer.cache_write, answer.cached)
        uses = [
            fake.ToolUse(c.name, {} if isinstance(c.input, str) else dict(c.input), **_id(c))
            for c in answer.calls
        ]
        reply = fake.MessageReply(
            text=answer.text,
            tool_uses=uses,
            usage=usage,
            stop_reason="tool_use" if uses else "end_turn",
            pieces=answer.pieces,
            chunk_delay=answer.chunk_delay,
            delay=answer.delay,
        )
        compacted = answer.compacted
        if compacted is not None:
            spent = fake.Usage(compacted.prompt, compacted.output)
            block = fake.Compacted(content=compacted.summary, usage=spent)
            reply = replace(reply, compaction=block)
            if compacted.pause:
                reply = replace(reply, text="", tool_uses=(), stop_reason="compaction")
        broken = [c for c in answer.calls if isinstance(c.input, str)]
        if broken:
            return anthropic_raw_arguments(reply, broken)
        if answer.cut:
            return replace(reply, cut_after=4)
        return reply

    def sent(self) -> list[Sent]:
        return [anthropic_sent(r.body, r.headers) for r in self.server.message_requests()]

    def _sent_of(self, body: dict[str, Any]) -> Sent:
        return anthropic_sent(body, {})


def _id(call: Call) -> dict[str, str]:
    return {"id": call.id} if call.id else {}


def _anthropic_failure(failure: Failure) -> Any:
    from segue.testing import anthropic_server as fake  # noqa: PLC0415

    if failure.kind == "overflow":
        return fake.prompt_too_long(210_000, 200_000)
    if failure.kind == "rate_limit":
        headers = (
            {"retry-after": str(failure.retry_after)} if failure.retry_after is not None else {}
        )
        return fake.ErrorReply(429, "rate_limit_error", "Rate limited.", headers)
    if failure.kind == "server":
        return fake.ErrorReply(500, "api_error", "Internal server error")
    if failure.kind == "mid_stream":
        return fake.overloaded(mid_stream=True)
    if failure.kind == "compaction_refused":
        said = "compact_20260112 is not supported for this model"
        return fake.ErrorReply(400, "invalid_request_error", said)
    return fake.ErrorReply(401, "authentication_error", f"invalid x-api-key: {failure.echo}")


class OpenAIHarness(_Base):
    """``OpenAIModel`` (``api`` ``chat`` or ``responses``) against ``FakeOpenAIServer``."""

    def __init__(self, api: Literal["chat", "responses"] = "chat", *, key: str = _KEY) -> None:
        super().__init__(key=key)
        self.api = api
        self.name = f"openai-{api}"
        self.compacting_model = "gpt-4o"
        """A model whose compaction the Responses API does (Chat Completions does none)."""

    def _fake(self) -> ScriptedServer[Any]:
        from segue.testing.openai_server import FakeOpenAIServer  # noqa: PLC0415

        return FakeOpenAIServer()

    def model(self, **options: Any) -> contextlib.AbstractAsyncContextManager[LlmModel]:
        import openai  # noqa: PLC0415

        from segue.executor.models.openai import OpenAIModel  # noqa: PLC0415

        retries = options.pop("max_retries", 0)
        client = openai.AsyncOpenAI(api_key=self.key, base_url=self.server.url, max_retries=retries)
        return _closing(client, OpenAIModel(client, api=self.api, **options))

    def _native(self, answer: Answer) -> Any:
        from segue.testing import openai_server as fake  # noqa: PLC0415

        if isinstance(answer, Failure):
            return _openai_failure(answer)
        usage = None
        if answer.prompt is not None:
            usage = fake.Usage(
                answer.prompt,
                answer.output,
                cached_tokens=answer.cached,
                cache_write_tokens=answer.cache_write or None,
            )
        calls = [fake.ToolCall(c.name, c.input, **_id(c)) for c in answer.calls]
        item = None
        if answer.compacted is not None:
            from segue.testing.openai_compaction import compaction_item  # noqa: PLC0415

            if answer.compacted.summary is None or answer.compacted.pause:
                msg = "OpenAI's compaction item holds no summary to fail and does not pause"
                raise NotApplicable(msg)
            item = compaction_item(answer.compacted.summary)
        return fake.Reply(
            compaction=item,
            text=answer.text,
            tool_calls=calls,
            usage=usage,
            pieces=answer.pieces,
            chunk_delay=answer.chunk_delay,
            delay=answer.delay,
            cut_after=3 if answer.cut else None,
        )

    def sent(self) -> list[Sent]:
        return [openai_sent(r.body, r.headers) for r in self.server.model_requests()]

    def _sent_of(self, body: dict[str, Any]) -> Sent:
        return openai_sent(body, {})


def _openai_failure(failure: Failure) -> Any:
    from segue.testing import openai_server as fake  # noqa: PLC0415

    if failure.kind == "overflow":
        return fake.context_length_exceeded(130_000, 128_000)
    if failure.kind == "rate_limit":
        return fake.rate_limited(
            str(failure.retry_after) if failure.retry_after is not None else "0"
        )
    if failure.kind == "server":
        return fake.server_error()
    if failure.kind == "mid_stream":
        return fake.ErrorReply(
            500, "The server had an error.", "server_error", code="server_error", mid_stream=True
        )
    if failure.kind == "compaction_refused":
        said = "context_management compaction is not supported for this model"
        return fake.ErrorReply(400, said, code="unsupported_parameter")
    return fake.invalid_api_key(failure.echo)


class ScriptedHarness(_Base):
    """The offline ``ScriptedModel``: the script is its script; it has no wire, so the checks
    that read what was sent are not applicable, and a failure is the ``LlmCallError`` a
    provider adapter would raise for it."""

    name = "scripted"
    wire = False

    def _start(self) -> None:
        self._queue: list[Answer] = []
        self._default: Answer | Callable[[], Answer] = Said()

    def _stop(self) -> None:
        self._queue.clear()

    def script(self, *answers: Answer) -> None:
        self._queue.extend(answers)

    def default(self, answer: Answer | Callable[[], Answer]) -> None:
        self._default = answer

    @property
    def pending(self) -> int:
        return len(self._queue)

    def sent(self) -> list[Sent]:
        return []

    def model(self, **options: Any) -> contextlib.AbstractAsyncContextManager[LlmModel]:
        from segue.executor.models.scripted import ScriptedModel  # noqa: PLC0415

        harness = self

        def step(request: LlmRequest) -> LlmReply:
            answer = harness._queue.pop(0) if harness._queue else harness._default
            if callable(answer):
                answer = answer()
            return _scripted_reply(answer, harness.key)

        options.pop("max_retries", None)
        # Small pieces a few milliseconds apart: a long reply streams long enough to cancel.
        options = {"chunk_chars": 8, "chunk_delay": 0.002, **options}
        return _nothing_to_close(ScriptedModel(default=step, **options))


@contextlib.asynccontextmanager
async def _nothing_to_close(model: LlmModel) -> AsyncIterator[LlmModel]:
    yield model


def _scripted_reply(answer: Answer, key: str) -> LlmReply:
    from segue.executor.models.replies import usage_from_prompt  # noqa: PLC0415
    from segue.statemachine import Usage  # noqa: PLC0415

    if isinstance(answer, Failure):
        raise {
            "overflow": LlmCallError("prompt is too long", context_overflow=True, status_code=400),
            "rate_limit": LlmCallError(
                "rate limited", retryable=True, status_code=429, retry_after=answer.retry_after
            ),
            "server": LlmCallError("server error", retryable=True, status_code=500),
            "mid_stream": LlmCallError("stream error", retryable=True),
            "auth": LlmCallError(
                "authentication failed: check THE_API_KEY", fatal=True, status_code=401
            ),
            "compaction_refused": LlmCallError(
                "the provider cannot compact", status_code=400, compaction_refused=True
            ),
        }[answer.kind]
    if answer.cut:
        raise LlmCallError("the stream ended before its end", retryable=True)
    if any(isinstance(c.input, str) for c in answer.calls):
        raise LlmCallError("a tool call's arguments are not JSON", retryable=True)
    calls = tuple(
        ToolCall(
            id=c.id or f"call_{i}",
            name=c.name,
            input=dict(c.input) if not isinstance(c.input, str) else {},
        )
        for i, c in enumerate(answer.calls)
    )
    usage = usage_from_prompt(
        answer.prompt, answer.output, cache_read=answer.cached, cache_write=answer.cache_write
    )
    return LlmReply(
        text=answer.text,
        tool_calls=calls,
        usage=usage if usage is not None else Usage(),
        stop_reason="tool_use" if calls else "end_turn",
    )


HARNESSES: dict[str, Callable[[], Harness]] = {
    "anthropic": AnthropicHarness,
    "openai-chat": lambda: OpenAIHarness("chat"),
    "openai-responses": lambda: OpenAIHarness("responses"),
    "scripted": ScriptedHarness,
}
"""The built-in harnesses by name (what segue's own tests parametrise over)."""

__all__ = ["HARNESSES", "AnthropicHarness", "OpenAIHarness", "ScriptedHarness"]
