"""The figures trackpoint records: their stable names, bucket bounds and declarations.

A figure is declared once (:class:`Figure`) and recorded into a
:class:`~trackpoint.metrics.registry.Registry`; exporters read the declarations to build their
instruments. Kept apart from the registry so that exporters depend on the declarations only.
docs/metrics.md lists the figures and what each measures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "BYTES_BUCKETS",
    "BYTES_READ",
    "BYTES_WRITTEN",
    "CHECKPOINT_SIZE",
    "CHECKSUM_FAILURES",
    "DEFAULT_FIGURES",
    "KINDS",
    "READ_DURATION",
    "SECONDS_BUCKETS",
    "SHARDING_POLICY_DURATION",
    "SHARDS_WRITTEN",
    "TRAINING_TIME_BETWEEN_WRITES",
    "WRITE_DURATION",
    "Figure",
    "LabelKey",
    "Listener",
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

KINDS = ("counter", "gauge", "histogram")
"""The kinds of figure a registry records."""


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


Listener = Callable[[Figure, float, LabelKey], None]
"""Called after each recording with the figure, the value (a counter's increment, a histogram's
observation, a gauge's new value) and the label set; see
:meth:`~trackpoint.metrics.registry.Registry.add_listener`."""

DEFAULT_FIGURES = (
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
"""The figures every :class:`~trackpoint.metrics.registry.Registry` declares on construction."""
