"""Lazy snapshots of torch state: optimizer step pre-hooks gate the deferred copies.

For ``CheckpointOptions(enable_async=True, lazy_snapshot=True)`` (see
:mod:`trackpoint.saving.lazy_snapshot`), this module's planner defers the copy of every CPU
tensor that a *tracked* optimizer (one whose ``param_groups`` state is in the checkpoint) owns:
its parameters and its per-parameter state. Such a tensor changes in that optimizer's
``step()``, so a step pre-hook (``Optimizer.register_step_pre_hook``) first makes sure its
copies are done, copying on the training thread whatever the writer thread has not reached.
Everything else (buffers such as BatchNorm running statistics, RNG states, tensors of an
optimizer the checkpoint does not hold) is copied at the call.

Each deferred tensor is guarded by its version counter (``tensor._version``), which every
in-place operation through autograd's view of the tensor moves: an EMA update, ``p.mul_()``
under ``no_grad``, a second optimizer nobody tracked, a restore. What the counter does not see
(writes through ``tensor.data`` or a ``tensor.numpy()`` view, ``fused=True`` optimizer kernels of
an *untracked* optimizer) is a documented blind spot (docs/performance.md).

Device tensors are copied to the host at the call (``TensorVariable`` evaluates them then), so
only CPU tensors are deferred. One hook per optimizer is installed the first time a lazy save
sees it, and stays: removing a hook while ``step()`` iterates its hooks is an error in torch,
and an idle hook costs one lock.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from trackpoint.integrations.torch_optim import OptimizerConfig
from trackpoint.integrations.torch_tensors import TensorVariable
from trackpoint.saving.lazy_snapshot import (
    DeferredValue,
    LazyCopy,
    LazyPlan,
    register_lazy_planner,
)
from trackpoint.saving.sharding import ShardableTensor

__all__ = ["StepGate", "install_lazy_snapshots", "plan_torch_lazy", "step_gate"]


class StepGate:
    """The step pre-hook of one optimizer: finishes pending lazy copies of its tensors first.

    Holds the pending copies weakly (the writer thread holds them until written) and never the
    optimizer, so neither is kept alive by the other.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[tuple[weakref.ref[LazyCopy], tuple[int, ...]]] = []
        self.calls = 0  # steps that found a pending copy (tests, benchmarks)

    def attach(self, copy: LazyCopy, indices: Sequence[int]) -> None:
        """Make the next ``step()`` ensure ``copy``'s values at ``indices`` first."""
        with self._lock:
            self._waiting = [
                (ref, idx) for ref, idx in self._waiting
                if (live := ref()) is not None and not live.finished
            ]  # fmt: skip
            self._waiting.append((weakref.ref(copy), tuple(indices)))

    @property
    def pending(self) -> bool:
        """True while a lazy copy waits for this optimizer's next step."""
        with self._lock:
            return any(
                (live := ref()) is not None and not live.finished for ref, _ in self._waiting
            )

    def __call__(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for ref, indices in waiting:
            copy = ref()
            if copy is not None:
                self.calls += 1
                copy.ensure(indices)


_GATES: weakref.WeakKeyDictionary[torch.optim.Optimizer, StepGate] = weakref.WeakKeyDictionary()
_GATES_LOCK = threading.Lock()


def step_gate(optimizer: torch.optim.Optimizer) -> StepGate:
    """``optimizer``'s gate, its step pre-hook installed on first use."""
    with _GATES_LOCK:
        gate = _GATES.get(optimizer)
        if gate is None:
            gate = _GATES[optimizer] = StepGate()
            optimizer.register_step_pre_hook(gate)
        return gate


def _version(tensor: torch.Tensor) -> int:
    return int(tensor._version)


def _views(array: np.ndarray, tensor: torch.Tensor) -> bool:
    """True if ``array`` is a view of ``tensor``'s memory (not a copy made at the snapshot)."""
    return bool(
        tensor.device.type == "cpu"
        and array.__array_interface__["data"][0] == tensor.data_ptr()
        and array.nbytes == tensor.numel() * tensor.element_size()
    )


def plan_torch_lazy(tensors: Sequence[ShardableTensor]) -> LazyPlan | None:
    """Defer the CPU tensors that tracked optimizers own; gate them on those optimizers."""
    optimizers: list[torch.optim.Optimizer] = []
    for st in tensors:
        if isinstance(st.trackable, OptimizerConfig):
            optimizer = st.trackable._optimizer
            if all(optimizer is not o for o in optimizers):
                optimizers.append(optimizer)
    if not optimizers:
        return None
    owners: dict[int, list[int]] = {}  # id(tensor) -> the optimizers changing it
    for number, optimizer in enumerate(optimizers):
        for group in optimizer.param_groups:
            for param in group["params"]:
                owners.setdefault(id(param), []).append(number)
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    owners.setdefault(id(value), []).append(number)
    deferred: dict[int, DeferredValue] = {}
    per_optimizer: list[list[int]] = [[] for _ in optimizers]
    for index, st in enumerate(tensors):
        variable = st.trackable
        if not isinstance(variable, TensorVariable):
            continue
        tensor = variable.tensor
        numbers = owners.get(id(tensor))
        if not numbers or not _views(st.tensor, tensor):
            continue
        deferred[index] = DeferredValue(partial(_version, tensor), variable.name)
        for number in numbers:
            per_optimizer[number].append(index)
    if not deferred:
        return None

    def arm(copy: LazyCopy) -> None:
        for optimizer, indices in zip(optimizers, per_optimizer):
            if indices:
                step_gate(optimizer).attach(copy, indices)

    return LazyPlan(deferred, arm)


def install_lazy_snapshots() -> None:
    """Register the torch planner for lazy snapshots (the torch integration calls it)."""
    register_lazy_planner(plan_torch_lazy)
