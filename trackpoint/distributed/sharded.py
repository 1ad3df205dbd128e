"""Sharded values: a rank's part of a larger tensor, saved as TensorFlow slices of the full tensor.

Three ways to say that a value is a shard, all ending in a :class:`ShardLayout`:

* a ``DTensor`` (FSDP2, tensor parallelism) needs nothing: importing ``trackpoint.distributed``
  registers an adapter that reads the local shard's offsets from the DTensor itself;
* a plain tensor inside a module (hand-written tensor parallelism, FSDP1 flat shards):
  :func:`mark_sharded` records its place in the full tensor; its optimizer state follows it;
* a value given to the checkpoint directly: :class:`Slice` (a box) or :class:`FlatSlice` (a
  flat range), which wrap a numpy array or a torch tensor.

Saving yields ``{slice spec: local view}`` for the value's key, so the merged checkpoint holds one
full-tensor entry listing every rank's slices (tf-checkpoint-format.md §8.1), readable as one
tensor by TensorFlow and ``tp.load_checkpoint``. Restoring asks for the same boxes; the bundle
reader assembles each from whatever slices the file holds, so the saving layout does not matter.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.distributed.tensor import DTensor

import trackpoint.integrations.torch  # noqa: F401  (registers the torch adapters first)
from trackpoint.distributed.layout import ShardLayout
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
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable

__all__ = [
    "FlatSlice",
    "ShardedTensorVariable",
    "Slice",
    "layout_of",
    "mark_sharded",
    "prepare_shard_restore",
    "save_shard",
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


# -- saving and restoring one shard -----------------------------------------------------------


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


def _numpy_dtype(local: Any, what: str) -> np.dtype[Any]:
    if isinstance(local, torch.Tensor):
        return numpy_dtype_for(local.dtype, what=what)
    return np.asarray(local).dtype


def save_shard(local: Any, layout: ShardLayout, what: str) -> Any:
    """The value to save for a shard: ``{slice spec: array}`` (or one array if unsliced).

    CPU tensors and numpy arrays are viewed without copying; a device tensor is copied to the
    host once, when the saver evaluates the first of its slices.
    """
    if layout.is_empty_tensor:
        return np.empty(layout.full_shape, dtype=_numpy_dtype(local, what))
    if isinstance(local, torch.Tensor) and local.device.type != "cpu":
        copy = _HostCopy(local, layout, what)
        values: dict[str, Any] = {
            spec: DeviceValue(functools.partial(copy.view, spec), device=str(local.device))
            for spec, _, _ in layout.pieces()
        }
    else:
        array = to_numpy(local, what=what) if isinstance(local, torch.Tensor) else local
        values = dict(layout.numpy_views(np.asarray(array)))
    if layout.is_whole:
        (value,) = values.values()
        return value
    return values


def _targets(local: Any, layout: ShardLayout, saved: Any, what: str) -> list[tuple[Any, Any]]:
    """(part of the local value, saved array) pairs, in ``layout.pieces()`` order."""
    if layout.is_whole:
        parts = [("", saved)]
    else:
        if not isinstance(saved, Mapping):
            raise InvalidArgumentError(
                f"{what} is sharded; restoring needs its slices, got a whole {type(saved)}"
            )
        parts = [(spec, saved[spec]) for spec, _, _ in layout.pieces()]
    views: Sequence[torch.Tensor | np.ndarray]
    if isinstance(local, torch.Tensor):
        base = local.detach()
        if layout.flat:
            if not base.is_contiguous():
                raise InvalidArgumentError(f"cannot restore into {what}: a flat shard must be "
                                           "a contiguous tensor")
            flat = base.view(-1)
            views = [flat[start : start + box.size].view(box.shape)
                     for _, box, start in layout.pieces()]
        else:
            views = [base] * len(parts)
    else:
        array_views = layout.writable_numpy_views(np.asarray(local), what)
        views = [array_views[spec] for spec, _, _ in layout.pieces()]
    return [(view, value) for view, (_, value) in zip(views, parts)]


def prepare_shard_restore(
    local: Any, layout: ShardLayout, saved: Any, what: str
) -> Callable[[], None]:
    """Check every restored slice against the local value; return the step copying them in.

    Raises:
        InvalidArgumentError: a slice's shape or dtype differs; nothing is written.
    """
    if layout.is_empty_tensor:
        return _nothing
    with torch.no_grad():
        pairs = _targets(local, layout, saved, what)
        checked = []
        for view, value in pairs:
            if isinstance(view, torch.Tensor):
                checked.append(check_restorable(view, value, what=what))
            else:
                array = np.asarray(value)
                if array.shape != view.shape or array.dtype.newbyteorder("=") != view.dtype:
                    raise InvalidArgumentError(
                        f"Received incompatible tensor with shape {array.shape} and dtype "
                        f"{array.dtype} when attempting to restore {what}, a slice of shape "
                        f"{view.shape} and dtype {view.dtype}"
                    )
                checked.append(array)

    def apply() -> None:
        with torch.no_grad():
            for (view, _), array in zip(pairs, checked):
                if isinstance(view, torch.Tensor):
                    view.copy_(tensor_from_numpy(array, view.dtype))
                else:
                    np.copyto(view, array)

    return apply


def _nothing() -> None:
    """The restore step of an empty tensor."""


# -- trackables ------------------------------------------------------------------------------


def _shape_of(local: Any, what: str) -> tuple[int, ...]:
    if isinstance(local, torch.Tensor):
        return tuple(local.shape)
    if isinstance(local, np.ndarray):
        return tuple(local.shape)
    raise InvalidArgumentError(
        f"{what} must be a numpy array or a torch tensor, got {type(local).__name__}"
    )


class _ShardTrackable(Trackable):
    """A local value and its layout, saved as slices under ``VARIABLE_VALUE``."""

    _kind = "shard"

    def __init__(self, local: Any, layout: ShardLayout) -> None:
        self._local = local
        self._layout = layout

    @property
    def local(self) -> Any:
        """The local array or tensor (restores write into it)."""
        return self._local

    @property
    def layout(self) -> ShardLayout:
        return self._layout

    @property
    def full_shape(self) -> tuple[int, ...]:
        return self._layout.full_shape

    def __repr__(self) -> str:
        boxes = ", ".join(
            f"{list(b.offsets)}+{list(b.shape)}" for b in self._layout.boxes
        )
        return f"<{type(self).__name__} of {list(self.full_shape)}: {boxes}>"

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # docstring inherited
        return {VARIABLE_VALUE_KEY: save_shard(self._local, self._layout, repr(self))}

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited
        saved = restored_tensors[VARIABLE_VALUE_KEY]
        return prepare_shard_restore(self._local, self._layout, saved, repr(self))


class Slice(_ShardTrackable):
    """``local`` is the box at ``offsets`` of a tensor of ``full_shape``.

    Saved as one TensorFlow slice of the full tensor's key; restored, in place, from whatever
    slices the checkpoint holds (any number of ranks, any slicing).

    Args:
        local: a numpy array or torch tensor holding this rank's box.
        full_shape: shape of the whole tensor (the same on every rank).
        offsets: where the box starts, one offset per dimension.

    Raises:
        InvalidArgumentError: the box does not fit in ``full_shape``.

    Example::

        rows = vocab // world
        table = torch.randn(rows, dim)
        ckpt = tpd.DistributedCheckpoint(table=tpd.Slice(table, (vocab, dim), (rank * rows, 0)))
    """

    def __init__(self, local: Any, full_shape: Sequence[int], offsets: Sequence[int]) -> None:
        super().__init__(local, ShardLayout.box(full_shape, offsets, _shape_of(local, "Slice")))


class FlatSlice(_ShardTrackable):
    """``local`` holds elements ``[start, start + local.numel)`` of a tensor of ``full_shape``
    in row-major order: an FSDP-style flat shard.

    Saved as at most ``2 * len(full_shape) - 1`` TensorFlow slices (the boxes the range covers);
    restoring needs a contiguous ``local``.

    Raises:
        InvalidArgumentError: the range does not fit in ``full_shape``.
    """

    def __init__(self, local: Any, full_shape: Sequence[int], start: int) -> None:
        size = int(np.prod(_shape_of(local, "FlatSlice"), dtype=np.int64))
        super().__init__(local, ShardLayout.flat_range(full_shape, int(start), size))


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


_register()
