"""Model adapters: segue's ``LlmModel`` port over a provider (``AnthropicModel``,
``OpenAIModel`` for OpenAI and compatible servers) or a script (``ScriptedModel``, offline and
deterministic, for the demo and tests). What an adapter for another provider needs
(``docs/adapters.md``) and no provider owns: ``history`` (the transcript as it must be sent),
``replies`` (usage counted once, streamed tool calls joined), ``call_errors`` (failures as
``LlmCallError``, the key kept out), ``calls`` (one call as the port asks it, and the streamed
HTTP call both built-in adapters share). ``providers`` names the built-in providers (their key
variables and default models) and builds their adapters, for the CLI and the server alike.

The adapters load on first use: each pulls in its provider's client, which an application
using another provider need not have installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from segue._lazy import lazy_getattr

if TYPE_CHECKING:  # the lazy names below, for type checkers (``X as X`` marks a re-export)
    from segue.executor.models.anthropic import AnthropicModel as AnthropicModel
    from segue.executor.models.openai import OpenAIModel as OpenAIModel
    from segue.executor.models.scripted import ScriptedModel as ScriptedModel

_LAZY = {
    "AnthropicModel": "segue.executor.models.anthropic",
    "OpenAIModel": "segue.executor.models.openai",
    "ScriptedModel": "segue.executor.models.scripted",
}

__getattr__ = lazy_getattr("segue.executor.models", _LAZY, globals())

__all__ = list(_LAZY)
