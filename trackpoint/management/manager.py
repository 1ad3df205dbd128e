"""CheckpointManager: numbered checkpoints in one directory, keeping the newest few.

Behaviour follows ``tf.train.CheckpointManager`` (tf-checkpoint-format.md §14). The manager
drives any checkpoint object through its public surface — ``save_counter``, ``write(prefix,
options)``, ``restore(path)``, ``sync()`` — and does its bookkeeping in a write callback, so the
state file is updated and old checkpoints are deleted only after the new checkpoint is committed
(for async saves, on the writer thread once the files are durable).

One writer per directory (docs/design.md): the manager holds the directory's writer lock
(``Storage.lock_directory``) from construction until :meth:`CheckpointManager.close`, one
process opens one manager per directory, and a checkpoint that has neither saved nor been
restored never replaces a committed checkpoint: its numbering continues after them.

Pruning never leaves a state file naming a deleted checkpoint: the state file is rewritten
without the checkpoints to prune first, then they are deleted. Only paths inside the directory
are ever deleted (the state file is confined to it, ``state_file.py``).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from trackpoint._types import PathLike, fspath
from trackpoint.errors import (
    CheckpointError,
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
)
from trackpoint.graph.keys import SAVE_COUNTER, checkpoint_key
from trackpoint.management.continuous import ContinuousCheckpointingPolicy, ContinuousSaves
from trackpoint.management.reader import CheckpointReader
from trackpoint.management.state_file import (
    checkpoint_exists,
    get_checkpoint_state,
    inside,
    remove_checkpoint,
    write_checkpoint_state,
)
from trackpoint.saving.options import CheckpointOptions
from trackpoint.storage import DirectoryLock, Storage, locate
from trackpoint.tracking.base import VARIABLE_VALUE_KEY

__all__ = ["CheckpointManager"]

logger = logging.getLogger(__name__)

_SAVE_COUNTER_KEY = checkpoint_key(SAVE_COUNTER, VARIABLE_VALUE_KEY)

# The open manager of each directory this process writes, by its lock's key. The directory lock
# is shared within a process (a manager and Checkpoint.save must not fail against each other),
# so it cannot tell two managers apart: two would each rewrite the state file with their own
# list, and one's checkpoints would never be pruned. Held weakly: a dropped manager frees it.
_open_managers: dict[tuple[str, ...], weakref.ref[CheckpointManager]] = {}
_open_managers_lock = threading.Lock()
_HERE = os.path.dirname(os.path.abspath(__file__))


def _caller() -> str:
    """``file:line`` of the code that created a manager (the first frame outside this
    package), for the message naming it."""
    frame = sys._getframe(1)
    while frame.f_back is not None and os.path.dirname(frame.f_code.co_filename) == _HERE:
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class _Checkpointable(Protocol):
    """What the manager needs of a checkpoint object (``tp.Checkpoint`` provides it).

    Optional: ``is_coordinator``, a bool. A checkpoint saved by several processes together
    (``trackpoint.distributed.DistributedCheckpoint``) sets it False on all but the process
    that commits; the manager there neither writes the state file nor deletes checkpoints, it
    follows the state file that process wrote (before the save returned).
    """

    @property
    def save_counter(self) -> Any: ...

    def write(self, prefix: str, options: CheckpointOptions | None = None) -> str: ...

    def restore(self, save_path: str | None, options: CheckpointOptions | None = None) -> Any: ...

    def sync(self) -> None: ...


def _as_int(value: Any) -> int:
    """An integer from an int, a numpy/torch scalar, or a ``tp.Variable``."""
    if isinstance(value, int):
        return value
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not value.is_integer():
        raise InvalidArgumentError(f"expected an integer step or checkpoint number, got {value}")
    return int(value)


class CheckpointManager:
    """Saves numbered checkpoints ``<directory>/<checkpoint_name>-<n>`` and prunes old ones.

    Only checkpoints in the *active set* (listed in the state file) are ever deleted, oldest
    first, once more than ``max_to_keep`` exist; ``keep_checkpoint_every_n_hours`` preserves
    one checkpoint per that many hours forever. A new manager on the same directory recovers
    the active set and ``latest_checkpoint`` from the state file.

    One writer per directory: the manager takes the directory's writer lock when it is created
    (creating the directory) and holds it until :meth:`close` (also the end of a ``with``
    block, garbage collection, or process exit; a killed process's lock is released by the OS).
    A manager in another process fails at once, naming the holder, and so does a second open
    manager of the same process (it would overwrite the first's list in the state file): close
    the first (or let it be garbage collected) before creating another. A manager and
    ``Checkpoint.save`` calls of one process share the lock. On object stores the lock is a
    best-effort lease (docs/design.md). Only the process that commits (``is_coordinator``, see
    ``_Checkpointable``) takes the lock.

    A committed checkpoint of another writer is never replaced: if the checkpoint has neither
    saved nor been restored (``save_counter`` 0, a new run, or JAX state restored with
    ``tp.jax.restore``), ``save()`` numbers on after the directory's highest ``ckpt-N`` (and
    sets ``save_counter`` to it), and an explicit ``checkpoint_number`` naming an existing
    checkpoint fails. A checkpoint that restored continues that history and may replace later
    checkpoints of it, as in TensorFlow (rolling back to an older checkpoint).

    Example:
        >>> import numpy as np, tempfile, trackpoint as tp
        >>> ckpt = tp.Checkpoint(w=np.zeros(3))
        >>> manager = tp.CheckpointManager(ckpt, tempfile.mkdtemp(), max_to_keep=2)
        >>> path = manager.save()
        >>> manager.latest_checkpoint == path
        True

    Args:
        checkpoint: the ``tp.Checkpoint`` to save and restore.
        directory: where checkpoints and the ``checkpoint`` state file live.
        max_to_keep: how many checkpoints to keep in the active set; None keeps all.
        keep_checkpoint_every_n_hours: preserve a checkpoint leaving the active set if this many
            hours passed since the last preserved one.
        checkpoint_name: base name of the prefixes.
        step_counter: an int-valued holder read by ``checkpoint_interval``.
        checkpoint_interval: minimum step distance between two saves (needs ``step_counter``).
        init_fn: called by ``restore_or_initialize`` when there is no checkpoint.
        clock: seconds since the epoch; injectable for tests.

    Raises:
        InvalidArgumentError: ``checkpoint`` is not a checkpoint (say, the model itself),
            ``max_to_keep`` is not positive, or ``checkpoint_interval`` is given without
            ``step_counter``.
        FailedPreconditionError: another process holds ``directory``'s writer lock (the
            message names its host and pid), or another open manager of this process
            manages ``directory`` (the message names where it was created).
        DataLossError: the directory's state file names a path outside it.
    """

    def __init__(
        self,
        checkpoint: _Checkpointable,
        directory: PathLike,
        max_to_keep: int | None,
        keep_checkpoint_every_n_hours: float | None = None,
        checkpoint_name: str = "ckpt",
        step_counter: Any = None,
        checkpoint_interval: int | None = None,
        init_fn: Callable[[], Any] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        save_policy: ContinuousCheckpointingPolicy | None = None,
    ) -> None:
        missing = [name for name in ("write", "restore", "sync")
                   if not callable(getattr(checkpoint, name, None))]
        if missing:  # (save_counter is not asked: reading it creates the counter)
            raise InvalidArgumentError(
                f"CheckpointManager needs a tp.Checkpoint (or an object with save_counter, "
                f"write, restore and sync), got {type(checkpoint).__name__}: wrap the state "
                "first, e.g. CheckpointManager(tp.Checkpoint(model=model), directory, ...)"
            )
        if max_to_keep is not None and max_to_keep <= 0:
            raise InvalidArgumentError(
                f"Expected a positive integer or `None` for `max_to_keep`, got {max_to_keep}."
            )
        if checkpoint_interval is not None and step_counter is None:
            raise InvalidArgumentError(
                "`step_counter` should be passed if `checkpoint_interval` is not None."
            )
        self._checkpoint = checkpoint
        self._max_to_keep = max_to_keep
        self._keep_every_n_hours = keep_checkpoint_every_n_hours
        self._directory = fspath(directory, argument="directory")
        self._prefix = os.path.join(self._directory, checkpoint_name)
        # The directory's backend, picked once: the lock, the state file, the listing and the
        # pruning all use it (a save's options.storage still serves that save).
        self._storage = locate(self._directory).storage
        self._step_counter = step_counter
        self._checkpoint_interval = checkpoint_interval
        self._last_checkpoint_step: int | None = None
        self._init_fn = init_fn
        self._clock = clock
        # Continuous checkpointing (maybe_save); TF's checkpoint_interval is save()'s alone.
        self._continuous = ContinuousSaves(save_policy) if save_policy is not None else None
        self._lock = threading.Lock()
        self._active: OrderedDict[str, float] = OrderedDict()
        self._closed = False
        self._directory_lock: DirectoryLock | None = None
        self._created_at = _caller()
        if getattr(checkpoint, "is_coordinator", True):
            self._directory_lock = self._storage.lock_directory(self._directory)
        try:
            if self._directory_lock is not None:
                self._claim_directory(self._directory_lock.key)
            self._recover_state()
        except BaseException:
            self.close()
            raise

    def _claim_directory(self, key: tuple[str, ...]) -> None:
        """Register as the process's one open manager of the directory.

        Raises:
            FailedPreconditionError: another open manager of this process has it.
        """
        for attempt in range(2):
            with _open_managers_lock:
                ref = _open_managers.get(key)
                other = ref() if ref is not None else None
                if other is None or other._closed:
                    _open_managers[key] = weakref.ref(self)
                    return
                created_at = other._created_at
                del other  # hold no reference while collecting
            if attempt == 0:
                gc.collect()  # a dropped manager in a reference cycle: free it first
        raise FailedPreconditionError(
            f"Cannot create a CheckpointManager for {self._directory}: another "
            f"CheckpointManager of this process, created at {created_at}, manages it and is "
            "not closed. Two managers of one directory would overwrite each other's list of "
            "checkpoints in the state file (one's checkpoints would never be deleted). Keep "
            "using that manager, or close it first (manager.close(), or create it in a `with` "
            "block); a manager that is no longer referenced is released when it is garbage "
            "collected.",
            path=self._directory,
        )

    def _recover_state(self) -> None:
        state = get_checkpoint_state(self._directory, storage=self._storage)
        now = self._clock()
        if state is None:
            self._latest: str | None = None
            # Slightly in the past, so a manager re-created at once still counts as newer.
            self._last_preserved = now - 1.0
            return
        self._latest = state.model_checkpoint_path
        self._last_preserved = state.last_preserved_timestamp
        if now < self._last_preserved:
            logger.warning(
                "time.time() returned a value %f seconds behind the last preserved checkpoint "
                "timestamp.",
                self._last_preserved - now,
            )
            self._last_preserved = now
        paths = list(state.all_model_checkpoint_paths)
        stamps = list(state.all_model_checkpoint_timestamps) or [self._last_preserved] * len(paths)
        for path, stamp in zip(paths, stamps):
            stamp = min(stamp, now)
            if stamp <= self._last_preserved:
                continue
            if path != self._latest and not checkpoint_exists(path, storage=self._storage):
                # A writer killed while pruning (TensorFlow deletes before it records): the
                # checkpoint is gone, so it is no longer managed.
                logger.warning(
                    "the state file of %s lists %s, but %s.index does not exist; forgetting it",
                    self._directory, path, path,
                )
                continue
            self._active[path] = stamp

    # -- properties -----------------------------------------------------------------------
    @property
    def directory(self) -> str:
        return self._directory

    @property
    def storage(self) -> Storage:
        """The backend of ``directory``, picked once when the manager was created."""
        return self._storage

    @property
    def checkpoint(self) -> _Checkpointable:
        return self._checkpoint

    @property
    def checkpoint_interval(self) -> int | None:
        return self._checkpoint_interval

    @property
    def latest_checkpoint(self) -> str | None:
        """Prefix of the newest committed checkpoint, or None."""
        with self._lock:
            return self._latest

    @property
    def checkpoints(self) -> list[str]:
        """Managed checkpoints, oldest first (preserved ones are not listed)."""
        with self._lock:
            return list(self._active)

    # -- operations -----------------------------------------------------------------------
    def save(
        self,
        checkpoint_number: Any = None,
        check_interval: bool = True,
        options: CheckpointOptions | None = None,
    ) -> str | None:
        """Write a new checkpoint and prune old ones.

        ``save_counter`` is incremented even when ``checkpoint_number`` names the checkpoint;
        when it was 0 and the directory holds ``<checkpoint_name>-N`` checkpoints, an
        unnumbered save writes ``N+1`` and sets ``save_counter`` to ``N+1``.
        Returns the new prefix, or None when ``checkpoint_interval`` says it is too early.
        The state-file update and deletions happen only after the new checkpoint is committed.
        An existing checkpoint at the prefix is replaced atomically, unless the checkpoint has
        neither saved nor been restored (see the class docstring).

        Raises:
            FailedPreconditionError: ``save_counter`` is 0 and ``checkpoint_number`` names a
                committed checkpoint (nothing is changed, ``save_counter`` included; the
                message names the checkpoint and the fix), the manager is closed, or it lost
                its lock.
            CheckpointError: writing failed, as for ``Checkpoint.write``.
        """
        self._check_can_write()
        step: int | None = None
        if self._checkpoint_interval is not None:
            step = _as_int(self._step_counter)
            if self._last_checkpoint_step is not None:
                if step == self._last_checkpoint_step:
                    return None
                if check_interval and step < self._last_checkpoint_step + self._checkpoint_interval:
                    return None
        counter = self._checkpoint.save_counter
        previous = _as_int(counter)
        options = options or CheckpointOptions()
        if checkpoint_number is not None:
            number = _as_int(checkpoint_number)
        elif previous == 0:
            # Not restored (tp.jax.restore leaves save_counter alone, a new run): continue
            # after the directory's checkpoints rather than collide with ckpt-1.
            highest = max(self._taken_numbers(options.storage), default=0)
            if highest:
                logger.info(
                    "save_counter is 0 (the checkpoint was not restored): numbering continues "
                    "after %s-%d", self._prefix, highest,
                )
            number = highest + 1
        else:
            number = previous + 1
        prefix = f"{self._prefix}-{number}"
        if previous == 0:  # a new history: it must not replace a committed checkpoint
            self._refuse_replacing(prefix, options.storage)
        if step is not None:
            self._last_checkpoint_step = step
        counter.assign(number if checkpoint_number is None else previous + 1)
        options = dataclasses.replace(
            options, write_callbacks=(*options.write_callbacks, self._record_and_sweep)
        )
        return self._checkpoint.write(prefix, options=options)

    def maybe_save(self, step: int, options: CheckpointOptions | None = None) -> str | None:
        """Save ``<checkpoint_name>-<step>`` if the ``save_policy`` says so (continuous
        checkpointing, :mod:`trackpoint.management.continuous`): at every multiple of its
        ``interval_steps``, and between them whenever no async write is running.

        Returns:
            The new prefix, or None when the policy skipped ``step``.

        Raises:
            FailedPreconditionError: the manager has no ``save_policy``, or as :meth:`save`.
        """
        if self._continuous is None:
            raise FailedPreconditionError(
                "maybe_save needs a save policy: create the manager with "
                "save_policy=tp.management.ContinuousCheckpointingPolicy(...), or call save()"
            )
        return self._continuous.maybe_save(self, step, options)

    def _check_can_write(self) -> None:
        if self._closed:
            raise FailedPreconditionError(
                f"this CheckpointManager of {self._directory} is closed; create a new one to "
                "save again",
                path=self._directory,
            )
        if self._directory_lock is not None:
            self._directory_lock.check()

    def _taken_numbers(self, storage: Storage | None) -> list[int]:
        """The numbers N of the committed ``<checkpoint_name>-N`` in the directory."""
        store = storage if storage is not None else self._storage
        if not store.exists(self._directory):
            return []
        base = os.path.basename(self._prefix)
        return [
            int(name[len(base) + 1 : -len(".index")])
            for name in store.list(self._directory)
            if name.startswith(f"{base}-") and name.endswith(".index")
            and name[len(base) + 1 : -len(".index")].isdigit()
        ]

    def _refuse_replacing(self, prefix: str, storage: Storage | None) -> None:
        """Raise if ``prefix`` holds a committed checkpoint (for a checkpoint not restored)."""
        if not checkpoint_exists(prefix, storage=storage or self._storage):
            return
        free = max(self._taken_numbers(storage), default=0) + 1
        latest = f", {self._latest}," if self._latest else ""
        raise FailedPreconditionError(
            f"Refusing to replace the committed checkpoint {prefix} ({prefix}.index exists): "
            "another writer saved it, and this manager's checkpoint has neither saved nor been "
            "restored (save_counter is 0). Restore first: manager.restore_or_initialize() "
            "(for JAX state: tp.jax.restore_or_initialize(manager)) restores the latest "
            f"checkpoint{latest} and numbering continues after it; or "
            f"pass checkpoint_number={free} (or any number not taken). To discard {prefix}, "
            "delete its files first.",
            path=prefix,
        )

    def _record_and_sweep(self, save_path: str) -> None:
        if not getattr(self._checkpoint, "is_coordinator", True):
            with self._lock:  # another process recorded and swept: follow its state file
                self._active.clear()
                self._recover_state()
            return
        with self._lock:
            self._active.pop(save_path, None)
            self._active[save_path] = self._clock()
            self._latest = save_path
            doomed = self._sweep()
            # The state file first stops naming what is deleted, then it is deleted: a crash in
            # between leaves files no state file names, never a state file naming a deleted
            # checkpoint (and the new checkpoint is recorded either way).
            self._record_state()
            for path in doomed:
                self._delete(path)

    def _sweep(self) -> list[str]:
        """Take the checkpoints beyond ``max_to_keep`` out of the active set, oldest first.

        Returns:
            Those to delete (the others are preserved by ``keep_checkpoint_every_n_hours``).
        """
        doomed: list[str] = []
        if not self._max_to_keep:
            return doomed
        while len(self._active) > self._max_to_keep:
            path, stamp = self._active.popitem(last=False)
            if (
                self._keep_every_n_hours
                and stamp - self._keep_every_n_hours * 3600.0 >= self._last_preserved
            ):
                self._last_preserved = stamp
                continue
            doomed.append(path)
        return doomed

    def _delete(self, path: str) -> None:
        """Delete checkpoint ``path`` if it lies in the directory; a failure is logged (the
        save itself is committed and recorded)."""
        if inside(self._directory, path) is None:  # the state file is confined: never here
            logger.error("not deleting %s: it is outside %s", path, self._directory)
            return
        try:
            remove_checkpoint(path, storage=self._storage)
        except (CheckpointError, OSError) as exc:
            logger.error("could not delete the old checkpoint %s: %s", path, exc)

    def _record_state(self) -> None:
        assert self._latest is not None
        write_checkpoint_state(
            self._directory,
            self._latest,
            list(self._active),
            list(self._active.values()),
            self._last_preserved,
            storage=self._storage,
        )

    def restore_or_initialize(
        self, restore_fn: Callable[[str], Any] | None = None
    ) -> str | None:
        """Restore the latest checkpoint and return its prefix; else call ``init_fn``.

        Args:
            restore_fn: called with the latest prefix instead of ``checkpoint.restore``, for
                state that cannot be restored in place: JAX arrays are immutable, and
                ``tp.jax.restore_or_initialize(manager, target)`` passes one that builds the
                new tree. The manager then sets ``save_counter`` to the checkpoint's (read and
                checked first), so numbering continues after it as after ``restore``.

        Raises:
            FailedPreconditionError: the checkpoint holds JAX arrays and no ``restore_fn`` is
                given (use ``tp.jax.restore_or_initialize``).
            CheckpointError: restoring failed, as for ``Checkpoint.restore``.
        """
        self._checkpoint.sync()
        latest = self.latest_checkpoint
        if latest is not None:
            if restore_fn is None:
                self._checkpoint.restore(latest)
            else:
                counter = self._saved_counter(latest)
                restore_fn(latest)
                if counter is not None:
                    self._checkpoint.save_counter.assign(counter)
            if self._checkpoint_interval is not None:
                self._last_checkpoint_step = _as_int(self._step_counter)
            return latest
        if self._init_fn is not None:
            self._init_fn()
        return None

    def _saved_counter(self, prefix: str) -> int | None:
        """The ``save_counter`` checkpoint ``prefix`` holds, or None (a ``write()``).

        Raises:
            DataLossError: the value is damaged, or not a non-negative integer scalar.
        """
        with CheckpointReader(prefix, storage=self._storage) as reader:
            if not reader.has_tensor(_SAVE_COUNTER_KEY):
                return None
            value = reader.get_tensor(_SAVE_COUNTER_KEY)
        if value.shape != () or value.dtype.kind not in "iu" or int(value) < 0:
            shown = f" {value.item()!r}" if value.size == 1 else ""
            raise DataLossError(
                f"the save_counter of {prefix} is {value.dtype}{list(value.shape)}{shown}, not "
                "a non-negative integer; the checkpoint is damaged or "
                "was not written as a tp/TF Checkpoint: restore it with tp.jax.restore(path, "
                "target) and save with an explicit checkpoint_number",
                path=prefix,
                key=_SAVE_COUNTER_KEY,
            )
        return int(value)

    def sync(self) -> None:
        """Block until a pending async save (and this manager's bookkeeping) has finished."""
        self._checkpoint.sync()

    def close(self) -> None:
        """Wait for a pending async save, then release the directory's writer lock.

        Idempotent. The manager can still restore afterwards, but not save. The lock is also
        released when the manager is garbage collected or the process exits.

        Raises:
            CheckpointError: the pending async save failed (the lock is released anyway).
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._checkpoint.sync()
        finally:
            if self._directory_lock is not None:
                with _open_managers_lock:
                    ref = _open_managers.get(self._directory_lock.key)
                    if ref is not None and ref() is self:
                        del _open_managers[self._directory_lock.key]
                self._directory_lock.release()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
