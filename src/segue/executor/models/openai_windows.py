"""The window an OpenAI-compatible server serves a model with, asked the way each server answers.

OpenAI itself reports no window (segue's table knows its models). A local server does, each in
its own place, and what it serves may be far less than the model was trained for (a llama
loaded with 8,192 tokens of its 131,072): that figure is the one a conversation must fit.

* ``GET /v1/models/{id}``: a field some servers add (``max_model_len``, ``context_length``...);
* ``GET /v1/models``: vLLM's list, each entry with its ``max_model_len`` (vLLM has no
  ``/v1/models/{id}``);
* ``GET /props`` at the server's root: llama.cpp's ``default_generation_settings.n_ctx`` (the
  context of one slot, what one request may fill);
* ``POST /api/show`` at the server's root: Ollama's ``num_ctx`` in the model's ``parameters``
  when it sets one, else ``model_info["<architecture>.context_length"]``.

They are tried in that order until one answers, each asked once per model by the adapter
(``calls.EventStreamModel.window`` caches the answer). An endpoint the server does not have
answers 4xx and the next is tried; a server that cannot be reached, or is overloaded, raises,
and the adapter asks again next time. OpenAI's and Azure's own hosts are asked only the first.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import openai

WINDOW_FIELDS: Final = (
    "context_window",
    "max_model_len",
    "context_length",
    "max_context_length",
    "max_input_tokens",
)
"""Fields compatible servers add to a model's entry (vLLM, LM Studio, OpenRouter...)."""
_NO_SUCH_ENDPOINT: Final = frozenset({400, 404, 405, 410, 422, 501})
"""What a server without an endpoint answers: try the next one."""
_OPENAI_HOSTS: Final = ("openai.com", "openai.azure.com", "azure-api.net")

Probe = Callable[[openai.AsyncOpenAI, str], Awaitable[int | None]]


def _tokens(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _field_window(fields: Mapping[str, Any]) -> int | None:
    return next((t for name in WINDOW_FIELDS if (t := _tokens(fields.get(name)))), None)


def _root(client: openai.AsyncOpenAI) -> str:
    """The server's root: the base URL without its ``/v1`` (where llama.cpp and Ollama answer)."""
    return str(client.base_url).rstrip("/").removesuffix("/v1")


async def model_entry(client: openai.AsyncOpenAI, model: str) -> int | None:
    """A window field of ``GET /models/{id}``."""
    return _field_window((await client.models.retrieve(model)).model_extra or {})


async def model_list(client: openai.AsyncOpenAI, model: str) -> int | None:
    """vLLM: the ``max_model_len`` of the model's entry in ``GET /models``."""
    for entry in (await client.models.list()).data:
        if entry.id == model:
            return _field_window(entry.model_extra or {})
    return None


async def llama_cpp_props(client: openai.AsyncOpenAI, model: str) -> int | None:
    """llama.cpp: ``default_generation_settings.n_ctx`` of ``GET /props``."""
    props = await client.get(f"{_root(client)}/props", cast_to=object)
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    return _tokens(settings.get("n_ctx")) if isinstance(settings, dict) else None


async def ollama_show(client: openai.AsyncOpenAI, model: str) -> int | None:
    """Ollama: ``num_ctx`` from ``POST /api/show``'s parameters, else the architecture's
    ``context_length`` (Ollama cuts a longer prompt silently, so the smaller figure counts)."""
    shown = await client.post(f"{_root(client)}/api/show", cast_to=object, body={"model": model})
    if not isinstance(shown, dict):
        return None
    parameters = shown.get("parameters")
    for line in parameters.splitlines() if isinstance(parameters, str) else ():
        name, _, value = line.strip().partition(" ")
        if name == "num_ctx" and value.strip().isdigit():
            return _tokens(int(value.strip()))
    info = shown.get("model_info")
    if not isinstance(info, dict):
        return None
    architecture = info.get("general.architecture")
    return _tokens(info.get(f"{architecture}.context_length"))


PROBES: Final[tuple[Probe, ...]] = (model_entry, model_list, llama_cpp_props, ollama_show)


async def served_window(client: openai.AsyncOpenAI, model: str) -> int | None:
    """The window the server at ``client.base_url`` serves ``model`` with (see the module
    docstring), None when no endpoint describes it; raises what an unreachable or failing
    server raises (the caller does not cache that)."""
    host = client.base_url.host
    probes = PROBES[:1] if host.endswith(_OPENAI_HOSTS) else PROBES
    for probe in probes:
        try:
            window = await probe(client, model)
        except openai.APIStatusError as exc:
            if exc.status_code in _NO_SUCH_ENDPOINT:
                continue
            raise
        if window is not None:
            return window
    return None


__all__ = ["PROBES", "WINDOW_FIELDS", "served_window"]
