"""The runtime's observer for its settings: OpenTelemetry's with the ``otel`` extra, else none.

Apart from ``telemetry`` (the observer's base, which ``otel`` builds on) so that choosing the
implementation does not make the base import the extra's module that imports it back: this
module sits above both. ``segue.executor.otel`` is still imported only when the extra is
installed (it imports OpenTelemetry at its top).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from segue.executor.telemetry import DEFAULT_STORE_METRICS_RATE, NOTHING, Telemetry


def for_settings(
    *,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    capture_content: bool = False,
    store_metrics_rate: float = DEFAULT_STORE_METRICS_RATE,
) -> Telemetry:
    """The runtime's observer: OpenTelemetry's when the ``otel`` extra is installed (the
    providers given, else the global ones, resolved at each turn: an application that sets
    them after making the runtime is heard), else ``NOTHING``. ``store_metrics_rate``: the
    share of commits, from 0 to 1, whose duration is recorded (``ValueError`` outside)."""
    if isinstance(store_metrics_rate, bool) or not 0.0 <= store_metrics_rate <= 1.0:
        msg = f"store_metrics_rate must be a share from 0 to 1, not {store_metrics_rate!r}"
        raise ValueError(msg)
    try:
        installed = importlib.util.find_spec("opentelemetry") is not None
    except ImportError:  # refused by an import hook: as good as not installed
        installed = False
    if not installed:
        if tracer_provider is not None or meter_provider is not None:
            msg = "tracer_provider and meter_provider need OpenTelemetry: pip install 'segue[otel]'"
            raise ImportError(msg)
        return NOTHING
    from segue.executor.otel import OtelTelemetry  # noqa: PLC0415  # only with the extra

    return OtelTelemetry(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        capture_content=capture_content,
        store_metrics_rate=store_metrics_rate,
    )


__all__ = ["for_settings"]
