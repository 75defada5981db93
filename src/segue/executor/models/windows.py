"""A model's context window and where the figure came from, for any adapter.

Every threshold of a conversation is a fraction of its window, so a window guessed too large
is a crash at the provider and one guessed too small an early continuation; the user should
see which it is. A window comes from one of four places (``WindowSource``):

* ``given``: the application said it (``context_window=`` on the conversation, or an adapter
  configured with one, such as ``ScriptedModel(window=...)``);
* ``server``: the provider's server reported it (Anthropic's ``max_input_tokens``, vLLM's
  ``max_model_len``, llama.cpp's ``n_ctx``, Ollama's ``context_length``);
* ``table``: segue's table of models knows the model (``segue.statemachine.model_info``);
* ``assumed``: nobody knows it, and the smallest window of the adapter's provider is assumed
  (a warning, ``model_window_unknown``, says so, once per model and adapter).

``WindowReporter`` is what an adapter that can say this has (segue's real adapters do);
``window_of(llm, model)`` asks any adapter, falling back on ``context_window`` and the table for
one that cannot (an adapter written before, or another's).
"""

from __future__ import annotations

import re
from typing import Final, Protocol, TypeGuard, runtime_checkable

from segue.executor._log import get_logger
from segue.executor.model_port import LlmModel, capable
from segue.statemachine.models import Provider, provider_of
from segue.statemachine.options import (
    ConversationOptions,
    Window,
    resolved_window,
    window_in_table,
)
from segue.statemachine.state import WindowSource

log = get_logger(__name__)


@runtime_checkable
class WindowReporter(Protocol):
    """An adapter that says where each window it reports came from."""

    async def window(self, model: str) -> Window:
        """The model's window and its source; never raises (a failure to ask is a guess)."""
        ...


_CLOUD_PREFIX: Final = re.compile(r"^(?:[a-z]{2,6}\.)?anthropic\.")
"""Bedrock's ``anthropic.`` and its cross-region inference profiles' ``us.``, ``eu.``,
``apac.``, ``global.`` before it."""
_BEDROCK_VERSION: Final = re.compile(r"-v\d+(?::\d+)?$")
_VERTEX_VERSION: Final = re.compile(r"@[\w.-]+$")


def anthropic_model_name(model: str) -> str:
    """The Messages API's name of a Claude model as Bedrock or Vertex AI spells it:
    ``anthropic.claude-sonnet-4-6-20260101-v1:0`` (and ``us.anthropic...``, or an inference
    profile's ARN ending in one) and ``claude-sonnet-4-6@20260101`` are ``claude-sonnet-4-6...``
    to segue's table; any other name is returned as it is."""
    name = model.strip().rsplit("/", 1)[-1]
    name = _CLOUD_PREFIX.sub("", name, count=1)
    name = _BEDROCK_VERSION.sub("", name)
    return _VERTEX_VERSION.sub("", name)


def table_window(model: str, provider: Provider | None) -> Window:
    """The window segue's table gives ``model``; for a model it does not know, the smallest of
    the provider its name says, else of ``provider`` (the adapter's), logged as a guess: the
    core's ``window_in_table``, which a conversation created without a word from the adapter
    gets too."""
    window = window_in_table(model, provider)
    if window.source == "assumed":
        owner = provider_of(model) or provider
        log.warning(
            "model_window_unknown", model=model, assumed_window=window.tokens, provider=owner
        )
    return window


def reports_windows(llm: object) -> TypeGuard[WindowReporter]:
    """Whether the adapter says where its windows come from (``WindowReporter``)."""
    return capable(llm, WindowReporter)


async def window_of(llm: LlmModel, model: str) -> Window:
    """``model``'s window as ``llm`` knows it: its own answer when it is a
    ``WindowReporter``; else what its ``context_window`` reports (``server``), else the table."""
    if reports_windows(llm):
        return await llm.window(model)
    reported = await llm.context_window(model)
    if reported is not None:
        return Window(reported, "server")
    return table_window(model, None)


async def window_for(llm: LlmModel, options: ConversationOptions) -> Window:
    """The window a conversation made with ``options`` gets (``resolved_window``): the one they
    give, else ``llm``'s word on their model, asked only then."""
    reported = None if options.context_window else await window_of(llm, options.model)
    return resolved_window(options, reported)


__all__ = [
    "Window",
    "WindowReporter",
    "WindowSource",
    "anthropic_model_name",
    "table_window",
    "window_for",
    "window_of",
]
