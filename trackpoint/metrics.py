"""Counters and duration histograms that trackpoint records, with optional exporters.

Every layer records into the default :class:`Registry` through the module functions
(``record_duration``, ``increment``, ``timed``...); users read it with ``snapshot()`` or export
it with ``register_prometheus()`` / ``register_opentelemetry()``. Recording is thread-safe and
cheap (one short lock per recording), so it is always on.

Figures (the names are stable; they mirror TensorFlow's ``/tensorflow/core/checkpoint/...``
metrics). Histograms, each with its labels:

- ``trackpoint_write_duration_seconds`` (``mode`` = ``sync``/``async``, ``phase`` =
  ``blocking``/``background``): time to write one checkpoint; ``blocking`` is the part the
  caller waits for, ``background`` the part an async writer does afterwards.
- ``trackpoint_read_duration_seconds``: time to read (restore) one checkpoint.
- ``trackpoint_training_time_between_writes_seconds``: TensorFlow's "training time saved", the
  time from the end of one write to the start of the next (``mark_write_end`` /
  ``mark_write_start``).
- ``trackpoint_checkpoint_size_bytes``: bytes of one checkpoint (all its files).
- ``trackpoint_sharding_policy_duration_seconds`` (``policy`` = the policy's description):
  time the sharding policy took to plan the shards.

Counters, no labels:

- ``trackpoint_shards_written_total``: data files written.
- ``trackpoint_bytes_written_total`` / ``trackpoint_bytes_read_total``: bytes moved to and
  from storage.
- ``trackpoint_checksum_failures_total``: crc32c mismatches found while reading.

Histograms use fixed buckets: ``SECONDS_BUCKETS`` for durations, ``BYTES_BUCKETS`` for sizes.

Example::

    from trackpoint import metrics
    with metrics.timed(metrics.READ_DURATION):
        ...
    metrics.snapshot()[metrics.READ_DURATION][()]["count"]   # -> 1
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from trackpoint.errors import InvalidArgumentError

__all__ = [
    "BYTES_BUCKETS",
    "BYTES_READ",
    "BYTES_WRITTEN",
    "CHECKPOINT_SIZE",
    "CHECKSUM_FAILURES",
    "READ_DURATION",
    "REGISTRY",
    "SECONDS_BUCKETS",
    "SHARDING_POLICY_DURATION",
    "SHARDS_WRITTEN",
    "TRAINING_TIME_BETWEEN_WRITES",
    "WRITE_DURATION",
    "Figure",
    "LabelKey",
    "Registry",
    "increment",
    "mark_write_end",
    "mark_write_start",
    "record_duration",
    "register_opentelemetry",
    "register_prometheus",
    "reset",
    "set_gauge",
    "snapshot",
    "timed",
]

WRITE_DURATION = "trackpoint_write_duration_seconds"
READ_DURATION = "trackpoint_read_duration_seconds"
TRAINING_TIME_BETWEEN_WRITES = "trackpoint_training_time_between_writes_seconds"
CHECKPOINT_SIZE = "trackpoint_checkpoint_size_bytes"
SHARDING_POLICY_DURATION = "trackpoint_sharding_policy_duration_seconds"
SHARDS_WRITTEN = "trackpoint_shards_written_total"
BYTES_WRITTEN = "trackpoint_bytes_written_total"
BYTES_READ = "trackpoint_bytes_read_total"
CHECKSUM_FAILURES = "trackpoint_checksum_failures_total"

# Upper bounds (inclusive); an implicit +inf bucket follows. Saves range from milliseconds
# (tests) to an hour (multi-TB models); sizes from KiB to TiB in powers of four.
SECONDS_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
BYTES_BUCKETS: tuple[float, ...] = tuple(float(1024 * 4**i) for i in range(16))

LabelKey = tuple[tuple[str, str], ...]
"""A label set as sorted ``(name, value)`` pairs; ``()`` for a figure without labels."""

_KINDS = ("counter", "gauge", "histogram")


@dataclass(frozen=True, slots=True)
class Figure:
    """The declaration of one figure.

    Attributes:
        name: the stable name, Prometheus style (``_total``, ``_seconds``, ``_bytes``).
        kind: ``"counter"``, ``"gauge"`` or ``"histogram"``.
        description: one line for exporters' help text.
        unit: ``"s"``, ``"By"`` or ``""`` (UCUM, as OpenTelemetry wants).
        labels: the label names every recording must give, no more, no fewer.
        buckets: a histogram's inclusive upper bounds, ascending; empty for other kinds.
    """

    name: str
    kind: str
    description: str
    unit: str = ""
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()


class _Histogram:
    __slots__ = ("bounds", "counts", "count", "sum", "min", "max")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value
        self.min = min(self.min, value)
        self.max = max(self.max, value)

    def cumulative(self) -> dict[float, int]:
        result: dict[float, int] = {}
        running = 0
        for bound, n in zip((*self.bounds, math.inf), self.counts):
            running += n
            result[bound] = running
        return result

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "sum": self.sum,
            "min": self.min,
            "max": self.max,
            "buckets": self.cumulative(),
        }


_DEFAULT_FIGURES = (
    Figure(WRITE_DURATION, "histogram", "Time to write one checkpoint", "s",
           ("mode", "phase"), SECONDS_BUCKETS),
    Figure(READ_DURATION, "histogram", "Time to read one checkpoint", "s", (), SECONDS_BUCKETS),
    Figure(TRAINING_TIME_BETWEEN_WRITES, "histogram",
           "Time from the end of one checkpoint write to the start of the next", "s", (),
           SECONDS_BUCKETS),
    Figure(CHECKPOINT_SIZE, "histogram", "Size of one checkpoint", "By", (), BYTES_BUCKETS),
    Figure(SHARDING_POLICY_DURATION, "histogram", "Time a sharding policy took", "s",
           ("policy",), SECONDS_BUCKETS),
    Figure(SHARDS_WRITTEN, "counter", "Data files written"),
    Figure(BYTES_WRITTEN, "counter", "Bytes written to storage", "By"),
    Figure(BYTES_READ, "counter", "Bytes read from storage", "By"),
    Figure(CHECKSUM_FAILURES, "counter", "crc32c mismatches found while reading"),
)  # fmt: skip


class Registry:
    """A thread-safe set of declared figures and their values, per label set.

    One lock guards everything; recordings happen a few times per checkpoint, so contention
    does not matter. The figures above are declared on construction; ``declare`` adds more.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._figures: dict[str, Figure] = {f.name: f for f in _DEFAULT_FIGURES}
        self._values: dict[str, dict[LabelKey, Any]] = {name: {} for name in self._figures}
        self._last_write_end: float | None = None
        self._exporters: dict[tuple[str, int], object] = {}

    # -- declarations ---------------------------------------------------------------------
    def declare(self, figure: Figure) -> None:
        """Add a figure; re-declaring an identical figure is a no-op.

        Raises:
            InvalidArgumentError: the name exists with a different declaration, or the kind
                is unknown.
        """
        if figure.kind not in _KINDS:
            raise InvalidArgumentError(f"figure {figure.name}: kind must be one of {_KINDS}")
        if figure.kind == "histogram" and list(figure.buckets) != sorted(set(figure.buckets)):
            raise InvalidArgumentError(f"figure {figure.name}: buckets must ascend strictly")
        with self._lock:
            existing = self._figures.get(figure.name)
            if existing is not None and existing != figure:
                raise InvalidArgumentError(
                    f"figure {figure.name} is already declared as {existing}; pick another name"
                )
            self._figures[figure.name] = figure
            self._values.setdefault(figure.name, {})

    def figures(self) -> tuple[Figure, ...]:
        """Every declared figure, in declaration order."""
        with self._lock:
            return tuple(self._figures.values())

    def _check(self, name: str, kind: str, labels: Mapping[str, object]) -> LabelKey:
        figure = self._figures.get(name)
        if figure is None:
            raise InvalidArgumentError(
                f"unknown figure {name!r}; use one of the trackpoint.metrics names or declare it"
            )
        if figure.kind != kind:
            raise InvalidArgumentError(f"figure {name} is a {figure.kind}, not a {kind}")
        if set(labels) != set(figure.labels):
            raise InvalidArgumentError(
                f"figure {name} takes labels {sorted(figure.labels)}, got {sorted(labels)}"
            )
        return tuple(sorted((k, str(v)) for k, v in labels.items()))

    # -- recording ------------------------------------------------------------------------
    def record_duration(self, name: str, seconds: float, **labels: object) -> None:
        """Add one observation to histogram ``name`` (seconds, or bytes for size figures).

        Raises:
            InvalidArgumentError: unknown figure, wrong labels, or a negative/NaN value.
        """
        if not seconds >= 0:  # also rejects NaN
            raise InvalidArgumentError(f"figure {name}: observation must be >= 0, got {seconds}")
        with self._lock:
            key = self._check(name, "histogram", labels)
            series = self._values[name]
            histogram = series.get(key)
            if histogram is None:
                histogram = series[key] = _Histogram(self._figures[name].buckets)
            histogram.observe(float(seconds))

    def increment(self, name: str, value: float = 1, **labels: object) -> None:
        """Add ``value`` (>= 0) to counter ``name``."""
        if not value >= 0:
            raise InvalidArgumentError(f"counter {name} only goes up; got increment {value}")
        with self._lock:
            key = self._check(name, "counter", labels)
            series = self._values[name]
            series[key] = series.get(key, 0) + value

    def set_gauge(self, name: str, value: float, **labels: object) -> None:
        """Set gauge ``name`` to ``value``."""
        with self._lock:
            key = self._check(name, "gauge", labels)
            self._values[name][key] = value

    @contextmanager
    def timed(self, name: str, **labels: object) -> Iterator[None]:
        """Record the wall time of the ``with`` block into histogram ``name``.

        Only blocks that complete are recorded: a failed write's time would skew the figure.
        """
        start = time.perf_counter()
        yield
        self.record_duration(name, time.perf_counter() - start, **labels)

    def mark_write_start(self) -> None:
        """Record the training time since the last ``mark_write_end`` (none before the first)."""
        now = time.monotonic()
        with self._lock:
            last = self._last_write_end
        if last is not None:
            self.record_duration(TRAINING_TIME_BETWEEN_WRITES, max(0.0, now - last))

    def mark_write_end(self) -> None:
        """Note that a checkpoint write finished (async writes: when the background part ends)."""
        with self._lock:
            self._last_write_end = time.monotonic()

    # -- reading --------------------------------------------------------------------------
    def series(self, name: str) -> dict[LabelKey, Any]:
        """A copy of one figure's values per label set, as in ``snapshot()``.

        Raises:
            InvalidArgumentError: ``name`` is not declared.
        """
        with self._lock:
            if name not in self._values:
                raise InvalidArgumentError(f"unknown figure {name!r}")
            return {
                key: v.to_dict() if isinstance(v, _Histogram) else v
                for key, v in self._values[name].items()
            }

    def snapshot(self) -> dict[str, dict[LabelKey, Any]]:
        """A copy of every figure: ``{name: {label_key: value}}``.

        Counters and gauges map to a number; histograms to ``{"count", "sum", "min", "max",
        "buckets"}`` where ``buckets`` maps each upper bound (last ``inf``) to the cumulative
        count. Figures with nothing recorded map to ``{}``.
        """
        with self._lock:
            return {
                name: {
                    key: v.to_dict() if isinstance(v, _Histogram) else v
                    for key, v in series.items()
                }
                for name, series in self._values.items()
            }

    def reset(self) -> None:
        """Forget every recorded value (declarations and exporter registrations stay)."""
        with self._lock:
            self._values = {name: {} for name in self._figures}
            self._last_write_end = None

    # -- exporters ------------------------------------------------------------------------
    def register_prometheus(self, registry: Any = None) -> Any:
        """Expose these figures to ``prometheus_client`` (default: its global ``REGISTRY``).

        Returns the collector (pass it to ``registry.unregister`` to stop). Registering twice
        with the same registry returns the first collector.
        """
        import prometheus_client

        target = registry if registry is not None else prometheus_client.REGISTRY
        with self._lock:
            collector = self._exporters.get(("prometheus", id(target)))
            if collector is None:
                collector = _PrometheusCollector(self)
                target.register(collector)
                self._exporters[("prometheus", id(target))] = collector
        return collector

    def register_opentelemetry(self, meter_provider: Any = None) -> Any:
        """Expose these figures as OpenTelemetry observable instruments.

        Counters become observable counters, gauges observable gauges, and each histogram
        three observable counters, ``<name>_count``, ``<name>_sum`` and ``<name>_bucket``
        (attribute ``le``, cumulative), so nothing recorded before registration is lost.
        Uses the global meter provider unless one is given. Returns the meter.
        """
        from opentelemetry import metrics as otel_metrics

        provider = meter_provider or otel_metrics.get_meter_provider()
        with self._lock:
            meter = self._exporters.get(("opentelemetry", id(provider)))
            if meter is None:
                meter = provider.get_meter("trackpoint")
                self._exporters[("opentelemetry", id(provider))] = meter
                register = True
            else:
                register = False
        if register:
            _create_opentelemetry_instruments(self, meter)
        return meter


