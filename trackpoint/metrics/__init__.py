"""Counters and duration histograms trackpoint records, and their exporters.

The user's side (DESIGN.md): ``tp.metrics.snapshot()`` and ``tp.metrics.reset()``, the figure
names to read a snapshot by, the exporters, and the ``WriteStats`` / ``ReadStats`` records that
ride on progress events. ``REGISTRY`` (a :class:`Registry`) is the registry trackpoint records
into; its ``add_listener`` takes a :data:`Listener` for other monitoring systems. trackpoint's
layers record through :mod:`trackpoint.metrics.registry` (``begin_write``, ``record_write``,
``increment``, ...), which is not part of this API. docs/metrics.md lists the figures.
"""

from __future__ import annotations

from trackpoint.metrics.figures import (
    BYTES_BUCKETS,
    BYTES_READ,
    BYTES_WRITTEN,
    CHECKPOINT_SIZE,
    CHECKSUM_FAILURES,
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
from trackpoint.metrics.records import ReadStats, WriteStats
from trackpoint.metrics.registry import (
    REGISTRY,
    Registry,
    register_opentelemetry,
    register_prometheus,
    reset,
    snapshot,
)

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
    "register_opentelemetry",
    "register_prometheus",
    "reset",
    "snapshot",
]
