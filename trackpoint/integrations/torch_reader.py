"""Reading a checkpoint as a torch ``state_dict``, without building the module first.

``tp.Checkpoint(model=m).restore(path)`` restores into a live module. When there is no module
yet, or the tensors go elsewhere (``module.load_state_dict``, a model hub, an inference server),
:func:`load_state_dict` returns what ``module.state_dict()`` would: tensors keyed by dotted
names, tied weights under every name they have. The names come from the object graph
(:mod:`trackpoint.graph.aliases`): a value stored once under ``lm_head.weight`` is also
``transformer.wte.weight`` when the graph reaches that node by both paths.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from trackpoint.bundle.reader import BundleReader
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.aliases import ValuePath, resolve_object_path, value_paths
from trackpoint.graph.keys import SAVE_COUNTER, VARIABLE_VALUE_KEY, split_checkpoint_key
from trackpoint.integrations.torch_tensors import tensor_from_numpy, torch_dtype_for
from trackpoint.management.paths import resolve_location
from trackpoint.management.reader import CheckpointReader

if TYPE_CHECKING:
    from trackpoint._types import PathLike

__all__ = ["load_state_dict"]

logger = logging.getLogger(__name__)


def _names_without_graph(reader: CheckpointReader, root: str | None) -> list[ValuePath]:
    """A checkpoint without an object graph (TF1 names): its keys, under ``root`` if given."""
    out = []
    start = root.strip("/") + "/" if root else ""
    for key in reader.keys():
        if not key.startswith(start):
            continue
        relative = key[len(start) :]
        split = split_checkpoint_key(relative)
        if split is None:
            out.append(ValuePath(key, tuple(relative.split("/")), VARIABLE_VALUE_KEY, -1))
        else:
            out.append(ValuePath(key, split[0], split[1], -1))
    return out


def _value_paths(reader: CheckpointReader, root: str | None) -> list[ValuePath]:
    graph = reader.object_graph()
    if graph is None:
        return _names_without_graph(reader, root)
    if root:
        node_id, _ = resolve_object_path(graph, root)
        return value_paths(graph, start=node_id)
    # save_counter is the Checkpoint's own, no module has it.
    return [v for v in value_paths(graph) if v.path[:1] != (SAVE_COUNTER,)]


def load_state_dict(
    path: PathLike, root: str | None = None, *, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint keyed by the names ``module.state_dict()`` uses.

    Every value under ``root`` comes back as a tensor that owns its memory (it outlives the
    file). A value reachable by several paths (tied weights) is one tensor listed under each
    name, as ``state_dict()`` lists it. bfloat16 and float8 values keep their dtype. Values a
    state_dict does not hold are left out and logged: strings (Python state, optimizer
    configuration, the object graph) and optimizer slot variables. Nothing is pickled.

    Args:
        path: a checkpoint prefix, one of its files, or a directory (its latest checkpoint).
        root: the object path of the module inside the checkpoint, e.g. ``"model"`` for
            ``tp.Checkpoint(model=m)`` (``"model/encoder"`` or ``"model.encoder"`` for a
            submodule); names are relative to it. ``None``: the checkpoint's root, without its
            ``save_counter``.
        device: where the tensors go (read straight from the mapped file to that device).

    Returns:
        ``{name: tensor}`` in ``state_dict()`` order (depth first, children in order).

    Raises:
        NotFoundError: no checkpoint at ``path``, or no object at ``root``.
        InvalidArgumentError: two different values would get one name.
        DataLossError: the checkpoint is damaged.

    Example::

        model.load_state_dict(tp.torch.load_state_dict("runs/gpt", root="model"))
    """
    target = torch.device(device)
    state: dict[str, torch.Tensor] = {}
    owners: dict[str, str] = {}
    location = resolve_location(path)
    with CheckpointReader(location.prefix, storage=location.storage) as reader:
        bundle = reader.bundle
        tensors: dict[str, torch.Tensor] = {}
        for value in _value_paths(reader, root):
            key = value.key
            if not bundle.has_tensor(key):
                logger.info("load_state_dict: %s has no value in %s, skipped", key, reader.prefix)
                continue
            if bundle.dtype(key) == np.dtype(object):
                logger.debug("load_state_dict: skipped string value %s", key)
                continue
            name = value.name
            if name in owners and owners[name] != key:
                raise InvalidArgumentError(
                    f"{owners[name]!r} and {key!r} in {reader.prefix} both have the state_dict "
                    f"name {name!r} (local names with dots); read them by checkpoint key with "
                    "tp.load_checkpoint() instead",
                    path=reader.prefix,
                    key=name,
                )
            tensor = tensors.get(key)
            if tensor is None:
                tensor = tensors[key] = _read(bundle, key, target)
            owners[name] = key
            state[name] = tensor
    return state


def _read(bundle: BundleReader, key: str, device: torch.device) -> torch.Tensor:
    """Tensor ``key``: copied once into host memory it owns, or from the mapping to ``device``."""
    on_host = device.type == "cpu"
    array = bundle.read(key, copy=on_host)
    # torch.from_numpy cannot take ml_dtypes arrays: tensor_from_numpy views bfloat16/float8
    # bytes through an integer type of the same width.
    tensor = tensor_from_numpy(array, torch_dtype_for(array.dtype, what=f"value {key!r}"))
    return tensor if on_host else tensor.to(device)