# -- exporters (their packages are imported only when registering) ---------------------------
def _label_values(figure: Figure, key: LabelKey) -> list[str]:
    values = dict(key)
    return [values[label] for label in figure.labels]


class _PrometheusCollector:
    """A ``prometheus_client`` custom collector reading a :class:`Registry` on each scrape."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

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


def _create_opentelemetry_instruments(registry: Registry, meter: Any) -> None:
    """Create one observable instrument per figure (three per histogram) on ``meter``."""
    from opentelemetry.metrics import Observation

    def observe(name: str, field: str | None) -> Any:
        def callback(options: Any) -> Iterator[Any]:
            for key, value in registry.series(name).items():
                attributes = dict(key)
                if field is None:
                    yield Observation(value, attributes)
                elif field == "buckets":
                    for bound, count in value["buckets"].items():
                        le = "+Inf" if math.isinf(bound) else repr(bound)
                        yield Observation(count, {**attributes, "le": le})
                else:
                    yield Observation(value[field], attributes)

        return callback

    for figure in registry.figures():
        name, description = figure.name, figure.description
        if figure.kind == "counter":
            meter.create_observable_counter(
                name, [observe(name, None)], unit=figure.unit, description=description
            )
        elif figure.kind == "gauge":
            meter.create_observable_gauge(
                name, [observe(name, None)], unit=figure.unit, description=description
            )
        else:
            meter.create_observable_counter(
                f"{name}_count", [observe(name, "count")], description=f"{description} (count)"
            )
            meter.create_observable_counter(
                f"{name}_sum", [observe(name, "sum")], unit=figure.unit,
                description=f"{description} (sum)",
            )  # fmt: skip
            meter.create_observable_counter(
                f"{name}_bucket",
                [observe(name, "buckets")],
                description=f"{description} (cumulative count per upper bound le)",
            )


REGISTRY = Registry()
"""The registry trackpoint records into."""


def record_duration(name: str, seconds: float, **labels: object) -> None:
    """``REGISTRY.record_duration``: add one observation to a histogram."""
    REGISTRY.record_duration(name, seconds, **labels)


def increment(name: str, value: float = 1, **labels: object) -> None:
    """``REGISTRY.increment``: add to a counter."""
    REGISTRY.increment(name, value, **labels)


def set_gauge(name: str, value: float, **labels: object) -> None:
    """``REGISTRY.set_gauge``: set a gauge."""
    REGISTRY.set_gauge(name, value, **labels)


def timed(name: str, **labels: object) -> AbstractContextManager[None]:
    """``REGISTRY.timed``: time a ``with`` block into a histogram."""
    return REGISTRY.timed(name, **labels)


def mark_write_start() -> None:
    """``REGISTRY.mark_write_start``: record training time since the previous write."""
    REGISTRY.mark_write_start()


def mark_write_end() -> None:
    """``REGISTRY.mark_write_end``: note that a write finished."""
    REGISTRY.mark_write_end()


def snapshot() -> dict[str, dict[LabelKey, Any]]:
    """``REGISTRY.snapshot``: a plain-dict copy of every figure."""
    return REGISTRY.snapshot()


def reset() -> None:
    """``REGISTRY.reset``: forget every recorded value."""
    REGISTRY.reset()


def register_prometheus(registry: Any = None) -> Any:
    """``REGISTRY.register_prometheus``: expose the figures to ``prometheus_client``."""
    return REGISTRY.register_prometheus(registry)


def register_opentelemetry(meter_provider: Any = None) -> Any:
    """``REGISTRY.register_opentelemetry``: expose the figures to OpenTelemetry."""
    return REGISTRY.register_opentelemetry(meter_provider)
