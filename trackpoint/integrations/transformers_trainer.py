"""A Hugging Face ``Trainer`` whose checkpoints are TensorFlow V2 checkpoints.

``Trainer`` saves in one method, ``_save_checkpoint``, and resumes in five
(``_load_from_checkpoint``, ``_load_optimizer_and_scheduler``, ``_load_scaler``,
``_load_rng_state``, ``_load_best_model``), each called at the moment its object is ready
(weights before ``accelerator.prepare``, optimizer after it is built, RNG after the skipped
batches were drawn). :class:`TrackpointTrainerMixin` overrides exactly those six (plus
``train`` and ``_finalize_training``, only to wait for an async save and to resolve
``resume_from_checkpoint=True`` to a complete directory), so
everything else Trainer does around them (which step saves, skipping seen batches, the trainer
state, callbacks, ``save_total_limit``, ``load_best_model_at_end``) is Trainer's own code. A
callback cannot do this (``on_save`` runs after Trainer has written its pickles) and nothing is
patched: the subclass is what the user constructs.

Each ``checkpoint-<step>/`` holds one checkpoint (``ckpt-1`` and the ``checkpoint`` state file)
plus the small JSON files Trainer and ``from_pretrained`` read: ``trainer_state.json``,
``config.json`` (``generation_config.json``, the tokenizer's files) and ``training_args.json``
(in place of the pickled ``training_args.bin``). Keys::

    model/transformer/h/0/attn/c_attn/weight/.ATTRIBUTES/VARIABLE_VALUE   (state_dict names)
    model/.../.OPTIMIZER_SLOT/optimizer/exp_avg/...                       (AdamW's state)
    scheduler, scaler, rng/{python,numpy,torch/cpu}, trainer_state        (JSON / uint8)

The directory is written as ``.checkpoint-<step>.trackpoint-partial`` and renamed when
complete, so Trainer's own ``get_last_checkpoint`` never sees a torn one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from typing import Any

import torch
from transformers import Trainer
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy, rotate_checkpoints

from trackpoint.checkpoint import Checkpoint
from trackpoint.errors import FailedPreconditionError, InvalidArgumentError
from trackpoint.integrations.accelerate_state import (
    JsonValue,
    ProcessRNG,
    StagedDirectory,
    committed_prefix,
    remove_stale_staging,
)
from trackpoint.management import CheckpointManager, load_checkpoint
from trackpoint.saving import CheckpointOptions

__all__ = ["TRAINER_STATE", "TrackpointTrainerMixin", "get_last_checkpoint"]

logger = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state"
"""Local name of the trainer state (the same JSON as ``trainer_state.json``)."""
_TRAINER_STATE_FILE = "trainer_state.json"
_ARGS_FILE = "training_args.json"
_CHECKPOINT_DIR = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def _unwrap(obj: Any, attribute: str) -> Any:
    """The torch object inside Accelerate's wrapper (``AcceleratedOptimizer.optimizer``)."""
    inner = getattr(obj, attribute, None)
    return obj if inner is None or inner is obj else inner


def _holds(prefix: str, name: str) -> bool:
    """Whether the checkpoint has values under the root's child ``name``."""
    with load_checkpoint(prefix) as reader:
        return any(key.startswith(f"{name}/") for key in reader.keys())


def get_last_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest complete ``checkpoint-<step>`` directory in ``output_dir``, or None.

    Like ``transformers.trainer_utils.get_last_checkpoint``, but a directory counts only
    when it is complete: a trackpoint checkpoint directory (always complete under its final
    name), or one of Trainer's own that holds ``trainer_state.json``, the file Trainer writes
    after the weights, optimizer and RNG files.
    """
    directory = os.fspath(output_dir)
    if not os.path.isdir(directory):
        return None
    found = []
    for entry in os.scandir(directory):
        match = _CHECKPOINT_DIR.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry.path))
    for _, path in sorted(found, reverse=True):
        if committed_prefix(path) is not None or os.path.isfile(
            os.path.join(path, "trainer_state.json")
        ):
            return path
    return None


class _PendingSave:
    """An async save's completion: wait for the write, then commit and rotate."""

    def __init__(self, work: Callable[[], None]) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(work,), daemon=False, name="trackpoint-trainer-save"
        )
        self._thread.start()

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:  # re-raised on the training thread by wait()
            self._error = exc

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


