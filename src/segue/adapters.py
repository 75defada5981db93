"""What a model adapter is made of: the port (``LlmModel``, the request it is given and the
reply it returns), ``BaseLlmModel`` (every member but ``complete`` given its default),
``guarded`` (one call logged, its failure an ``LlmCallError`` with the key scrubbed), and the
built-in adapters.

``docs/adapters.md`` walks through writing one. The built-in adapters load on first use: each
pulls in its provider's client, which an application using another provider need not have
installed (``OpenAIModel`` needs the ``openai`` extra).
"""

from typing import TYPE_CHECKING

from segue._lazy import lazy_getattr
from segue.executor.model_port import (
    AgentToolActivity,
    BaseLlmModel,
    LlmModel,
    LlmReply,
    LlmRequest,
    ProviderCompaction,
    StreamingLlmModel,
    TextSink,
    ToolSink,
    ToolSpec,
)
from segue.executor.models.calls import guarded

if TYPE_CHECKING:  # the lazy names below, for type checkers
    from segue.executor.models.anthropic import AnthropicModel
    from segue.executor.models.openai import OpenAIModel
    from segue.executor.models.scripted import ScriptedModel

_ADAPTERS = {
    "AnthropicModel": "segue.executor.models.anthropic",
    "OpenAIModel": "segue.executor.models.openai",
    "ScriptedModel": "segue.executor.models.scripted",
}

__getattr__ = lazy_getattr("segue.adapters", _ADAPTERS, globals())

__all__ = [
    "AgentToolActivity",
    "AnthropicModel",
    "BaseLlmModel",
    "LlmModel",
    "LlmReply",
    "LlmRequest",
    "OpenAIModel",
    "ProviderCompaction",
    "ScriptedModel",
    "StreamingLlmModel",
    "TextSink",
    "ToolSink",
    "ToolSpec",
    "guarded",
]
