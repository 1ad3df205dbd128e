"""JAX pytrees as object graphs: containers become nodes, leaves become values.

A pytree container (dict, list, tuple, namedtuple, registered dataclass or custom node) is a
:class:`PyTreeNode` whose children are named after jax's key path entries: dict keys, sequence
indices, and attribute names of namedtuples and dataclasses (tf-checkpoint-format.md §9.3, the
names TF's tracked containers use). A namedtuple's fields are also reachable by index, as in
TF's ``_TupleWrapper`` (semantics B11), so its object graph is the one the generic containers
write. Leaves are jax arrays (:class:`~trackpoint.integrations.jax_arrays.ArrayLeaf`), numpy
arrays (``tp.Variable`` through the adapter registry), Python or numpy scalars
(:class:`~trackpoint.integrations.jax_arrays.ScalarLeaf`) and trackables; ``None`` and empty
containers hold nothing and are left out.

Unlike the generic ``DictWrapper``/``ListWrapper``, a ``PyTreeNode`` never modifies the
container it views, so the user's pytree stays a valid JAX pytree. It is a live view: each save
(and restore) looks the container's entries up again, so the training-loop pattern of rebinding
entries (``state["w"] = new_w``, JAX arrays being immutable) and views whose leaves change
(a Flax NNX ``nnx.state(model)``) save the values reachable at the moment of the call, never
those of an earlier save. Child trackables are reused while an entry holds the same object, so
identities stay stable between calls, and dropped entries release their arrays.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

from trackpoint._gc import collector_paused
from trackpoint.errors import InvalidArgumentError
from trackpoint.integrations.jax_arrays import ScalarLeaf, check_array, check_storable_dtype
from trackpoint.tracking.adapters import is_adaptable, to_trackable
from trackpoint.tracking.base import Trackable

__all__ = [
    "PyTreeNode",
    "check_leaf",
    "is_jax_pytree",
    "leaf_trackable",
    "leaves_with_names",
    "local_name",
    "readable",
    "tree_trackable",
]

_SCALARS = (bool, int, float, complex, np.generic)


def local_name(entry: Any) -> str:
    """The local name of one key path entry: dict key, index or attribute name.

    Raises:
        InvalidArgumentError: a dict key that is not a str or int (it has no stable name).
    """
    if isinstance(entry, DictKey):
        key = entry.key
        if isinstance(key, str):
            return key
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return str(int(key))
        raise InvalidArgumentError(
            f"a pytree dict key {key!r} of type {type(key).__name__} cannot name a checkpoint "
            "value; use str (or int) keys"
        )
    if isinstance(entry, SequenceKey):
        return str(entry.idx)
    if isinstance(entry, GetAttrKey):
        return str(entry.name)
    if isinstance(entry, FlattenedIndexKey):
        return str(entry.key)
    raise InvalidArgumentError(
        f"unsupported pytree key {entry!r} ({type(entry).__name__}); register the node with "
        "DictKey, SequenceKey or GetAttrKey keys (jax.tree_util.register_pytree_with_keys)"
    )


def readable(path: Sequence[Any]) -> str:
    """A key path as jax prints it, e.g. ``['params']['w']``; ``<root>`` when empty."""
    return jax.tree_util.keystr(tuple(path)) or "<root>"


def _is_leaf(value: Any) -> bool:
    # Trackables (tracked containers included) are values, not pytree structure.
    return isinstance(value, Trackable)


def _is_leaf_at(path: Any, value: Any) -> bool:
    return isinstance(value, Trackable)  # _is_leaf, in the form jax calls without a wrapper


def leaves_with_names(tree: Any) -> tuple[list[tuple[tuple[str, ...], Any, Any]], Any]:
    """Every leaf of ``tree`` with its local names from the root and its jax key path.

    Returns:
        ``([(names, key_path, leaf), ...], treedef)`` in jax's flattening order.

    Raises:
        InvalidArgumentError: jax cannot flatten ``tree``, a key cannot be named, or two
            children of one node get the same name (e.g. dict keys ``1`` and ``"1"``).
    """
    try:
        flat, treedef = jax.tree_util.tree_flatten_with_path(
            tree, is_leaf=_is_leaf_at, is_leaf_takes_path=True
        )
    except (TypeError, ValueError) as exc:  # e.g. dict keys jax cannot sort
        raise InvalidArgumentError(f"cannot flatten the pytree to checkpoint it: {exc}") from exc
    out = []
    # A trie of the names seen, each name holding the key entry that took it: two different
    # keys of one node with one name collide. jax shares the entries of a common prefix among
    # leaves, so the name of each entry is computed once (by identity, while flat holds it).
    root: dict[str, tuple[Any, dict[str, Any]]] = {}
    name_of: dict[int, str] = {}
    for path, leaf in flat:
        node = root
        names: list[str] = []
        for entry in path:
            name = name_of.get(id(entry))
            if name is None:
                name = name_of[id(entry)] = local_name(entry)
            slot = node.get(name)
            if slot is None:
                slot = node[name] = (entry, {})
            elif slot[0] is not entry and slot[0] != entry:
                depth = len(names) + 1
                other = (*path[: depth - 1], slot[0])
                raise InvalidArgumentError(
                    f"pytree keys {readable(other)} and {readable(path[:depth])} get the same "
                    f"checkpoint name {'/'.join((*names, name))!r}; rename one of them"
                )
            names.append(name)
            node = slot[1]
        out.append((tuple(names), path, leaf))
    return out, treedef


def is_jax_pytree(value: Any) -> bool:
    """True for a pytree container holding at least one ``jax.Array`` (what JAX owns).

    Such containers are tracked as :class:`PyTreeNode` instead of being wrapped in place.
    """
    try:
        leaves = jax.tree_util.tree_leaves(value, is_leaf=_is_leaf)
    except (TypeError, ValueError):  # not a pytree jax can flatten: not JAX's to claim
        return False
    return _is_container(value) and any(isinstance(leaf, jax.Array) for leaf in leaves)


def _children(tree: Any) -> Iterator[tuple[str, Any, Any]]:
    """``(local name, key entry, child)`` of one container level."""
    kind = type(tree)
    if kind is dict and all(type(key) is str for key in tree):
        # What jax does for a dict of str keys (sorted keys, DictKey entries), without a flatten.
        for key in sorted(tree):
            yield key, DictKey(key), tree[key]
        return
    if kind is list or kind is tuple:
        for index, child in enumerate(tree):
            yield str(index), SequenceKey(index), child
        return
    # Not flatten_one_level_with_keys: jax 0.10 gives every namedtuple field the first
    # field's key there. Flattening with every child as a leaf gives the right keys.
    pairs, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)
    for (entry,), child in pairs:
        yield local_name(entry), entry, child


def _has_leaves(value: Any) -> bool:
    """Whether the container ``value`` holds a leaf (plain containers: up to the first one)."""
    kind = type(value)
    if kind is dict:
        children: Any = value.values()
    elif kind is list or kind is tuple:
        children = value
    else:
        return bool(jax.tree_util.tree_leaves(value, is_leaf=_is_leaf))
    for child in children:
        if child is not None and (isinstance(child, jax.Array) or _has_leaves(child)):
            return True
    return False


def _is_container(value: Any) -> bool:
    """A pytree node (not a leaf); ``None`` counts as a leaf here."""
    kind = type(value)
    if kind is dict or kind is list or kind is tuple:
        return True
    if value is None or isinstance(value, (jax.Array, Trackable)):
        return False
    leaves = jax.tree_util.tree_leaves(value, is_leaf=_is_leaf)
    return not (len(leaves) == 1 and leaves[0] is value)


def _check_tree(tree: Any) -> None:
    """Raise if a leaf of ``tree`` cannot be saved or a key cannot name a value (names the key
    path); a jax array is checked by its dtype, once per dtype."""
    with collector_paused():  # see trackpoint._gc: a large tree's paths are many containers
        leaves, _ = leaves_with_names(tree)
        dtypes: set[Any] = set()
        for _, leaf_path, leaf in leaves:
            if isinstance(leaf, jax.Array):
                if leaf.dtype in dtypes:
                    continue
                dtypes.add(leaf.dtype)
            check_leaf(leaf, leaf_path)


class PyTreeNode(Trackable):
    """A pytree container as a node of the object graph; the container is never modified.

    The whole tree is checked when the node is made; its children are looked up again on every
    ``_trackable_children()`` call (the adapter registry makes nodes under its lock, and
    children come from the registry too), reusing a child while its entry is the same object.

    Args:
        tree: a container pytree (a leaf is not a node: see :func:`leaf_trackable`).
        path: the key path of ``tree`` in an enclosing pytree, for error messages.

    Raises:
        InvalidArgumentError: a leaf cannot be saved (names its key path and type), a key
            cannot be named, or two children get the same name.
    """

    def __init__(self, tree: Any, path: tuple[Any, ...] = ()) -> None:
        if not path:
            _check_tree(tree)
        self._tree = tree
        self._path = path
        self._children: dict[str, Trackable] | None = None
        self._lock = threading.Lock()

    @property
    def tree(self) -> Any:
        """The viewed container."""
        return self._tree

    def _trackable_children(self) -> dict[str, Trackable]:
        # docstring inherited; a live view: entries rebound since the last call are seen
        with self._lock:
            self._children = self._make_children(self._children or {})
            return dict(self._children)

    def _make_children(self, previous: dict[str, Trackable]) -> dict[str, Trackable]:
        children: dict[str, Trackable] = {}
        for name, entry, child in _children(self._tree):
            if name in children:
                raise InvalidArgumentError(
                    f"two entries of the pytree node {readable(self._path)} get the checkpoint "
                    f"name {name!r} (one is {readable((*self._path, entry))}); rename one of them"
                )
            old = previous.get(name)
            if _is_container(child):
                if _has_leaves(child):
                    children[name] = (
                        old if isinstance(old, PyTreeNode) and old._tree is child
                        else PyTreeNode(child, (*self._path, entry))
                    )
            elif child is not None:
                # An entry still holding the same object keeps its trackable: the adapter
                # the registry would return (it is alive: held here), checked when made.
                same = old is not None and (
                    old is child
                    or getattr(old, "_self_adapted_value", None) is child
                    or (isinstance(old, ScalarLeaf) and old.value is child)
                )
                children[name] = (
                    old if same and old is not None
                    else leaf_trackable(child, (*self._path, entry))
                )
        fields = getattr(type(self._tree), "_fields", None)
        if isinstance(self._tree, tuple) and fields is not None:
            # Namedtuple fields by index too (B11); the field name comes first, so it is the
            # path the checkpoint keys use.
            for index, field in enumerate(fields):
                if field in children:
                    children.setdefault(str(index), children[field])
        return children

    def __deepcopy__(self, memo: dict[int, Any]) -> PyTreeNode:
        copied = PyTreeNode.__new__(PyTreeNode)
        memo[id(self)] = copied
        copied._tree = copy.deepcopy(self._tree, memo)
        copied._path = self._path
        copied._children = None  # rebuilt from the copied tree on first use
        copied._lock = threading.Lock()
        return copied

    def __repr__(self) -> str:
        return f"<PyTreeNode {type(self._tree).__name__} at {readable(self._path)}>"


def tree_trackable(tree: Any) -> Trackable:
    """The trackable that saves ``tree``: a :class:`PyTreeNode`, or a single leaf's trackable.

    Raises:
        InvalidArgumentError: a leaf cannot be saved (names its key path).
    """
    leaves, _ = leaves_with_names(tree)  # a clear error if jax cannot flatten it
    if len(leaves) == 1 and leaves[0][2] is tree:
        return leaf_trackable(tree)
    return PyTreeNode(tree)


def check_leaf(leaf: Any, path: tuple[Any, ...] = ()) -> None:
    """Raise if ``leaf`` cannot be saved; the message names its key path.

    Raises:
        InvalidArgumentError: abstract (``jax.ShapeDtypeStruct``), an unsupported dtype, or a
            type that is neither an array, a scalar nor trackable.
    """
    where = f"the pytree leaf {readable(path)}"
    if isinstance(leaf, Trackable):
        return
    if isinstance(leaf, jax.Array):
        check_array(leaf, what=where)
    elif isinstance(leaf, np.ndarray):
        check_storable_dtype(leaf.dtype, what=where)
    elif isinstance(leaf, _SCALARS):
        ScalarLeaf(leaf, what=where)
    elif isinstance(leaf, jax.ShapeDtypeStruct):
        raise InvalidArgumentError(
            f"{where} is a jax.ShapeDtypeStruct, which has no value to save; abstract leaves "
            "are restore targets only (tp.jax.restore)"
        )
    elif not is_adaptable(leaf):
        raise InvalidArgumentError(
            f"{where} is a {type(leaf).__name__}, which cannot be saved; leaves must be jax or "
            "numpy arrays, Python/numpy scalars or trackable objects (keep other values out of "
            "the checkpointed tree)"
        )


def leaf_trackable(leaf: Any, path: tuple[Any, ...] = ()) -> Trackable:
    """The trackable saving one pytree leaf (its registered adapter, or a ``ScalarLeaf``).

    Raises:
        InvalidArgumentError: as :func:`check_leaf`.
    """
    if isinstance(leaf, jax.Array):  # checked once, by its adapter; the message names path
        try:
            trackable = to_trackable(leaf)
        except InvalidArgumentError:
            check_leaf(leaf, path)
            raise
        assert trackable is not None  # jax arrays have an adapter
        return trackable
    check_leaf(leaf, path)
    if isinstance(leaf, _SCALARS) and not isinstance(leaf, Trackable):
        return ScalarLeaf(leaf, what=f"the pytree leaf {readable(path)}")
    trackable = to_trackable(leaf)
    assert trackable is not None  # check_leaf accepted it
    return trackable
