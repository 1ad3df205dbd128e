"""One leaf of a restored pytree as the restore engine sees it: what to read, what to build.

Both kinds of ``tp.jax.restore`` (into a target, and without one) describe each leaf by a
:class:`LeafSpec` and plan a :class:`LeafTarget` per leaf with :class:`LeafReads`, which hands
them to the one restore engine (trackpoint/saving/restore.py) as one ``RestoreBatch`` (plus an
item per leaf stored in slices); the engine reads and verifies every value before any leaf is
built.

A jax leaf is rebuilt on its sharding: one box per distinct shard index (for a checkpoint that
stores the tensor in slices, each box is read with ``BundleReader.read_slice``, which touches
only the stored slices that intersect it, so a sharded checkpoint is resharded without reading
everything on every device), put on each device that holds that index, and assembled with
``jax.make_array_from_single_device_arrays``. A PRNG key is rebuilt from its ``key_data`` with
the implementation the plan resolved; a weakly typed leaf is made weak again. The engine hands
every leaf of a restore to one ``LeafTarget._prepare_restores`` call, which places the leaves
bound for one local device (most of them) in one batch (``jax_placement.py``), and each
sharding's boxes are computed once per distinct (sharding, shape).

In a multi-process JAX job the target's sharding is global, and its
``addressable_devices_indices_map`` names this process's devices only: each process reads the
boxes of its own shards and builds its part of the global array (no exchange between
processes is needed, each reads the shared checkpoint itself).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from trackpoint.bundle.reader import BundleReader
from trackpoint.bundle.slice_spec import TensorSlice, format_slice_spec
from trackpoint.errors import InvalidArgumentError
from trackpoint.integrations.jax_arrays import index_bounds
from trackpoint.integrations.jax_metadata import with_weak_type
from trackpoint.integrations.jax_placement import (
    Placement,
    default_sharding,
    place,
    placement,
    single_device,
)
from trackpoint.saving.restore import RestoreBatch, RestoreItem
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable
from trackpoint.tracking.value_columns import ValueColumns

__all__ = ["LeafReads", "LeafSpec", "LeafTarget", "abstract_array", "default_sharding"]


@dataclass(frozen=True, slots=True)
class LeafSpec:
    """One leaf of the result and where the checkpoint keeps its value."""

    position: int
    """Index in the flattened result."""
    path: tuple[Any, ...]
    """jax key path, for messages."""
    target: Any
    """What to build: a jax array or ``jax.ShapeDtypeStruct`` (a jax leaf on its sharding, the
    default device without one), a numpy array or scalar, or a Python scalar."""
    key: str
    """Checkpoint key of its ``VARIABLE_VALUE`` (the expected key if missing)."""
    metadata_key: str | None = None
    """Checkpoint key of the leaf's ``jax_metadata`` value, if the checkpoint has one."""
    prng_impl: str | None = None
    """For a jax leaf: wrap the stored ``key_data`` as keys of this implementation."""
    weak_type: bool = False
    """For a jax leaf (not a key): make the result weakly typed."""


def abstract_array(
    shape: tuple[int, ...], dtype: np.dtype[Any], sharding: jax.sharding.Sharding | None = None
) -> jax.ShapeDtypeStruct:
    """``jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)``: a jax leaf to build."""
    # jax leaves ShapeDtypeStruct.__init__ unannotated; this is its one typed caller.
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)  # type: ignore[no-untyped-call]


def _is_jax(target: Any) -> bool:
    return isinstance(target, (jax.Array, jax.ShapeDtypeStruct))


# What a leaf is built as (LeafTarget._kind).
_HOST = 0  # a numpy array or a scalar
_WHOLE = 1  # a jax array on one local device, from the whole stored value
_SHARDS = 2  # a jax array assembled from boxes on several devices, or a PRNG key

# (sharding, shape) -> {box bounds: devices holding it}: a model has a handful of each.
_layouts: dict[tuple[jax.sharding.Sharding, tuple[int, ...]], dict[Any, list[Any]]] = {}


