"""One leaf of a restored pytree as the restore engine sees it: what to read, what to build.

Both kinds of ``tp.jax.restore`` (into a target, and without one) describe each leaf by a
:class:`LeafSpec` and hand a :class:`LeafTarget` per leaf to the one restore engine
(trackpoint/saving/restore.py), which reads and verifies every value before any leaf is built.

A jax leaf is rebuilt on its sharding: one box per distinct shard index (for a checkpoint that
stores the tensor in slices, each box is read with ``BundleReader.read_slice``, which touches
only the stored slices that intersect it, so a sharded checkpoint is resharded without reading
everything on every device), put on each device that holds that index, and assembled with
``jax.make_array_from_single_device_arrays``. A PRNG key is rebuilt from its ``key_data`` with
the implementation the plan resolved; a weakly typed leaf is made weak again.

In a multi-process JAX job the target's sharding is global, and its
``addressable_devices_indices_map`` names this process's devices only: each process reads the
boxes of its own shards and builds its part of the global array (no exchange between
processes is needed, each reads the shared checkpoint itself).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from trackpoint.bundle.reader import BundleReader
from trackpoint.bundle.slice_spec import TensorSlice, format_slice_spec
from trackpoint.integrations.jax_arrays import index_bounds
from trackpoint.integrations.jax_metadata import with_weak_type
from trackpoint.saving.restore import RestoreItem
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable

__all__ = ["LeafSpec", "LeafTarget", "abstract_array", "default_sharding", "restore_item"]


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


def default_sharding() -> jax.sharding.Sharding:
    """Where a jax leaf without a sharding goes: the first local device."""
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def abstract_array(
    shape: tuple[int, ...], dtype: np.dtype[Any], sharding: jax.sharding.Sharding | None = None
) -> jax.ShapeDtypeStruct:
    """``jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)``: a jax leaf to build."""
    # jax leaves ShapeDtypeStruct.__init__ unannotated; this is its one typed caller.
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)  # type: ignore[no-untyped-call]


def _is_jax(target: Any) -> bool:
    return isinstance(target, (jax.Array, jax.ShapeDtypeStruct))


class LeafTarget(Trackable):
    """One leaf of the result, as the restore engine sees it.

    The engine reads and verifies the leaf's value (or, for a checkpoint that stores the tensor
    in slices, one box per distinct shard index of the target's sharding); ``_prepare_restore``
    builds the new leaf from the verified bytes, and its apply step stores it in ``results``.
    """

    def __init__(self, leaf: LeafSpec, shape: tuple[int, ...], results: list[Any]) -> None:
        self._leaf = leaf
        self._shape = shape
        self._results = results
        self._boxes: dict[tuple[tuple[int, int], ...], list[Any]] = {}
        target = leaf.target
        if _is_jax(target) and leaf.prng_impl is None:
            sharding = target.sharding if target.sharding is not None else default_sharding()
            for device, index in sharding.addressable_devices_indices_map(shape).items():
                bounds = (
                    index_bounds(index, shape)
                    if index is not None
                    else tuple((0, size) for size in shape)  # the whole array on this device
                )
                self._boxes.setdefault(bounds, []).append(device)

    def box_specs(self) -> dict[str, None]:
        """``{slice spec: None}`` of every box to read from a checkpoint that stores slices."""
        specs: dict[str, None] = {}
        for bounds in self._boxes:
            tensor_slice = TensorSlice.from_bounds(
                [start for start, _ in bounds], [stop - start for start, stop in bounds]
            )
            specs[format_slice_spec(self._shape, tensor_slice)] = None
        return specs

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited: builds the new leaf; nothing of the program changes
        value = self._build(restored_tensors[VARIABLE_VALUE_KEY])
        return functools.partial(self._results.__setitem__, self._leaf.position, value)

    def _box(self, saved: Any, bounds: tuple[tuple[int, int], ...]) -> np.ndarray:
        """A new array holding ``bounds`` (safe to hand to a device: owns its memory)."""
        if isinstance(saved, Mapping):  # read as slices: one verified box per spec
            tensor_slice = TensorSlice.from_bounds(
                [start for start, _ in bounds], [stop - start for start, stop in bounds]
            )
            return np.array(saved[format_slice_spec(self._shape, tensor_slice)], copy=True)
        return np.array(saved[tuple(slice(s, e) for s, e in bounds)], copy=True)

    def _build(self, saved: Any) -> Any:
        leaf = self._leaf
        target = leaf.target
        if not _is_jax(target):
            value = np.array(saved, copy=True)
            if isinstance(target, np.ndarray):
                return value
            if isinstance(target, np.generic):
                return value[()]
            return type(target)(value[()])
        sharding = target.sharding if target.sharding is not None else default_sharding()
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
        arrays = []
        for bounds, devices in self._boxes.items():
            piece = self._box(saved, bounds)
            for device in devices:
                placement = jax.sharding.SingleDeviceSharding(device, memory_kind=memory_kind)
                arrays.append(jax.device_put(piece, placement))
        array = jax.make_array_from_single_device_arrays(self._shape, sharding, arrays)
        return with_weak_type(array) if leaf.weak_type else array


def restore_item(
    leaf: LeafSpec, reader: BundleReader, results: list[Any], label: str
) -> RestoreItem:
    """The engine's item for ``leaf``: its value is stored in ``results`` when applied.

    A tensor stored in slices is read box by box (only the slices each box touches); an
    unsliced one is read, and verified, once and cut into boxes from the mapping.
    """
    target = LeafTarget(leaf, tuple(reader.shape(leaf.key)), results)
    sliced = bool(reader.slices(leaf.key)) and bool(target.box_specs())
    layouts = {VARIABLE_VALUE_KEY: target.box_specs()} if sliced else None
    return RestoreItem(target, {VARIABLE_VALUE_KEY: leaf.key}, label, layouts)