class TrackpointTrainerMixin(Trainer):
    """Trainer checkpointing through trackpoint; mix in before any ``Trainer`` subclass.

    Example:
        >>> class MyTrainer(TrackpointTrainerMixin, SFTTrainer): ...
        >>> trainer = MyTrainer(model=model, args=args, train_dataset=data,
        ...                     trackpoint_options=tp.CheckpointOptions(enable_async=True))
        >>> trainer.train(resume_from_checkpoint=True)   # newest complete checkpoint-<step>

    Args:
        trackpoint_options: ``tp.CheckpointOptions`` for every save. ``enable_async=True``
            returns from the save after one copy of the state, writes it on a background
            thread and renames the directory when the write is done; the next save, the
            best-model load and the end of ``train`` wait for it.
        *args, **kwargs: passed to the Trainer class mixed with.

    Raises:
        FailedPreconditionError: DeepSpeed, FSDP or more than one process (their states are
            sharded by the engine: use Trainer's own checkpointing there), or ``push_to_hub``
            (push an exported model instead, see docs/huggingface.md).
        InvalidArgumentError: ``trackpoint_options`` is not a ``tp.CheckpointOptions``.
    """

    def __init__(
        self, *args: Any, trackpoint_options: CheckpointOptions | None = None, **kwargs: Any
    ) -> None:
        if trackpoint_options is not None and not isinstance(trackpoint_options, CheckpointOptions):
            raise InvalidArgumentError(
                "trackpoint_options must be a tp.CheckpointOptions or None, got "
                f"{type(trackpoint_options).__name__}"
            )
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        if getattr(training_args, "push_to_hub", False):  # before Trainer creates a Hub repo
            raise FailedPreconditionError(
                f"{type(self).__name__} does not push checkpoints to the Hub (they are not in "
                "Hub format); set push_to_hub=False and push an exported model: `trackpoint "
                "convert <checkpoint-N> <dir>/model.safetensors --root model` (docs/huggingface.md)"
            )
        super().__init__(*args, **kwargs)
        self.trackpoint_options = trackpoint_options
        self._pending_save: _PendingSave | None = None
        if self.is_deepspeed_enabled or self.is_fsdp_enabled or self.args.world_size > 1:
            raise FailedPreconditionError(
                f"{type(self).__name__} saves from one process without DeepSpeed or FSDP; this "
                f"run has world_size={self.args.world_size}, deepspeed="
                f"{self.is_deepspeed_enabled}, fsdp={self.is_fsdp_enabled}: use "
                "transformers.Trainer's own checkpointing for it"
            )

    # ---- saving -------------------------------------------------------------------------

    def wait_for_checkpoint(self) -> None:
        """Block until a pending async save is committed; raises the error it hit, if any."""
        pending, self._pending_save = self._pending_save, None
        if pending is not None:
            pending.wait()

    def _checkpoint_objects(self, *, with_training_state: bool) -> dict[str, Any]:
        objects: dict[str, Any] = {"model": self.accelerator.unwrap_model(self.model)}
        if with_training_state:
            if self.optimizer is not None:
                objects["optimizer"] = _unwrap(self.optimizer, "optimizer")
            if self.lr_scheduler is not None:
                objects["scheduler"] = _unwrap(self.lr_scheduler, "scheduler")
            scaler = getattr(self.accelerator, "scaler", None)
            if scaler is not None:
                objects["scaler"] = scaler
        return objects

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        """Trainer's ``_save_checkpoint``, writing one trackpoint checkpoint directory."""
        self.wait_for_checkpoint()
        folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.hp_search_backend is None and trial is None:
            self.store_flos()
        run_dir = self._get_output_dir(trial=trial)
        output_dir = os.path.join(run_dir, folder)
        if (
            self.args.save_strategy in (SaveStrategy.STEPS, SaveStrategy.EPOCH, SaveStrategy.BEST)
            and self.state.best_global_step
        ):
            best = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.best_global_step}")
            # This save's directory is the best one when it holds the best step: it exists
            # once committed (Trainer checks os.path.exists after writing the model).
            if self.state.best_global_step == self.state.global_step or os.path.isdir(best):
                self.state.best_model_checkpoint = best
        if not self.args.should_save:
            return
        # As Trainer does: the stateful callbacks' and TrainerControl's state at this step.
        stateful: Any = self.state.stateful_callbacks
        for callback in [*self.callback_handler.callbacks, self.control]:
            if isinstance(callback, ExportableState):
                name = type(callback).__name__
                if isinstance(stateful[name], list):
                    stateful[name].append(callback.state())
                else:
                    stateful[name] = callback.state()
        state = dataclasses.asdict(self.state)
        staged = StagedDirectory(output_dir)
        try:
            self._write_side_files(staged.path, state)
            objects = self._checkpoint_objects(with_training_state=not self.args.save_only_model)
            if not self.args.save_only_model:
                objects["rng"] = ProcessRNG()
            objects[TRAINER_STATE] = JsonValue(state, "Trainer state")
            manager = CheckpointManager(Checkpoint(**objects), staged.path, max_to_keep=1)
            try:
                manager.save(options=self.trackpoint_options)
            except BaseException:
                manager.close()
                raise
        except BaseException:
            staged.abandon()
            raise
        best_model = self.state.best_model_checkpoint

        def finish() -> None:
            try:
                manager.close()  # waits for an async write
            except BaseException:
                staged.abandon()
                raise
            staged.commit()
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=best_model,
                use_mtime=True,
            )
            logger.info("saved trackpoint checkpoint %s", output_dir)

        if self.trackpoint_options is not None and self.trackpoint_options.enable_async:
            self._pending_save = _PendingSave(finish)
        else:
            finish()

    def _write_side_files(self, directory: str, state: dict[str, Any]) -> None:
        """The JSON files readers of a Trainer checkpoint expect, next to the checkpoint."""
        with open(os.path.join(directory, _TRAINER_STATE_FILE), "w", encoding="utf-8") as f:
            f.write(json.dumps(state, indent=2, sort_keys=True) + "\n")
        with open(os.path.join(directory, _ARGS_FILE), "w", encoding="utf-8") as f:
            training_args: Any = self.args
            f.write(training_args.to_json_string())
        model = self.accelerator.unwrap_model(self.model)
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "save_pretrained"):
            config.save_pretrained(directory)
        generation = getattr(model, "generation_config", None)
        if generation is not None and hasattr(generation, "save_pretrained"):
            generation.save_pretrained(directory)
        if self.processing_class is not None and hasattr(self.processing_class, "save_pretrained"):
            self.processing_class.save_pretrained(directory)

    # ---- resuming -----------------------------------------------------------------------

    def train(
        self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        """Trainer's ``train``; ``resume_from_checkpoint=True`` takes the newest complete one.

        Staging directories a killed save left in ``output_dir`` are removed first.
        """
        output_dir = str(self.args.output_dir)
        if self.args.should_save:
            for path in remove_stale_staging(output_dir):
                logger.warning("removed %s, left by a save that was killed", path)
        if resume_from_checkpoint is True:
            found = get_last_checkpoint(output_dir)
            if found is None:
                raise FailedPreconditionError(
                    f"no complete checkpoint-<step> directory in {self.args.output_dir} to "
                    "resume from; train without resume_from_checkpoint to start afresh",
                    path=self.args.output_dir,
                )
            resume_from_checkpoint = found
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            self.wait_for_checkpoint()

    def _restore(self, checkpoint: str, objects: dict[str, Any]) -> None:
        prefix = committed_prefix(checkpoint)
        assert prefix is not None
        Checkpoint(**objects).read(prefix).expect_partial().assert_existing_objects_matched()

    def _load_from_checkpoint(
        self, resume_from_checkpoint: str, model: torch.nn.Module | None = None
    ) -> None:
        if committed_prefix(resume_from_checkpoint) is None:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
            return
        target = self.accelerator.unwrap_model(model if model is not None else self.model)
        logger.info("loading model weights from %s", resume_from_checkpoint)
        self._restore(resume_from_checkpoint, {"model": target})

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        prefix = None if checkpoint is None else committed_prefix(checkpoint)
        if checkpoint is None or prefix is None:
            super()._load_optimizer_and_scheduler(checkpoint)
            return
        objects = self._checkpoint_objects(with_training_state=True)
        objects.pop("scaler", None)  # _load_scaler's
        for name in ("optimizer", "scheduler"):
            if name in objects and not _holds(prefix, name):
                logger.info("%s holds no %s state (save_only_model?)", checkpoint, name)
                objects.pop(name)
        # The model is restored again with its optimizer: Adam's slots hang off the weights.
        self._restore(checkpoint, objects)

    def _load_scaler(self, checkpoint: str | None) -> None:
        prefix = None if checkpoint is None else committed_prefix(checkpoint)
        if checkpoint is None or prefix is None:
            super()._load_scaler(checkpoint)
            return
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None and _holds(prefix, "scaler"):
            self._restore(checkpoint, {"scaler": scaler})

    def _load_rng_state(self, checkpoint: str | None) -> None:
        prefix = None if checkpoint is None else committed_prefix(checkpoint)
        if checkpoint is None or prefix is None:
            super()._load_rng_state(checkpoint)
            return
        if not _holds(prefix, "rng"):
            logger.info("%s holds no RNG state; reproducibility is not guaranteed", checkpoint)
            return
        self._restore(checkpoint, {"rng": ProcessRNG()})

    def _finalize_training(self, *args: Any, **kwargs: Any) -> Any:
        # Trainer's end of training lists and deletes checkpoint directories
        # (save_total_limit=1 keeps only the best): the last async save must be in place.
        self.wait_for_checkpoint()
        parent: Any = super()
        return parent._finalize_training(*args, **kwargs)

    def _load_best_model(self) -> None:
        self.wait_for_checkpoint()
        best = self.state.best_model_checkpoint
        if best is None or committed_prefix(best) is None:
            super()._load_best_model()
            return
        logger.info("loading best model from %s (score: %s)", best, self.state.best_metric)
        self._restore(best, {"model": self.accelerator.unwrap_model(self.model)})
