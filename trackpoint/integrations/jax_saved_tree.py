"""``tp.jax.restore(path)`` without a target: the saved tree, rebuilt from the object graph.

The object graph (tf-checkpoint-format.md §9) names every node by its local names from the
root, so the nesting of a saved pytree can be rebuilt without knowing the program that wrote
it, as Orbax returns a saved pytree without a target:

* a node with children becomes a dict by local name, or a list when its children are named
  exactly ``"0"``, ``"1"``, … (a saved list or tuple; also a dict whose keys were ``0, 1, …``:
  the graph does not tell them apart). A namedtuple's or ``_TupleWrapper``'s index aliases of
  its named fields (semantics B11) are dropped: it becomes a dict by field name, as does a
  dataclass. Objects that are not containers (a torch module, a Keras layer, a
  ``tp.AutoTrackable``) become dicts by local name too;
* a node holding only ``VARIABLE_VALUE`` is that value: a jax array on the default device
  (a PRNG key of the recorded implementation, weakly typed if it was saved so:
  ``jax_metadata.py``). A value whose dtype JAX cannot hold as is (64-bit types unless
  ``jax_enable_x64`` is on) comes back as a numpy array, a string tensor as a numpy object
  array (``bytes`` for a scalar);
* plain Python values of tracked containers (the JSON ``py_state`` written by
  ``tracking/plain_values.py``) come back as Python values, merged into their container (a
  list's by index); a ``PythonState`` object's JSON is decoded the same way (bytes that are
  not trackpoint's JSON are returned as they are);
* other attributes of an object join its dict under their value names; an optimizer's slot
  variables join the optimizer's dict as ``{".OPTIMIZER_SLOT": {variable path: {slot name:
  value}}}``, the variable path spelled as in checkpoint keys;
* objects with nothing saved are left out of dicts (``None`` in lists); ``save_counter``
  (``Checkpoint.save`` bookkeeping) is left out; objects of registered savers keep their state
  in their own files and are left out with a warning.

Every value is read through the one restore engine, verified before anything is built.
"""

from __future__ import annotations

import collections
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from trackpoint.bundle.reader import BundleReader
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.keys import (
    OPTIMIZER_SLOTS_NAME,
    SAVE_COUNTER,
    escape_local_name,
    unescape_local_name,
)
from trackpoint.integrations.jax_leaf_targets import (
    LeafReads,
    LeafSpec,
    abstract_array,
    default_sharding,
)
from trackpoint.integrations.jax_metadata import JAX_METADATA, ArrayMetadata, decode_metadata
from trackpoint.management.reader import CheckpointReader
from trackpoint.saving.restore import RestoreItem, restore_items
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable
from trackpoint.tracking.plain_values import decode_plain
from trackpoint.tracking.python_state import PYTHON_STATE, bytes_of

__all__ = ["restore_saved_tree"]

logger = logging.getLogger(__name__)

