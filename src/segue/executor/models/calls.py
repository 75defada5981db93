"""One call of an adapter, the way the port asks for it, whatever the provider.

Both real adapters (``AnthropicModel``, ``OpenAIModel``) run their call through ``guarded``: the
call and its reply are logged at debug level (what was asked, what it cost, how long it took;
never text), and whatever it raises comes out as an ``LlmCallError`` (the port promises nothing
else), with the API key scrubbed from the error and from every exception chained below it.
An adapter for another provider does the same in one line.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from segue.executor.errors import LlmCallError
from segue.executor.model_port import LlmReply, LlmRequest
from segue.executor.models.helpers import scrub_secrets


async def guarded(
    request: LlmRequest,
    call: Callable[[], Awaitable[LlmReply]],
    *,
    to_error: Callable[[BaseException], LlmCallError],
    secrets: Sequence[str],
    log: Any,
) -> LlmReply:
    """``await call()``, logged; any failure raised as ``to_error(exc)`` from ``exc`` (itself
    when it is already an ``LlmCallError``), ``secrets`` scrubbed from the whole chain."""
    started = time.monotonic()
    try:
        reply = await call()
    except Exception as exc:  # the port promises LlmCallError and nothing else
        error = to_error(exc)
        scrub_secrets(exc, secrets)  # the chain below the error must not hold the key
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
        if error is exc:  # already ours (a cut stream): never its own cause
            raise
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
