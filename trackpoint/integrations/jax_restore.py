"""``restore``: read a checkpoint into a new pytree shaped, typed and sharded like a target.

The target's leaves are matched to the checkpoint's object graph by local names from the root
(dict keys, indices, field names: the names :class:`PyTreeNode` writes, and the names TF's
tracked containers write), the way ``Checkpoint.restore`` matches objects
(tf-checkpoint-format.md §9.4). Every check runs before any value is read: the structure
(missing and extra values), then each leaf's shape and dtype (no casting).

Targets may be abstract (``jax.ShapeDtypeStruct`` leaves, typed PRNG keys included, as
``jax.eval_shape`` and ``nnx.eval_shape`` make them). A key's implementation comes from the
target and is checked against the one the checkpoint records (``jax_metadata.py``) before
anything is read; a jax leaf takes the target's ``weak_type``, as it takes its dtype and
sharding. Without a target the saved tree itself is rebuilt (``jax_saved_tree.py``).

Values are read through the one restore engine (trackpoint/saving/restore.py): the leaves
read whole as one ``RestoreBatch`` of
:class:`~trackpoint.integrations.jax_leaf_targets.LeafTarget` s (a leaf stored in slices as an
item of its own); every value is read and its crc32c verified before any leaf is built, each
jax leaf on the target's sharding. The storage is picked once, from ``options.storage`` or the
path (``resolve_location``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from trackpoint._gc import collector_paused
from trackpoint._types import PathLike
from trackpoint.bundle.reader import BundleReader
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.keys import SAVE_COUNTER, checkpoint_key, escape_local_name
from trackpoint.integrations.jax_leaf_targets import LeafReads, LeafSpec
from trackpoint.integrations.jax_metadata import (
    JAX_METADATA,
    decode_metadata,
    is_key_array,
    key_data_spec,
    key_impl_name,
)
from trackpoint.integrations.jax_pytrees import leaves_with_names, readable
from trackpoint.integrations.jax_saved_tree import restore_saved_tree
from trackpoint.management.paths import resolve_location
from trackpoint.management.reader import CheckpointReader
from trackpoint.saving.options import CheckpointOptions
from trackpoint.saving.restore import restore_items
from trackpoint.tracking.base import VARIABLE_VALUE_KEY

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


def _expected_key(names: Sequence[str]) -> str:
    return checkpoint_key("/".join(escape_local_name(n) for n in names), VARIABLE_VALUE_KEY)


def _shown(items: list[str]) -> str:
    more = f", … ({len(items) - _SHOW_AT_MOST} more)" if len(items) > _SHOW_AT_MOST else ""
    return ", ".join(items[:_SHOW_AT_MOST]) + more


def _match(
    reader: CheckpointReader, target: Any, prefix: str
) -> tuple[list[LeafSpec], list[LeafSpec], list[str], Any]:
    """Target leaves found in the checkpoint, those missing, unused checkpoint keys, treedef."""
    proto = reader.object_graph()
    if proto is None or not proto.nodes:
        raise InvalidArgumentError(
            f"the checkpoint {prefix} has no object graph (a name-based checkpoint); read its "
            "values by key with tp.load_checkpoint() instead",
            path=prefix,
        )
    # One pass over the graph: each node's children by local name, and the checkpoint keys of
    # its value, its jax metadata and its first attribute (protobuf access is the cost here).
    children: list[dict[str, int]] = []
    attributes: list[tuple[str | None, str | None, str | None]] = []
    for node in proto.nodes:
        edges: dict[str, int] = {}
        for child in node.children:
            edges.setdefault(child.local_name, child.node_id)
        children.append(edges)
        key = metadata_key = first = None
        for attribute in node.attributes:
            name, checkpoint_key = attribute.name, attribute.checkpoint_key
            if first is None:
                first = checkpoint_key
            if name == VARIABLE_VALUE_KEY:
                key = checkpoint_key
            elif name == JAX_METADATA:
                metadata_key = checkpoint_key
        attributes.append((key, metadata_key, first))
    count = len(children)
    leaves, treedef = leaves_with_names(target)
    found: list[LeafSpec] = []
    missing: list[LeafSpec] = []
    used_nodes: set[int] = set()
    has_tensor = reader.has_tensor
    for position, (names, path, leaf) in enumerate(leaves):
        node_id: int | None = 0
        for name in names:
            node_id = children[node_id].get(name) if node_id is not None else None
            if node_id is not None and not 0 <= node_id < count:
                node_id = None  # a dangling reference: nothing there
        key = metadata_key = None
        if node_id is not None:
            key, metadata_key, _ = attributes[node_id]
        if key is None or not has_tensor(key):
            missing.append(LeafSpec(position, path, leaf, key or _expected_key(names)))
        else:
            assert node_id is not None
            used_nodes.add(node_id)
            found.append(LeafSpec(position, path, leaf, key, metadata_key))
    ignored = set(used_nodes)
    if all(names[:1] != (SAVE_COUNTER,) for names, _, _ in leaves):
        # Checkpoint.save() bookkeeping, not program state (as the load status treats it).
        counter = children[0].get(SAVE_COUNTER)
        if counter is not None:
            ignored.add(counter)
    unused = sorted(
        first
        for node_id, (_, _, first) in enumerate(attributes)
        if first is not None and node_id not in ignored
    )
    return found, missing, unused, treedef


def _target_spec(leaf: LeafSpec) -> tuple[tuple[int, ...], frozenset[np.dtype[Any]]]:
    """Shape and the dtypes the checkpoint may hold for ``leaf`` (one, except for Python
    scalars)."""
    target = leaf.target
    if isinstance(target, (jax.Array, jax.ShapeDtypeStruct)):
        if is_key_array(target):  # concrete or abstract: the key_data is stored
            data = key_data_spec(target)
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


def _check(reader: BundleReader, leaves: list[LeafSpec], prefix: str) -> list[LeafSpec]:
    """Every leaf's stored shape and dtype equal the target's; one error lists all that differ.

    Returns:
        The leaves with what to build resolved: a key target's implementation (checked against
        the recorded one), a jax target's ``weak_type``.
    """
    problems: list[tuple[LeafSpec, str]] = []
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
    return _resolve(reader, leaves, prefix)


def _resolve(reader: BundleReader, leaves: list[LeafSpec], prefix: str) -> list[LeafSpec]:
    """``leaves`` with ``prng_impl``/``weak_type`` set from their targets; the error lists every
    key target whose implementation differs from the recorded one."""
    resolved: list[LeafSpec] = []
    problems: list[tuple[LeafSpec, str]] = []
    for leaf in leaves:
        target = leaf.target
        if not isinstance(target, (jax.Array, jax.ShapeDtypeStruct)):
            resolved.append(leaf)
            continue
        if not is_key_array(target):
            weak = bool(getattr(target, "weak_type", False))
            resolved.append(dataclasses.replace(leaf, weak_type=True) if weak else leaf)
            continue
        impl = key_impl_name(target)
        if leaf.metadata_key is not None:  # earlier checkpoints record none: the target decides
            saved = decode_metadata(
                reader.read(leaf.metadata_key), prefix=prefix, key=leaf.metadata_key
            ).prng_impl
            if saved != impl:
                stored = f"PRNG keys of implementation {saved!r}" if saved else "no PRNG keys"
                problems.append((leaf, (
                    f"{readable(leaf.path)} ({leaf.key}): the checkpoint holds {stored}, the "
                    f"target is {target.dtype} ({impl!r})"
                )))
        resolved.append(dataclasses.replace(leaf, prng_impl=impl))
    if problems:
        raise InvalidArgumentError(
            f"cannot restore from {prefix}: {len(problems)} PRNG key leaves differ in "
            f"implementation: {_shown([text for _, text in problems])}. Keys are not converted "
            "between implementations; build the target with the saved one (e.g. "
            "jax.random.key(0, impl='rbg')), or restore the raw key data with a uint32 target",
            path=prefix,
            key=problems[0][0].key,
        )
    return resolved


def restore(
    path: PathLike,
    target: Any = None,
    *,
    partial: bool = False,
    options: CheckpointOptions | None = None,
) -> Any:
    """Read the checkpoint ``path`` into a new pytree with the structure of ``target``.

    JAX arrays are immutable, so nothing is restored in place: every leaf of the result is a
    new value with the target leaf's shape and dtype, and jax leaves are placed on the target
    leaf's sharding (any sharding: the checkpoint's own layout does not matter) with its
    ``weak_type``. Targets may be abstract: ``jax.ShapeDtypeStruct`` leaves (with a
    ``sharding``, or the default device), typed PRNG keys among them, allocate nothing before
    the read, so the Flax pattern ``nnx.split(nnx.eval_shape(make_model))`` gives a target.
    numpy leaves come back as new numpy arrays, Python scalars as the same Python type. A key
    leaf is rebuilt with the target's implementation, which must be the recorded one.

    Without a target (``restore(path)``) the saved tree itself is returned: nested dicts and
    lists rebuilt from the object graph, jax arrays on the default device (see
    :func:`~trackpoint.integrations.jax_saved_tree.restore_saved_tree` for the details).

    A checkpoint written by ``tp.Checkpoint(params=p, opt_state=o)`` (``write`` or ``save``) is
    restored with the target ``{"params": p, "opt_state": o}``: the dict keys play the part of
    the keyword arguments, and its ``save_counter`` is ignored. ``tp.jax.write(prefix, tree)``
    pairs with ``restore(prefix, tree)``.

    Args:
        path: a checkpoint prefix, or a directory (its latest checkpoint).
        target: the pytree to mirror, or None for the saved tree.
        partial: restore what matches. Checkpoint values the target lacks are ignored; target
            leaves the checkpoint lacks keep their target value (abstract ones are an error).
            Off (the default), both are an error, like ``assert_consumed()``. Without a
            target everything is restored.
        options: ``storage`` is the backend to read through (by default chosen from
            ``path``); the other options concern saving (values are read through the one
            restore engine, which verifies every value before any leaf is built).

    Returns:
        A pytree of the same structure (same container types) as ``target``.

    Raises:
        NotFoundError: no checkpoint at ``path``.
        InvalidArgumentError: the checkpoint and ``target`` do not match: leaves missing or
            extra (listed, with their key paths and checkpoint keys), or shapes/dtypes differ
            (listed), PRNG key implementations differ (listed); a target leaf of an
            unsupported type. Raised before any value is read.
        DataLossError: the files are damaged.

    Example:
        >>> state = tp.jax.restore("/ckpts/run-3", {"params": params, "opt_state": opt_state})
        >>> params, opt_state = state["params"], state["opt_state"]
    """
    storage = CheckpointOptions.resolve(options).storage  # refuses anything but options/None
    location = resolve_location(path, storage=storage)
    prefix = location.prefix
    # collector_paused: see trackpoint._gc (a restore of many leaves allocates many containers)
    with collector_paused(), CheckpointReader(prefix, storage=location.storage) as reader:
        if target is None:
            return restore_saved_tree(reader, prefix)
        found, missing, unused, treedef = _match(reader, target, prefix)
        abstract = [leaf for leaf in missing if isinstance(leaf.target, jax.ShapeDtypeStruct)]
        if (missing or unused) and (not partial or abstract):
            _raise_mismatch(prefix, missing, unused, abstract if partial else None)
        bundle = reader.bundle
        found = _check(bundle, found, prefix)
        values: list[Any] = [None] * (len(found) + len(missing))
        for leaf in missing:
            values[leaf.position] = leaf.target
        reads = LeafReads(bundle, values, readable)
        for leaf in found:
            reads.add(leaf)
        # The one restore engine: every value read and verified, then the leaves built.
        restore_items(reads.items, bundle, prefix=prefix, batches=reads.batches())
    return jax.tree_util.tree_unflatten(treedef, values)


def _raise_mismatch(
    prefix: str, missing: list[LeafSpec], unused: list[str], abstract: list[LeafSpec] | None
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
