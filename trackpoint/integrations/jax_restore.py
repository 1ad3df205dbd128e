"""``restore``: read a checkpoint into a new pytree shaped, typed and sharded like a target.

The target's leaves are matched to the checkpoint's object graph by local names from the root
(dict keys, indices, field names: the names :class:`PyTreeNode` writes, and the names TF's
tracked containers write), the way ``Checkpoint.restore`` matches objects
(tf-checkpoint-format.md §9.4). Every check runs before any value is read: the structure
(missing and extra values), then each leaf's shape and dtype (no casting).

Values are read through the one restore engine (trackpoint/saving/restore.py): every value is
read and its crc32c verified before any leaf is built. Each jax leaf is rebuilt on the target's
sharding: one box per distinct shard index (for a checkpoint that stores the tensor in slices,
each box is read with ``BundleReader.read_slice``, which touches only the stored slices that
intersect it, so a sharded checkpoint is resharded without reading everything on every device),
put on each device that holds that index, and assembled with
``jax.make_array_from_single_device_arrays``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from trackpoint._types import PathLike
from trackpoint.bundle.reader import BundleReader
from trackpoint.bundle.slice_spec import TensorSlice, format_slice_spec
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.keys import SAVE_COUNTER, checkpoint_key, escape_local_name
from trackpoint.integrations.jax_arrays import index_bounds, is_key_array
from trackpoint.integrations.jax_pytrees import leaves_with_names, readable
from trackpoint.management.paths import resolve_prefix
from trackpoint.management.reader import CheckpointReader
from trackpoint.saving.options import CheckpointOptions
from trackpoint.saving.restore import RestoreItem, restore_items
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable

__all__ = ["restore"]

_SHOW_AT_MOST = 10
# Stored dtypes a Python scalar target accepts (np.asarray stores int as int64, float as
# float64; TF and other writers may use narrower types of the same kind).
_PY_SCALAR_DTYPES: dict[type, frozenset[np.dtype[Any]]] = {
    bool: frozenset({np.dtype(np.bool_)}),
    int: frozenset(np.dtype(t) for t in "bBhHiIlLqQ"),
    float: frozenset(np.dtype(t) for t in "efd"),
    complex: frozenset(np.dtype(t) for t in "FD"),
}


@dataclass(frozen=True, slots=True)
class _Leaf:
    """One target leaf and where the checkpoint keeps its value."""

    position: int
    """Index in the flattened target."""
    path: tuple[Any, ...]
    """jax key path, for messages."""
    target: Any
    key: str
    """Checkpoint key of its ``VARIABLE_VALUE`` (the expected key if missing)."""


def _expected_key(names: Sequence[str]) -> str:
    return checkpoint_key("/".join(escape_local_name(n) for n in names), VARIABLE_VALUE_KEY)


def _shown(items: list[str]) -> str:
    more = f", … ({len(items) - _SHOW_AT_MOST} more)" if len(items) > _SHOW_AT_MOST else ""
    return ", ".join(items[:_SHOW_AT_MOST]) + more


def _match(
    reader: CheckpointReader, target: Any, prefix: str
) -> tuple[list[_Leaf], list[_Leaf], list[str], Any]:
    """Target leaves found in the checkpoint, those missing, unused checkpoint keys, treedef."""
    proto = reader.object_graph()
    if proto is None or not proto.nodes:
        raise InvalidArgumentError(
            f"the checkpoint {prefix} has no object graph (a name-based checkpoint); read its "
            "values by key with tp.load_checkpoint() instead",
            path=prefix,
        )
    children: list[dict[str, int]] = []
    for node in proto.nodes:
        edges: dict[str, int] = {}
        for child in node.children:
            edges.setdefault(child.local_name, child.node_id)
        children.append(edges)
    leaves, treedef = leaves_with_names(target)
    found: list[_Leaf] = []
    missing: list[_Leaf] = []
    used_nodes: set[int] = set()
    for position, (names, path, leaf) in enumerate(leaves):
        node_id: int | None = 0
        for name in names:
            node_id = children[node_id].get(name) if node_id is not None else None
        key = None
        if node_id is not None and 0 <= node_id < len(proto.nodes):
            for attribute in proto.nodes[node_id].attributes:
                if attribute.name == VARIABLE_VALUE_KEY:
                    key = attribute.checkpoint_key
        if key is None or not reader.has_tensor(key):
            missing.append(_Leaf(position, path, leaf, key or _expected_key(names)))
        else:
            assert node_id is not None
            used_nodes.add(node_id)
            found.append(_Leaf(position, path, leaf, key))
    ignored = set(used_nodes)
    if all(names[:1] != (SAVE_COUNTER,) for names, _, _ in leaves):
        # Checkpoint.save() bookkeeping, not program state (as the load status treats it).
        counter = children[0].get(SAVE_COUNTER)
        if counter is not None:
            ignored.add(counter)
    unused = sorted(
        node.attributes[0].checkpoint_key
        for node_id, node in enumerate(proto.nodes)
        if node.attributes and node_id not in ignored
    )
    return found, missing, unused, treedef


def _target_spec(leaf: _Leaf) -> tuple[tuple[int, ...], frozenset[np.dtype[Any]]]:
    """Shape and the dtypes the checkpoint may hold for ``leaf`` (one, except for Python
    scalars)."""
    target = leaf.target
    if isinstance(target, (jax.Array, jax.ShapeDtypeStruct)):
        if isinstance(target, jax.ShapeDtypeStruct) and is_key_array(target):
            raise InvalidArgumentError(
                f"the target leaf {readable(leaf.path)} is an abstract PRNG key; pass a "
                "concrete key array (e.g. jax.random.key(0)) so its implementation is known"
            )
        if isinstance(target, jax.Array) and is_key_array(target):
            data = jax.eval_shape(jax.random.key_data, target)
            return tuple(data.shape), frozenset({np.dtype(data.dtype)})
        return tuple(target.shape), frozenset({np.dtype(target.dtype)})
    if isinstance(target, (np.ndarray, np.generic)):
        return tuple(target.shape), frozenset({target.dtype})
    dtypes = _PY_SCALAR_DTYPES.get(type(target))
    if dtypes is not None:
        return (), dtypes
    raise InvalidArgumentError(
        f"the target leaf {readable(leaf.path)} is a {type(target).__name__}; restore targets "
        "are jax arrays, jax.ShapeDtypeStruct, numpy arrays or Python/numpy scalars"
    )


def _check(reader: BundleReader, leaves: list[_Leaf], prefix: str) -> None:
    """Every leaf's stored shape and dtype equal the target's; one error lists all that differ."""
    problems: list[tuple[_Leaf, str]] = []
    for leaf in leaves:
        shape, dtypes = _target_spec(leaf)
        stored_shape, stored_dtype = tuple(reader.shape(leaf.key)), reader.dtype(leaf.key)
        if stored_shape != shape or stored_dtype not in dtypes:
            wanted = (
                f"{next(iter(dtypes))}{list(shape)}" if len(dtypes) == 1
                else f"a Python {type(leaf.target).__name__}"
            )
            problems.append((leaf, (
                f"{readable(leaf.path)} ({leaf.key}): the checkpoint holds "
                f"{stored_dtype}{list(stored_shape)}, the target is {wanted}"
            )))
    if problems:
        raise InvalidArgumentError(
            f"cannot restore from {prefix}: {len(problems)} leaves differ in shape or dtype: "
            f"{_shown([text for _, text in problems])}. trackpoint does not cast or reshape on "
            "restore; build the target with the saved shapes and dtypes (tp.list_variables "
            "shows them), or cast after restoring",
            path=prefix,
            key=problems[0][0].key,
        )


def _default_sharding() -> jax.sharding.Sharding:
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


class _LeafTarget(Trackable):
    """One leaf of the result, as the restore engine sees it.

    The engine reads and verifies the leaf's value (or, for a checkpoint that stores the tensor
    in slices, one box per distinct shard index of the target's sharding); ``_prepare_restore``
    builds the new leaf from the verified bytes, and its apply step stores it in the result.
    """

    def __init__(self, leaf: _Leaf, shape: tuple[int, ...], results: list[Any]) -> None:
        self._leaf = leaf
        self._shape = shape
        self._results = results
        self._boxes: dict[tuple[tuple[int, int], ...], list[Any]] = {}
        target = leaf.target
        if isinstance(target, (jax.Array, jax.ShapeDtypeStruct)) and not is_key_array(target):
            sharding = target.sharding if target.sharding is not None else _default_sharding()
            for device, index in sharding.addressable_devices_indices_map(shape).items():
                bounds = (
                    index_bounds(index, shape) if index is not None
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
        target = self._leaf.target
        if not isinstance(target, (jax.Array, jax.ShapeDtypeStruct)):
            value = np.array(saved, copy=True)
            if isinstance(target, np.ndarray):
                return value
            if isinstance(target, np.generic):
                return value[()]
            return type(target)(value[()])
        sharding = target.sharding if target.sharding is not None else _default_sharding()
        if is_key_array(target):
            assert isinstance(target, jax.Array)  # abstract key targets are refused by _check
            data = jax.numpy.asarray(np.array(saved, copy=True))
            keys = jax.random.wrap_key_data(data, impl=jax.random.key_impl(target))
            return jax.device_put(keys, sharding)
        memory_kind = getattr(sharding, "memory_kind", None)
        arrays = []
        for bounds, devices in self._boxes.items():
            piece = self._box(saved, bounds)
            for device in devices:
                placement = jax.sharding.SingleDeviceSharding(device, memory_kind=memory_kind)
                arrays.append(jax.device_put(piece, placement))
        return jax.make_array_from_single_device_arrays(self._shape, sharding, arrays)


def restore(
    path: PathLike,
    target: Any,
    *,
    partial: bool = False,
    options: CheckpointOptions | None = None,
) -> Any:
    """Read the checkpoint ``path`` into a new pytree with the structure of ``target``.

    JAX arrays are immutable, so nothing is restored in place: every leaf of the result is a
    new value with the target leaf's shape and dtype, and jax leaves are placed on the target
    leaf's sharding (any sharding: the checkpoint's own layout does not matter). Targets may be
    abstract: a ``jax.ShapeDtypeStruct`` (with a ``sharding``, or the default device) allocates
    nothing before the read. numpy leaves come back as new numpy arrays, Python scalars as the
    same Python type.

    A checkpoint written by ``tp.Checkpoint(params=p, opt_state=o)`` (``write`` or ``save``) is
    restored with the target ``{"params": p, "opt_state": o}``: the dict keys play the part of
    the keyword arguments, and its ``save_counter`` is ignored. ``tp.jax.write(prefix, tree)``
    pairs with ``restore(prefix, tree)``.

    Args:
        path: a checkpoint prefix, or a directory (its latest checkpoint).
        target: the pytree to mirror.
        partial: restore what matches. Checkpoint values the target lacks are ignored; target
            leaves the checkpoint lacks keep their target value (abstract ones are an error).
            Off (the default), both are an error, like ``assert_consumed()``.
        options: accepted for symmetry with ``Checkpoint.read`` (values are read through the
            one restore engine, which verifies every value before any leaf is built).

    Returns:
        A pytree of the same structure (same container types) as ``target``.

    Raises:
        NotFoundError: no checkpoint at ``path``.
        InvalidArgumentError: the checkpoint and ``target`` do not match: leaves missing or
            extra (listed, with their key paths and checkpoint keys), or shapes/dtypes differ
            (listed); a target leaf of an unsupported type. Raised before anything is read.
        DataLossError: the files are damaged.

    Example:
        >>> state = tp.jax.restore("/ckpts/run-3", {"params": params, "opt_state": opt_state})
        >>> params, opt_state = state["params"], state["opt_state"]
    """
    CheckpointOptions.resolve(options)  # refuses anything but options or None
    prefix = resolve_prefix(path)
    with CheckpointReader(prefix) as reader:
        found, missing, unused, treedef = _match(reader, target, prefix)
        abstract = [leaf for leaf in missing if isinstance(leaf.target, jax.ShapeDtypeStruct)]
        if (missing or unused) and (not partial or abstract):
            _raise_mismatch(prefix, missing, unused, abstract if partial else None)
        bundle = reader.bundle
        _check(bundle, found, prefix)
        values: list[Any] = [None] * (len(found) + len(missing))
        for leaf in missing:
            values[leaf.position] = leaf.target
        items = []
        for leaf in found:
            target = _LeafTarget(leaf, tuple(bundle.shape(leaf.key)), values)
            # A tensor stored in slices is read box by box (only the slices each box touches);
            # an unsliced one is read, and verified, once and cut into boxes from the mapping.
            sliced = bool(bundle.slices(leaf.key)) and bool(target.box_specs())
            layouts = {VARIABLE_VALUE_KEY: target.box_specs()} if sliced else None
            items.append(RestoreItem(target, {VARIABLE_VALUE_KEY: leaf.key}, readable(leaf.path),
                                     layouts))
        # The one restore engine: every value read and verified, then the leaves built.
        restore_items(items, bundle, prefix=prefix)
    return jax.tree_util.tree_unflatten(treedef, values)


def _raise_mismatch(
    prefix: str, missing: list[_Leaf], unused: list[str], abstract: list[_Leaf] | None
) -> None:
    if abstract is not None:
        raise InvalidArgumentError(
            f"cannot restore from {prefix} with partial=True: {len(abstract)} abstract target "
            "leaves (jax.ShapeDtypeStruct) are not in the checkpoint and have no value to keep: "
            f"{_shown([f'{readable(x.path)} ({x.key})' for x in abstract])}",
            path=prefix,
        )
    parts = []
    if missing:
        parts.append(
            f"{len(missing)} target leaves are not in the checkpoint: "
            f"{_shown([f'{readable(x.path)} ({x.key})' for x in missing])}"
        )
    if unused:
        parts.append(f"{len(unused)} checkpoint values are not in the target: {_shown(unused)}")
    raise InvalidArgumentError(
        f"the checkpoint {prefix} does not match the target pytree: {'; '.join(parts)}. Make "
        "the target's structure match the saved one (dict keys, list positions and field "
        "names name the values), or pass partial=True to restore only what matches",
        path=prefix,
        key=missing[0].key if missing else None,
    )
