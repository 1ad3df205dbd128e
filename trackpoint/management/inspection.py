"""Inspecting checkpoints: ``load_checkpoint``, ``list_variables``, ``load_variable``.

Thin wrappers over :class:`trackpoint.bundle.CheckpointReader` that also accept a directory
(resolved through its ``checkpoint`` state file), as ``tf.train.load_checkpoint`` does.
"""

from __future__ import annotations

import numpy as np

from trackpoint._types import PathLike
from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.errors import NotFoundError
from trackpoint.graph.keys import ATTRIBUTES, OBJECT_GRAPH_KEY, variable_key
from trackpoint.management.paths import resolve_location
from trackpoint.management.reader import CheckpointReader

__all__ = ["list_variables", "load_checkpoint", "load_variable", "object_metadata"]


def load_checkpoint(path: PathLike) -> CheckpointReader:
    """Open the checkpoint at ``path`` (a prefix or a directory) for reading.

    Example:
        >>> reader = tp.load_checkpoint("/tmp/run")          # doctest: +SKIP
        >>> reader.get_tensor("model/w/.ATTRIBUTES/VARIABLE_VALUE")  # doctest: +SKIP
    """
    location = resolve_location(path)
    return CheckpointReader(location.prefix, storage=location.storage)


def list_variables(path: PathLike) -> list[tuple[str, list[int]]]:
    """Sorted ``(checkpoint key, shape)`` pairs of every tensor in the checkpoint."""
    with load_checkpoint(path) as reader:
        shapes = reader.get_variable_to_shape_map()
    return [(key, list(shapes[key])) for key in sorted(shapes)]


def load_variable(path: PathLike, key: str) -> np.ndarray:
    """The value stored under checkpoint ``key`` (``name/.ATTRIBUTES/VARIABLE_VALUE``).

    A bare name without ``/.ATTRIBUTES/`` is tried as ``name/.ATTRIBUTES/VARIABLE_VALUE`` too.
    """
    with load_checkpoint(path) as reader:
        if not reader.has_tensor(key) and ATTRIBUTES not in key:
            candidate = variable_key(key)
            if reader.has_tensor(candidate):
                key = candidate
        return reader.get_tensor(key)


def object_metadata(prefix: PathLike) -> TrackableObjectGraph:
    """The object graph stored in the checkpoint ``prefix``.

    Raises:
        NotFoundError: the checkpoint does not exist, or holds no object graph (a TF1
            name-based checkpoint).
        DataLossError: the graph is damaged.
    """
    with load_checkpoint(prefix) as reader:
        proto = reader.object_graph()
    prefix = reader.prefix
    if proto is None:
        raise NotFoundError(
            f"the checkpoint {prefix} has no object graph ({OBJECT_GRAPH_KEY}); it was "
            "written by a name-based saver, read its values by key instead",
            path=prefix,
            key=OBJECT_GRAPH_KEY,
        )
    return proto
