"""A Lightning (or Fabric) checkpoint dict as a TensorFlow V2 checkpoint (the writing half).

Lightning hands its ``CheckpointIO`` one nested dict: ``state_dict``, ``optimizer_states``,
``lr_schedulers``, ``loops``, ``callbacks``, ``epoch``, ``hyper_parameters``… Each tensor (and
numeric numpy array) becomes a checkpoint value at a readable key, the path of dict keys and
list indices leading to it; dotted names nest like a module's, so ``state_dict['net.0.weight']``
is ``state_dict/net/0/weight/.ATTRIBUTES/VARIABLE_VALUE``, the key ``tp.Checkpoint(
state_dict=module)`` uses too. Everything else is kept exactly, as JSON
(:mod:`trackpoint.tracking.state_json`), in one ``PythonState`` value,
``checkpoint_dict/.ATTRIBUTES/py_state``, with a reference in place of each tensor. Loading
never unpickles, and gives back an equal dict: the same nesting and types (dict/OrderedDict
with its ``_metadata``, list/tuple, int/float/bool, ``torch.Size``, dtypes, devices, paths),
tensors with their dtype (bfloat16 and float8 too), ``requires_grad`` and ``Parameter``-ness.

A tensor reached twice (tied weights: two names viewing the same memory) is stored once; both
names load as the same tensor. Values that cannot be stored without pickle (arbitrary objects
in ``hyper_parameters``, say) are refused, naming the key and the way out. Reading is
:mod:`trackpoint.integrations.lightning_read`; the constants here are shared with it.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import numpy as np
import torch

from trackpoint.checkpoint import Checkpoint
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.keys import SAVE_COUNTER, escape_local_name, variable_key
from trackpoint.integrations.torch_tensors import TensorVariable
from trackpoint.management import CheckpointManager
from trackpoint.saving import CheckpointOptions
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import Trackable
from trackpoint.tracking.python_state import PythonState
from trackpoint.tracking.state_json import dumps

__all__ = [
    "CHECKPOINT_DICT_NAME",
    "CHECKPOINT_NAME",
    "FORMAT_VERSION",
    "ORDERED_TAG",
    "PATH_TAG",
    "TORCH_TAG",
    "VALUE_TAG",
    "MapLocation",
    "ValueRef",
    "start_checkpoint_dict",
    "write_checkpoint_dict",
]

CHECKPOINT_DICT_NAME = "checkpoint_dict"
"""Local name (under the root) of the JSON value holding the dict's structure."""
CHECKPOINT_NAME = "ckpt"
"""Name of the checkpoints in a Lightning path: ``<path>/ckpt-<n>``, next to the state file."""

MapLocation = Union[
    str, torch.device, Mapping[str, str], Callable[[torch.Tensor, str], torch.Tensor], None
]
"""Where loaded tensors go: as ``torch.load``'s ``map_location``, with tensors for storages."""

FORMAT_VERSION = 1
"""Version of the JSON layout, stored next to the dict (``{"format": 1, "checkpoint": ...}``)."""
# JSON tags (state_json's one-key form) of what JSON has no word for.
VALUE_TAG = "__checkpoint_value__"
"""A tensor or array stored as a checkpoint value: the :class:`ValueRef` fields."""
ORDERED_TAG = "__ordered_dict__"
"""An OrderedDict: ``{"items": ..., "metadata": ...}`` (torch's ``_metadata``)."""
TORCH_TAG = "__torch__"
"""A ``torch.Size``, ``torch.dtype`` or ``torch.device``: ``{"size"|"dtype"|"device": ...}``."""
PATH_TAG = "__path__"
"""A ``pathlib`` path: ``{"type": class name, "path": str}``."""
# Root names Checkpoint itself uses; a top-level key spelled so is stored as "_<key>".
_RESERVED = frozenset({CHECKPOINT_DICT_NAME, SAVE_COUNTER, "root"})
# A dotted name nests like a module's state_dict key ("net.0.weight" -> net/0/weight).
_DOTTED = re.compile(r"[\w-]+(?:\.[\w-]+)+")


@dataclasses.dataclass(frozen=True, slots=True)
class ValueRef:
    """A tensor or array stored as a checkpoint value, as the JSON refers to it."""

    key: str  # its checkpoint key
    kind: str  # "torch" or "numpy"
    dtype: str  # torch dtype name without "torch." (torch only)
    device: str  # where the tensor was (torch only)
    requires_grad: bool
    parameter: bool  # a torch.nn.Parameter


@dataclasses.dataclass(frozen=True, slots=True)
class _Ordered:
    """An OrderedDict (a module's state_dict) with its ``_metadata`` (module versions)."""

    items: dict[Any, Any]
    metadata: Any


@dataclasses.dataclass(frozen=True, slots=True)
class _Tagged:
    """A value JSON has no word for, already in its tagged form."""

    tag: str
    body: Any


