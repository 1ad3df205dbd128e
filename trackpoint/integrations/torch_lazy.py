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

Checkpoints that hold an optimizer's tensors but not the optimizer (the dict Lightning hands its
``CheckpointIO``) name the optimizers with :func:`lazy_optimizers`; their tensors are then also
matched by memory (detached views).

Device tensors are copied to the host at the call (``TensorVariable`` evaluates them then), so
only CPU tensors are deferred. One hook per optimizer is installed the first time a lazy save
sees it, and stays: removing a hook while ``step()`` iterates its hooks is an error in torch,
and an idle hook costs one lock.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from trackpoint.integrations.torch_optim import OptimizerConfig
from trackpoint.integrations.torch_tensors import TensorVariable
from trackpoint.saving.lazy_snapshot import (
    DeferredValue,
    LazyCopy,
    LazyPlan,
    register_lazy_planner,
)
from trackpoint.saving.sharding import ShardableTensor

__all__ = [
    "StepGate",
    "install_lazy_snapshots",
    "lazy_optimizers",
    "plan_torch_lazy",
    "record_stepping_optimizers",
    "step_gate",
    "stepped_optimizers",
]


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


_THREAD = threading.local()  # .optimizers: those lazy_optimizers() adds on this thread
_STEPPED: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
_RECORDER: list[Any] = []  # the global step pre-hook's handle, once installed


@contextmanager
def lazy_optimizers(optimizers: Iterable[torch.optim.Optimizer]) -> Iterator[None]:
    """Inside the block, lazy saves on this thread treat ``optimizers`` as tracked.

    For checkpoints that hold an optimizer's tensors but not the optimizer: Lightning's dict
    (``optimizer.state_dict()`` and the module's ``state_dict()``, whose tensors are detached
    views). A tensor is then also matched by its memory (a detached view shares the memory
    and the version counter of the tensor the optimizer changes), and gated on the
    optimizer's next step as for a tracked one.
    """
    previous: tuple[torch.optim.Optimizer, ...] = getattr(_THREAD, "optimizers", ())
    _THREAD.optimizers = (*previous, *optimizers)
    try:
        yield
    finally:
        _THREAD.optimizers = previous


def _record(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    _STEPPED.add(optimizer)


def record_stepping_optimizers() -> None:
    """From now on, remember (weakly) every optimizer of the process that steps (idempotent).

    One global step pre-hook (``register_optimizer_step_pre_hook``): a caller that never sees
    the optimizers (a Lightning ``CheckpointIO``) learns them so, before its first save.
    """
    with _GATES_LOCK:
        if not _RECORDER:
            _RECORDER.append(register_optimizer_step_pre_hook(_record))


def stepped_optimizers() -> list[torch.optim.Optimizer]:
    """The live optimizers that stepped since :func:`record_stepping_optimizers` was called."""
    return list(_STEPPED)


def _memory(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    """Equal for two CPU tensors viewing the same memory the same way, else None."""
    if tensor.device.type != "cpu" or tensor.layout != torch.strided or tensor.numel() == 0:
        return None
    return (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))


def _version(tensor: torch.Tensor) -> int:
    return int(tensor._version)


def _views(array: np.ndarray, tensor: torch.Tensor) -> bool:
    """True if ``array`` is a view of ``tensor``'s memory (not a copy made at the snapshot).

    Follows the array's bases to the tensor ``Tensor.numpy()`` made it from: it runs per value
    at the call, and reading ``__array_interface__`` alone costs twice this whole check.
    """
    base: Any = array
    while isinstance(base, np.ndarray):
        base = base.base
    return bool(
        isinstance(base, torch.Tensor)
        and tensor.is_cpu
        and base.data_ptr() == tensor.data_ptr()
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
    added: tuple[torch.optim.Optimizer, ...] = getattr(_THREAD, "optimizers", ())
    by_memory = any(all(o is not t for t in optimizers) for o in added)
    optimizers.extend(o for o in added if all(o is not t for t in optimizers))
    if not optimizers:
        return None
    owners: dict[int, list[int]] = {}  # id(tensor) -> the optimizers changing it
    memory_owners: dict[tuple[Any, ...], list[int]] = {}  # the same by memory (detached views)
    for number, optimizer in enumerate(optimizers):
        owned: list[torch.Tensor] = [p for group in optimizer.param_groups for p in group["params"]]
        owned.extend(
            v for state in optimizer.state.values() for v in state.values()
            if isinstance(v, torch.Tensor)
        )  # fmt: skip
        for tensor in owned:
            owners.setdefault(id(tensor), []).append(number)
            if by_memory and (memory := _memory(tensor)) is not None:
                memory_owners.setdefault(memory, []).append(number)
    deferred: dict[int, DeferredValue] = {}
    per_optimizer: list[list[int]] = [[] for _ in optimizers]
    for index, st in enumerate(tensors):
        variable = st.trackable
        if not isinstance(variable, TensorVariable):
            continue
        tensor = variable.tensor
        numbers = owners.get(id(tensor))
        if numbers is None and memory_owners and (memory := _memory(tensor)) is not None:
            numbers = memory_owners.get(memory)
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
