"""Sharded values: a rank's part of a larger tensor, saved as TensorFlow slices of the full tensor.

Three ways to say that a value is a shard, all ending in a :class:`ShardLayout`:

* a ``DTensor`` (FSDP2, tensor parallelism) needs nothing: importing ``trackpoint.distributed``
  (with torch installed) registers an adapter that reads the local shard's offsets from the
  DTensor itself (``trackpoint.distributed.torch_sharded``);
* a plain tensor inside a module (hand-written tensor parallelism, FSDP1 flat shards):
  :func:`mark_sharded` records its place in the full tensor; its optimizer state follows it;
* a value given to the checkpoint directly: :class:`Slice` (a box) or :class:`FlatSlice` (a
  flat range), which wrap a numpy array or a torch tensor.

Saving yields ``{slice spec: local view}`` for the value's key, so the merged checkpoint holds one
full-tensor entry listing every rank's slices (tf-checkpoint-format.md §8.1), readable as one
tensor by TensorFlow and ``tp.load_checkpoint``. Restoring asks for the same boxes; the bundle
reader assembles each from whatever slices the file holds, so the saving layout does not matter.

This module needs numpy only: a torch tensor given to a slice goes through the helpers
``torch_sharded`` registers, so JAX and numpy programs run without torch installed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from trackpoint.distributed.layout import ShardLayout
from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable

__all__ = ["FlatSlice", "Slice", "prepare_shard_restore", "register_tensor_helpers", "save_shard"]


# Explicit registry (STYLE.md §1): helpers for a framework's tensors given to a slice, by tensor
# type. ``torch_sharded`` registers torch's when ``trackpoint.distributed`` imports it (with torch
# installed); numpy arrays need none, so a program without torch runs without it.
_tensor_helpers: list[tuple[type, ModuleType]] = []


def register_tensor_helpers(kind: type, helpers: ModuleType) -> None:
    """Save and restore values of ``kind`` through ``helpers`` (a module with the functions
    ``numpy_dtype``, ``shard_values``, ``restore_views``, ``checked``, ``copy_into`` and
    ``no_grad`` of ``trackpoint.distributed.torch_sharded``)."""
    _tensor_helpers.append((kind, helpers))


def _helpers_for(local: Any) -> ModuleType | None:
    """The registered helpers for ``local``'s type (a torch tensor), or None (a numpy array)."""
    for kind, helpers in _tensor_helpers:
        if isinstance(local, kind):
            return helpers
    return None


# -- saving and restoring one shard -----------------------------------------------------------


def save_shard(local: Any, layout: ShardLayout, what: str) -> Any:
    """The value to save for a shard: ``{slice spec: array}`` (or one array if unsliced).

    CPU tensors and numpy arrays are viewed without copying; a device tensor is copied to the
    host once, when the saver evaluates the first of its slices.
    """
    helpers = _helpers_for(local)
    if layout.is_empty_tensor:
        dtype = helpers.numpy_dtype(local, what) if helpers else np.asarray(local).dtype
        return np.empty(layout.full_shape, dtype=dtype)
    if helpers:
        values = helpers.shard_values(local, layout, what)
    else:
        values = dict(layout.numpy_views(np.asarray(local)))
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
    views: Sequence[Any]
    helpers = _helpers_for(local)
    if helpers:
        views = helpers.restore_views(local, layout, what)
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
    helpers = _helpers_for(local)
    if helpers is None:
        return _prepare_numpy(local, layout, saved, what)
    with helpers.no_grad():
        pairs = _targets(local, layout, saved, what)
        checked = [helpers.checked(view, value, what) for view, value in pairs]

    def apply() -> None:
        with helpers.no_grad():
            for (view, _), array in zip(pairs, checked):
                helpers.copy_into(view, array)

    return apply


def _prepare_numpy(
    local: Any, layout: ShardLayout, saved: Any, what: str
) -> Callable[[], None]:
    """:func:`prepare_shard_restore` of a numpy array."""
    pairs = _targets(local, layout, saved, what)
    checked = []
    for view, value in pairs:
        array = np.asarray(value)
        if array.shape != view.shape or array.dtype.newbyteorder("=") != view.dtype:
            raise InvalidArgumentError(
                f"Received incompatible tensor with shape {array.shape} and dtype "
                f"{array.dtype} when attempting to restore {what}, a slice of shape "
                f"{view.shape} and dtype {view.dtype}"
            )
        checked.append(array)

    def apply() -> None:
        for (view, _), array in zip(pairs, checked):
            np.copyto(view, array)

    return apply


def _nothing() -> None:
    """The restore step of an empty tensor."""


# -- trackables ------------------------------------------------------------------------------


def _shape_of(local: Any, what: str) -> tuple[int, ...]:
    if _helpers_for(local) or isinstance(local, np.ndarray):
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