def _boxes_of(
    sharding: jax.sharding.Sharding, shape: tuple[int, ...]
) -> dict[tuple[tuple[int, int], ...], list[Any]]:
    """One box per distinct shard index of ``sharding`` on this process, with its devices."""
    key = (sharding, shape)
    boxes = _layouts.get(key)
    if boxes is None:
        boxes = {}
        for device, index in sharding.addressable_devices_indices_map(shape).items():
            bounds = (
                index_bounds(index, shape)
                if index is not None
                else tuple((0, size) for size in shape)  # the whole array on this device
            )
            boxes.setdefault(bounds, []).append(device)
        if len(_layouts) >= 4096:
            _layouts.clear()
        _layouts[key] = boxes
    return boxes


class LeafTarget(Trackable):
    """One leaf of the result, as the restore engine sees it.

    The engine reads and verifies the leaf's value (or, for a checkpoint that stores the tensor
    in slices, one box per distinct shard index of the target's sharding); ``_prepare_restores``
    builds the new leaves of a whole restore from the verified bytes, the single-device ones in
    one batch (``jax_placement.place``), and its apply step stores them in ``results``.
    """

    def __init__(self, leaf: LeafSpec, shape: tuple[int, ...], results: list[Any]) -> None:
        self._leaf = leaf
        self._shape = shape
        self._results = results
        target = leaf.target
        self._sharding: jax.sharding.Sharding | None = None
        self._placement: Placement | None = None
        if not _is_jax(target):
            self._kind = _HOST
            return
        sharding = target.sharding
        self._sharding = sharding if sharding is not None else default_sharding()
        if leaf.prng_impl is None and single_device(self._sharding) is not None:
            self._kind = _WHOLE
            self._placement = placement(
                shape, np.dtype(target.dtype), leaf.weak_type, self._sharding
            )
        else:
            self._kind = _SHARDS

    def _boxes(self) -> dict[tuple[tuple[int, int], ...], list[Any]]:
        if self._sharding is None or self._leaf.prng_impl is not None:
            return {}  # keys and host leaves are read whole
        return _boxes_of(self._sharding, self._shape)

    def box_specs(self) -> dict[str, None]:
        """``{slice spec: None}`` of every box to read from a checkpoint that stores slices."""
        specs: dict[str, None] = {}
        for bounds in self._boxes():
            tensor_slice = TensorSlice.from_bounds(
                [start for start, _ in bounds], [stop - start for start, stop in bounds]
            )
            specs[format_slice_spec(self._shape, tensor_slice)] = None
        return specs

    @classmethod
    def _prepare_restores(
        cls,
        trackables: Sequence[Trackable],
        restored: Sequence[Mapping[str, Any]],
        on_error: Callable[[int, InvalidArgumentError], BaseException],
    ) -> Callable[[], None]:
        """Build every leaf of ``trackables`` (nothing of the program changes): those bound
        for one local device whole, in one batch; the step stores each in its results."""
        targets: Sequence[LeafTarget] = trackables  # type: ignore[assignment]
        values: list[Any] = [None] * len(targets)
        batch: list[int] = []
        arrays: list[np.ndarray] = []
        placements: list[Placement] = []
        saved_values: Sequence[Any] = (
            restored.column(VARIABLE_VALUE_KEY)  # a batch read whole: its column as is
            if isinstance(restored, ValueColumns)
            else [saved[VARIABLE_VALUE_KEY] for saved in restored]
        )
        for index, (target, value) in enumerate(zip(targets, saved_values, strict=True)):
            where = target._placement
            if where is not None and not isinstance(value, Mapping):
                batch.append(index)
                arrays.append(value)
                placements.append(where)
                continue
            try:
                values[index] = target._build(value)
            except InvalidArgumentError as exc:
                error = on_error(index, exc)
                if error is exc:  # one object alone (_prepare_restore): its own error
                    raise
                raise error from exc
        for index, array in zip(batch, place(arrays, placements)):
            values[index] = array

        def apply() -> None:
            for target, value in zip(targets, values):
                target._results[target._leaf.position] = value

        return apply

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited: builds the new leaf; nothing of the program changes
        return type(self)._prepare_restores([self], [restored_tensors], _reraise)

    def _box(self, saved: Any, bounds: tuple[tuple[int, int], ...]) -> np.ndarray:
        """A new array holding ``bounds`` (safe to hand to a device: owns its memory)."""
        if isinstance(saved, Mapping):  # read as slices: one verified box per spec
            tensor_slice = TensorSlice.from_bounds(
                [start for start, _ in bounds], [stop - start for start, stop in bounds]
            )
            return np.array(saved[format_slice_spec(self._shape, tensor_slice)], copy=True)
        return np.array(saved[tuple(slice(s, e) for s, e in bounds)], copy=True)

    def _build(self, saved: Any) -> Any:
        """The leaf from its verified value, one leaf at a time (host leaves, keys, shards)."""
        leaf = self._leaf
        target = leaf.target
        if self._kind == _HOST:
            value = np.array(saved, copy=True)
            if isinstance(target, np.ndarray):
                return value
            if isinstance(target, np.generic):
                return value[()]
            return type(target)(value[()])
        sharding = self._sharding
        assert sharding is not None
        if leaf.prng_impl is not None:
            data = jax.numpy.asarray(np.array(saved, copy=True))
            keys = jax.random.wrap_key_data(data, impl=leaf.prng_impl)
            if sharding.is_fully_addressable:
                return jax.device_put(keys, sharding)
            # A global sharding of a multi-process job: device_put accepts only devices of
            # this process, so each of them gets its part and the global array is assembled.
            parts = [
                jax.device_put(keys[index] if index is not None else keys, device)
                for device, index in sharding.addressable_devices_indices_map(keys.shape).items()
            ]
            return jax.make_array_from_single_device_arrays(keys.shape, sharding, parts)
        memory_kind = getattr(sharding, "memory_kind", None)
        pieces: list[np.ndarray] = []
        placements: list[Placement] = []
        for bounds, devices in self._boxes().items():
            piece = self._box(saved, bounds)
            for device in devices:
                pieces.append(piece)
                on = jax.sharding.SingleDeviceSharding(device, memory_kind=memory_kind)
                placements.append(placement(piece.shape, piece.dtype, False, on))
        arrays = place(pieces, placements)
        array = jax.make_array_from_single_device_arrays(self._shape, sharding, arrays)
        return with_weak_type(array) if leaf.weak_type else array


