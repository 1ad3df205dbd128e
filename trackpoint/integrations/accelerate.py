"""Hugging Face Accelerate's ``save_state``/``load_state`` as TensorFlow V2 checkpoints.

Example::

    import trackpoint as tp

    model, optimizer, scheduler, data = accelerator.prepare(model, optimizer, scheduler, data)
    accelerator.register_for_checkpointing(progress)      # any state_dict()/load_state_dict()
    tp.accelerate.load_state(accelerator, "ckpts/step-40")  # instead of accelerator.load_state
    ...
    tp.accelerate.save_state(accelerator, "ckpts/step-80")  # instead of accelerator.save_state

``accelerator.save_state`` pickles the optimizers, schedulers, scaler, RNG states and custom
objects with ``torch.save`` into a directory it fills file by file, so a kill mid-save leaves a
directory that ``load_state`` accepts half-written. Its ``register_save_state_pre_hook`` only
sees the models' weights, so it cannot route the rest elsewhere: these two functions replace
the calls instead. They save what ``save_state`` saves, from the same accelerator attributes,
as one checkpoint in ``output_dir`` (``ckpt-1`` and the ``checkpoint`` state file):

====================== =====================================================================
``model``, ``model_1``  ``accelerator._models`` (unwrapped), keys ``model/<state_dict path>``
``optimizer``, ...      the optimizers inside ``AcceleratedOptimizer`` (Adam's slots per param)
``scheduler``, ...      the schedulers inside ``AcceleratedScheduler`` (JSON)
``dataloader``, ...     the seedable sampler's epoch and seed, a stateful loader's state_dict
``scaler``              ``accelerator.scaler`` when mixed precision uses one
``rng``                 python, numpy, torch CPU and CUDA generators
``accelerator``         ``accelerator.step`` and the automatic-naming iteration
``custom_0``, ...       objects given to ``register_for_checkpointing``, in order
====================== =====================================================================

The directory is written under a hidden name and renamed into place when complete
(:class:`~trackpoint.integrations.accelerate_state.StagedDirectory`). With
``ProjectConfiguration(automatic_checkpoint_naming=True)`` the directories are
``<project_dir>/checkpoints/checkpoint_<i>`` as Accelerate names them; ``total_limit`` removes
the oldest only after the new one is committed, and ``load_state(accelerator)`` takes the
newest complete one. One process: multi-process, FSDP, DeepSpeed and Megatron runs are refused.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from typing import Any

from accelerate import Accelerator
from accelerate.data_loader import SeedableRandomSampler, get_sampler
from accelerate.utils import DistributedType

from trackpoint.checkpoint import Checkpoint
from trackpoint.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from trackpoint.integrations.accelerate_state import (
    JsonValue,
    ProcessRNG,
    StagedDirectory,
    committed_prefix,
)
from trackpoint.integrations.torch_state import StateDictAdapter
from trackpoint.integrations.torch_tensors import TENSOR_JSON_HOOKS, tensor_to_json
from trackpoint.management import CheckpointManager, object_metadata
from trackpoint.saving import CheckpointOptions
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import Trackable
from trackpoint.tracking.python_state import PythonState
from trackpoint.tracking.state_json import dumps, loads

__all__ = [
    "check_saved_names",
    "checkpoint_objects",
    "latest_state",
    "load_state",
    "save_state",
]

logger = logging.getLogger(__name__)

_AUTOMATIC = re.compile(r"^checkpoint_(\d+)$")
_REFUSED = ("FSDP", "DEEPSPEED", "MEGATRON_LM", "XLA")
# Files accelerator.save_state writes: a directory holding them is not ours to read.
_ACCELERATE_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "optimizer.bin",
    "random_states_0.pkl",
)


class _DataLoaderState(PythonState):
    """A prepared dataloader's position: seedable sampler epoch and seed, stateful state_dict."""

    def __init__(self, dataloader: Any, what: str) -> None:
        self._dataloader = dataloader
        self._what = what

    def __repr__(self) -> str:
        return f"<{self._what}>"

    def _sampler(self) -> SeedableRandomSampler | None:
        sampler = get_sampler(self._dataloader)
        return sampler if isinstance(sampler, SeedableRandomSampler) else None

    def serialize(self) -> bytes:
        # docstring inherited
        sampler = self._sampler()
        state: dict[str, Any] = {
            "iteration": getattr(self._dataloader, "iteration", None),
            "sampler": None
            if sampler is None
            else {"epoch": sampler.epoch, "initial_seed": sampler.initial_seed},
            "state_dict": (
                self._dataloader.state_dict()
                if getattr(self._dataloader, "use_stateful_dataloader", False)
                else None
            ),
        }
        return dumps(state, what=self._what, default=tensor_to_json)

    def deserialize(self, data: bytes) -> None:
        # docstring inherited
        self._prepare_deserialize(data)()

    def _prepare_deserialize(self, data: bytes) -> Any:
        # docstring inherited
        state = loads(data, what=self._what, hooks=TENSOR_JSON_HOOKS)
        if not isinstance(state, dict) or set(state) != {"iteration", "sampler", "state_dict"}:
            raise InvalidArgumentError(
                f"{self._what}: the checkpoint holds {state!r}, not a dataloader's state; was "
                "it written by another program?"
            )
        sampler = self._sampler()
        if (state["sampler"] is None) != (sampler is None):
            raise InvalidArgumentError(
                f"{self._what}: the checkpoint was saved "
                f"{'without' if state['sampler'] is None else 'with'} a seedable sampler and "
                f"this dataloader has {'one' if sampler is not None else 'none'}; prepare it "
                "with the same DataLoaderConfiguration(use_seedable_sampler=...)"
            )

        def apply() -> None:
            if state["iteration"] is not None and hasattr(self._dataloader, "iteration"):
                self._dataloader.iteration = state["iteration"]
            if sampler is not None:
                sampler.epoch = state["sampler"]["epoch"]
                sampler.initial_seed = state["sampler"]["initial_seed"]
            if state["state_dict"] is not None:
                self._dataloader.load_state_dict(state["state_dict"])

        return apply


