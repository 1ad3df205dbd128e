"""PyTorch integration: modules, optimizers, schedulers, tensors and RNG state as trackables.

Importing this module registers adapters (``trackpoint.tracking.register_adapter``) so that
plain torch objects go straight into a checkpoint::

    ckpt = tp.Checkpoint(model=model, optimizer=opt, scheduler=sched, rng=TorchRNG())
    ckpt.save("/ckpts/run")                 # model/0/weight/.ATTRIBUTES/VARIABLE_VALUE, ...
    ckpt.restore(tp.latest_checkpoint("/ckpts"))   # in place: same Parameter objects

``import trackpoint`` does not import torch: ``tracking/adapters.py`` imports this module the
first time it meets an object whose type comes from torch. What each adapter does:

* ``torch.Tensor`` (``Parameter``, buffers, optimizer state): :class:`TensorVariable`;
* ``torch.nn.Module``: :class:`ModuleAdapter` (children = parameters, buffers, submodules);
* ``torch.optim.Optimizer``: :class:`OptimizerAdapter` (slot variables + JSON hyperparameters);
* LR schedulers and ``torch.amp.GradScaler``: :class:`StateDictAdapter` (JSON state_dict);
* ``torch.Generator``: :class:`GeneratorVariable`; :class:`TorchRNG` groups the default ones.
"""

from __future__ import annotations

from typing import Any

import torch

from trackpoint.integrations.torch_lazy import install_lazy_snapshots
from trackpoint.integrations.torch_modules import (
    ExtraState,
    ModuleAdapter,
    install_registration_hooks,
)
from trackpoint.integrations.torch_optim import OptimizerAdapter, OptimizerConfig
from trackpoint.integrations.torch_reader import load_state_dict
from trackpoint.integrations.torch_state import GeneratorVariable, StateDictAdapter, TorchRNG
from trackpoint.integrations.torch_tensors import (
    TensorVariable,
    copy_into,
    host_copy,
    numpy_dtype_for,
    to_numpy,
    torch_dtype_for,
)
from trackpoint.tracking.adapters import register_adapter

__all__ = [
    "ExtraState",
    "GeneratorVariable",
    "ModuleAdapter",
    "OptimizerAdapter",
    "OptimizerConfig",
    "StateDictAdapter",
    "TensorVariable",
    "TorchRNG",
    "copy_into",
    "host_copy",
    "load_state_dict",
    "numpy_dtype_for",
    "to_numpy",
    "torch_dtype_for",
    "training_state",
]


def training_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    *,
    rng: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """Keyword arguments for ``tp.Checkpoint`` that capture a whole training run.

    Example:
        >>> ckpt = tp.Checkpoint(**training_state(model, opt, sched), step=tp.Variable(0))

    Returns:
        ``{"model": model, "optimizer": ..., "scheduler": ..., "rng": TorchRNG(), **extra}``,
        leaving out what is None (and ``rng`` when ``rng=False``).
    """
    state: dict[str, Any] = {"model": model}
    if optimizer is not None:
        state["optimizer"] = optimizer
    if scheduler is not None:
        state["scheduler"] = scheduler
    if rng:
        state["rng"] = TorchRNG()
    state.update(extra)
    return state


def _register() -> None:
    register_adapter(torch.Tensor, TensorVariable)
    register_adapter(torch.nn.Module, ModuleAdapter)
    register_adapter(torch.optim.Optimizer, OptimizerAdapter)
    register_adapter(torch.optim.lr_scheduler.LRScheduler, StateDictAdapter)
    # Older releases do not derive ReduceLROnPlateau from LRScheduler.
    register_adapter(torch.optim.lr_scheduler.ReduceLROnPlateau, StateDictAdapter)
    register_adapter(torch.amp.GradScaler, StateDictAdapter)
    register_adapter(torch.Generator, GeneratorVariable)
    install_registration_hooks()
    install_lazy_snapshots()


_register()
