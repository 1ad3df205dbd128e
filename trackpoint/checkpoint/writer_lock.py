"""One writer per directory, as ``Checkpoint.save`` and ``Checkpoint.write`` apply it.

``save`` takes the directory's writer lock (``Storage.lock_directory``) at its first save
there and keeps it while the ``Checkpoint`` lives, so a second process saving into the same
directory fails at once, naming the holder. A ``Checkpoint`` that has neither saved nor been
restored (``save_counter`` 0) starts a new history: its save never replaces a committed
checkpoint. ``write`` keeps TensorFlow's overwrite semantics for its exact prefix, except over a
committed checkpoint in a directory another live process holds. ``CheckpointManager`` applies
the same rules (trackpoint/management/manager.py); docs/design.md "One writer per directory".
"""

from __future__ import annotations

from trackpoint.errors import FailedPreconditionError
from trackpoint.management.state_file import checkpoint_directory, checkpoint_exists
from trackpoint.storage import DirectoryLock, Storage, locate

__all__ = ["hold_directory", "refuse_overwriting_live_writer", "refuse_replacing"]


def hold_directory(checkpoint: object, storage: Storage, directory: str) -> DirectoryLock:
    """The writer lock of ``directory``, taken once and kept on ``checkpoint`` while it lives.

    The handle is released when ``checkpoint`` is garbage collected (or the process exits);
    a copied checkpoint holds its own handle on the same lock.

    Raises:
        FailedPreconditionError: another process holds the lock (names it), or this process
            lost it (a lease taken over, the lock file deleted).
    """
    locks: dict[tuple[str, ...], DirectoryLock] | None = getattr(
        checkpoint, "_self_directory_locks", None
    )
    if locks is None:
        locks = {}
        # object.__setattr__: bookkeeping, not a tracked child of the checkpoint.
        object.__setattr__(checkpoint, "_self_directory_locks", locks)
    handle = storage.lock_directory(directory)
    kept = locks.get(handle.key)
    if kept is not None and not kept.released:
        handle.release()  # the process holds it already: keep the one handle
        handle = kept
    locks[handle.key] = handle
    handle.check()
    return handle


def refuse_replacing(prefix: str, storage: Storage, counter: int) -> None:
    """Raise if a new history (``counter`` 0) would replace the committed checkpoint ``prefix``.

    Args:
        prefix: the prefix ``save`` is about to write.
        storage: where it lives.
        counter: ``save_counter`` before this save: 0 for a checkpoint that has neither saved
            nor been restored.
    """
    if counter != 0 or not checkpoint_exists(prefix, storage=storage):
        return
    directory = checkpoint_directory(prefix)
    raise FailedPreconditionError(
        f"Refusing to replace the committed checkpoint {prefix} ({prefix}.index exists): "
        "another writer saved it, and this Checkpoint has neither saved nor been restored "
        "(save_counter is 0), so it would start over at 1. Restore first, e.g. "
        f"ckpt.restore(tp.latest_checkpoint({directory!r})), so the numbering continues after "
        f"the latest checkpoint; or save under another prefix. To discard {prefix}, delete its "
        "files first.",
        path=prefix,
    )


def refuse_overwriting_live_writer(prefix: str, storage: Storage | None) -> None:
    """Raise if ``prefix`` is a committed checkpoint in a directory another process holds."""
    store = locate(prefix, storage=storage).storage
    if not checkpoint_exists(prefix, storage=store):
        return
    directory = checkpoint_directory(prefix)
    holder = store.lock_holder(directory)
    if holder is None:
        return
    raise FailedPreconditionError(
        f"Refusing to overwrite the committed checkpoint {prefix}: another writer, {holder}, "
        f"holds the lock of {directory} and may still use it. Write to another prefix, or "
        "stop that writer first.",
        path=prefix,
    )