def _name(kind: str, index: int) -> str:
    return kind if index == 0 else f"{kind}_{index}"


def _check_supported(accelerator: Accelerator, verb: str) -> None:
    kind = accelerator.distributed_type
    if any(kind == getattr(DistributedType, name, None) for name in _REFUSED):
        raise FailedPreconditionError(
            f"tp.accelerate.{verb} does not support {kind} yet (its states are sharded by "
            f"the engine); use accelerator.{verb} for this run"
        )
    if accelerator.num_processes > 1:
        raise FailedPreconditionError(
            f"tp.accelerate.{verb} runs in one process, this accelerator has "
            f"{accelerator.num_processes}; use trackpoint.distributed.DistributedCheckpoint "
            f"or accelerator.{verb} for multi-process runs"
        )


def checkpoint_objects(accelerator: Accelerator) -> dict[str, Trackable | Any]:
    """The objects :func:`save_state` checkpoints, by name, for ``tp.Checkpoint(**objects)``.

    Raises:
        InvalidArgumentError: a custom object has no ``state_dict``/``load_state_dict``.
    """
    objects: dict[str, Any] = {}
    for i, model in enumerate(accelerator._models):
        objects[_name("model", i)] = accelerator.unwrap_model(model)
    for i, optimizer in enumerate(accelerator._optimizers):
        objects[_name("optimizer", i)] = getattr(optimizer, "optimizer", optimizer)
    for i, scheduler in enumerate(accelerator._schedulers):
        objects[_name("scheduler", i)] = getattr(scheduler, "scheduler", scheduler)
    for i, dataloader in enumerate(accelerator._dataloaders):
        name = _name("dataloader", i)
        objects[name] = _DataLoaderState(dataloader, f"accelerate {name} state")
    if accelerator.scaler is not None:
        objects["scaler"] = accelerator.scaler
    objects["rng"] = ProcessRNG()

    def set_counters(value: Any) -> None:
        accelerator.step = int(value["step"])
        if accelerator.project_configuration.automatic_checkpoint_naming:
            # The next save gets the next number instead of failing on an existing directory.
            accelerator.project_configuration.iteration = int(value["iteration"]) + 1

    counters = {"step": accelerator.step, "iteration": accelerator.save_iteration}
    objects["accelerator"] = JsonValue(counters, "accelerator counters", set_counters)
    for i, obj in enumerate(accelerator._custom_objects):
        trackable = to_trackable(obj)
        if trackable is None:
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise InvalidArgumentError(
                    f"custom object {i} ({type(obj).__name__}) registered for checkpointing has "
                    "no state_dict()/load_state_dict()"
                )
            trackable = StateDictAdapter(obj)
        objects[f"custom_{i}"] = trackable
    return objects


def _numbered(parent: str) -> list[tuple[int, str]]:
    if not os.path.isdir(parent):
        return []
    found = []
    for entry in os.scandir(parent):
        match = _AUTOMATIC.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry.path))
    return sorted(found)


def check_saved_names(prefix: str, live: set[str], owner: str) -> None:
    """Refuse, before anything changes, a checkpoint whose top-level objects differ from ``live``.

    ``save_counter`` (Checkpoint's own) is ignored on both sides.

    Raises:
        InvalidArgumentError: names saved but not live or live but not saved.
    """
    root = object_metadata(prefix).nodes[0]
    saved = {child.local_name for child in root.children} - {"save_counter"}
    live = live - {"save_counter"}
    if saved != live:
        raise InvalidArgumentError(
            f"{prefix} holds {sorted(saved)} but {owner} has {sorted(live)} (missing from the "
            f"checkpoint: {sorted(live - saved)}, not in {owner}: {sorted(saved - live)}); "
            "prepare and register the same objects, in the same order, as the saving run",
            path=prefix,
        )


def latest_state(directory: str) -> str | None:
    """The newest complete ``checkpoint_<i>`` directory under ``directory``, or None."""
    for _, path in reversed(_numbered(directory)):
        if committed_prefix(path) is not None:
            return path
    return None