class _Node(Trackable):
    """An inner node of the stored tree (a dict or list on the way to tensors)."""

    def __repr__(self) -> str:
        return f"<Lightning checkpoint node {sorted(self._trackable_children())}>"


class _DictState(PythonState):
    """The dict's structure as JSON (encoded once, before the save)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def serialize(self) -> bytes:
        # docstring inherited
        return self._data

    def deserialize(self, data: bytes) -> None:
        # docstring inherited
        self._data = data


def _where(parent: str, key: Any) -> str:
    return f"{parent}[{key!r}]"


def _fix_hint(where: str, path: Sequence[Any]) -> str:
    if len(path) >= 2 and path[0] in ("hyper_parameters", "datamodule_hyper_parameters"):
        return (
            f"leave it out of the saved hyperparameters, e.g. "
            f"self.save_hyperparameters(ignore=[{path[1]!r}]), or pass a plain value"
        )
    return f"store {where} as numbers, strings, lists, tuples, dicts, tensors or arrays"


def _child_names(mapping: Mapping[Any, Any], *, at_root: bool) -> list[tuple[str, ...]]:
    """The local names under which each key's values are stored (dotted str keys nest)."""
    names = [key if isinstance(key, str) else str(key) for key in mapping]
    if len(set(names)) != len(names) or "" in names:
        names = [repr(key) for key in mapping]  # 1 and "1", or an empty key: keep them apart
        if len(set(names)) != len(names):
            names = [f"#{index}" for index in range(len(names))]
    paths = [tuple(name.split(".")) if _DOTTED.fullmatch(name) else (name,) for name in names]
    full = set(paths)
    if len(full) != len(paths) or any(path[:i] in full for path in paths
                                       for i in range(1, len(path))):
        paths = [(name,) for name in names]  # "a" and "a.b" both present: do not nest
    if at_root:
        taken = {path[0] for path in paths}
        renamed = []
        for path in paths:
            first = path[0]
            if first in _RESERVED:
                while first in _RESERVED or first in taken:
                    first = "_" + first
                taken.add(first)
            renamed.append((first, *path[1:]))
        paths = renamed
    return paths


class _Encoder:
    """Walks the dict once: tensors into a tree of nodes, everything else into JSON form."""

    def __init__(self) -> None:
        self.root = _Node()
        self._nodes: dict[tuple[str, ...], Trackable] = {(): self.root}
        self._stored: dict[tuple[Any, ...], str] = {}  # memory identity of a tensor -> its key

    def encode(self, value: Any, where: str, path: tuple[str, ...], keys: tuple[Any, ...]) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value, where, path)
        if isinstance(value, np.ndarray):
            return self._array(value, where, path)
        if isinstance(value, torch.Size):
            return _Tagged(TORCH_TAG, {"size": list(value)})
        if isinstance(value, torch.dtype):
            return _Tagged(TORCH_TAG, {"dtype": str(value).removeprefix("torch.")})
        if isinstance(value, torch.device):
            return _Tagged(TORCH_TAG, {"device": str(value)})
        if isinstance(value, pathlib.PurePath):
            return _Tagged(PATH_TAG, {"type": type(value).__name__, "path": str(value)})
        if isinstance(value, Mapping):
            names = _child_names(value, at_root=not keys)
            items = {
                key: self.encode(item, _where(where, key), path + name, keys + (key,))
                for (key, item), name in zip(value.items(), names)
            }
            if isinstance(value, OrderedDict):
                metadata = getattr(value, "_metadata", None)
                return _Ordered(items, self.encode(metadata, f"{where}._metadata", path, keys))
            return items
        if isinstance(value, (list, tuple)):
            encoded = [
                self.encode(item, f"{where}[{index}]", path + (str(index),), keys + (index,))
                for index, item in enumerate(value)
            ]
            return tuple(encoded) if isinstance(value, tuple) else encoded
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            return value
        if isinstance(value, (np.bool_, np.integer, np.floating)):
            return value.item()
        raise InvalidArgumentError(
            f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which trackpoint "
            "cannot store without pickle (loading a checkpoint never runs code); "
            f"{_fix_hint(where, keys)}",
            key=where,
        )

    def _place(self, path: tuple[str, ...], leaf: Trackable) -> str:
        parent = self._node(path[:-1])
        parent._track_trackable(leaf, path[-1])
        return variable_key("/".join(escape_local_name(name) for name in path))

    def _node(self, path: tuple[str, ...]) -> Trackable:
        node = self._nodes.get(path)
        if node is None:
            node = _Node()
            self._node(path[:-1])._track_trackable(node, path[-1])
            self._nodes[path] = node
        return node

    def _tensor(self, tensor: torch.Tensor, where: str, path: tuple[str, ...]) -> ValueRef:
        identity = _memory_identity(tensor)
        key = self._stored.get(identity) if identity is not None else None
        if key is None:
            leaf = to_trackable(tensor)
            if isinstance(leaf, TensorVariable):
                leaf.set_name(where)
            assert leaf is not None  # the torch integration adapts every tensor
            key = self._place(path, leaf)
            if identity is not None:
                self._stored[identity] = key
        return ValueRef(
            key, "torch", str(tensor.dtype).removeprefix("torch."), str(tensor.device),
            bool(tensor.requires_grad), isinstance(tensor, torch.nn.Parameter),
        )

    def _array(self, array: np.ndarray, where: str, path: tuple[str, ...]) -> ValueRef:
        if array.dtype.kind not in "biufcV":  # V: bfloat16 and the other ml_dtypes
            raise InvalidArgumentError(
                f"{where} is a numpy array of dtype {array.dtype}; only numeric and bool arrays "
                "are stored (store text as a str or a list of str)",
                key=where,
            )
        leaf = to_trackable(array)
        assert leaf is not None  # numpy arrays are adapted by the core
        return ValueRef(self._place(path, leaf), "numpy", array.dtype.name, "cpu", False, False)


