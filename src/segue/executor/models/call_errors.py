"""What a failed call becomes, for any provider: the ``LlmCallError`` the core acts on, and
the API key kept out of it.

* ``http_error`` classifies an HTTP failure as the ``LlmCallError`` the core acts on (retry,
  trim, or give up) from the status, whether the provider said the prompt overflowed, what its
  error type means (``Meaning``) and its ``Retry-After`` (``retry_after``).
* ``says_overflow`` tells a provider's "the prompt does not fit" in any of the wordings the
  servers segue meets use (``OVERFLOW_WORDINGS``: OpenAI, Anthropic, vLLM, llama.cpp, Ollama,
  LM Studio, LiteLLM): each takes the exhaustion path, never a failed turn; and, on a 400 or
  a 413 only, in the generic families other libraries match (``GENERIC_OVERFLOW_WORDINGS``).
* ``secrets_of`` picks the credentials worth redacting, ``redact`` keeps them out of a
  message, and ``scrub_secrets`` out of every exception chained below the error raised (what
  ``calls.guarded`` does for every adapter).
"""

from __future__ import annotations

import contextlib
import email.utils
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from segue.executor.errors import LlmCallError

MAX_RETRY_AFTER: Final = 3600.0
"""A server's Retry-After is honoured up to an hour; longer is taken as an hour."""
MIN_SECRET: Final = 8
"""A credential shorter than this is not redacted: a test's ``"k"`` would blank out letters."""
RETRYABLE_STATUS: Final = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
"""Statuses worth another attempt: timeout, conflict, rate limit, the server's own trouble."""


OVERFLOW_WORDINGS: Final[tuple[tuple[str, str], ...]] = (
    ("OpenAI", "context_length_exceeded"),
    ("OpenAI, vLLM, LiteLLM", "maximum context length is"),
    ("OpenAI (Responses API)", "exceeds the context window"),
    ("Azure OpenAI", "input tokens exceed the configured limit"),
    ("Anthropic", "prompt is too long"),
    ("Anthropic", "exceed context limit"),
    ("Anthropic", "exceeds context limit"),
    ("vLLM (V1 engine)", "longer than the maximum model length"),
    ("llama.cpp server", "exceeds the available context size"),
    ("llama.cpp server", "exceed_context_size_error"),
    ("Ollama", "input length exceeds the context length"),
    ("LM Studio", "is greater than the context length"),
    ("LM Studio", "loaded with context length of only"),
    ("LiteLLM proxy", "contextwindowexceedederror"),
)
"""How each server says that the prompt does not fit its window (``(who, wording)``, the
wording lower-cased, as the server's own source writes it): an HTTP error or a stream's error
event whose message or type holds one is an overflow. ``tests/test_overflow_wordings.py``
checks each against the error body its server sends."""


GENERIC_OVERFLOW_WORDINGS: Final[tuple[str, ...]] = (
    "maximum context length",
    "context length exceeded",
    "input is too long",
    "exceeds token limit",
    "context window full",
)
"""The families of wordings other agent libraries' detectors take for an overflow (CrewAI's
list; "Requested token count exceeds the model's maximum context length of N tokens" is the
first), lower-cased. Looser than ``OVERFLOW_WORDINGS``, so they count only on a 400 or a 413
(``GENERIC_OVERFLOW_STATUS``): a 429 that says "too many tokens" is a rate limit, and a 5xx the
server's own trouble, worth retrying."""
GENERIC_OVERFLOW_STATUS: Final = frozenset({400, 413})
"""The statuses on which a generic wording (``GENERIC_OVERFLOW_WORDINGS``) is an overflow."""

NOT_OVERFLOW_STATUS: Final = frozenset({401, 403, 404, 429})
"""Statuses that mean something else whatever their message says (a key, a model, a rate)."""


def says_overflow(status: int | None, *texts: str | None) -> bool:
    """Whether an error of HTTP ``status`` (None: an error event in a stream) whose message,
    type or code are ``texts`` is a server saying the prompt does not fit
    (``OVERFLOW_WORDINGS``). Any other status counts: a server may say it with a 400, a 413,
    or (Ollama, some proxies) a 500, and no retry would make the prompt fit. The generic
    families (``GENERIC_OVERFLOW_WORDINGS``) count on a 400 or a 413 only."""
    if status in NOT_OVERFLOW_STATUS:
        return False
    generic = status in GENERIC_OVERFLOW_STATUS
    for text in texts:
        if text:
            lowered = text.lower()
            if any(wording in lowered for _, wording in OVERFLOW_WORDINGS):
                return True
            if generic and any(wording in lowered for wording in GENERIC_OVERFLOW_WORDINGS):
                return True
    return False


COMPACTION_REFUSALS: Final = ("compact", "context_management", "context management", "beta")
"""What a provider's error says when it cannot compact, or manage the context, for the model or
the account (its message or type, lower-cased): Anthropic's beta refused, OpenAI's
``context_management`` refused."""
_REFUSING_STATUS: Final = frozenset({400, 403, 404, 422})


def refuses_compaction(error: LlmCallError) -> bool:
    """Whether a failed request that asked the provider to compact failed because the
    provider cannot (not for a reason another attempt, or a shorter prompt, would fix)."""
    if error.retryable or error.context_overflow or error.status_code not in _REFUSING_STATUS:
        return False
    said = error.message.lower()
    return any(wording in said for wording in COMPACTION_REFUSALS)


def refusal(error: LlmCallError) -> LlmCallError:
    """``error`` as the provider's refusal to compact (REQ-SEG-049), for the adapter to raise
    from it."""
    return LlmCallError(
        f"the provider cannot compact this conversation: {error.message}",
        status_code=error.status_code,
        compaction_refused=True,
    )


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


__all__ = [
    "COMPACTION_REFUSALS",
    "GENERIC_OVERFLOW_STATUS",
    "GENERIC_OVERFLOW_WORDINGS",
    "MAX_RETRY_AFTER",
    "MIN_SECRET",
    "OVERFLOW_WORDINGS",
    "RETRYABLE_STATUS",
    "Meaning",
    "http_error",
    "redact",
    "refusal",
    "refuses_compaction",
    "retry_after",
    "says_overflow",
    "scrub_secrets",
    "secrets_of",
]
