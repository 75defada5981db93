"""segue: carry LLM conversations across the context-window limit.

The public face: what an application calls (the runtime, its stores and model adapters, a
conversation's options, the base errors). The rest has a module of its own:

- ``segue.core``: the pure core (phases, events, state, content blocks, ``transition()``);
- ``segue.effects``: what the core asks the world to do;
- ``segue.updates``: what a turn yields as it goes;
- ``segue.errors``: every error segue raises, one tree under ``SegueError``;
- ``segue.adapters``: what a model adapter is made of, and the built-in adapters;
- ``segue.views``: the JSON views a server answers with.

Every name ``segue`` exported before still imports from here (resolved on first use from the
module that holds it now), quietly: code written against the earlier face keeps working.
"""

import importlib
from typing import TYPE_CHECKING, Any, Final

from segue._lazy import lazy_getattr
from segue._version import __version__ as __version__
from segue.errors import (
    ConversationNotFoundError,
    LlmCallError,
    MessageRejectedError,
    SegueError,
)
from segue.statemachine import (
    ContextExhaustionBehavior,
    ConversationOptions,
    ConversationState,
    Message,
    Usage,
)

if TYPE_CHECKING:  # the face's lazy names below, for type checkers (``X as X`` re-exports)
    from segue.executor.bus import Watch as Watch
    from segue.executor.inputs import failure_of as failure_of
    from segue.executor.model_port import LlmModel as LlmModel
    from segue.executor.models.anthropic import AnthropicModel as AnthropicModel
    from segue.executor.models.openai import OpenAIModel as OpenAIModel
    from segue.executor.models.scripted import ScriptedModel as ScriptedModel
    from segue.executor.runtime import Runtime as Runtime
    from segue.executor.store_port import Store as Store
    from segue.executor.stores.memory import MemoryStore as MemoryStore
    from segue.executor.stores.postgres import PostgresStore as PostgresStore
    from segue.executor.stores.sqlite import SqliteStore as SqliteStore
    from segue.executor.subagent import subagent_tool as subagent_tool
    from segue.executor.tools import Tool as Tool
    from segue.executor.tools import ToolRegistry as ToolRegistry
    from segue.executor.updates import Update as Update
    from segue.views import update_json as update_json

if TYPE_CHECKING:  # the earlier face's names, typed as they were (``__getattr__`` resolves them)
    from segue.adapters import *  # noqa: F403
    from segue.errors import *  # noqa: F403
    from segue.executor.chains import Link as Link
    from segue.executor.chains import UsageReport as UsageReport
    from segue.executor.perform import current_conversation_id as current_conversation_id
    from segue.executor.snapshots import SnapshotContext as SnapshotContext
    from segue.executor.snapshots import git_context as git_context
    from segue.executor.store_port import ConversationPage as ConversationPage
    from segue.executor.store_port import StoredConversation as StoredConversation
    from segue.executor.store_port import StoredMessage as StoredMessage
    from segue.executor.store_port import TransitionRecord as TransitionRecord
    from segue.statemachine import *  # noqa: F403
    from segue.statemachine.effects import *  # noqa: F403
    from segue.updates import *  # noqa: F403
    from segue.views import ConversationView as ConversationView
    from segue.views import DoneView as DoneView

# The runtime pulls in anthropic, sqlite, psycopg and asyncio machinery; the pure core must not
# pay for that on import, so the runtime's names load on first use.
_FACE_LAZY: Final = {
    "Runtime": "segue.executor.runtime",
    "MemoryStore": "segue.executor.stores.memory",
    "SqliteStore": "segue.executor.stores.sqlite",
    "PostgresStore": "segue.executor.stores.postgres",
    "Store": "segue.executor.store_port",
    "AnthropicModel": "segue.executor.models.anthropic",
    "OpenAIModel": "segue.executor.models.openai",
    "ScriptedModel": "segue.executor.models.scripted",
    "LlmModel": "segue.executor.model_port",
    "Tool": "segue.executor.tools",
    "ToolRegistry": "segue.executor.tools",
    "subagent_tool": "segue.executor.subagent",
    "failure_of": "segue.executor.inputs",
    "Update": "segue.executor.updates",
    "Watch": "segue.executor.bus",
    "update_json": "segue.views",
}

_EARLIER_ELSEWHERE: Final = {
    "ConversationPage": "segue.executor.store_port",
    "StoredConversation": "segue.executor.store_port",
    "StoredMessage": "segue.executor.store_port",
    "TransitionRecord": "segue.executor.store_port",
    "Link": "segue.executor.chains",
    "UsageReport": "segue.executor.chains",
    "git_context": "segue.executor.snapshots",
    "SnapshotContext": "segue.executor.snapshots",
    "current_conversation_id": "segue.executor.perform",
    "ConversationView": "segue.views",
    "DoneView": "segue.views",
}
"""Names the earlier face exported that belong to no submodule: a runtime's records and
helpers, each resolved from the module that defines it."""

_SUBMODULES: Final = (
    "segue.core",
    "segue.errors",
    "segue.effects",
    "segue.updates",
    "segue.adapters",
)
"""Where the rest of the earlier face lives now, asked in this order: the cheap, pure ones
first, ``segue.adapters`` last (it loads the model port)."""

_MODULES: Final = frozenset(
    {"adapters", "core", "effects", "errors", "executor", "statemachine", "updates", "views"}
)
"""The submodules ``segue.X`` finds without an import of its own (``segue.effects`` and
``segue.executor`` were loaded with the package before)."""

_resolve = lazy_getattr("segue", {**_FACE_LAZY, **_EARLIER_ELSEWHERE}, globals())


def __getattr__(name: str) -> Any:
    """A name of the face that loads on first use, or one the earlier face exported, from the
    module that holds it now (kept in this module's namespace, so it is looked up once)."""
    if name in _FACE_LAZY or name in _EARLIER_ELSEWHERE:
        return _resolve(name)
    if name in _MODULES:
        return importlib.import_module(f"segue.{name}")
    if not name.startswith("_"):
        for module_name in _SUBMODULES:
            module = importlib.import_module(module_name)
            if name in module.__all__:
                value = getattr(module, name)
                globals()[name] = value
                return value
    msg = f"module 'segue' has no attribute {name!r}"
    raise AttributeError(msg)


__all__ = [
    "AnthropicModel",
    "ContextExhaustionBehavior",
    "ConversationNotFoundError",
    "ConversationOptions",
    "ConversationState",
    "LlmCallError",
    "LlmModel",
    "MemoryStore",
    "Message",
    "MessageRejectedError",
    "OpenAIModel",
    "PostgresStore",
    "Runtime",
    "ScriptedModel",
    "SegueError",
    "SqliteStore",
    "Store",
    "Tool",
    "ToolRegistry",
    "Update",
    "Usage",
    "Watch",
    "failure_of",
    "subagent_tool",
    "update_json",
]