def save_state(
    accelerator: Accelerator,
    output_dir: str | os.PathLike[str] | None = None,
    *,
    options: CheckpointOptions | None = None,
) -> str:
    """``accelerator.save_state(output_dir)``, written as one trackpoint checkpoint.

    Args:
        accelerator: the ``Accelerator`` whose prepared objects are saved.
        output_dir: the checkpoint directory; None with automatic checkpoint naming, which
            picks ``<project_dir>/checkpoints/checkpoint_<iteration>``.
        options: ``tp.CheckpointOptions`` (sharding, threads, progress); ``enable_async`` is
            refused, as the directory is renamed into place when the save returns.

    Returns:
        The directory written.

    Raises:
        InvalidArgumentError: no ``output_dir`` without automatic naming, a custom object
            without ``state_dict``, async options, or a value that cannot be stored.
        FailedPreconditionError: a multi-process or FSDP/DeepSpeed/Megatron accelerator, or
            the automatic directory exists already.
    """
    _check_supported(accelerator, "save_state")
    if options is not None and options.enable_async:
        raise InvalidArgumentError(
            "tp.accelerate.save_state(options=...) has enable_async=True: the directory is "
            "committed when the call returns; save without it"
        )
    config = accelerator.project_configuration
    if config.automatic_checkpoint_naming:
        parent = os.path.join(accelerator.project_dir, "checkpoints")
        target = os.path.join(parent, f"checkpoint_{accelerator.save_iteration}")
        if os.path.lexists(target):
            raise FailedPreconditionError(
                f"checkpoint directory {target} exists already; set "
                "accelerator.project_configuration.iteration to the next free number "
                "(tp.accelerate.load_state does so when it restores)"
            )
    elif output_dir is None:
        raise InvalidArgumentError(
            "tp.accelerate.save_state needs output_dir unless the accelerator's "
            "ProjectConfiguration has automatic_checkpoint_naming=True"
        )
    else:
        target = os.fspath(output_dir)
    staged = StagedDirectory(target)
    try:
        with CheckpointManager(
            Checkpoint(**checkpoint_objects(accelerator)), staged.path, max_to_keep=1
        ) as manager:
            manager.save(options=options)
        final = staged.commit()
    except BaseException:
        staged.abandon()
        raise
    if config.automatic_checkpoint_naming:
        config.iteration += 1
        if config.total_limit is not None:
            for _, old in _numbered(os.path.dirname(final))[: -config.total_limit]:
                logger.info("removing %s (total_limit=%d)", old, config.total_limit)
                shutil.rmtree(old, ignore_errors=True)
    logger.info("saved accelerator state to %s", final)
    return final


def load_state(accelerator: Accelerator, input_dir: str | os.PathLike[str] | None = None) -> str:
    """``accelerator.load_state(input_dir)`` for a directory :func:`save_state` wrote.

    Every value is read and checked before any object changes; the accelerator's objects
    must be the ones saved (same models, optimizers, schedulers, dataloaders, scaler and
    registered objects, in the same order).

    Args:
        accelerator: the ``Accelerator`` whose prepared objects are restored in place.
        input_dir: the checkpoint directory; None with automatic checkpoint naming: the
            newest complete ``checkpoint_<i>``.

    Returns:
        The directory loaded.

    Raises:
        NotFoundError: no complete checkpoint at ``input_dir`` (or none yet).
        InvalidArgumentError: ``input_dir`` was written by ``accelerator.save_state``; or
            the checkpoint's objects do not match the accelerator's (names which).
        DataLossError: the files are damaged.
    """
    _check_supported(accelerator, "load_state")
    if input_dir is None:
        if not accelerator.project_configuration.automatic_checkpoint_naming:
            raise InvalidArgumentError(
                "tp.accelerate.load_state needs input_dir unless the accelerator's "
                "ProjectConfiguration has automatic_checkpoint_naming=True"
            )
        parent = os.path.join(accelerator.project_dir, "checkpoints")
        found = latest_state(parent)
        if found is None:
            raise NotFoundError(f"no complete checkpoint_<i> directory in {parent}", path=parent)
        directory = found
    else:
        directory = os.fspath(input_dir)
    prefix = committed_prefix(directory)
    if prefix is None:
        if any(os.path.exists(os.path.join(directory, f)) for f in _ACCELERATE_FILES):
            raise InvalidArgumentError(
                f"{directory} was written by accelerator.save_state (torch.save files), not by "
                "tp.accelerate.save_state; load it with accelerator.load_state",
                path=directory,
            )
        raise NotFoundError(
            f"no complete trackpoint checkpoint in {directory} (a save killed before it "
            "finished leaves none: load the previous directory)",
            path=directory,
        )
    objects = checkpoint_objects(accelerator)
    check_saved_names(prefix, set(objects), "the accelerator")
    Checkpoint(**objects).read(prefix).assert_consumed()
    logger.info("loaded accelerator state from %s", directory)
    return directory