_VALUE = "value"
"""The own value name of a :class:`_ValueTarget` (any name: the engine maps it to the key)."""


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where a value read by the engine lands in the results list."""

    index: int


@dataclass(slots=True)
class _Node:
    """A node that becomes a dict or a list once its values are read."""

    names: list[str]
    """Local names of every child edge (aliases dropped), the empty children's included."""
    entries: dict[str, Any] = field(default_factory=dict)
    """Local name -> the child's skeleton, for children with something saved."""
    attributes: dict[str, _Slot] = field(default_factory=dict)
    """Own values other than plain state, by value name."""
    plain: _Slot | None = None
    """The decoded ``py_state`` (plain values of a container)."""
    slots: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Slot variables of an optimizer: variable path -> slot name -> skeleton."""


class _ValueTarget(Trackable):
    """A value the engine reads that is not an array for JAX: plain state or strings."""

    def __init__(self, index: int, results: list[Any], *, plain: bool, what: str) -> None:
        self._index = index
        self._results = results
        self._plain = plain
        self._what = what

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited: decodes or copies; nothing of the program changes
        saved = restored_tensors[_VALUE]
        value: Any
        if isinstance(saved, np.ndarray) and saved.shape == () and saved.dtype == object:
            value = bytes_of(saved)
            if self._plain:
                try:
                    value = decode_plain(value, what=self._what)
                except InvalidArgumentError:  # a PythonState's own bytes: returned as they are
                    pass
        else:
            value = np.array(saved, copy=True)
        return functools.partial(self._results.__setitem__, self._index, value)


def _jax_holds(dtype: np.dtype[Any]) -> bool:
    """True if a jax array can hold ``dtype`` unchanged (64-bit types need x64; no strings)."""
    if dtype.kind in "OSUa":
        return False
    try:
        return bool(jax.dtypes.canonicalize_dtype(dtype) == dtype)
    except (TypeError, ValueError):
        return False


def _is_index(name: str) -> bool:
    return name.isascii() and name.isdigit()


def _label(path: tuple[str, ...]) -> str:
    return "".join(f"[{name!r}]" for name in path) or "<root>"


class _Planner:
    """Walks the object graph from the root: a skeleton of the result and the engine's items."""

    def __init__(self, reader: CheckpointReader, prefix: str) -> None:
        proto = reader.object_graph()
        if proto is None or not proto.nodes:
            raise InvalidArgumentError(
                f"the checkpoint {prefix} has no object graph (a name-based checkpoint), so "
                "its tree cannot be rebuilt; read its values by key with tp.load_checkpoint()",
                path=prefix,
            )
        self._nodes = proto.nodes
        self._bundle: BundleReader = reader.bundle
        self._prefix = prefix
        self.items: list[RestoreItem] = []
        self.results: list[Any] = []
        self.leaves = LeafReads(self._bundle, self.results, _label)
        """The array values, read as one batch (those stored in slices as items)."""
        self._built: dict[int, Any] = {}
        self._active: set[int] = set()
        self._paths: dict[int, str] | None = None

    def _slot_for(self, key: str, path: tuple[str, ...], metadata_key: str | None) -> _Slot:
        index = len(self.results)
        self.results.append(None)
        slot = _Slot(index)
        bundle = self._bundle
        dtype = bundle.dtype(key)
        if dtype.kind == "O":
            self.items.append(RestoreItem(
                _ValueTarget(index, self.results, plain=False, what=key), {_VALUE: key},
                _label(path),
            ))  # fmt: skip
            return slot
        shape = tuple(bundle.shape(key))
        metadata = (
            decode_metadata(bundle.read(metadata_key), prefix=self._prefix, key=metadata_key)
            if metadata_key is not None
            else ArrayMetadata()
        )
        template: Any
        if not _jax_holds(dtype):
            template = np.broadcast_to(np.zeros((), dtype), shape)  # numpy back, no allocation
        else:
            template = abstract_array(shape, dtype, default_sharding())
        if metadata.prng_impl is not None:
            self._check_key(metadata.prng_impl, template, key, path)
        leaf = LeafSpec(
            index,
            path,
            template,
            key,
            metadata_key,
            prng_impl=metadata.prng_impl,
            weak_type=metadata.weak_type,
        )
        self.leaves.add(leaf, shape)
        return slot

    def _check_key(self, impl: str, data: Any, key: str, path: tuple[str, ...]) -> None:
        try:
            jax.eval_shape(functools.partial(jax.random.wrap_key_data, impl=impl), data)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"{_label(path)} ({key}) in {self._prefix} was saved as PRNG keys of "
                f"implementation {impl!r}, which this JAX cannot rebuild from "
                f"{data.dtype}{list(data.shape)} ({exc}); restore it with a target "
                "(jax.random.key(0, impl=...) or a uint32 array for the raw key data)",
                path=self._prefix,
                key=key,
            ) from exc

    def _plain_slot(self, key: str, path: tuple[str, ...]) -> _Slot:
        index = len(self.results)
        self.results.append(None)
        self.items.append(RestoreItem(
            _ValueTarget(index, self.results, plain=True, what=f"{key} in {self._prefix}"),
            {_VALUE: key}, _label(path),
        ))  # fmt: skip
        return _Slot(index)

    def _edges(self, node_id: int) -> list[tuple[str, int]]:
        """Child edges; a namedtuple's index aliases of its named fields are dropped."""
        edges = [(child.local_name, child.node_id) for child in self._nodes[node_id].children]
        if node_id == 0:
            edges = [(name, child) for name, child in edges if name != SAVE_COUNTER]
        named = {child for name, child in edges if not _is_index(name)}
        indexed = [(name, child) for name, child in edges if _is_index(name)]
        if indexed and named and all(child in named for _, child in indexed):
            edges = [(name, child) for name, child in edges if not _is_index(name)]
        return edges

    def plan(self, node_id: int, path: tuple[str, ...]) -> Any:
        """The skeleton of node ``node_id`` (None: nothing saved there)."""
        if node_id in self._built:
            return self._built[node_id]  # an object reached twice is one value
        if node_id in self._active or not 0 <= node_id < len(self._nodes):
            return None  # a cycle back to an enclosing object, or a dangling reference
        node = self._nodes[node_id]
        if node.registered_saver.name:
            logger.warning(
                "tp.jax.restore without a target leaves out %s: registered saver %r keeps its "
                "state in its own files",
                _label(path),
                node.registered_saver.name,
            )
            return None
        self._active.add(node_id)
        try:
            built = self._plan_node(node_id, path)
        finally:
            self._active.discard(node_id)
        self._built[node_id] = built
        return built

    def _plan_node(self, node_id: int, path: tuple[str, ...]) -> Any:
        node = self._nodes[node_id]
        attributes = {unescape_local_name(a.name): a.checkpoint_key for a in node.attributes}
        value_key = attributes.pop(VARIABLE_VALUE_KEY, None)
        metadata_key = attributes.pop(JAX_METADATA, None) if value_key is not None else None
        plain_key = attributes.pop(PYTHON_STATE, None)
        edges = self._edges(node_id)
        if not edges and not attributes and not node.slot_variables:
            if value_key is not None and plain_key is None:
                return self._slot_for(value_key, path, metadata_key)
            if plain_key is not None and value_key is None:
                return self._plain_slot(plain_key, path)
        built = _Node(names=[name for name, _ in edges])
        for name, child_id in edges:
            child = self.plan(child_id, (*path, name))
            if child is not None:
                built.entries[name] = child
        if value_key is not None:
            built.attributes[VARIABLE_VALUE_KEY] = self._slot_for(value_key, path, metadata_key)
        for name, key in attributes.items():
            built.attributes[name] = self._slot_for(key, (*path, name), None)
        if plain_key is not None:
            built.plain = self._plain_slot(plain_key, path)
        for slot in node.slot_variables:
            variable = self._path_of(slot.original_variable_node_id)
            value = self.plan(
                slot.slot_variable_node_id, (*path, OPTIMIZER_SLOTS_NAME, variable, slot.slot_name)
            )
            if value is not None:
                built.slots.setdefault(variable, {})[slot.slot_name] = value
        if not (built.entries or built.attributes or built.plain or built.slots):
            return None
        return built

    def _path_of(self, node_id: int) -> str:
        """A node's object path as checkpoint keys spell it (first path from the root)."""
        if self._paths is None:
            paths: dict[int, str] = {0: ""}
            queue = collections.deque([0])
            while queue:
                parent = queue.popleft()
                for child in self._nodes[parent].children:
                    if child.node_id not in paths and 0 <= child.node_id < len(self._nodes):
                        name = escape_local_name(child.local_name)
                        paths[child.node_id] = f"{paths[parent]}/{name}" if parent else name
                        queue.append(child.node_id)
            self._paths = paths
        return self._paths.get(node_id, f"<node {node_id}>")


