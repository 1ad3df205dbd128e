"""Optimizer state of sharded parameters: same layout as the parameter, created before restore.

Adam's ``exp_avg`` of a row-sharded embedding is row-sharded too. For DTensor parameters torch
already makes the state DTensors; for tensors given to :func:`~trackpoint.distributed.mark_sharded`
the layout is copied to every state tensor of the parameter's shape before a save or restore.

A fresh optimizer has no state until its first ``step()``. Restoring creates missing slots from
the checkpoint's *full* shape, which is wrong for a shard; so before restoring, optimizers that
own sharded parameters without state take one step with zero gradients and a learning rate of 0
(parameters unchanged), which creates state of the local shapes for the restore to fill. This is
what ``torch.distributed.checkpoint`` does for the same reason.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from trackpoint.distributed.torch_sharded import marked_layout, propagate_layout
from trackpoint.integrations.torch_optim import OptimizerAdapter

__all__ = ["init_sharded_optimizer_state", "needs_sharded_optimizer_state",
           "propagate_optimizer_layouts"]

logger = logging.getLogger(__name__)


def _optimizers(objects: Iterable[Any]) -> list[torch.optim.Optimizer]:
    return [obj.optimizer for obj in objects if isinstance(obj, OptimizerAdapter)]


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _is_sharded(param: torch.Tensor) -> bool:
    return isinstance(param, DTensor) or marked_layout(param) is not None


def propagate_optimizer_layouts(objects: Iterable[Any]) -> None:
    """Mark the state tensors of marked parameters with the parameters' layouts."""
    for optimizer in _optimizers(objects):
        for param in _params(optimizer):
            if marked_layout(param) is None:
                continue
            for value in optimizer.state.get(param, {}).values():
                if isinstance(value, torch.Tensor):
                    propagate_layout(param, value)


def _missing_sharded_state(optimizer: torch.optim.Optimizer) -> bool:
    return any(
        _is_sharded(p) and not optimizer.state.get(p)
        for p in _params(optimizer) if p.requires_grad
    )


def needs_sharded_optimizer_state(objects: Iterable[Any]) -> bool:
    """True if an optimizer among ``objects`` has sharded parameters without state yet.

    Only then does a restore need to know whether the checkpoint holds optimizer state.
    """
    return any(_missing_sharded_state(optimizer) for optimizer in _optimizers(objects))


def init_sharded_optimizer_state(objects: Iterable[Any]) -> int:
    """Create the state of optimizers whose sharded parameters have none (see module docstring).

    Only parameters without state get a (zero) gradient, so existing state is untouched; other
    gradients and the learning rates are put back afterwards.

    Returns:
        How many optimizers were stepped.
    """
    stepped = 0
    for optimizer in _optimizers(objects):
        if not _missing_sharded_state(optimizer):
            continue
        params = [p for p in _params(optimizer) if p.requires_grad]
        empty = [p for p in params if not optimizer.state.get(p)]
        grads = [p.grad for p in params]
        rates = [group["lr"] for group in optimizer.param_groups]
        empty_ids = {id(p) for p in empty}
        try:
            with torch.no_grad():
                for p in params:
                    p.grad = torch.zeros_like(p) if id(p) in empty_ids else None
            for group in optimizer.param_groups:
                lr = group["lr"]
                group["lr"] = torch.zeros_like(lr) if isinstance(lr, torch.Tensor) else 0.0
            optimizer.step()
        finally:
            for p, grad in zip(params, grads):
                p.grad = grad
            for group, lr in zip(optimizer.param_groups, rates):
                group["lr"] = lr
        logger.debug("created the state of %s for %d sharded parameters before restoring",
                     type(optimizer).__name__, len(empty))
        stepped += 1
    propagate_optimizer_layouts(objects)
    return stepped
