"""Hugging Face ``Trainer`` checkpoints as TensorFlow V2 checkpoints (``tp.transformers``).

Example::

    import trackpoint as tp

    trainer = tp.transformers.TrackpointTrainer(model=model, args=args, train_dataset=data)
    trainer.train(resume_from_checkpoint=True)        # the newest complete checkpoint-<step>/
    # trackpoint convert out/checkpoint-500 out/checkpoint-500/model.safetensors --root model
    # AutoModelForCausalLM.from_pretrained("out/checkpoint-500")

``TrackpointTrainer`` is ``transformers.Trainer`` with its checkpoint save and load steps
replaced (:mod:`trackpoint.integrations.transformers_trainer` says which and why); to keep a
Trainer subclass of your own (TRL's ``SFTTrainer``, say), mix in
:class:`TrackpointTrainerMixin` before it. Everything Trainer saves — weights, optimizer,
LR scheduler, grad scaler, the python/numpy/torch RNGs, the trainer state — goes into one
checkpoint per ``checkpoint-<step>/`` directory, which appears complete or not at all.
"""

from __future__ import annotations

from trackpoint._types import PathLike, fspath
from trackpoint.integrations.accelerate_state import committed_prefix
from trackpoint.integrations.transformers_trainer import (
    TRAINER_STATE,
    TrackpointTrainerMixin,
    get_last_checkpoint,
)

__all__ = [
    "TRAINER_STATE",
    "TrackpointTrainer",
    "TrackpointTrainerMixin",
    "get_last_checkpoint",
    "is_trackpoint_checkpoint",
]


class TrackpointTrainer(TrackpointTrainerMixin):
    """``transformers.Trainer`` saving and resuming through trackpoint.

    Takes Trainer's arguments plus ``trackpoint_options`` (a ``tp.CheckpointOptions``; see
    :class:`TrackpointTrainerMixin`).
    """


def is_trackpoint_checkpoint(directory: PathLike) -> bool:
    """Whether ``directory`` holds a complete trackpoint checkpoint (not Trainer's own files)."""
    return committed_prefix(fspath(directory)) is not None