def _reraise(index: int, exc: InvalidArgumentError) -> BaseException:
    return exc


class LeafReads:
    """The restore engine's sources for many leaves, gathered as they are planned.

    Every leaf read whole (most of them) joins one :class:`RestoreBatch`: a column of keys,
    no object per value, and one ``LeafTarget._prepare_restores`` call for all of them. A jax
    leaf whose tensor the checkpoint stores in slices is an item of its own, read box by box
    (only the slices each box touches); the engine prepares it with the batch (one class).

    Args:
        reader: the open checkpoint.
        results: the flattened result; each leaf's value is stored at its ``position``.
        label: a leaf's readable path from its ``LeafSpec.path`` (called only on error).
    """

    __slots__ = ("_keys", "_label", "_reader", "_results", "_targets", "items")

    def __init__(
        self, reader: BundleReader, results: list[Any], label: Callable[[Any], str]
    ) -> None:
        self._reader = reader
        self._results = results
        self._label = label
        self._targets: list[LeafTarget] = []
        self._keys: list[str] = []
        self.items: list[RestoreItem] = []
        """The leaves read in boxes, one item each."""

    def add(self, leaf: LeafSpec, shape: tuple[int, ...] | None = None) -> None:
        """Plan ``leaf``; ``shape`` is its stored shape, if the caller has it already."""
        reader = self._reader
        if shape is None:
            shape = tuple(reader.shape(leaf.key))
        target = LeafTarget(leaf, shape, self._results)
        if target._kind != _HOST and reader.slices(leaf.key):
            specs = target.box_specs()
            if specs:
                label = self._label
                self.items.append(RestoreItem(
                    target, {VARIABLE_VALUE_KEY: leaf.key},
                    lambda: label(leaf.path), {VARIABLE_VALUE_KEY: specs},
                ))  # fmt: skip
                return
        self._targets.append(target)
        self._keys.append(leaf.key)

    def batches(self) -> list[RestoreBatch]:
        """The leaves read whole, as one batch (none if there are none)."""
        if not self._targets:
            return []
        targets, label = self._targets, self._label
        return [RestoreBatch(
            targets, (VARIABLE_VALUE_KEY,), (self._keys,), lambda i: label(targets[i]._leaf.path)
        )]  # fmt: skip
