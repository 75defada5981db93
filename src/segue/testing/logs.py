"""Capture segue's log events in a test, as the application's logging would receive them.

segue logs through the standard ``logging`` module (loggers under ``segue``), so tests read what
an application's handler would get: one dict per record, with the event name under ``"event"``,
the level under ``"log_level"`` and the event's fields beside them::

    with capture_logs() as logs:
        await rt.send(conversation_id, "hi")
    assert [e["event"] for e in logs if e["event"] == "transition"]
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any


class _Collector(logging.Handler):
    def __init__(self, into: list[dict[str, Any]]) -> None:
        super().__init__(logging.DEBUG)
        self._into = into

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "segue_event", None)
        fields = dict(event) if isinstance(event, dict) else {"event": record.getMessage()}
        fields["log_level"] = record.levelname.lower()
        fields["logger"] = record.name
        self._into.append(fields)


@contextlib.contextmanager
def capture_logs(
    level: int = logging.DEBUG, logger: str = "segue"
) -> Iterator[list[dict[str, Any]]]:
    """Collect every record of ``logger`` (and below) at ``level`` or above while the block runs;
    the logger's level comes back afterwards."""
    records: list[dict[str, Any]] = []
    target = logging.getLogger(logger)
    handler = _Collector(records)
    previous = target.level
    target.addHandler(handler)
    target.setLevel(level)
    try:
        yield records
    finally:
        target.removeHandler(handler)
        target.setLevel(previous)
