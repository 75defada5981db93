"""What local OpenAI-compatible servers add to OpenAI's API, for ``FakeOpenAIServer``: the
window they serve a model with (llama.cpp's ``GET /props``, Ollama's ``POST /api/show``) and
the words each uses for a prompt that does not fit (``OVERFLOWS``), as their sources write
them. Only the standard library is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from segue.testing.openai_replies import ErrorReply, context_length_exceeded


def llama_cpp_props(n_ctx: int) -> dict[str, Any]:
    """What llama.cpp's server answers ``GET /props`` with (the fields segue reads, and a few
    beside them): ``n_ctx`` is the context one request may fill."""
    return {
        "default_generation_settings": {"n_ctx": n_ctx, "params": {"n_predict": -1}},
        "total_slots": 1,
        "model_path": "models/local.gguf",
        "build_info": "b0000-fake",
    }


def ollama_show(
    architecture: str, context_length: int, *, num_ctx: int | None = None
) -> dict[str, Any]:
    """What Ollama answers ``POST /api/show`` with for a model trained for
    ``context_length`` tokens, served with ``num_ctx`` when its Modelfile sets one."""
    parameters = 'stop                           "<|eot_id|>"'
    if num_ctx is not None:
        parameters = f"num_ctx                        {num_ctx}\n{parameters}"
    return {
        "modelfile": "FROM local",
        "parameters": parameters,
        "details": {"format": "gguf", "family": architecture},
        "model_info": {
            "general.architecture": architecture,
            f"{architecture}.context_length": context_length,
            f"{architecture}.embedding_length": 4096,
        },
        "capabilities": ["completion", "tools"],
    }


OVERFLOWS: Mapping[str, ErrorReply] = {
    "openai": context_length_exceeded(130_000, 128_000),
    "vllm": ErrorReply(
        400,
        "This model's maximum context length is 8192 tokens. However, you requested 9100 "
        "tokens (8100 in the messages, 1000 in the completion). Please reduce the length of "
        "the messages or completion.",
        type="BadRequestError",
    ),
    "vllm-v1": ErrorReply(
        400,
        "The decoder prompt (length 9000) is longer than the maximum model length of 8192. "
        "Make sure that `max_model_len` is no smaller than the number of text tokens.",
        type="BadRequestError",
    ),
    "llama.cpp": ErrorReply(
        400,
        "request (9000 tokens) exceeds the available context size (8192 tokens), try increasing it",
        type="exceed_context_size_error",
    ),
    "llama.cpp-old": ErrorReply(
        400,
        "the request exceeds the available context size, try increasing it",
        type="invalid_request_error",
    ),
    "ollama": ErrorReply(400, "the input length exceeds the context length", type="api_error"),
    "lm-studio": ErrorReply(
        400,
        "Trying to keep the first 9000 tokens when context the overflows. However, the model "
        "is loaded with context length of only 8192 tokens, which is not enough. Try to load "
        "the model with a larger context length, or provide a shorter input",
    ),
    "lm-studio-keep": ErrorReply(
        400,
        "The number of tokens to keep from the initial prompt is greater than the context length.",
    ),
    "litellm": ErrorReply(
        400,
        "litellm.ContextWindowExceededError: litellm.BadRequestError: "
        "ContextWindowExceededError: OpenAIException - Input is too long for the model.",
        code="400",
    ),
}
"""How each OpenAI-compatible server answers a prompt that does not fit its window, as its
source words it (``call_errors.OVERFLOW_WORDINGS`` is segue's side of the same table)."""


__all__ = ["OVERFLOWS", "llama_cpp_props", "ollama_show"]
