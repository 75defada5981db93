"""What ``Runtime.stream`` and ``Runtime.watch`` yield as a turn goes: one class per kind of
update, ``Update`` their union, and ``Watch`` what ``Runtime.watch`` returns.

A backend sends an update as JSON with ``segue.update_json`` (``segue.views`` holds the JSON
views); a watcher that fell behind gets ``segue.errors.UpdatesLostError``.
"""

from segue.executor.bus import Watch
from segue.executor.updates import (
    CompactedUpdate,
    ContextEditedUpdate,
    DoneUpdate,
    ExhaustedUpdate,
    FailedUpdate,
    FallbackUpdate,
    NoticeUpdate,
    OccupancyUpdate,
    PausedUpdate,
    RetryUpdate,
    SessionUpdate,
    TextUpdate,
    ToolFinishedUpdate,
    ToolStartedUpdate,
    Update,
    UserMessageUpdate,
    WarningUpdate,
)

__all__ = [
    "CompactedUpdate",
    "ContextEditedUpdate",
    "DoneUpdate",
    "ExhaustedUpdate",
    "FailedUpdate",
    "FallbackUpdate",
    "NoticeUpdate",
    "OccupancyUpdate",
    "PausedUpdate",
    "RetryUpdate",
    "SessionUpdate",
    "TextUpdate",
    "ToolFinishedUpdate",
    "ToolStartedUpdate",
    "Update",
    "UserMessageUpdate",
    "WarningUpdate",
    "Watch",
]
