"""Exporters for :mod:`trackpoint.metrics`: a Prometheus collector, OpenTelemetry instruments.

Private to ``trackpoint.metrics``, whose registry imports this module only when an exporter is
registered, so ``import trackpoint`` never loads ``prometheus_client`` or ``opentelemetry``.
The exporters see a registry through :class:`FigureSource` (what they read), so this module
depends on the figures' declarations only, never on the registry module.

The two libraries want opposite shapes: Prometheus pulls (a custom collector reads the registry's
aggregates at each scrape, so nothing recorded before registration is lost), OpenTelemetry is
pushed to (each recording goes on to a synchronous instrument, one per figure, which aggregates it
the OpenTelemetry way: histograms stay histograms for every OpenTelemetry backend).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from trackpoint.metrics.figures import Figure, LabelKey, Listener

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

__all__ = ["FigureSource", "OpenTelemetryExporter", "PrometheusCollector"]


class FigureSource(Protocol):
    """What an exporter reads from a :class:`~trackpoint.metrics.registry.Registry`."""

    def figures(self) -> tuple[Figure, ...]:
        """Every declared figure."""
        ...

    def snapshot(self) -> dict[str, dict[LabelKey, Any]]:
        """A copy of every figure's values."""
        ...

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling ``listener``."""
        ...


def _label_values(figure: Figure, key: LabelKey) -> list[str]:
    values = dict(key)
    return [values[label] for label in figure.labels]


class PrometheusCollector:
    """A ``prometheus_client`` custom collector reading a :class:`Registry` on each scrape."""

    def __init__(self, registry: FigureSource) -> None:
        self._registry = registry

    def describe(self) -> Iterator[Any]:
        """The metric families, for ``prometheus_client``'s duplicate-name check."""
        return self.collect()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )
        from prometheus_client.utils import floatToGoString

        values = self._registry.snapshot()
        for figure in self._registry.figures():
            series = values.get(figure.name, {})
            labels = list(figure.labels)
            family: Any
            if figure.kind == "histogram":
                family = HistogramMetricFamily(figure.name, figure.description, labels=labels)
                for key, h in series.items():
                    buckets = [(floatToGoString(b), n) for b, n in h["buckets"].items()]
                    family.add_metric(_label_values(figure, key), buckets, h["sum"])
            else:
                cls = CounterMetricFamily if figure.kind == "counter" else GaugeMetricFamily
                family = cls(figure.name, figure.description, labels=labels)
                for key, value in series.items():
                    family.add_metric(_label_values(figure, key), value)
            yield family


class OpenTelemetryExporter:
    """A :data:`~trackpoint.metrics.Listener` that records into OpenTelemetry instruments.

    Instruments are created on a figure's first recording (so figures declared later are
    exported too): ``Counter.add`` for counters, ``Histogram.record`` (with the figure's bucket
    bounds as advisory boundaries) for histograms, ``Gauge.set`` for gauges; labels become
    attributes. Thread-safe.
    """

    def __init__(self, registry: FigureSource, meter: Meter) -> None:
        self._registry = registry
        self.meter = meter
        self._lock = threading.Lock()
        self._instruments: dict[str, Any] = {}

    def _instrument(self, figure: Figure) -> Any:
        instrument = self._instruments.get(figure.name)
        if instrument is not None:
            return instrument
        with self._lock:
            instrument = self._instruments.get(figure.name)
            if instrument is None:
                meter, name, unit = self.meter, figure.name, figure.unit
                if figure.kind == "counter":
                    instrument = meter.create_counter(name, unit, figure.description)
                elif figure.kind == "histogram":
                    instrument = meter.create_histogram(
                        name, unit, figure.description,
                        explicit_bucket_boundaries_advisory=list(figure.buckets),
                    )  # fmt: skip
                else:
                    instrument = meter.create_gauge(name, unit, figure.description)
                self._instruments[figure.name] = instrument
        return instrument

    def __call__(self, figure: Figure, value: float, key: LabelKey) -> None:
        instrument = self._instrument(figure)
        attributes = dict(key)
        if figure.kind == "counter":
            instrument.add(value, attributes)
        elif figure.kind == "histogram":
            instrument.record(value, attributes)
        else:
            instrument.set(value, attributes)

    def close(self) -> None:
        """Stop passing recordings on (the instruments keep what they have)."""
        self._registry.remove_listener(self)
