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
from trackpoint.saving.options import CheckpointOptions
from trackpoint.saving.saver import MultiDeviceSaver, SaveSnapshot
from trackpoint.storage import Storage

__all__ = ["AsyncWriter"]

logger = logging.getLogger(__name__)

_Job = tuple[MultiDeviceSaver, SaveSnapshot, str, CheckpointOptions, "Storage | None"]


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
        saver, snapshot, prefix, options, storage = job
        try:
            saver.save_snapshot(snapshot, prefix, options, storage=storage)
        except BaseException as exc:  # kept for sync(); the thread must survive
            logger.error("Asynchronous save to %s failed: %s", prefix, exc)
            shared.error = exc
        finally:
            # Drop every reference before reporting idle: a daemon thread that frees framework
            # objects (torch tensors behind numpy views) during interpreter exit aborts it.
            del saver, snapshot, options, storage, job
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
    ) -> str:
        """Snapshot ``saver``'s values now and write them to ``prefix`` in the background.

        Waits for the previous save first. Callables are evaluated here, on the caller's
        thread. If the snapshot would need more than ``options.max_staging_bytes`` of host
        memory, the save is written synchronously instead (no extra memory, blocks longer).

        Returns:
            ``prefix``; the checkpoint exists once ``sync()`` returns.

        Raises:
            FailedPreconditionError: the writer is closed.
            Exception: the error of the previous background save, if it failed (that save is
                lost; this one is not started).
        """
        options = options or CheckpointOptions()
        prefix_str = fspath(prefix)
        background = dataclasses.replace(options, enable_async=False)
        with self._lock:
            if self._closed:
                raise FailedPreconditionError(
                    f"cannot save {prefix_str}: this AsyncWriter is closed"
                )
            self._shared.idle.wait()
            self._raise_error()
            snapshot = saver.snapshot()
            limit = options.max_staging_bytes
            if limit is not None and snapshot.nbytes > limit:
                logger.info(
                    "Saving %s synchronously: its %d bytes exceed max_staging_bytes=%d",
                    prefix_str, snapshot.nbytes, limit,
                )
                self._buffers.clear()
                return saver.save_snapshot(snapshot, prefix_str, background, storage=storage)
            copied = snapshot.copy(self._buffers)
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
            self._shared.jobs.put((saver, copied, prefix_str, background, storage))
        return prefix_str

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
