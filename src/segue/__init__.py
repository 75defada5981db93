"""segue: carry LLM conversations across the context-window limit.

The public API. The pure core (``segue.statemachine``) decides; effects (``segue.effects``) say
what to do; the executor (``segue.executor``) does it.
"""

from typing import TYPE_CHECKING

from segue._lazy import lazy_getattr
from segue.statemachine import *  # noqa: F403  # the core's __all__ is the public core API
from segue.statemachine import __all__ as _core_all

# isort: split
# The effects after the core: the core's machine imports segue.effects, and segue.effects
# imports the core's leaf modules, which first runs the core's package (see segue.effects).
from segue.effects import (
    Effect,
    ExecuteTools,
    NotifyContextExhausted,
    NotifyContextWarning,
    RejectUserMessage,
    RequestContinuation,
    RequestLlm,
)

if TYPE_CHECKING:  # the lazy names below, for type checkers (``X as X`` marks a re-export)
    from segue.executor.bus import Watch as Watch
    from segue.executor.chains import Link as Link
    from segue.executor.chains import UsageReport as UsageReport
    from segue.executor.errors import CompactionDoesNotFitError as CompactionDoesNotFitError
    from segue.executor.errors import ConcurrentUpdateError as ConcurrentUpdateError
    from segue.executor.errors import ConversationBusyError as ConversationBusyError
    from segue.executor.errors import ConversationExhaustedError as ConversationExhaustedError
    from segue.executor.errors import ConversationExistsError as ConversationExistsError
    from segue.executor.errors import ConversationFailedError as ConversationFailedError
    from segue.executor.errors import ConversationNotFoundError as ConversationNotFoundError
    from segue.executor.errors import ConversationPausedError as ConversationPausedError
    from segue.executor.errors import DuplicateMessageError as DuplicateMessageError
    from segue.executor.errors import InvalidCursorError as InvalidCursorError
    from segue.executor.errors import InvalidDocumentError as InvalidDocumentError
    from segue.executor.errors import InvalidMessageError as InvalidMessageError
    from segue.executor.errors import InvalidMetadataError as InvalidMetadataError
    from segue.executor.errors import InvalidTextError as InvalidTextError
    from segue.executor.errors import LlmCallError as LlmCallError
    from segue.executor.errors import MessageRejectedError as MessageRejectedError
    from segue.executor.errors import MessageTooLargeError as MessageTooLargeError
    from segue.executor.errors import NoCompactionError as NoCompactionError
    from segue.executor.errors import NotPausedError as NotPausedError
    from segue.executor.errors import SegueError as SegueError
    from segue.executor.errors import StoreError as StoreError
    from segue.executor.errors import StoreFullError as StoreFullError
    from segue.executor.errors import StoreLockedError as StoreLockedError
    from segue.executor.errors import StoreUnavailableError as StoreUnavailableError
    from segue.executor.errors import SubAgentFailedError as SubAgentFailedError
    from segue.executor.errors import UnsupportedOptionError as UnsupportedOptionError
    from segue.executor.errors import UpdatesLostError as UpdatesLostError
    from segue.executor.inputs import failure_of as failure_of
    from segue.executor.model_port import AgentToolActivity as AgentToolActivity
    from segue.executor.model_port import LlmModel as LlmModel
    from segue.executor.model_port import LlmReply as LlmReply
    from segue.executor.model_port import LlmRequest as LlmRequest
    from segue.executor.model_port import ProviderCompaction as ProviderCompaction
    from segue.executor.model_port import StreamingLlmModel as StreamingLlmModel
    from segue.executor.model_port import TextSink as TextSink
    from segue.executor.model_port import ToolSink as ToolSink
    from segue.executor.model_port import ToolSpec as ToolSpec
    from segue.executor.models.anthropic import AnthropicModel as AnthropicModel
    from segue.executor.models.openai import OpenAIModel as OpenAIModel
    from segue.executor.models.scripted import ScriptedModel as ScriptedModel
    from segue.executor.perform import current_conversation_id as current_conversation_id
    from segue.executor.runtime import Runtime as Runtime
    from segue.executor.snapshots import SnapshotContext as SnapshotContext
    from segue.executor.snapshots import git_context as git_context
    from segue.executor.store_port import ConversationPage as ConversationPage
    from segue.executor.store_port import Store as Store
    from segue.executor.store_port import StoredConversation as StoredConversation
    from segue.executor.store_port import StoredMessage as StoredMessage
    from segue.executor.store_port import TransitionRecord as TransitionRecord
    from segue.executor.stores.memory import MemoryStore as MemoryStore
    from segue.executor.stores.postgres import PostgresStore as PostgresStore
    from segue.executor.stores.sqlite import SqliteStore as SqliteStore
    from segue.executor.subagent import subagent_tool as subagent_tool
    from segue.executor.tools import Tool as Tool
    from segue.executor.tools import ToolRegistry as ToolRegistry
    from segue.executor.updates import CompactedUpdate as CompactedUpdate
    from segue.executor.updates import ContextEditedUpdate as ContextEditedUpdate
    from segue.executor.updates import DoneUpdate as DoneUpdate
    from segue.executor.updates import ExhaustedUpdate as ExhaustedUpdate
    from segue.executor.updates import FailedUpdate as FailedUpdate
    from segue.executor.updates import FallbackUpdate as FallbackUpdate
    from segue.executor.updates import NoticeUpdate as NoticeUpdate
    from segue.executor.updates import OccupancyUpdate as OccupancyUpdate
    from segue.executor.updates import PausedUpdate as PausedUpdate
    from segue.executor.updates import RetryUpdate as RetryUpdate
    from segue.executor.updates import SessionUpdate as SessionUpdate
    from segue.executor.updates import TextUpdate as TextUpdate
    from segue.executor.updates import ToolFinishedUpdate as ToolFinishedUpdate
    from segue.executor.updates import ToolStartedUpdate as ToolStartedUpdate
    from segue.executor.updates import Update as Update
    from segue.executor.updates import UserMessageUpdate as UserMessageUpdate
    from segue.executor.updates import WarningUpdate as WarningUpdate
    from segue.views import ConversationView as ConversationView
    from segue.views import DoneView as DoneView
    from segue.views import update_json as update_json

