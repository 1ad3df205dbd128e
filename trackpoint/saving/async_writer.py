"""Asynchronous saves: snapshot on the caller's thread, write on one background thread (J1).

``AsyncWriter.save`` returns as soon as the values are copied into host buffers, so training can
change them right away (in-place updates never reach the file); the ordinary synchronous
``MultiDeviceSaver.save_snapshot`` then runs on the writer thread: shards, merge, atomic commit
and write callbacks, exactly as a synchronous save (tf-checkpoint-format.md §15).

Rules: at most one save is in flight; a second ``save`` waits for the first to finish, which
also lets it reuse the first snapshot's buffers instead of allocating. A background error is
raised by the next ``sync()`` or ``save()`` (TF only logs it at ``sync()``). At interpreter exit a
pending save is waited for (up to ``exit_timeout`` seconds), so the last checkpoint is not lost.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import weakref

import numpy as np

from trackpoint._types import PathLike, fspath
from trackpoint.errors import FailedPreconditionError
from trackpoint.metrics import registry as metrics
from trackpoint.saving.devices import LOCAL_TASK
from trackpoint.saving.incremental import prepare_incremental
from trackpoint.saving.lazy_snapshot import LazyCopy, plan_lazy
from trackpoint.saving.options import CheckpointOptions
from trackpoint.saving.progress import ProgressEvent
from trackpoint.saving.saver import MultiDeviceSaver
from trackpoint.saving.snapshot import SaveSnapshot, Snapshot
from trackpoint.saving.staging import Stager
from trackpoint.storage import Storage

__all__ = ["AsyncWriter"]

logger = logging.getLogger(__name__)

_Job = tuple[
    MultiDeviceSaver, Snapshot, str, CheckpointOptions, "Storage | None", metrics.WriteTiming
]


class _Shared:
    """What the writer thread shares with its ``AsyncWriter``.

    The thread holds only this object, never the writer, so a writer that is no longer used can
    be garbage collected (freeing its snapshot buffers) and its finalizer stops the thread.
    """

    def __init__(self) -> None:
        self.jobs: queue.Queue[_Job | None] = queue.Queue()
        self.idle = threading.Event()
        self.idle.set()
        self.error: BaseException | None = None


def _run(shared: _Shared) -> None:
    """The writer thread: write queued snapshots one at a time until told to stop (None)."""
    while True:
        job = shared.jobs.get()
        if job is None:
            return
        saver, snapshot, prefix, options, storage, timing = job
        complete: SaveSnapshot | None = None
        try:
            # A lazy snapshot finishes its copies first; a staged one is written as it arrives.
            complete = snapshot.complete()
            saver.save_snapshot(complete, prefix, options, storage=storage, timing=timing)
        except BaseException as exc:  # kept for sync(); the thread must survive
            logger.error("Asynchronous save to %s failed: %s", prefix, exc)
            shared.error = exc
            snapshot.abandon(exc)  # e.g. the caller may be waiting for staging space
        finally:
            # Drop every reference before reporting idle: a daemon thread that frees framework
            # objects (torch tensors behind numpy views) during interpreter exit aborts it.
            del saver, snapshot, complete, options, storage, timing, job
            shared.idle.set()


def _finalize(shared: _Shared, thread: list[threading.Thread], timeout: float) -> None:
    """At exit (or when the writer is collected): wait for a pending save, stop the thread."""
    if not shared.idle.is_set():
        logger.info("Waiting up to %.0f s for an asynchronous save to finish", timeout)
        if not shared.idle.wait(timeout):
            logger.error("Asynchronous save still running at exit; it is abandoned")
    if shared.error is not None:
        logger.error("The last asynchronous save failed: %s", shared.error)
    if thread:
        shared.jobs.put(None)


class AsyncWriter:
    """One background writer thread for the saves of one checkpoint object.

    Thread-safe: ``save``, ``sync`` and ``close`` may be called from any thread; concurrent
    ``save`` calls are serialized.

    Args:
        exit_timeout: seconds to wait at interpreter exit for a pending save (TF: 300).

    Example::

        writer = AsyncWriter()
        writer.save(saver, "/tmp/ckpt-1")   # returns after the snapshot
        weights += 1                        # does not affect ckpt-1
        writer.sync()                       # ckpt-1 is committed (or its error is raised)
    """

    def __init__(self, *, exit_timeout: float = 300.0) -> None:
        self._shared = _Shared()
        self._lock = threading.Lock()  # serializes save() callers
        self._thread: list[threading.Thread] = []  # 0 or 1 thread, shared with the finalizer
        self._buffers: dict[tuple[str, str], np.ndarray] = {}
        self._staging: np.ndarray | None = None  # ring buffer of bounded (staged) saves
        self._closed = False
        self._finalizer = weakref.finalize(
            self, _finalize, self._shared, self._thread, exit_timeout
        )

    @property
    def pending(self) -> bool:
        """True while a save is being written."""
        return not self._shared.idle.is_set()

    def save(
        self,
        saver: MultiDeviceSaver,
        prefix: PathLike,
        options: CheckpointOptions | None = None,
        *,
        storage: Storage | None = None,
        timing: metrics.WriteTiming | None = None,
    ) -> str:
        """Snapshot ``saver``'s values now and write them to ``prefix`` in the background.

        Waits for the previous save first. Callables are evaluated here, on the caller's
        thread. If the values exceed ``options.max_staging_bytes``, they are copied through a
        staging buffer of that size while the writer thread writes them, and this call
        returns once the last value is copied (blocking longer, but holding at most that
        much extra memory); the files are the same. A saver that overrides ``save_snapshot``
        (distributed) then saves synchronously instead. With ``options.lazy_snapshot`` only the
        values no registered lazy planner defers are copied here; the writer thread copies the
        rest before writing (:mod:`trackpoint.saving.lazy_snapshot`); a saver with its own
        ``save_snapshot`` gets the ordinary full copy.

        The figures of the write (``trackpoint.metrics.WriteStats``, mode ``"async"``) are
        recorded when the background part commits: the blocking part lasts from ``timing``
        (``trackpoint.metrics.begin_write()``, by default this call) until the snapshot is
        handed to the writer thread. ``options.progress`` gets a ``"stage"`` event here, on
        the caller's thread, and the other events on the writer thread.

        Returns:
            ``prefix``; the checkpoint exists once ``sync()`` returns.

        Raises:
            FailedPreconditionError: the writer is closed.
            Exception: the error of the previous background save, if it failed (that save is
                lost; this one is not started).
        """
        timing = timing or metrics.begin_write()
        options = options or CheckpointOptions()
        prefix_str = fspath(prefix)
        background = dataclasses.replace(options, enable_async=False, lazy_snapshot=False)
        with self._lock:
            if self._closed:
                raise FailedPreconditionError(
                    f"cannot save {prefix_str}: this AsyncWriter is closed"
                )
            self._shared.idle.wait()
            self._raise_error()
            snapshot = saver.snapshot()
            plain = type(saver).save_snapshot is MultiDeviceSaver.save_snapshot
            if options.lazy_snapshot and plain:
                # Copies what may change before the next optimizer step; the rest on the
                # writer thread, which also hashes for an incremental save (save_snapshot).
                self._staging = None
                lazy = LazyCopy(
                    snapshot, self._buffers,
                    plan_lazy(snapshot.tensors_by_task.get(LOCAL_TASK, ())),
                )  # fmt: skip
                if options.progress is not None:
                    staged = lazy.immediate_bytes
                    options.progress(ProgressEvent(prefix_str, "stage", 0, 0, staged, staged))
                timing = metrics.end_blocking(timing)
                self._submit((saver, lazy, prefix_str, background, storage, timing))
                return prefix_str
            # Incremental: decided now, so unchanged values are neither copied nor staged.
            snapshot = prepare_incremental(saver.history, snapshot, prefix_str, options, storage)
            limit = options.max_staging_bytes
            if limit is not None and snapshot.nbytes > limit:
                self._buffers.clear()
                if type(saver).save_snapshot is MultiDeviceSaver.save_snapshot:
                    self._save_staged(saver, snapshot, prefix_str, options, storage, timing)
                    return prefix_str
                # A saver with its own save_snapshot (distributed) cannot take staged shards.
                logger.info(
                    "Saving %s synchronously: its %d bytes exceed max_staging_bytes=%d",
                    prefix_str, snapshot.nbytes, limit,
                )
                return saver.save_snapshot(
                    snapshot, prefix_str, background, storage=storage, timing=timing
                )
            self._staging = None
            copied = snapshot.copy(self._buffers)
            if options.progress is not None:
                staged = copied.nbytes
                options.progress(ProgressEvent(prefix_str, "stage", 0, 0, staged, staged))
            timing = metrics.end_blocking(timing)  # training resumes: restart its clock
            self._submit((saver, copied, prefix_str, background, storage, timing))
        return prefix_str

    def _submit(self, job: _Job) -> None:
        """Hand ``job`` to the writer thread (started if needed); the caller holds the lock."""
        self._shared.idle.clear()
        if not self._thread or not self._thread[0].is_alive():
            # A daemon thread: the finalizer decides how long exit waits for it.
            self._thread[:] = [
                threading.Thread(
                    target=_run, args=(self._shared,), name="trackpoint-async-save",
                    daemon=True,
                )
            ]
            self._thread[0].start()
        self._shared.jobs.put(job)

    def _save_staged(
        self,
        saver: MultiDeviceSaver,
        snapshot: SaveSnapshot,
        prefix: str,
        options: CheckpointOptions,
        storage: Storage | None,
        timing: metrics.WriteTiming,
    ) -> None:
        """A save bounded by ``options.max_staging_bytes``: staged while it is written.

        The shards are cut here; the writer thread starts on them at once and writes each
        value as soon as the stager has copied it into the reusable staging buffer. This call
        returns when the last value is copied (the stager then ends the blocking part of
        ``timing``; the writer thread takes it from there).
        """
        assert options.max_staging_bytes is not None
        background = dataclasses.replace(options, enable_async=False, lazy_snapshot=False)
        stager = Stager(options.max_staging_bytes, self._staging)
        self._staging = stager.buffer  # kept for the next bounded save
        shards = stager.stage_shards(saver._shard(snapshot, background))
        staged = dataclasses.replace(snapshot, shards=tuple(shards), stager=stager)
        self._submit((saver, staged, prefix, background, storage, timing))
        try:
            if not stager.stage(timing):
                return  # the write failed; sync() or the next save raises its error
        except BaseException:
            # Copying failed: the aborted write's error would only repeat this one.
            self._shared.idle.wait()
            self._shared.error = None
            raise
        logger.debug(
            "Staged %s through %d bytes (peak %d in use)", prefix, stager.capacity,
            stager.peak_bytes,
        )
        if options.progress is not None:
            nbytes = stager.staged_bytes
            options.progress(ProgressEvent(prefix, "stage", 0, 0, nbytes, nbytes))

    def sync(self) -> None:
        """Block until the pending save is committed; raise its error if it failed."""
        self._shared.idle.wait()
        self._raise_error()

    def close(self) -> None:
        """Wait for the pending save, then stop the thread. Errors are raised as by sync()."""
        with self._lock:
            self._closed = True
            self._shared.idle.wait()
            if self._thread:
                self._shared.jobs.put(None)
                self._thread[0].join()
                self._thread.clear()
            self._finalizer.detach()
        self._raise_error()

    def _raise_error(self) -> None:
        error, self._shared.error = self._shared.error, None
        if error is not None:
            raise error

    def __repr__(self) -> str:
        return f"AsyncWriter({'pending' if self.pending else 'idle'})"
