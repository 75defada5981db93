"""Usage as an OpenAI API says it, read into segue's ``Usage``: the streamed reply's last chunk
or event (``openai_stream``) and a ``responses.compact`` answer (``openai_context``) both carry
one, so both read it here (neither imports the other for it).
"""

from __future__ import annotations

from typing import Any

from segue.executor.models.replies import usage_from_prompt
from segue.statemachine import Usage


def _field(value: Any, name: str) -> Any:
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


def read_usage(usage: Any) -> Usage | None:
    """segue's ``Usage`` from a Chat Completions or Responses usage object, as JSON or as the
    client's parsed model (None: not said)."""
    if usage is None:
        return None
    prompt = _field(usage, "prompt_tokens")
    if prompt is not None:  # Chat Completions
        details = _field(usage, "prompt_tokens_details")
        output = _field(usage, "completion_tokens")
    else:  # Responses
        prompt = _field(usage, "input_tokens")
        details = _field(usage, "input_tokens_details")
        output = _field(usage, "output_tokens")
    written = _field(details, "cache_write_tokens")
    if written is None:  # a proxy in front of Anthropic says it as Anthropic does
        extra = usage if isinstance(usage, dict) else (getattr(usage, "model_extra", None) or {})
        written = extra.get("cache_creation_input_tokens")
    return usage_from_prompt(
        prompt, output, cache_read=_field(details, "cached_tokens"), cache_write=written
    )


__all__ = ["read_usage"]
