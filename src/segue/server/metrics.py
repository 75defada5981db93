"""``/metrics``: segue's metrics in Prometheus' text format, for ``segue serve --metrics``.

OpenTelemetry's Prometheus exporter reads the runtime's metrics (``segue.executor.otel``) into a
registry of the server's own, which this route writes out, behind the token like every other
API route. It needs the SDK and the exporter (``pip install "segue[metrics]"``); without them
``--metrics`` refuses to start and says what to install.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Response

from segue.errors import MissingExtraError

INSTALL = "segue[metrics]"


@dataclass(frozen=True, slots=True)
class Metrics:
    """A meter provider for the runtime, and the Prometheus registry it is exported into."""

    meter_provider: Any
    registry: Any


def prometheus() -> Metrics:
    """A meter provider whose metrics the Prometheus exporter keeps in a registry of its own
    (not the process's global one: two apps in one process do not mix their figures)."""
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader  # noqa: PLC0415
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
        from prometheus_client import CollectorRegistry  # noqa: PLC0415
    except ImportError as missing:
        message = f'segue serve --metrics needs the metrics extra: pip install "{INSTALL}"'
        raise MissingExtraError(message, name=missing.name) from missing
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    return Metrics(MeterProvider(metric_readers=[reader]), registry)


def router(metrics: Metrics) -> APIRouter:
    routes = APIRouter()

    @routes.get("/metrics", include_in_schema=False)
    async def exposition() -> Response:
        """The runtime's metrics in Prometheus' text format."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest  # noqa: PLC0415

        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return routes
