"""The one pool of hashing threads of the process: bounded, named, made on first use.

Hashing releases the GIL (crc32c, XXH3), so a large buffer hashed on a helper thread overlaps
with whatever the caller's thread does meanwhile: a shard writer writes the bytes while their
CRC-32C is computed (:func:`trackpoint.bundle.crc.crc32c_in_background`), a reader checks one
value while the next is hashed, an incremental save hashes values on several threads at once
(:func:`trackpoint.saving.change_tracking.run_shared`). They all share this pool, so a process
never holds more than :data:`MAX_THREADS` hashing threads whatever runs at the same time.

The pool is made on first use and forgotten in a forked child: the parent's threads do not
exist there, so work handed to the parent's pool would never run (a ``ThreadPoolExecutor``
that believes it is full starts no thread). The child makes its own pool when it first hashes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["MAX_THREADS", "hash_threads", "submit"]

T = TypeVar("T")

# One per concurrent shard writer (MultiDeviceSaver's default I/O threads): each may hash a
# large buffer while it writes the one before.
MAX_THREADS = 4

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def hash_threads() -> int:
    """How many threads hashing one batch should use, the caller's included (1 to 4).

    Never more than the machine's cores: more threads than cores only take turns.
    """
    return max(1, min(MAX_THREADS, os.cpu_count() or 1))


def _executor() -> ThreadPoolExecutor:
    global _pool
    pool = _pool
    if pool is None:
        with _pool_lock:
            pool = _pool
            if pool is None:
                pool = _pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="trackpoint-hash")
    return pool


def submit(fn: Callable[..., T], *args: object) -> Future[T]:
    """``fn(*args)`` on a thread of the pool; the pool is made on first use.

    When the interpreter is exiting and no thread can start, ``fn`` runs now and its result
    (or error) is returned as a completed future.
    """
    try:
        return _executor().submit(fn, *args)
    except RuntimeError:  # the interpreter is exiting (or the pool shut down): no new threads
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as exc:  # handed to the caller through the future, as a pool would
            done.set_exception(exc)
        return done


def _forget_in_child() -> None:
    """After ``fork``, in the child: the parent's pool threads are gone; start afresh."""
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
