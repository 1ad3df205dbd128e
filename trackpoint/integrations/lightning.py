"""PyTorch Lightning and Fabric write TensorFlow V2 checkpoints (``tp.lightning``).

Example::

    import lightning as L
    import trackpoint as tp

    trainer = L.Trainer(
        plugins=[tp.lightning.TrackpointCheckpointIO()],
        callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath="ckpts", save_last=True)],
    )
    trainer.fit(model, ckpt_path="last")            # resumes from ckpts/last.ckpt if present
    tp.load_checkpoint("ckpts/last.ckpt")           # what trackpoint (or TensorFlow) reads

Each path Lightning names, ``ckpts/epoch=0-step=10.ckpt``, is a directory holding one
checkpoint (``ckpt-1.index``, its data file and the ``checkpoint`` state file), so everything
``ModelCheckpoint`` does with paths keeps working: existence checks, top-k removal,
``save_last=True`` (saved again in place, atomically) and ``save_last="link"`` (a symlink to
the directory), and ``ckpt_path="last"``. What the directory holds is described in
:mod:`trackpoint.integrations.lightning_state`: tensors are checkpoint values at readable keys
(``state_dict/net/0/weight/.ATTRIBUTES/VARIABLE_VALUE``), the rest of Lightning's dict is JSON,
and loading never unpickles.

Works with ``AsyncCheckpointIO(TrackpointCheckpointIO())`` (Lightning clones the tensors, the
write runs on its thread) and with ``Fabric(plugins=[...])`` (``fabric.save``/``fabric.load``).
Better, background saves of its own: ``TrackpointCheckpointIO(tp.CheckpointOptions(
enable_async=True, lazy_snapshot=True))`` returns before copying the parameters and the
optimizer state; each optimizer's next ``step()`` first finishes the copies of what it changes
(:mod:`trackpoint.integrations.torch_lazy`). Lightning hands the plugin a dict, never the
optimizers, so the plugin learns them from their steps (a global step pre-hook): a save before
any optimizer has stepped copies everything at the call. Writes to different paths run side by
side; a save, removal or load of a path waits for that path's write, ``teardown()`` (the end of
``fit``) for all of them, and a failed write is raised by the next call that finds it done.
``LightningModule.load_from_checkpoint`` reads files with ``torch.load`` itself, bypassing the
plugin: use :func:`load_from_checkpoint` (``tp.lightning.load_from_checkpoint(Model, path)``)
or mix :class:`TrackpointLoadingMixin` into the module class (:mod:`.lightning_load`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from trackpoint._types import PathLike, fspath
from trackpoint.errors import InvalidArgumentError
from trackpoint.integrations.lightning_load import TrackpointLoadingMixin, load_from_checkpoint
from trackpoint.integrations.lightning_read import read_checkpoint_dict
from trackpoint.integrations.lightning_state import (
    CHECKPOINT_DICT_NAME,
    MapLocation,
    start_checkpoint_dict,
    write_checkpoint_dict,
)
from trackpoint.integrations.torch_lazy import (
    lazy_optimizers,
    record_stepping_optimizers,
    stepped_optimizers,
)
from trackpoint.management import CheckpointManager
from trackpoint.management.continuous import write_running
from trackpoint.saving import CheckpointOptions

try:  # the unified package (`pip install lightning`)
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning.fabric.utilities.cloud_io import get_filesystem
except ModuleNotFoundError:  # only `pip install pytorch-lightning`
    from lightning_fabric.plugins.io.checkpoint_io import (  # type: ignore[assignment]
        CheckpointIO,
    )
    from lightning_fabric.utilities.cloud_io import get_filesystem

__all__ = [
    "CHECKPOINT_DICT_NAME",
    "MapLocation",
    "TrackpointCheckpointIO",
    "TrackpointLoadingMixin",
    "load_from_checkpoint",
    "read_checkpoint_dict",
    "write_checkpoint_dict",
]

logger = logging.getLogger(__name__)


def _check_options(options: Any, where: str) -> CheckpointOptions | None:
    if options is None:
        return None
    if not isinstance(options, CheckpointOptions):
        raise InvalidArgumentError(
            f"{where} must be a tp.CheckpointOptions or None, got {type(options).__name__}"
        )
    if options.lazy_snapshot:
        record_stepping_optimizers()  # learn the optimizers before the first save
    return options


class TrackpointCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` writing TensorFlow V2 checkpoints instead of pickles.

    Lightning calls it from global rank zero only (saves and removals) and from every rank to
    load. Each call is independent, so one instance may serve several trainers; it is
    thread-safe as far as calls on different paths go (``AsyncCheckpointIO`` saves on its
    own thread while ``ModelCheckpoint`` removes older paths).

    Args:
        options: ``tp.CheckpointOptions`` for every save (sharding, I/O threads, progress,
            storage, ``enable_async`` and ``lazy_snapshot``: see the module docstring).
            ``trainer.save_checkpoint(path, storage_options=tp.CheckpointOptions(...))``
            overrides them for one save.

    Raises:
        InvalidArgumentError: ``options`` is not a ``CheckpointOptions``.
    """

    def __init__(self, options: CheckpointOptions | None = None) -> None:
        super().__init__()
        self._options = _check_options(options, "TrackpointCheckpointIO(options=...)")
        self._lock = threading.Lock()
        self._writing: dict[str, CheckpointManager] = {}  # path -> its async write's manager

    def __repr__(self) -> str:
        return f"TrackpointCheckpointIO(options={self._options!r})"

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: PathLike, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` as the checkpoint directory ``path`` (replacing one there).

        Atomic: an existing checkpoint at ``path`` stays readable until the new one is
        committed. A symlink or a file at ``path`` is replaced (the checkpoint a link names
        is left alone), as Lightning's torch plugin replaces them. Blocks until written, unless
        the options ask for async (then a write to ``path`` still running is waited for first).

        Raises:
            InvalidArgumentError: a value cannot be stored without pickle (names its key and
                the fix), or ``storage_options`` is not a ``tp.CheckpointOptions``.
            CheckpointError: writing failed (this one, or an earlier async write found done
                or waited for here); nothing was committed.
        """
        options = _check_options(storage_options, "storage_options") or self._options
        target = fspath(path)
        self._finish(lambda written: written == target)
        if os.path.islink(target) or os.path.isfile(target):
            # Lightning saves over whatever is at ``path`` (its torch plugin moves a new file
            # over it): a link from save_last="link", never the checkpoint it names, or a
            # torch.save file of an earlier run.
            logger.warning("replacing %s %s with a trackpoint checkpoint",
                           "the link" if os.path.islink(target) else "the file", target)
            os.unlink(target)
        if options is None or not options.enable_async:
            prefix = write_checkpoint_dict(checkpoint, target, options=options)
            logger.debug("saved Lightning checkpoint %s", prefix)
            return
        lazy = lazy_optimizers(stepped_optimizers()) if options.lazy_snapshot else nullcontext()
        with lazy:
            prefix, manager = start_checkpoint_dict(checkpoint, target, options=options)
        with self._lock:
            self._writing[target] = manager
        logger.debug("saving Lightning checkpoint %s in the background", prefix)

    def _finish(self, which: Callable[[str], bool]) -> None:
        """Close the async writes of the paths ``which`` accepts (waiting), and any done.

        The first failure is raised once all of them are closed.
        """
        with self._lock:
            chosen = [
                (path, manager) for path, manager in self._writing.items()
                if which(path) or not write_running(manager.checkpoint)
            ]  # fmt: skip
            for path, _ in chosen:
                del self._writing[path]
        error: BaseException | None = None
        for _, manager in chosen:
            try:
                manager.close()  # waits for the write; raises its error
            except BaseException as exc:  # every manager must be closed
                error = error or exc
        if error is not None:
            raise error

    def teardown(self) -> None:
        """Wait for every async write; Lightning calls it at the end of ``fit``.

        Raises:
            CheckpointError: an async write failed (the first failure).
        """
        self._finish(lambda path: True)

    def load_checkpoint(
        self, path: PathLike, map_location: MapLocation = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The dict saved at ``path``: tensors on the CPU unless ``map_location`` says otherwise.

        ``weights_only`` is accepted for Lightning's sake and has no effect: nothing is ever
        unpickled, so every load is as safe as ``torch.load(weights_only=True)``.

        Raises:
            NotFoundError: no checkpoint at ``path`` (also a ``FileNotFoundError``).
            InvalidArgumentError: ``path`` is a ``torch.save`` file or not a Lightning
                checkpoint written by trackpoint (the message says how to convert it).
            DataLossError: the files are damaged.
        """
        self._finish(lambda path: True)
        return read_checkpoint_dict(fspath(path), map_location=map_location)

    def remove_checkpoint(self, path: PathLike) -> None:
        """Delete the checkpoint at ``path``; a symlink (``save_last="link"``) only is unlinked.

        A path that does not exist is ignored, as Lightning's own plugin does. An async write
        to ``path`` still running is waited for first.
        """
        target = fspath(path)
        self._finish(lambda written: written == target)
        if os.path.islink(target):
            os.unlink(target)  # never follow it: the directory it names is another checkpoint
            logger.debug("removed link %s", target)
            return
        fs = get_filesystem(target)
        if fs.exists(target):
            fs.rm(target, recursive=True)
            logger.debug("removed checkpoint %s", target)


def _register_for_pytorch_lightning() -> None:
    """Make ``pytorch_lightning.Trainer`` accept the plugin too when both packages exist.

    ``lightning`` and ``pytorch-lightning`` ship the same classes under two names, and each
    Trainer checks plugins against its own ``CheckpointIO``; the interface is the same.
    """
    try:
        from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO as Other
    except ModuleNotFoundError:
        return
    if not issubclass(TrackpointCheckpointIO, Other):
        Other.register(TrackpointCheckpointIO)


_register_for_pytorch_lightning()
