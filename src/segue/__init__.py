"""segue: carry LLM conversations across the context-window limit.

The public API. The pure core (``segue.statemachine``) decides; effects (``segue.effects``) say
what to do; the executor (``segue.executor``) does it.
"""

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

__version__ = "0.1.0"

__all__ = [  # noqa: PLE0604  # extends the core's list with the effects
    *_core_all,
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
