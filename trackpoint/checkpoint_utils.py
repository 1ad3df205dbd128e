"""Inspecting checkpoints: ``load_checkpoint``, ``list_variables``, ``load_variable``.

Thin wrappers over :class:`trackpoint.bundle.CheckpointReader` that also accept a directory
(resolved through its ``checkpoint`` state file), as ``tf.train.load_checkpoint`` does.
"""

from __future__ import annotations

import numpy as np

from trackpoint._types import PathLike, fspath
from trackpoint.bundle import CheckpointReader
from trackpoint.errors import NotFoundError
from trackpoint.state_file import checkpoint_exists, latest_checkpoint
from trackpoint.storage import storage_for

__all__ = ["list_variables", "load_checkpoint", "load_variable", "resolve_prefix"]


def resolve_prefix(path: PathLike) -> str:
    """The checkpoint prefix ``path`` names: itself, or a directory's latest checkpoint.

    Raises:
        NotFoundError: nothing committed at ``path``; the message hints at the ``-N`` suffix
            that ``save()`` adds.
    """
    path = fspath(path)
    if checkpoint_exists(path):
        return path
    # A file of the checkpoint given instead of its prefix: ckpt-1.index, ckpt-1.data-00000-of-…
    for marker in (".index", ".data-"):
        head, sep, _ = path.rpartition(marker)
        if sep and head and checkpoint_exists(head):
            return head
    storage = storage_for(path)
    if storage.exists(path) and not storage.exists(path + ".index"):
        latest = latest_checkpoint(path)
        if latest is not None:
            return latest
        raise NotFoundError(
            f"{path} is a directory without a committed checkpoint: its `checkpoint` state file "
            "is missing or names no existing checkpoint. Pass a checkpoint prefix such as "
            f"{path}/ckpt-1 instead.",
            path=path,
        )
    raise NotFoundError(
        f"Failed to find any matching files for {path}: there is no {path}.index. Checkpoints "
        "written by save() carry a number suffix (e.g. ckpt-1); pass that prefix, the value "
        "save() returned, or the directory to use its latest checkpoint.",
        path=path,
    )


def load_checkpoint(path: PathLike) -> CheckpointReader:
    """Open the checkpoint at ``path`` (a prefix or a directory) for reading.

    Example:
        >>> reader = tp.load_checkpoint("/tmp/run")          # doctest: +SKIP
        >>> reader.get_tensor("model/w/.ATTRIBUTES/VARIABLE_VALUE")  # doctest: +SKIP
    """
    return CheckpointReader(resolve_prefix(path))


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
        if not reader.has_tensor(key) and "/.ATTRIBUTES/" not in key:
            candidate = f"{key}/.ATTRIBUTES/VARIABLE_VALUE"
            if reader.has_tensor(candidate):
                key = candidate
        return reader.get_tensor(key)
