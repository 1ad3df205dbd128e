"""The one path resolver: from what a user passes to the checkpoint prefix it names.

Every caller (``Checkpoint.read``/``restore``, ``load_checkpoint`` and friends, ``tp.jax.restore``,
the distributed layer, the CLI) goes through :func:`resolve_prefix`, so a path that works in one
place works everywhere, and a path that does not gets the same message everywhere.
:func:`resolve_location` is the same resolver returning the backend with the prefix, decided
once here, for the layers below to use instead of picking it again from the path.
"""

from __future__ import annotations

from trackpoint._types import PathLike, fspath
from trackpoint.errors import InvalidArgumentError, NotFoundError
from trackpoint.management.state_file import checkpoint_exists, latest_checkpoint
from trackpoint.storage import CheckpointLocation, Storage, locate

__all__ = ["resolve_location", "resolve_prefix"]

# Files of other formats a user may hand us by mistake: name the format and the way out.
_FOREIGN_FORMATS = {
    ".pt": "a PyTorch file",
    ".pth": "a PyTorch file",
    ".bin": "a PyTorch file",
    ".ckpt": "a PyTorch Lightning file",
    ".safetensors": "a safetensors file",
}


def resolve_prefix(path: PathLike, *, storage: Storage | None = None) -> str:
    """The checkpoint prefix ``path`` names (:func:`resolve_location`'s prefix).

    Accepted: a prefix (``dir/ckpt-3``), one of its files (``dir/ckpt-3.index``,
    ``dir/ckpt-3.data-00000-of-00001``), a directory (its latest checkpoint, through the
    ``checkpoint`` state file), or a URL of any of these.

    Raises:
        NotFoundError: nothing committed at ``path``; the message hints at the ``-N`` suffix
            ``save()`` adds, or says the directory has no committed checkpoint.
        InvalidArgumentError: ``path`` is a file of another format (torch, safetensors); the
            message names ``trackpoint convert``.
    """
    return resolve_location(path, storage=storage).prefix


def resolve_location(path: PathLike, *, storage: Storage | None = None) -> CheckpointLocation:
    """The checkpoint ``path`` names, with the storage that holds it: ``storage`` if given,
    else the backend ``path``'s syntax picks, chosen once for every look-up here and below.

    Accepts and raises as :func:`resolve_prefix`.
    """
    path = fspath(path)
    store = locate(path, storage=storage).storage
    if checkpoint_exists(path, storage=store):
        return CheckpointLocation(store, path)
    # A file of the checkpoint given instead of its prefix: ckpt-1.index, ckpt-1.data-00000-of-…
    for marker in (".index", ".data-"):
        head, sep, _ = path.rpartition(marker)
        if sep and head and checkpoint_exists(head, storage=store):
            return CheckpointLocation(store, head)
    if store.exists(path) and not store.exists(path + ".index"):
        # Say what it is: a regular file, a FIFO... ("an existing path": the storage cannot tell).
        kind = store.describe(path)
        # A directory first: Lightning checkpoints (tp.lightning) are directories named *.ckpt.
        latest = None
        if kind in ("a directory", "an existing path"):
            latest = latest_checkpoint(path, storage=store)
        if latest is not None:
            return CheckpointLocation(store, latest)
        for suffix, what in _FOREIGN_FORMATS.items():
            if path.endswith(suffix):
                raise InvalidArgumentError(
                    f"{path} is {what}, not a TensorFlow checkpoint. Convert it first: "
                    f"`trackpoint convert {path} OUT_PREFIX` writes a checkpoint trackpoint "
                    "and TensorFlow can read.",
                    path=path,
                )
        if kind not in ("a directory", "an existing path"):
            raise NotFoundError(
                f"{path} is {kind}, not a checkpoint: there is no {path}.index and it is not a "
                "directory. Pass a checkpoint prefix such as path/to/ckpt-1, one of its files "
                "(ckpt-1.index), or a directory with a `checkpoint` state file.",
                path=path,
            )
        raise NotFoundError(
            f"{path} is a directory without a committed checkpoint: its `checkpoint` state file "
            "is missing or names no existing checkpoint. Pass a checkpoint prefix such as "
            f"{path}/ckpt-1 instead.",
            path=path,
        )
    raise NotFoundError(
        f"Failed to find any matching files for {path}: there is no {path}.index. You may be "
        "missing the checkpoint suffix (e.g. the '-1' in 'path/to/ckpt-1'): save() returns the "
        "full prefix, tp.latest_checkpoint(directory) finds the newest one, and a directory "
        "stands for its latest checkpoint.",
        path=path,
    )