def _memory_identity(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    """Equal for two tensors viewing the same memory the same way (tied weights), else None."""
    if (
        tensor.layout != torch.strided or tensor.is_quantized or tensor.is_meta
        or getattr(tensor, "is_nested", False) or tensor.numel() == 0
    ):
        return None
    return (
        tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
        tuple(tensor.stride()), tensor.dtype, str(tensor.device),
    )


def _to_json(value: Any) -> dict[str, Any] | None:
    """``state_json``'s ``default`` hook: our markers as tagged dicts."""
    if isinstance(value, ValueRef):
        return {VALUE_TAG: dataclasses.asdict(value)}
    if isinstance(value, _Tagged):
        return {value.tag: value.body}
    if isinstance(value, _Ordered):
        # The hook's result is not encoded further: encode the contents here.
        return {ORDERED_TAG: {
            "items": _json_value(value.items, "OrderedDict"),
            "metadata": _json_value(value.metadata, "OrderedDict._metadata"),
        }}
    return None


def _json_value(value: Any, what: str) -> Any:
    return json.loads(dumps(value, what=what, default=_to_json))


def write_checkpoint_dict(
    checkpoint: Mapping[str, Any], path: str, *, options: CheckpointOptions | None = None
) -> str:
    """Save ``checkpoint`` (Lightning's dict) as the checkpoint directory ``path``.

    ``path`` becomes a directory holding one checkpoint, ``ckpt-<n>``, and the ``checkpoint``
    state file naming it, so ``tp.load_checkpoint(path)`` (and TensorFlow's) reads it. Saving to
    an existing ``path`` replaces it atomically: ``ckpt-<n+1>`` is written, and ``ckpt-<n>``
    deleted only once the new one is committed. Returns once the checkpoint is written, also
    with ``options.enable_async`` (see :func:`start_checkpoint_dict` for a write that does not).

    Returns:
        The checkpoint prefix written (``<path>/ckpt-<n>``).

    Raises:
        InvalidArgumentError: a value cannot be stored (names its key and the fix).
        CheckpointError: writing failed; nothing was committed.
    """
    prefix, manager = start_checkpoint_dict(checkpoint, path, options=options)
    manager.close()  # waits for an async write and raises its error
    return prefix


def start_checkpoint_dict(
    checkpoint: Mapping[str, Any], path: str, *, options: CheckpointOptions | None = None
) -> tuple[str, CheckpointManager]:
    """Begin saving ``checkpoint`` as :func:`write_checkpoint_dict` does; the caller finishes it.

    With ``options.enable_async`` this returns once the values are snapshotted (lazily, with
    ``lazy_snapshot``) and the write goes on in the background; the returned manager holds
    ``path``'s writer lock until ``close()``, which waits for the write and raises its error.

    Returns:
        The checkpoint prefix (``<path>/ckpt-<n>``) and the open manager.

    Raises:
        InvalidArgumentError: a value cannot be stored (names its key and the fix).
        CheckpointError: a synchronous write failed; nothing was committed.
    """
    encoder = _Encoder()
    structure = encoder.encode(checkpoint, "checkpoint", (), ())
    data = dumps({"format": FORMAT_VERSION, "checkpoint": structure}, what="Lightning checkpoint",
                 default=_to_json)
    encoder.root._track_trackable(_DictState(data), CHECKPOINT_DICT_NAME)
    # A manager keeping one checkpoint: a save over an existing path writes the next number
    # and deletes the earlier one only after the new one is committed and recorded.
    manager = CheckpointManager(Checkpoint(root=encoder.root), path, max_to_keep=1,
                                checkpoint_name=CHECKPOINT_NAME)
    try:
        latest = manager.latest_checkpoint
        number = int(latest.rpartition("-")[2]) + 1 if latest else 1
        prefix = manager.save(checkpoint_number=number, options=options)
    except BaseException:
        manager.close()
        raise
    assert prefix is not None  # no checkpoint_interval: every save happens
    return prefix, manager
