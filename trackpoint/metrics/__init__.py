"""Counters and duration histograms trackpoint records, and their exporters.

``tp.metrics.snapshot()`` and ``tp.metrics.reset()`` are the user's side (DESIGN.md); layers
record through the module-level functions of :mod:`trackpoint.metrics.registry`, re-exported
here. docs/metrics.md lists the figures.
"""

from __future__ import annotations

from trackpoint.metrics.records import ReadStats, WriteStats, WriteTiming
from trackpoint.metrics.registry import (
    BYTES_BUCKETS,
    BYTES_READ,
    BYTES_WRITTEN,
    CHECKPOINT_SIZE,
    CHECKSUM_FAILURES,
    READ_DURATION,
    REGISTRY,
    SECONDS_BUCKETS,
    SHARDING_POLICY_DURATION,
    SHARDS_WRITTEN,
    TRAINING_TIME_BETWEEN_WRITES,
    WRITE_DURATION,
    Figure,
    LabelKey,
    Listener,
    Registry,
    begin_write,
    end_blocking,
    increment,
    record_duration,
    record_write,
    register_opentelemetry,
    register_prometheus,
    reset,
    set_gauge,
    snapshot,
    timed,
)

# The user's API; the other names are for trackpoint's layers and exporters.
__all__ = [
    "BYTES_READ",
    "BYTES_WRITTEN",
    "CHECKPOINT_SIZE",
    "CHECKSUM_FAILURES",
    "READ_DURATION",
    "REGISTRY",
    "SHARDING_POLICY_DURATION",
    "SHARDS_WRITTEN",
    "TRAINING_TIME_BETWEEN_WRITES",
    "WRITE_DURATION",
    "ReadStats",
    "Registry",
    "WriteStats",
    "register_opentelemetry",
    "register_prometheus",
    "reset",
    "snapshot",
]

# Re-exported for the layers that record (not part of __all__).
_LAYER_NAMES = (
    BYTES_BUCKETS, SECONDS_BUCKETS, Figure, LabelKey, Listener, WriteTiming, begin_write,
    end_blocking, increment, record_duration, record_write, set_gauge, timed,
)