# The runtime pulls in anthropic, sqlite, psycopg and asyncio machinery; the pure core must not
# pay for that on import, so the runtime's names load on first use.
_LAZY = {
    "AnthropicModel": "segue.executor.models.anthropic",
    "OpenAIModel": "segue.executor.models.openai",
    "MemoryStore": "segue.executor.stores.memory",
    "SqliteStore": "segue.executor.stores.sqlite",
    "PostgresStore": "segue.executor.stores.postgres",
    "AgentToolActivity": "segue.executor.model_port",
    "ConcurrentUpdateError": "segue.executor.errors",
    "ConversationExistsError": "segue.executor.errors",
    "ConversationNotFoundError": "segue.executor.errors",
    "DuplicateMessageError": "segue.executor.errors",
    "InvalidMessageError": "segue.executor.errors",
    "InvalidTextError": "segue.executor.errors",
    "LlmCallError": "segue.executor.errors",
    "LlmModel": "segue.executor.model_port",
    "LlmReply": "segue.executor.model_port",
    "LlmRequest": "segue.executor.model_port",
    "ProviderCompaction": "segue.executor.model_port",
    "SegueError": "segue.executor.errors",
    "UnsupportedOptionError": "segue.executor.errors",
    "StoreFullError": "segue.executor.errors",
    "InvalidMetadataError": "segue.executor.errors",
    "ConversationBusyError": "segue.executor.errors",
    "ConversationPausedError": "segue.executor.errors",
    "ConversationFailedError": "segue.executor.errors",
    "MessageTooLargeError": "segue.executor.errors",
    "StoreError": "segue.executor.errors",
    "InvalidCursorError": "segue.executor.errors",
    "InvalidDocumentError": "segue.executor.errors",
    "ConversationPage": "segue.executor.store_port",
    "Store": "segue.executor.store_port",
    "StoredConversation": "segue.executor.store_port",
    "StoredMessage": "segue.executor.store_port",
    "StoreLockedError": "segue.executor.errors",
    "StoreUnavailableError": "segue.executor.errors",
    "StreamingLlmModel": "segue.executor.model_port",
    "TextSink": "segue.executor.model_port",
    "ToolSink": "segue.executor.model_port",
    "ToolSpec": "segue.executor.model_port",
    "TransitionRecord": "segue.executor.store_port",
    "ConversationExhaustedError": "segue.executor.errors",
    "MessageRejectedError": "segue.executor.errors",
    "NotPausedError": "segue.executor.errors",
    "NoCompactionError": "segue.executor.errors",
    "CompactionDoesNotFitError": "segue.executor.errors",
    "Runtime": "segue.executor.runtime",
    "current_conversation_id": "segue.executor.perform",
    "failure_of": "segue.executor.inputs",
    "ScriptedModel": "segue.executor.models.scripted",
    "subagent_tool": "segue.executor.subagent",
    "git_context": "segue.executor.snapshots",
    "SnapshotContext": "segue.executor.snapshots",
    "Link": "segue.executor.chains",
    "UsageReport": "segue.executor.chains",
    "SubAgentFailedError": "segue.executor.errors",
    "Tool": "segue.executor.tools",
    "ToolRegistry": "segue.executor.tools",
    "UpdatesLostError": "segue.executor.errors",
    "Watch": "segue.executor.bus",
    "Update": "segue.executor.updates",
    "UserMessageUpdate": "segue.executor.updates",
    "TextUpdate": "segue.executor.updates",
    "ToolStartedUpdate": "segue.executor.updates",
    "ToolFinishedUpdate": "segue.executor.updates",
    "OccupancyUpdate": "segue.executor.updates",
    "WarningUpdate": "segue.executor.updates",
    "ExhaustedUpdate": "segue.executor.updates",
    "FailedUpdate": "segue.executor.updates",
    "RetryUpdate": "segue.executor.updates",
    "PausedUpdate": "segue.executor.updates",
    "SessionUpdate": "segue.executor.updates",
    "CompactedUpdate": "segue.executor.updates",
    "NoticeUpdate": "segue.executor.updates",
    "DoneUpdate": "segue.executor.updates",
    "ContextEditedUpdate": "segue.executor.updates",
    "FallbackUpdate": "segue.executor.updates",
    "ConversationView": "segue.views",
    "DoneView": "segue.views",
    "update_json": "segue.views",
}


