"""The torch half of sharded values: DTensors, :func:`mark_sharded` tensors, their adapters.

Imported by ``trackpoint.distributed`` when torch is installed, which registers the adapter
that gives a DTensor or a marked tensor a :class:`ShardedTensorVariable` (unmarked tensors
keep a plain ``TensorVariable``). ``trackpoint.distributed.sharded`` calls the helpers here
(registered with it) for a torch tensor given to :class:`~trackpoint.distributed.Slice` or
:class:`~trackpoint.distributed.FlatSlice`; a program without torch never imports this module.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.distributed.tensor import DTensor

import trackpoint.integrations.torch  # noqa: F401  (registers the torch adapters first)
from trackpoint.distributed.layout import ShardLayout
from trackpoint.distributed.sharded import (
    prepare_shard_restore,
    register_tensor_helpers,
    save_shard,
)
from trackpoint.errors import InvalidArgumentError
from trackpoint.integrations.torch_tensors import (
    TensorVariable,
    check_restorable,
    numpy_dtype_for,
    tensor_from_numpy,
    to_numpy,
)
from trackpoint.saving.devices import DeviceValue
from trackpoint.tracking.adapters import register_adapter
from trackpoint.tracking.base import VARIABLE_VALUE_KEY

__all__ = [
    "ShardedTensorVariable",
    "layout_of",
    "mark_sharded",
    "marked_layout",
    "propagate_layout",
]

# Explicit registry (STYLE.md §1): layouts of plain tensors marked sharded, by id of the tensor.
# The weak reference removes the entry when the tensor dies, so an id is never reused wrongly.
_marked: dict[int, tuple[weakref.ref[torch.Tensor], ShardLayout]] = {}


# -- layouts of tensors ----------------------------------------------------------------------


def dtensor_layout(tensor: DTensor) -> ShardLayout:
    """The box a DTensor's local shard covers in the global tensor.

    Raises:
        InvalidArgumentError: the DTensor has a ``Partial`` placement (pending reduction).
    """
    try:
        chunks = tensor.__create_chunk_list__()
    except (RuntimeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"a DTensor of shape {list(tensor.shape)} with placements {tensor.placements} cannot "
            f"be checkpointed ({exc}); redistribute it to Shard/Replicate placements first"
        ) from exc
    if len(chunks) != 1:
        raise InvalidArgumentError(
            f"a DTensor of shape {list(tensor.shape)} has {len(chunks)} local chunks; trackpoint "
            "saves DTensors whose local tensor is one box of the global tensor"
        )
    chunk = chunks[0]
    return ShardLayout.box(tuple(tensor.shape), tuple(chunk.offsets), tuple(chunk.sizes))


def _register_layout(tensor: torch.Tensor, layout: ShardLayout) -> None:
    key = id(tensor)

    def forget(_: weakref.ref[torch.Tensor]) -> None:
        _marked.pop(key, None)

    _marked[key] = (weakref.ref(tensor, forget), layout)


def marked_layout(tensor: torch.Tensor) -> ShardLayout | None:
    """The layout :func:`mark_sharded` recorded for ``tensor`` (DTensors not included)."""
    entry = _marked.get(id(tensor))
    if entry is not None and entry[0]() is tensor:
        return entry[1]
    return None


def layout_of(tensor: torch.Tensor) -> ShardLayout | None:
    """Where ``tensor``'s values lie in the full tensor, or None for an ordinary tensor."""
    if isinstance(tensor, DTensor):
        return dtensor_layout(tensor)
    return marked_layout(tensor)


def mark_sharded(
    tensor: torch.Tensor,
    full_shape: Sequence[int],
    offsets: Sequence[int] | None = None,
    *,
    flat_start: int | None = None,
) -> torch.Tensor:
    """Declare that ``tensor`` (a parameter or buffer of this rank) is part of a larger tensor.

    Give ``offsets`` when the tensor is a box of the full tensor (a row block of an embedding:
    ``offsets=(rank * rows, 0)``), or ``flat_start`` when it is a flat run of the full tensor's
    elements in row-major order (an FSDP-style flat shard). Optimizer state of the same shape
    (Adam's ``exp_avg``...) is sharded the same way automatically. Call it before the tensor is
    first checkpointed; the tensor itself is not changed.

    Returns:
        ``tensor``, for chaining.

    Raises:
        InvalidArgumentError: neither or both of ``offsets`` and ``flat_start``, or the shard
            does not fit in ``full_shape``.

    Example::

        rows = vocab // world
        emb = torch.nn.Embedding(rows, dim)
        tpd.mark_sharded(emb.weight, (vocab, dim), offsets=(rank * rows, 0))
    """
    if not isinstance(tensor, torch.Tensor) or isinstance(tensor, DTensor):
        raise InvalidArgumentError(
            f"mark_sharded() takes a plain torch.Tensor, got {type(tensor).__name__} (DTensors "
            "are recognised without marking)"
        )
    if (offsets is None) == (flat_start is None):
        raise InvalidArgumentError(
            "mark_sharded() needs exactly one of offsets= (a box of the full tensor) or "
            "flat_start= (a flat range of it)"
        )
    if offsets is not None:
        layout = ShardLayout.box(full_shape, offsets, tuple(tensor.shape))
    else:
        assert flat_start is not None
        layout = ShardLayout.flat_range(full_shape, int(flat_start), tensor.numel())
    _register_layout(tensor, layout)
    return tensor


