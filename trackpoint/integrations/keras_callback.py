"""``TrackpointCheckpoint``: Keras's ``ModelCheckpoint`` writing TensorFlow V2 checkpoints.

The callback takes ``ModelCheckpoint``'s arguments with a directory in place of ``filepath``,
and keeps the newest ``max_to_keep`` checkpoints there through ``tp.CheckpointManager``
(``ckpt-1``, ``ckpt-2``, … and the ``checkpoint`` state file). Each checkpoint holds the model's
variables, the optimizer's and the process's random generators (unless
``save_weights_only``) and the number of completed epochs; ``tp.keras.restore`` reads them back.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import keras
import numpy as np

from trackpoint._types import PathLike, fspath
from trackpoint.checkpoint import Checkpoint
from trackpoint.errors import InvalidArgumentError
from trackpoint.integrations.keras_restore import restore
from trackpoint.integrations.keras_rng import RNG_NAME, GlobalRandomState
from trackpoint.integrations.keras_variables import EPOCH_NAME, MODEL_NAME, OPTIMIZER_NAME
from trackpoint.management import CheckpointManager
from trackpoint.saving import CheckpointOptions
from trackpoint.tracking.variable import Variable

__all__ = ["TrackpointCheckpoint"]

logger = logging.getLogger(__name__)

# Metric names ModelCheckpoint's mode="auto" maximizes; anything with loss or error minimizes.
_HIGHER_IS_BETTER = ("acc", "auc", "precision", "recall", "f1", "iou", "fmeasure")


def _monitor_sign(monitor: str, mode: str) -> float:
    """+1 when larger values of ``monitor`` are better, -1 when smaller are."""
    if mode == "max":
        return 1.0
    if mode == "min":
        return -1.0
    if mode != "auto":
        raise InvalidArgumentError(f"mode must be 'auto', 'min' or 'max', got {mode!r}")
    name = monitor.removeprefix("val_")
    if "loss" in name or "error" in name:
        return -1.0
    if any(word in name for word in _HIGHER_IS_BETTER):
        return 1.0
    raise InvalidArgumentError(
        f"TrackpointCheckpoint cannot tell whether monitor={monitor!r} should be maximized or "
        "minimized; pass mode='max' or mode='min'"
    )


class TrackpointCheckpoint(keras.callbacks.Callback):  # type: ignore[misc]  # keras is untyped
    """Save the model (and optimizer) as numbered TensorFlow checkpoints during ``fit``.

    Saves at the end of every epoch (``save_freq="epoch"``) or every ``save_freq`` batches;
    with ``save_best_only`` only when ``monitor`` improved. Old checkpoints beyond
    ``max_to_keep`` are deleted after the new one is committed. The directory's writer lock is
    held from the start of ``fit`` to its end (one writer per directory).

    Example:
        >>> callback = tp.keras.TrackpointCheckpoint("/ckpts", max_to_keep=3)  # doctest: +SKIP
        >>> model.fit(x, y, epochs=5, callbacks=[callback])                  # doctest: +SKIP
        >>> tp.keras.restore(fresh_model, "/ckpts")                            # doctest: +SKIP

    Args:
        directory: where the checkpoints and the ``checkpoint`` state file go.
        monitor: the logged metric ``save_best_only`` compares.
        verbose: 1 logs each save (``logging``, INFO).
        save_best_only: save only when ``monitor`` improved on the best value so far.
        save_weights_only: leave the optimizer's state out.
        mode: ``"auto"``, ``"min"`` or ``"max"``: whether smaller or larger is better.
        save_freq: ``"epoch"`` or a number of batches.
        initial_value_threshold: the value ``monitor`` must improve on first.
        max_to_keep: how many checkpoints to keep (None: all).
        checkpoint_name: the prefixes' base name.
        options: ``tp.CheckpointOptions`` for each save (``enable_async=True`` writes in the
            background while training goes on; ``fit`` waits for the last write at its end).
        resume: when ``directory`` holds a checkpoint, restore it as ``fit`` starts (as
            keras's ``BackupAndRestore`` does) and continue from its epoch. The random
            generators are set there, after ``fit``'s own start-up draws, so a resumed fit
            draws the same dropout masks and shuffles as the uninterrupted one; a
            ``tp.keras.restore`` before ``fit`` sets them before those draws.

    Raises:
        InvalidArgumentError: ``save_freq`` is neither ``"epoch"`` nor a positive int, or
            ``mode`` is unknown or cannot be inferred from ``monitor``.
    """

    def __init__(
        self,
        directory: PathLike,
        monitor: str = "val_loss",
        verbose: int = 0,
        save_best_only: bool = False,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: str | int = "epoch",
        initial_value_threshold: float | None = None,
        *,
        max_to_keep: int | None = 5,
        checkpoint_name: str = "ckpt",
        options: CheckpointOptions | None = None,
        resume: bool = False,
    ) -> None:
        super().__init__()
        if save_freq != "epoch" and (
            not isinstance(save_freq, int) or isinstance(save_freq, bool) or save_freq <= 0
        ):
            raise InvalidArgumentError(
                f"save_freq must be 'epoch' or a positive number of batches, got {save_freq!r}"
            )
        self.directory = fspath(directory, argument="directory")
        self.monitor = monitor
        self.verbose = verbose
        self.save_best_only = save_best_only
        self.save_weights_only = save_weights_only
        self.save_freq = save_freq
        self.max_to_keep = max_to_keep
        self.checkpoint_name = checkpoint_name
        self.options = options
        self.resume = resume
        self._resumed_epoch: int | None = None
        self._sign = _monitor_sign(monitor, mode) if save_best_only else 1.0
        self.best = initial_value_threshold
        self._epoch = Variable(np.zeros((), dtype=np.int64), name=EPOCH_NAME)
        self._manager: CheckpointManager | None = None
        self._current_epoch = 0
        self._batches_since_save = 0
        self._last_batch: int | None = None
        self._next_number = 1

    def __repr__(self) -> str:
        return f"TrackpointCheckpoint({self.directory!r}, max_to_keep={self.max_to_keep})"

    @property
    def latest_checkpoint(self) -> str | None:
        """The prefix of the newest checkpoint in ``directory``, or None."""
        return self._manager.latest_checkpoint if self._manager is not None else None

    # -- keras hooks ---------------------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        # docstring inherited
        children: dict[str, Any] = {MODEL_NAME: self.model, EPOCH_NAME: self._epoch}
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and not self.save_weights_only:
            children[OPTIMIZER_NAME] = optimizer
        if not self.save_weights_only:
            # Unseeded dropout and shuffling draw from the process's generators: a resumed
            # fit repeats the uninterrupted one only if they are restored too.
            children[RNG_NAME] = GlobalRandomState()
        previous, self._manager = self._manager, None
        if previous is not None:  # a fit that raised skips on_train_end: one manager per dir
            previous.close()
        self._manager = CheckpointManager(
            Checkpoint(**children), self.directory, self.max_to_keep,
            checkpoint_name=self.checkpoint_name,
        )
        # Numbered on from the directory's latest checkpoint (a resumed run continues it);
        # counted here because an async save records itself only once written.
        latest = self._manager.latest_checkpoint
        self._next_number = int(latest.rpartition("-")[2]) + 1 if latest else 1
        if self.resume and latest:
            # keras's own resumption hook (BackupAndRestore): fit reads _initial_epoch right
            # after on_train_begin.
            self._resumed_epoch = restore(self.model, latest, weights_only=self.save_weights_only)
            self.model._initial_epoch = self._resumed_epoch
            if self.verbose:
                logger.info("resumed from %s (epoch %d)", latest, self._resumed_epoch)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        # docstring inherited
        self._current_epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # docstring inherited
        if self.save_freq == "epoch":
            return
        # Batches since the last call: more than one with steps_per_execution > 1 (keras
        # reports the last batch of each execution), the index restarts with each epoch.
        seen = self._last_batch
        self._batches_since_save += batch + 1 if seen is None or batch <= seen else batch - seen
        self._last_batch = batch
        if self._batches_since_save >= int(self.save_freq):
            self._batches_since_save = 0
            self._save(self._current_epoch, logs)  # the current epoch is not complete yet

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        # docstring inherited
        if self.save_freq == "epoch":
            self._save(epoch + 1, logs)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        # docstring inherited
        manager, self._manager = self._manager, None
        if self._resumed_epoch is not None and self.model is not None:
            self.model._initial_epoch = None  # a later fit starts where its caller says
            self._resumed_epoch = None
        if manager is not None:
            manager.sync()  # an async save must be complete when fit returns
            manager.close()

    # -- saving --------------------------------------------------------------------------------

    def _improved(self, logs: dict[str, Any] | None) -> bool:
        current = (logs or {}).get(self.monitor)
        if current is None:
            logger.warning(
                "TrackpointCheckpoint: save_best_only needs %r in the logs, which has %s; "
                "not saving", self.monitor, sorted(logs or {}),
            )
            return False
        value = float(np.asarray(current))
        if math.isnan(value):
            return False
        if self.best is not None and self._sign * (value - self.best) <= 0:
            if self.verbose:
                logger.info("%s did not improve from %.5f", self.monitor, self.best)
            return False
        self.best = value
        return True

    def _save(self, completed_epochs: int, logs: dict[str, Any] | None) -> None:
        manager = self._manager
        if manager is None:
            raise InvalidArgumentError(
                "TrackpointCheckpoint saved outside fit(); it opens its CheckpointManager in "
                "on_train_begin"
            )
        if self.save_best_only and not self._improved(logs):
            return
        # Keras's ``Callback.model`` property attaches the JAX backend's training state to the
        # variables (mid-epoch they are detached); read it before the values are.
        assert self.model is not None
        self._epoch.assign(completed_epochs)
        prefix = manager.save(checkpoint_number=self._next_number, options=self.options)
        self._next_number += 1
        if self.verbose:
            logger.info("saved checkpoint %s (epoch %d)", prefix, completed_epochs)
