"""segue: carry LLM conversations across the context-window limit.

The public API. The pure core (``segue.statemachine``) decides; effects (``segue.effects``) say
what to do; the executor (``segue.executor``) does it.
"""

from typing import TYPE_CHECKING

from segue._lazy import lazy_getattr
from segue.effects import (
    AppendMessage,
    ArchiveTranscript,
    CancelRequest,
    Effect,
    ExecuteTools,
    NotifyContextExhausted,
    NotifyContextWarning,
    NotifyFailed,
    NotifyParent,
    NotifyTruncated,
    RejectUserMessage,
    ReportAccountingAnomaly,
    RequestCheckpoint,
    RequestCompaction,
    RequestContinuation,
    RequestLlm,
    SaveSnapshot,
    ScheduleRetry,
    StartGeneration,
    StartSession,
)
from segue.statemachine import *  # noqa: F403  # the core's __all__ is the public core API
from segue.statemachine import __all__ as _core_all

if TYPE_CHECKING:  # the lazy names below, for type checkers (``X as X`` marks a re-export)
    from segue.executor.models.anthropic import AnthropicModel as AnthropicModel
    from segue.executor.models.scripted import ScriptedModel as ScriptedModel
    from segue.executor.ports import ConcurrentUpdateError as ConcurrentUpdateError
    from segue.executor.ports import ConversationExistsError as ConversationExistsError
    from segue.executor.ports import ConversationNotFoundError as ConversationNotFoundError
    from segue.executor.ports import LlmCallError as LlmCallError
    from segue.executor.ports import SegueError as SegueError
    from segue.executor.ports import StoreLockedError as StoreLockedError
    from segue.executor.runtime import ConversationExhaustedError as ConversationExhaustedError
    from segue.executor.runtime import MessageRejectedError as MessageRejectedError
    from segue.executor.runtime import Runtime as Runtime
    from segue.executor.stores.memory import MemoryStore as MemoryStore
    from segue.executor.stores.sqlite import SqliteStore as SqliteStore
    from segue.executor.subagent import subagent_tool as subagent_tool
    from segue.executor.tools import Tool as Tool
    from segue.executor.tools import ToolRegistry as ToolRegistry

# The runtime pulls in anthropic, sqlite and asyncio machinery; the pure core must not pay for
# that on import, so the runtime's names load on first use.
_LAZY = {
    "AnthropicModel": "segue.executor.models.anthropic",
    "MemoryStore": "segue.executor.stores.memory",
    "ConcurrentUpdateError": "segue.executor.ports",
    "ConversationExistsError": "segue.executor.ports",
    "ConversationNotFoundError": "segue.executor.ports",
    "LlmCallError": "segue.executor.ports",
    "SegueError": "segue.executor.ports",
    "StoreLockedError": "segue.executor.ports",
    "ConversationExhaustedError": "segue.executor.runtime",
    "MessageRejectedError": "segue.executor.runtime",
    "Runtime": "segue.executor.runtime",
    "ScriptedModel": "segue.executor.models.scripted",
    "SqliteStore": "segue.executor.stores.sqlite",
    "subagent_tool": "segue.executor.subagent",
    "Tool": "segue.executor.tools",
    "ToolRegistry": "segue.executor.tools",
}


__getattr__ = lazy_getattr("segue", _LAZY, globals())


__version__ = "0.1.0"

__all__ = [  # noqa: PLE0604  # extends the core's list with the effects
    *_core_all,
    *_LAZY,
    "AppendMessage",
    "ArchiveTranscript",
    "CancelRequest",
    "Effect",
    "ExecuteTools",
    "NotifyContextExhausted",
    "NotifyContextWarning",
    "NotifyFailed",
    "NotifyParent",
    "NotifyTruncated",
    "RejectUserMessage",
    "ReportAccountingAnomaly",
    "RequestCheckpoint",
    "RequestCompaction",
    "RequestContinuation",
    "RequestLlm",
    "SaveSnapshot",
    "ScheduleRetry",
    "StartGeneration",
    "StartSession",
]
