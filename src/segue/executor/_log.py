"""segue's logs: structured events delivered to the standard ``logging`` module.

A library must not print: the application decides what is shown. Every segue logger is a
structlog logger wrapped around ``logging.getLogger("segue.<part>")``, so an application controls
segue's events exactly as it controls anthropic's or httpx's (levels, handlers,
``logging.basicConfig``), and structlog's global configuration, which belongs to the
application, is never read or changed.

Each event becomes one ``LogRecord``: its message is the event name (``"transition"``), its
attributes are the event's fields (``record.conversation_id``, ``record.to_phase``...), and
``record.segue_event`` holds them all as one dict (name included) for handlers that want the
structure back. structlog's ``ProcessorFormatter`` with ``ExtraAdder`` renders them as key=value
or JSON. The ``segue`` logger carries a ``NullHandler``, so an application that configures no
logging at all sees nothing (not even warnings through Python's last-resort handler).

When the application traces with OpenTelemetry (its ``opentelemetry.trace`` is loaded) and a
span is active, each event carries its ``trace_id`` and ``span_id``, so logs join traces;
segue never imports OpenTelemetry for this.

A disabled level costs one cached ``isEnabledFor`` check: nothing is built for an event nobody
listens to, which matters on the runtime's per-transition event.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, Final

import structlog

ROOT: Final = "segue"
"""The logger every segue logger sits under."""

_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}
_RESERVED: Final = frozenset(
    {*vars(logging.LogRecord("", 0, "", 0, "", None, None)), "message", "asctime"}
)
"""``LogRecord`` attributes: an event field of the same name would make ``logging`` raise."""

logging.getLogger(ROOT).addHandler(logging.NullHandler())


def _to_record(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> Mapping[str, Any]:
    """The keyword arguments of the stdlib call: the event name as the message, the fields as
    record attributes (a field that clashes with one of ``LogRecord``'s gets a ``_`` suffix)."""
    name = event_dict.pop("event", "")
    exc_info = event_dict.pop("exc_info", None)
    tracing = sys.modules.get("opentelemetry.trace")
    if tracing is not None:  # the application uses OpenTelemetry: join the logs to its traces
        span = tracing.get_current_span().get_span_context()
        if span.is_valid:
            event_dict["trace_id"] = format(span.trace_id, "032x")
            event_dict["span_id"] = format(span.span_id, "016x")
    fields = {(f"{key}_" if key in _RESERVED else key): value for key, value in event_dict.items()}
    extra = {**fields, "segue_event": {"event": name, **event_dict}}
    kwargs: dict[str, Any] = {"msg": name, "extra": extra}
    if exc_info:
        kwargs["exc_info"] = exc_info
    return kwargs


class _Logger(structlog.stdlib.BoundLogger):
    """A stdlib-bound structlog logger that does nothing for a level nobody listens to."""

    def _proxy_to_logger(
        self, method_name: str, event: str | None = None, *event_args: Any, **event_kw: Any
    ) -> Any:
        if not self._logger.isEnabledFor(_LEVELS.get(method_name, logging.INFO)):
            return None
        return super()._proxy_to_logger(method_name, event, *event_args, **event_kw)


def get_logger(name: str) -> Any:
    """The structlog logger for ``name`` (a ``segue.*`` logger name)."""
    if name != ROOT and not name.startswith(ROOT + "."):
        msg = f"segue's loggers live under {ROOT!r}, not {name!r}"
        raise ValueError(msg)
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[_to_record],
        wrapper_class=_Logger,
        cache_logger_on_first_use=True,
    )
