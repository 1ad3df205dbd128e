"""Counters and duration histograms that trackpoint records, with optional exporters.

Every layer records into the default :class:`Registry` through the module functions
(``record_duration``, ``increment``, ``timed``, ``record_write``); users read it with
``snapshot()`` or export it with ``register_prometheus()`` / ``register_opentelemetry()``.
Recording is thread-safe and cheap (one short lock per recording, a few per checkpoint), so it
is always on. docs/metrics.md lists the figures and shows how to read them.

Figures (the names are stable, Prometheus style). Histograms, each with its labels:

- ``trackpoint_write_duration_seconds`` (``mode`` = ``sync``/``async``, ``phase`` =
  ``blocking``/``background``): time to write one checkpoint; ``blocking`` is the part the
  caller waits for, ``background`` the part an async writer does afterwards.
- ``trackpoint_read_duration_seconds``: time ``Checkpoint.read``/``restore`` blocked.
- ``trackpoint_training_time_between_writes_seconds``: from the end of one write's blocking
  part to the start of the next write (TensorFlow's "training time saved").
- ``trackpoint_checkpoint_size_bytes``: bytes of one checkpoint (its index and data files).
- ``trackpoint_sharding_policy_duration_seconds`` (``policy`` = the policy's description):
  time the sharding policy took to plan the shards.

Counters, no labels: ``trackpoint_shards_written_total`` (data files written),
``trackpoint_bytes_written_total`` / ``trackpoint_bytes_read_total`` (bytes moved to and from
storage; a reader adds its bytes when it is closed) and ``trackpoint_checksum_failures_total``
(crc32c mismatches found while reading).

Who records what: a save gathers its figures into one :class:`WriteStats` and records them with
one ``record_write`` call once it is committed (on the writer thread for async saves);
``Checkpoint.read`` records its duration; the bundle reader counts bytes read and checksum
failures. The same :class:`WriteStats` / :class:`ReadStats` ride on the last progress event of
each save and restore (``CheckpointOptions.progress``), so a training loop can log them.

Example::

    from trackpoint.metrics import registry
    with registry.timed(registry.READ_DURATION):
        ...
    registry.snapshot()[registry.READ_DURATION][()]["count"]   # -> 1
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from trackpoint.errors import InvalidArgumentError
from trackpoint.metrics.figures import (
    BYTES_BUCKETS,
    BYTES_READ,
    BYTES_WRITTEN,
    CHECKPOINT_SIZE,
    CHECKSUM_FAILURES,
    DEFAULT_FIGURES,
    KINDS,
    READ_DURATION,
    SECONDS_BUCKETS,
    SHARDING_POLICY_DURATION,
    SHARDS_WRITTEN,
    TRAINING_TIME_BETWEEN_WRITES,
    WRITE_DURATION,
    Figure,
    LabelKey,
    Listener,
)
from trackpoint.metrics.records import ReadStats, WriteStats, WriteTiming

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from prometheus_client import CollectorRegistry

    from trackpoint.metrics.export import OpenTelemetryExporter, PrometheusCollector

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
    "Listener",
    "ReadStats",
    "Registry",
    "WriteStats",
    "WriteTiming",
    "begin_write",
    "end_blocking",
    "increment",
    "record_duration",
    "record_write",
    "register_opentelemetry",
    "register_prometheus",
    "reset",
    "set_gauge",
    "snapshot",
    "timed",
]

logger = logging.getLogger(__name__)

_E = TypeVar("_E")


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


_Recording = tuple[Figure, float, LabelKey]


class Registry:
    """A thread-safe set of declared figures and their values, per label set.

    One lock guards everything; recordings happen a few times per checkpoint, so contention
    does not matter. The figures above are declared on construction; ``declare`` adds more.
    Listeners (exporters that push, like OpenTelemetry's) are called after the lock is
    released, on the recording thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._figures: dict[str, Figure] = {f.name: f for f in DEFAULT_FIGURES}
        self._values: dict[str, dict[LabelKey, Any]] = {name: {} for name in self._figures}
        # perf_counter() when the last write's blocking part ended: the training clock.
        self._last_write_end: float | None = None
        self._listeners: list[Listener] = []
        # (target, exporter): targets are held (and compared) by identity, not by id().
        self._exporters: list[tuple[object, object]] = []

    # -- declarations ---------------------------------------------------------------------
    def declare(self, figure: Figure) -> None:
        """Add a figure; re-declaring an identical figure is a no-op.

        Raises:
            InvalidArgumentError: the name exists with a different declaration, or the kind
                is unknown.
        """
        if figure.kind not in KINDS:
            raise InvalidArgumentError(f"figure {figure.name}: kind must be one of {KINDS}")
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
        with self._lock:
            recording = self._observe(name, seconds, labels)
        self._notify((recording,))

    def _observe(self, name: str, value: float, labels: Mapping[str, object]) -> _Recording:
        """``record_duration`` with the lock held."""
        if not value >= 0:  # also rejects NaN
            raise InvalidArgumentError(f"figure {name}: observation must be >= 0, got {value}")
        key = self._check(name, "histogram", labels)
        series = self._values[name]
        histogram = series.get(key)
        if histogram is None:
            histogram = series[key] = _Histogram(self._figures[name].buckets)
        histogram.observe(float(value))
        return self._figures[name], float(value), key

    def _add(self, name: str, value: float, labels: Mapping[str, object]) -> _Recording:
        """``increment`` with the lock held."""
        if not value >= 0:
            raise InvalidArgumentError(f"counter {name} only goes up; got increment {value}")
        key = self._check(name, "counter", labels)
        series = self._values[name]
        series[key] = series.get(key, 0) + value
        return self._figures[name], value, key

    def increment(self, name: str, value: float = 1, **labels: object) -> None:
        """Add ``value`` (>= 0) to counter ``name``."""
        with self._lock:
            recording = self._add(name, value, labels)
        self._notify((recording,))

    def set_gauge(self, name: str, value: float, **labels: object) -> None:
        """Set gauge ``name`` to ``value``."""
        with self._lock:
            key = self._check(name, "gauge", labels)
            self._values[name][key] = value
            recording = (self._figures[name], value, key)
        self._notify((recording,))

    @contextmanager
    def timed(self, name: str, **labels: object) -> Iterator[None]:
        """Record the wall time of the ``with`` block into histogram ``name``.

        Only blocks that complete are recorded: a failed write's time would skew the figure.
        """
        start = time.perf_counter()
        yield
        self.record_duration(name, time.perf_counter() - start, **labels)

    def begin_write(self) -> WriteTiming:
        """Start timing a checkpoint write; note the training time since the previous one.

        Call it where the caller's wait begins and hand the result to whoever finishes the
        write, which builds a :class:`WriteStats` and calls :meth:`record_write`. Nothing is
        recorded here, so a write that fails leaves no figure behind.
        """
        now = time.perf_counter()
        with self._lock:
            last = self._last_write_end
        return WriteTiming(now, None if last is None else max(0.0, now - last))

    def end_blocking(self, timing: WriteTiming) -> WriteTiming:
        """The caller's part of an async write is over: training resumes now.

        Restarts the training clock (the next write's ``training_seconds`` counts from here,
        even while this write goes on in the background).

        Returns:
            ``timing`` with ``blocking_seconds`` set, for the writer thread.
        """
        now = time.perf_counter()
        with self._lock:
            self._last_write_end = now
        return WriteTiming(timing.started, timing.training_seconds, now - timing.started)

    def record_write(self, stats: WriteStats) -> None:
        """Record every figure of one committed write at once.

        Records the blocking (and, for async writes, background) duration, the training time
        before the write, checkpoint size, shards and bytes written, and the sharding policy's
        duration under its description: one lock, whatever the number of tensors. A sync
        write also restarts the training clock (an async one did at :meth:`end_blocking`).

        Raises:
            InvalidArgumentError: ``stats.mode`` is not ``"sync"``/``"async"``, or a figure is
                negative (nothing is recorded then).
        """
        if stats.mode not in ("sync", "async"):
            raise InvalidArgumentError(
                f"WriteStats.mode must be 'sync' or 'async', got {stats.mode!r}"
            )
        observations: list[tuple[str, float, dict[str, object]]] = [
            (WRITE_DURATION, stats.blocking_seconds, {"mode": stats.mode, "phase": "blocking"}),
            (CHECKPOINT_SIZE, stats.checkpoint_bytes, {}),
            (SHARDING_POLICY_DURATION, stats.sharding_seconds, {"policy": stats.sharding_policy}),
        ]
        if stats.mode == "async":
            labels: dict[str, object] = {"mode": "async", "phase": "background"}
            observations.append((WRITE_DURATION, stats.background_seconds, labels))
        if stats.training_seconds is not None:
            observations.append((TRAINING_TIME_BETWEEN_WRITES, stats.training_seconds, {}))
        for name, value, _ in observations:
            if not value >= 0:
                raise InvalidArgumentError(f"{stats.prefix}: {name} must be >= 0, got {value}")
        if any(size < 0 for size in stats.shard_bytes):
            raise InvalidArgumentError(f"{stats.prefix}: shard sizes must be >= 0")
        with self._lock:
            recordings = [self._observe(name, value, lbl) for name, value, lbl in observations]
            recordings.append(self._add(SHARDS_WRITTEN, stats.num_shards, {}))
            recordings.append(self._add(BYTES_WRITTEN, stats.checkpoint_bytes, {}))
            if stats.mode == "sync":
                self._last_write_end = time.perf_counter()
        self._notify(recordings)

    # -- listeners ------------------------------------------------------------------------
    def add_listener(self, listener: Listener, *, replay_counters: bool = False) -> None:
        """Call ``listener(figure, value, label_key)`` after every recording from now on.

        Args:
            listener: must be thread-safe and quick; an exception it raises is logged, never
                propagated into a save or restore.
            replay_counters: first pass every counter's and gauge's current value, so a
                listener that keeps totals starts from the registry's (histograms cannot be
                replayed: only their aggregates are kept).
        """
        with self._lock:
            self._listeners = [*self._listeners, listener]  # copy on write: see _notify
            replay: list[_Recording] = []
            if replay_counters:
                for name, series in self._values.items():
                    figure = self._figures[name]
                    if figure.kind != "histogram":
                        replay.extend((figure, value, key) for key, value in series.items())
        for recording in replay:
            self._call(listener, recording)

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling ``listener`` (no-op if it was not added)."""
        with self._lock:
            self._listeners = [x for x in self._listeners if x is not listener]

    def _notify(self, recordings: Iterable[_Recording]) -> None:
        for listener in self._listeners:  # replaced, never mutated: safe without the lock
            for recording in recordings:
                self._call(listener, recording)

    @staticmethod
    def _call(listener: Listener, recording: _Recording) -> None:
        try:
            listener(*recording)
        except Exception:  # metrics must never break a checkpoint
            logger.warning("metrics listener %r failed", listener, exc_info=True)

    # -- reading --------------------------------------------------------------------------
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
        """Forget every recorded value (declarations, listeners and exporters stay)."""
        with self._lock:
            self._values = {name: {} for name in self._figures}
            self._last_write_end = None

    # -- exporters ------------------------------------------------------------------------
    def _exporter(
        self, kind: type[_E], target: object, create: Callable[[], _E]
    ) -> tuple[_E, bool]:
        """The exporter of class ``kind`` for ``target``, created (once) by ``create``.

        ``create`` runs under the lock, so it must not record (exporters only store things).

        Returns:
            The exporter, and whether this call created it.
        """
        with self._lock:
            for t, exporter in self._exporters:
                if isinstance(exporter, kind) and t is target:
                    return exporter, False
            created = create()
            self._exporters.append((target, created))
        return created, True

    def register_prometheus(self, registry: CollectorRegistry | None = None) -> PrometheusCollector:
        """Expose these figures to ``prometheus_client`` (default: its global ``REGISTRY``).

        The collector reads this registry at each scrape, so values recorded before the call
        are exported too. Registering again with the same registry returns the same collector
        (registered again if it was unregistered); pass it to ``registry.unregister`` to stop.

        Returns:
            The collector (a ``prometheus_client`` custom collector).
        """
        import prometheus_client

        from trackpoint.metrics.export import PrometheusCollector

        target = registry if registry is not None else prometheus_client.REGISTRY
        collector, _ = self._exporter(
            PrometheusCollector, target, lambda: PrometheusCollector(self)
        )
        try:
            target.register(collector)
        except ValueError:  # registered already (prometheus_client refuses duplicate names)
            pass
        return collector

    def register_opentelemetry(
        self, meter_provider: MeterProvider | None = None
    ) -> OpenTelemetryExporter:
        """Record every figure into OpenTelemetry instruments too, one instrument per figure.

        Counters become ``Counter`` s, histograms ``Histogram`` s (with these bucket bounds as
        the advisory explicit boundaries), gauges ``Gauge`` s, all on the meter
        ``"trackpoint"`` of ``meter_provider`` (default: the global one). From the call on,
        each recording is passed on as it happens; counters start from their current totals,
        histograms from empty. Registering again with the same provider returns the same
        exporter (passing recordings on again if it was closed).

        Returns:
            The exporter; ``exporter.close()`` stops passing recordings on.
        """
        from opentelemetry import metrics as otel_metrics

        from trackpoint.metrics.export import OpenTelemetryExporter

        provider = meter_provider or otel_metrics.get_meter_provider()
        exporter, created = self._exporter(
            OpenTelemetryExporter,
            provider,
            lambda: OpenTelemetryExporter(self, provider.get_meter("trackpoint")),
        )
        if not any(listener is exporter for listener in self._listeners):
            # Totals are replayed once: the instruments keep them across close().
            self.add_listener(exporter, replay_counters=created)
        return exporter


REGISTRY = Registry()
"""The registry trackpoint records into."""

# The module functions are the default registry's bound methods (as ``random.random`` is).
record_duration = REGISTRY.record_duration
increment = REGISTRY.increment
set_gauge = REGISTRY.set_gauge
timed = REGISTRY.timed
begin_write = REGISTRY.begin_write
end_blocking = REGISTRY.end_blocking
record_write = REGISTRY.record_write
snapshot = REGISTRY.snapshot
reset = REGISTRY.reset
register_prometheus = REGISTRY.register_prometheus
register_opentelemetry = REGISTRY.register_opentelemetry
