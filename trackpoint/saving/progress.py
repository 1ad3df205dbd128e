"""Progress events and per-save figures of the saving layer.

``ProgressEvent`` is what ``CheckpointOptions.progress`` receives; the helpers here gather a
save's figures (:class:`~trackpoint.metrics.WriteStats`) while it runs so that they are
recorded once, at the commit, with no per-tensor locking.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trackpoint.errors import CheckpointError
from trackpoint.metrics import registry as metrics

if TYPE_CHECKING:
    from trackpoint.bundle.reader import BundleReader
    from trackpoint.saving.commit import AtomicCommit

__all__ = ["ProgressEvent", "ReadProgress", "WrittenFiles", "committed_sizes", "write_stats"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """Progress of a save or restore, passed to ``CheckpointOptions.progress``.

    A save reports ``"stage"`` (async saves only: the values are copied to host memory, on
    the caller's thread), then ``"write"`` after each shard is persisted, then ``"commit"``
    once the checkpoint exists and the write callbacks ran. A restore reports ``"read"`` after
    each value is read and ends with ``"restored"``. The last event of each (``"commit"``,
    ``"restored"``) carries the operation's figures in ``stats``. An async save's events
    after ``"stage"`` come from the writer thread. The callback runs inline: keep it quick
    and thread-safe; an exception it raises during a save aborts that save (docs/metrics.md).

    Restores are all or nothing, and so are their events: every ``"read"`` event comes while
    the values are being read and verified, before any object changes, so an exception a
    callback raises there fails the restore with nothing changed. ``"restored"`` comes once
    every object has its value; an exception the callback raises then cannot undo that and
    would make a restore that raised yet changed everything, so it is logged (logger
    ``trackpoint.checkpoint``, with its traceback) and the restore returns normally. (A
    ``KeyboardInterrupt`` or ``SystemExit`` still propagates: like a Ctrl-C just after
    ``restore`` returned, it interrupts a restore that is complete.)

    Example::

        def log_progress(event: ProgressEvent) -> None:
            if event.stats is not None:
                logging.info("%s: %s", event.phase, event.stats)

        ckpt.save(prefix, tp.CheckpointOptions(progress=log_progress))
    """

    prefix: str
    """The checkpoint being written or read."""
    phase: str
    """``"stage"``, ``"write"``, ``"commit"`` (saves), ``"read"``, ``"restored"`` (restores)."""
    shards_done: int
    """Shards persisted so far (saves; 0 while staging). Restores: the checkpoint's shards."""
    num_shards: int
    """Shards this save writes (0 while staging). Restores: the checkpoint's shards."""
    bytes_done: int
    """Bytes staged (``"stage"``), persisted (``"write"``, ``"commit"``; payload bytes, strings
    counted by length) or read into arrays (``"read"``) so far; ``"restored"``: the
    checkpoint's data file bytes."""
    bytes_total: int
    """What ``bytes_done`` reaches when the phase ends."""
    shard_id: int | None = None
    """``"write"``: the shard just persisted (its position among this save's shards)."""
    shard_bytes: int = 0
    """``"write"``: that shard's payload bytes."""
    stats: metrics.WriteStats | metrics.ReadStats | None = None
    """The last event's figures (``"commit"``: :class:`~trackpoint.metrics.WriteStats`,
    ``"restored"``: :class:`~trackpoint.metrics.ReadStats`); ``None`` on earlier events."""


@dataclass(frozen=True, slots=True)
class WrittenFiles:
    """What one save persisted: for its last progress event and its figures."""

    num_shards: int
    payload_bytes: int
    file_bytes: tuple[int, ...]  # each data file of the checkpoint, in file order
    checkpoint_bytes: int  # data files and index
    sharding_policy: str
    sharding_seconds: float


def committed_sizes(commit: AtomicCommit) -> tuple[tuple[int, ...], int]:
    """(bytes of each data file in order, bytes of the index) of a committed checkpoint.

    One stat per file (a HEAD request on object stores). The checkpoint is committed already,
    so a failure only loses the figures: it is logged, and the sizes count as 0.
    """
    try:
        files = tuple(commit.storage.size(path) for path in sorted(commit.placed))
        return files, commit.storage.size(commit.index_path)
    except CheckpointError as exc:
        logger.warning("Could not read the file sizes of checkpoint %s: %s", commit.prefix, exc)
        return tuple(0 for _ in commit.placed), 0


def write_stats(
    prefix: str, written: WrittenFiles, timing: metrics.WriteTiming, background_started: float
) -> metrics.WriteStats:
    """The figures of a write that just finished (after its write callbacks)."""
    now = time.perf_counter()
    if timing.blocking_seconds is None:
        mode, blocking, background = "sync", now - timing.started, 0.0
    else:
        mode, blocking, background = "async", timing.blocking_seconds, now - background_started
    return metrics.WriteStats(
        prefix=prefix,
        mode=mode,
        blocking_seconds=blocking,
        background_seconds=background,
        training_seconds=timing.training_seconds,
        checkpoint_bytes=written.checkpoint_bytes,
        shard_bytes=written.file_bytes,
        sharding_policy=written.sharding_policy,
        sharding_seconds=written.sharding_seconds,
    )


class ReadProgress:
    """Emits a restore's ``"read"`` events; exists only when a progress callback is set."""

    def __init__(
        self, callback: Callable[[ProgressEvent], None], reader: BundleReader, total: int
    ) -> None:
        self._callback = callback
        self._prefix = reader.prefix
        self._shards = reader.num_shards
        self._total = total
        self._done = 0

    def advance(self, nbytes: int) -> None:
        self._done += nbytes
        shards = self._shards
        self._callback(ProgressEvent(self._prefix, "read", shards, shards, self._done, self._total))