def _fill(skeleton: Any, results: list[Any], memo: dict[int, Any]) -> Any:
    """The value of ``skeleton`` once ``results`` hold every value read."""
    if isinstance(skeleton, _Slot):
        return results[skeleton.index]
    if not isinstance(skeleton, _Node):
        return skeleton
    if id(skeleton) in memo:
        return memo[id(skeleton)]
    entries = {name: _fill(child, results, memo) for name, child in skeleton.entries.items()}
    plain = results[skeleton.plain.index] if skeleton.plain is not None else None
    value: list[Any] | dict[Any, Any] | None = _as_list(skeleton, entries, plain)
    if value is None:
        value = dict(entries)
        if isinstance(plain, dict):
            for key, item in plain.items():
                value.setdefault(key, item)
        elif skeleton.plain is not None:
            value[PYTHON_STATE] = plain
        for name, slot in skeleton.attributes.items():
            value[name] = results[slot.index]
        if skeleton.slots:
            value[OPTIMIZER_SLOTS_NAME] = {
                variable: {name: _fill(s, results, memo) for name, s in slots.items()}
                for variable, slots in skeleton.slots.items()
            }
    memo[id(skeleton)] = value
    return value


def _as_list(skeleton: _Node, entries: dict[str, Any], plain: Any) -> list[Any] | None:
    """The node as a list if its names (children and plain entries) are exactly 0..n-1."""
    if skeleton.attributes or skeleton.slots:
        return None
    if plain is None:
        plain = {}
    if not isinstance(plain, dict) or not all(isinstance(key, str) for key in plain):
        return None
    names = set(skeleton.names) | set(plain)
    if not names or names != {str(i) for i in range(len(names))}:
        return None
    return [entries.get(str(i), plain.get(str(i))) for i in range(len(names))]


def restore_saved_tree(reader: CheckpointReader, prefix: str) -> Any:
    """The checkpoint's saved tree, as the module docstring describes.

    Raises:
        InvalidArgumentError: the checkpoint has no object graph, or a key was saved with an
            implementation this JAX does not know.
        DataLossError: a value or the object graph is damaged.
    """
    planner = _Planner(reader, prefix)
    skeleton = planner.plan(0, ())
    leaves = planner.leaves
    restore_items(
        [*planner.items, *leaves.items], reader.bundle, prefix=prefix, batches=leaves.batches()
    )
    tree = _fill(skeleton, planner.results, {})
    return {} if tree is None else tree