_EARLIER = dict.fromkeys(
    (
        "AppendMessage",
        "ArchiveTranscript",
        "CancelRequest",
        "NotifyCompactionFailed",
        "NotifyFailed",
        "NotifyParent",
        "NotifyToolRoundLimit",
        "NotifyTruncated",
        "ReportAccountingAnomaly",
        "RequestCheckpoint",
        "RequestCompaction",
        "SaveSnapshot",
        "ScheduleRetry",
        "StartGeneration",
        "StartSession",
    ),
    "segue.effects",
)
"""Effects no application builds: they live in ``segue.effects``, and still resolve here for
code written when they were listed (they are not part of the public face)."""

__getattr__ = lazy_getattr("segue", {**_LAZY, **_EARLIER}, globals())


__version__ = "0.1.0"

_CORE_MACHINERY = frozenset(
    {
        "EVENT_TYPES",
        "PHASE_TYPES",
        "HANDLED_PAIRS",
        "checkpoint_sections",
        "compile_resume_context",
        "continuation_prompt",
        "estimate_content",
        "extract_checkpoint",
        "extract_decisions",
    }
)
"""The core's own machinery: importable from ``segue.statemachine`` (and, for code written
before, from ``segue``), but not what an application calls."""

__all__ = [  # noqa: PLE0604  # the core's values, the runtime's names, the contract's effects
    *(name for name in _core_all if name not in _CORE_MACHINERY),
    *_LAZY,
    # Every effect is importable from segue.effects; these are the ones the contract names
    # (the others still resolve here, for code written before, but are not the public face).
    "Effect",
    "ExecuteTools",
    "NotifyContextExhausted",
    "NotifyContextWarning",
    "RejectUserMessage",
    "RequestContinuation",
    "RequestLlm",
]
