"""What one save or restore measured: the records behind :mod:`trackpoint.metrics`' figures.

Private: ``trackpoint.metrics`` re-exports these names, and users reach them as
``tp.metrics.WriteStats`` and so on (they ride on the last progress event of each save and
restore). Kept apart so the registry module stays one concept.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReadStats", "WriteStats", "WriteTiming"]


@dataclass(frozen=True, slots=True)
class WriteTiming:
    """When a checkpoint write began; made by :func:`begin_write` on the caller's thread.

    It travels with the write to whoever finishes it (the saver, or an async writer's thread),
    which turns it into the write's durations.

    Attributes:
        started: ``time.perf_counter()`` when the caller started the write.
        training_seconds: time since the previous write's blocking part ended, ``None`` for
            the first write.
        blocking_seconds: set by :func:`end_blocking` when an async writer hands the write to
            its thread (``None`` for a synchronous write, whose blocking part lasts until the
            commit).
    """

    started: float
    training_seconds: float | None
    blocking_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class WriteStats:
    """The figures of one committed checkpoint write.

    Recorded into the registry once per write (:func:`record_write`) and passed to progress
    callbacks on the write's last event (``ProgressEvent.stats``).

    Attributes:
        prefix: the checkpoint written.
        mode: ``"sync"`` or ``"async"``.
        blocking_seconds: how long the caller (the training loop) was blocked.
        background_seconds: how long the async writer thread worked afterwards (0 for sync).
        training_seconds: time from the end of the previous write's blocking part to the start
            of this one (TensorFlow's "training time saved"); ``None`` for the first write.
        checkpoint_bytes: bytes of the checkpoint's files (index and data files).
        shard_bytes: bytes of each data file, in file order.
        sharding_policy: the sharding policy's description.
        sharding_seconds: time the sharding policy took.
    """

    prefix: str
    mode: str
    blocking_seconds: float
    background_seconds: float
    training_seconds: float | None
    checkpoint_bytes: int
    shard_bytes: tuple[int, ...]
    sharding_policy: str
    sharding_seconds: float

    @property
    def num_shards(self) -> int:
        """Data files written."""
        return len(self.shard_bytes)


@dataclass(frozen=True, slots=True)
class ReadStats:
    """The figures of one checkpoint read (``Checkpoint.read``/``restore``).

    Passed to progress callbacks on the read's last event (``ProgressEvent.stats``); the
    registry gets ``seconds`` as one ``trackpoint_read_duration_seconds`` observation.

    Attributes:
        prefix: the checkpoint read.
        seconds: how long the read blocked the caller (values for objects that do not exist
            yet are restored later, when they are attached, and are not included).
        checkpoint_bytes: bytes of the checkpoint's files (index and data files).
        shard_bytes: bytes of each data file, in file order.
    """

    prefix: str
    seconds: float
    checkpoint_bytes: int
    shard_bytes: tuple[int, ...]

    @property
    def num_shards(self) -> int:
        """Data files of the checkpoint."""
        return len(self.shard_bytes)