def propagate_layout(param: torch.Tensor, state: torch.Tensor) -> None:
    """Give optimizer ``state`` the layout of its marked parameter if their shapes agree."""
    layout = marked_layout(param)
    if (
        layout is not None
        and not isinstance(state, DTensor)
        and tuple(state.shape) == tuple(param.shape)
        and marked_layout(state) is None
    ):
        _register_layout(state, layout)


# -- a torch tensor as a shard (sharded.py's torch branches) --------------------------------


class _HostCopy:
    """A device tensor's host copy, taken once however many slices read it."""

    def __init__(self, tensor: torch.Tensor, layout: ShardLayout, what: str) -> None:
        self._tensor, self._layout, self._what = tensor, layout, what
        self._views: dict[str, np.ndarray] | None = None

    def view(self, spec: str) -> np.ndarray:
        if self._views is None:
            array = to_numpy(self._tensor, what=self._what)
            self._views = self._layout.numpy_views(array)
        return self._views[spec]


def numpy_dtype(local: torch.Tensor, what: str) -> np.dtype[Any]:
    """The numpy dtype ``local``'s values are saved as."""
    return numpy_dtype_for(local.dtype, what=what)


def shard_values(local: torch.Tensor, layout: ShardLayout, what: str) -> dict[str, Any]:
    """``{slice spec: value}`` of a tensor: views of a CPU tensor; for a device tensor, values
    that copy it to the host once, when the saver evaluates the first of its slices."""
    if local.device.type != "cpu":
        copy = _HostCopy(local, layout, what)
        return {
            spec: DeviceValue(functools.partial(copy.view, spec), device=str(local.device))
            for spec, _, _ in layout.pieces()
        }
    return dict(layout.numpy_views(np.asarray(to_numpy(local, what=what))))


def restore_views(local: torch.Tensor, layout: ShardLayout, what: str) -> list[torch.Tensor]:
    """The part of ``local`` each of ``layout.pieces()`` restores into, in order."""
    base = local.detach()
    if not layout.flat:
        return [base] * len(layout.pieces())
    if not base.is_contiguous():
        raise InvalidArgumentError(f"cannot restore into {what}: a flat shard must be "
                                   "a contiguous tensor")
    flat = base.view(-1)
    return [flat[start : start + box.size].view(box.shape) for _, box, start in layout.pieces()]


def checked(view: torch.Tensor, value: Any, what: str) -> Any:
    """``value`` once it fits ``view`` (shape and dtype)."""
    return check_restorable(view, value, what=what)


def copy_into(view: torch.Tensor, array: Any) -> None:
    view.copy_(tensor_from_numpy(array, view.dtype))


def no_grad() -> contextlib.AbstractContextManager[Any]:
    return torch.no_grad()


# -- the adapter -----------------------------------------------------------------------------


class ShardedTensorVariable(TensorVariable):
    """Adapter for a sharded torch tensor (a DTensor, or a tensor given to :func:`mark_sharded`).

    A ``TensorVariable`` to the rest of trackpoint (module children, optimizer slots), but it
    saves and restores the slices its layout names instead of the whole value.
    """

    def __init__(self, tensor: torch.Tensor, layout: ShardLayout) -> None:
        super().__init__(tensor)
        self._layout = layout

    @property
    def layout(self) -> ShardLayout:
        return self._layout

    def _local(self) -> torch.Tensor:
        tensor = self.tensor
        if isinstance(tensor, DTensor):
            with torch.no_grad():
                return tensor.to_local()  # shares the DTensor's storage
        return tensor

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # docstring inherited
        return {VARIABLE_VALUE_KEY: save_shard(self._local(), self._layout, self.name)}

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited
        saved = restored_tensors[VARIABLE_VALUE_KEY]
        return prepare_shard_restore(self._local(), self._layout, saved, self.name)


def _adapt_tensor(tensor: torch.Tensor) -> TensorVariable:
    layout = layout_of(tensor)
    if layout is None:
        return TensorVariable(tensor)
    return ShardedTensorVariable(tensor, layout)


def _register() -> None:
    # Replaces the plain torch.Tensor adapter of trackpoint.integrations.torch (imported above,
    # so its registration runs first): unmarked tensors still get a plain TensorVariable.
    register_adapter(torch.Tensor, _adapt_tensor)
    register_adapter(DTensor, _adapt_tensor)
    register_tensor_helpers(torch.Tensor, sys.modules[__name__])


_register()
