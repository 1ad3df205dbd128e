"""Converting between TensorFlow/trackpoint checkpoints, torch state_dict files and safetensors.

Formats (chosen by file name unless given): ``checkpoint`` (a prefix: TensorFlow V2, written by
TF or trackpoint), ``torch`` (``.pt``/``.pth``/``.bin``: a ``torch.save``d dict of tensors,
loaded with ``torch.load(weights_only=True)``, so loading never unpickles arbitrary objects)
and ``safetensors`` (``.safetensors``; handled with numpy alone). TensorFlow is never needed;
torch only for the ``torch`` format.

Names. A checkpoint's values are named by checkpoint key
(``model/0/weight/.ATTRIBUTES/VARIABLE_VALUE``), a state_dict's by dotted path
(``0.weight``). Converting a key to a state_dict name drops ``/.ATTRIBUTES/VARIABLE_VALUE``,
unescapes the local names and joins them with ``.``; the reverse splits a dotted name into
nested objects, so ``tp.Checkpoint(model=m).read(dst)`` restores a converted state_dict when
``root="model"``. ``root`` selects (and strips) an object path of a checkpoint source, or nests
a checkpoint destination under one. A :class:`KeyMap` (``--map FILE``) renames, transposes and
drops values by exact name or regular expression before the default naming applies; it is how a
TensorFlow model's variables land in a PyTorch module's layout. Values that cannot be carried
(strings, Python state, the object graph, optimizer slots when the target is a state_dict) are
skipped and reported.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trackpoint._types import PathLike, fspath
from trackpoint.convert.formats import FORMATS, check_format, detect_format
from trackpoint.convert.key_map import KeyMap
from trackpoint.convert.safetensors_format import read_safetensors, write_safetensors
from trackpoint.errors import (
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from trackpoint.graph.aliases import alias_keys
from trackpoint.graph.keys import ATTRIBUTES, OBJECT_GRAPH_KEY, split_checkpoint_key
from trackpoint.graph.serialize import serialize_graph
from trackpoint.graph.walk import ObjectGraphView
from trackpoint.management.reader import CheckpointReader
from trackpoint.saving import CheckpointOptions, MultiDeviceSaver, ProgressEvent
from trackpoint.storage import Storage, is_url, locate
from trackpoint.storage.url import local_path
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable

__all__ = [
    "FORMATS",
    "ConversionResult",
    "KeyMap",
    "checkpoint_key_to_name",
    "convert",
    "detect_format",
]

logger = logging.getLogger(__name__)

_SLOT_MARKER = "/.OPTIMIZER_SLOT/"

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes total) while the destination is written."""


@dataclass(frozen=True, slots=True)
class ConversionResult:
    """What :func:`convert` did."""

    source: str
    destination: str
    source_format: str
    destination_format: str
    names: tuple[tuple[str, str], ...]
    """(source name, destination name) of every converted value, in write order."""
    skipped: tuple[tuple[str, str], ...]
    """(source name, reason) of every value left out."""
    nbytes: int
    """Bytes of tensor data written."""


# -- reading ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Source:
    # (name seen by the key map, value, name reported to the user)
    values: list[tuple[str, Any, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def add(self, name: str, value: Any, original: str | None = None) -> None:
        self.values.append((name, value, original or name))


def _strip_root(key: str, root: str | None) -> str | None:
    if not root:
        return key
    prefix = "/".join(root.strip("/").split("/")) + "/"
    return key[len(prefix):] if key.startswith(prefix) else None


@contextmanager
def _read_checkpoint(
    path: str, root: str | None, keep_all: bool, aliases: str
) -> Iterator[_Source]:
    """The values of a checkpoint; ``aliases`` says which names a value reachable by several
    paths (a tied weight) gets: ``"all"``, or ``"one"`` (its first name under ``root``)."""
    from trackpoint.management.paths import resolve_location

    source = _Source()
    location = resolve_location(path)
    with CheckpointReader(location.prefix, storage=location.storage) as reader:
        bundle = reader.bundle
        graph = None if keep_all else reader.object_graph()
        others = alias_keys(graph) if graph is not None else {}
        for key in reader.keys():
            if keep_all:
                source.add(key, bundle.read(key, copy=False))
                continue
            names = [
                (relative, name)
                for name in (key, *others.get(key, ()))
                if (relative := _strip_root(name, root)) is not None
            ]
            if not names:
                source.skipped.append((key, f"outside root {root!r}"))
            elif key == OBJECT_GRAPH_KEY:
                source.skipped.append((key, "object graph (rebuilt for checkpoint targets)"))
            elif bundle.dtype(key) == np.dtype(object):
                source.skipped.append((key, "string value (Python state)"))
            else:
                array = bundle.read(key, copy=False)
                for relative, name in names if aliases == "all" else names[:1]:
                    source.add(relative, array, name)
        yield source


@contextmanager
def _read_safetensors(path: str, storage: Storage) -> Iterator[_Source]:
    with read_safetensors(path, storage=storage) as file:
        source = _Source()
        for name, array in file.tensors.items():
            source.add(name, array)
        yield source


def _flatten(value: Any, name: str, source: _Source, torch: Any) -> None:
    from trackpoint.integrations.torch_tensors import to_numpy

    if isinstance(value, torch.Tensor):
        source.add(name, to_numpy(value, what=f"tensor {name!r}"))
    elif isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{name}.{key}" if name else str(key), source, torch)
    elif isinstance(value, (list, tuple)) and any(
        isinstance(v, (torch.Tensor, dict, list, tuple)) for v in value
    ):
        for index, item in enumerate(value):
            _flatten(item, f"{name}.{index}" if name else str(index), source, torch)
    else:
        source.skipped.append((name, f"not a tensor ({type(value).__name__})"))


@contextmanager
def _read_torch(path: str, storage: Storage) -> Iterator[_Source]:
    import torch

    if not storage.exists(path):
        raise NotFoundError(f"{path} does not exist", path=path)
    try:
        if is_url(path):
            data = io.BytesIO(storage.read_bytes(path))
            loaded = torch.load(data, map_location="cpu", weights_only=True)
        else:  # a plain path or file:// URL: torch maps the file itself
            loaded = torch.load(
                local_path(path), map_location="cpu", weights_only=True, mmap=True
            )
    except Exception as exc:  # torch.load raises UnpicklingError, RuntimeError, EOFError, ...
        # weights_only=True refuses anything but tensors, containers and numbers: loading a
        # file never runs its code.
        raise DataLossError(
            f"cannot load {path} as a torch state_dict with weights_only=True ({exc}); only "
            "files of tensors, dicts, lists and numbers can be converted",
            path=path,
        ) from exc
    source = _Source()
    if isinstance(loaded, torch.Tensor):
        loaded = {"tensor": loaded}
    _flatten(loaded, "", source, torch)
    yield source


# -- naming ----------------------------------------------------------------------------------


def checkpoint_key_to_name(key: str) -> str | None:
    """``a/b.Sc/.ATTRIBUTES/VARIABLE_VALUE`` → ``a.b/c``; other attributes add ``.<name>``.

    Returns None for keys that are not values of objects (slots, TF1 names are kept as is).
    """
    if _SLOT_MARKER in key:
        return None
    split = split_checkpoint_key(key)
    if split is None:
        return key  # TF1 name-based key: already a plain name
    path, attribute = split
    parts = list(path)
    if attribute != VARIABLE_VALUE_KEY:
        parts.append(attribute)
    return ".".join(parts)


def _name_to_path(name: str) -> tuple[list[str], str]:
    """A destination name → (local names, attribute) for a checkpoint target."""
    split = split_checkpoint_key(name)
    if split is not None:
        return list(split[0]), split[1]
    parts = [p for p in (name.split("/") if "/" in name else name.split(".")) if p]
    if not parts:
        raise InvalidArgumentError(f"cannot place a value named {name!r} in a checkpoint")
    return parts, VARIABLE_VALUE_KEY


# -- writing ---------------------------------------------------------------------------------


class _Node(Trackable):
    """One object of a checkpoint being built from names: children and values."""

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.values: dict[str, Any] = {}

    def _trackable_children(self) -> dict[str, Trackable]:
        return dict(self.children)

    def _serialize_to_tensors(self) -> dict[str, Any]:
        return dict(self.values)


def _build_tree(values: list[tuple[str, Any]], root: str | None) -> _Node:
    top = _Node()
    root_parts = [p for p in (root or "").split("/") if p]
    for name, array in values:
        parts, attribute = _name_to_path(name)
        node = top
        for part in [*root_parts, *parts]:
            node = node.children.setdefault(part, _Node())
        if attribute in node.values:
            raise InvalidArgumentError(f"two values are named {name!r} in the destination")
        node.values[attribute] = array
    return top


def _checkpoint_progress(progress: Progress | None) -> Callable[[ProgressEvent], None] | None:
    if progress is None:
        return None
    return lambda event: progress(event.bytes_done, event.bytes_total)


def _write_checkpoint(
    path: str, values: list[tuple[str, Any]], root: str | None, verbatim: bool,
    options: CheckpointOptions | None, progress: Progress | None,
) -> None:
    options = options or CheckpointOptions(progress=_checkpoint_progress(progress))
    if verbatim:
        MultiDeviceSaver({None: dict(values)}).save(path, options)
        return
    graph = serialize_graph(ObjectGraphView(_build_tree(values, root)))
    MultiDeviceSaver(graph.tensors).save(path, options)


def _write_torch(path: str, values: list[tuple[str, np.ndarray]], storage: Storage) -> None:
    import torch

    from trackpoint.integrations.torch_tensors import tensor_from_numpy, torch_dtype_for

    state = {}
    shared: dict[int, Any] = {}  # id(array) -> its tensor: tied names stay one tensor on save
    for name, array in values:
        tensor = shared.get(id(array))
        if tensor is None:
            # np.require, not np.ascontiguousarray: the latter turns 0-d arrays into 1-d ones.
            tensor = shared[id(array)] = tensor_from_numpy(
                np.require(array, requirements="C"),
                torch_dtype_for(array.dtype, what=f"tensor {name!r}"),
            )
        state[name] = tensor
    parent = storage.dirname(path)
    if parent:
        storage.makedirs(parent)
    # The file appears whole or not at all.
    with storage.open_atomic(path) as out:
        torch.save(state, out)


# -- the conversion --------------------------------------------------------------------------


def convert(
    source: PathLike,
    destination: PathLike,
    *,
    key_map: KeyMap | None = None,
    root: str | None = None,
    source_format: str | None = None,
    destination_format: str | None = None,
    options: CheckpointOptions | None = None,
    progress: Progress | None = None,
    overwrite: bool = False,
    aliases: bool = True,
) -> ConversionResult:
    """Convert the tensors of ``source`` into ``destination`` (formats in the module docstring).

    Values are read zero-copy (mmap) where the source allows and written once. The destination
    appears complete or not at all (checkpoints commit atomically; files are renamed into place).

    Args:
        source: a checkpoint prefix (or directory: its latest checkpoint), ``.pt``/``.pth``/
            ``.bin`` or ``.safetensors`` file.
        destination: where to write; its format comes from its name.
        key_map: renames/transposes/drops applied to source names before default naming.
        root: the object path of the checkpoint side (``"model"``): a checkpoint source keeps
            only values under it (path stripped); a checkpoint destination nests values under it.
        source_format: override the format detected from the source name.
        destination_format: override the format detected from the destination name.
        options: checkpoint write options (sharding policy, fsync) for checkpoint destinations.
        progress: called with (bytes done, bytes total) while writing.
        overwrite: replace an existing destination (otherwise an error: nothing is touched).
        aliases: a checkpoint value reachable by several object paths (a tied weight) is
            written under every name ``module.state_dict()`` gives it, so
            ``load_state_dict(strict=True)`` finds them all; False: under its first name only.
            A checkpoint destination always gets one copy per value.

    Raises:
        NotFoundError: the source does not exist.
        InvalidArgumentError: a value cannot be stored in the destination format, two values get
            one name, a map rule fails, ``root`` is given with no checkpoint side, or a file
            name has an extension no format has (``.onnx``; the message lists the known ones).
        DataLossError: the source is damaged, or a torch file holds more than tensors.
        FailedPreconditionError: the destination exists and ``overwrite`` is off.

    Example:
        >>> convert("run/ckpt-3", "model.safetensors", root="model")    # doctest: +SKIP
    """
    src, dst = fspath(source), fspath(destination)
    src_fmt = check_format(source_format, src, source=True)
    dst_fmt = check_format(destination_format, dst, source=False)
    if root and "checkpoint" not in (src_fmt, dst_fmt):
        raise InvalidArgumentError(
            f"root={root!r} names an object path inside a checkpoint, but neither {src} nor "
            f"{dst} is a checkpoint; rename state_dict keys with a key map instead"
        )
    existing = f"{dst}.index" if dst_fmt == "checkpoint" else dst
    # Each side's backend is picked once here; a checkpoint source is resolved by the reader.
    dst_storage = locate(dst).storage
    if not overwrite and dst_storage.exists(existing):
        raise FailedPreconditionError(
            f"{existing} already exists; choose another destination or overwrite it "
            "(overwrite=True, --force)",
            path=dst,
        )
    verbatim = src_fmt == dst_fmt == "checkpoint" and key_map is None and not root
    with ExitStack() as stack:
        if src_fmt == "checkpoint":
            alias_mode = "all" if aliases and dst_fmt != "checkpoint" else "one"
            reader = _read_checkpoint(src, root, keep_all=verbatim, aliases=alias_mode)
        elif src_fmt == "safetensors":
            reader = _read_safetensors(src, locate(src).storage)
        else:
            reader = _read_torch(src, locate(src).storage)
        loaded = stack.enter_context(reader)
        skipped = list(loaded.skipped)
        values: list[tuple[str, Any]] = []
        names: list[tuple[str, str]] = []
        taken: dict[str, tuple[str, int]] = {}  # target -> (source name, id of its value)
        for name, array, original in loaded.values:
            target, value_id = name, id(array)  # tied names share one source array
            if not verbatim:
                mapped = _map_name(name, array, key_map, src_fmt, dst_fmt)
                if isinstance(mapped, str):
                    skipped.append((original, mapped))
                    continue
                target, array = mapped
            if target in taken:
                if taken[target][1] == value_id:
                    continue  # two names of one tied value mapped to one target
                raise InvalidArgumentError(
                    f"{taken[target][0]!r} and {original!r} would both be written as "
                    f"{target!r}; rename one with a key map (--map)",
                    key=target,
                )
            taken[target] = (original, value_id)
            values.append((target, array))
            names.append((original, target))
        for name, reason in skipped:
            logger.info("convert %s: skipped %s (%s)", src, name, reason)
        total = sum(int(np.asarray(a).nbytes) for _, a in values)
        if dst_fmt == "checkpoint":
            _write_checkpoint(dst, values, root, verbatim, options, progress)
        elif dst_fmt == "safetensors":
            done = [0]

            def advance(nbytes: int) -> None:
                done[0] += nbytes
                if progress is not None:
                    progress(done[0], total)

            write_safetensors(dst, values, progress=advance, storage=dst_storage)
        else:
            _write_torch(dst, values, dst_storage)
            if progress is not None:
                progress(total, total)
    return ConversionResult(
        src, dst, src_fmt, dst_fmt, tuple(names), tuple(skipped), total
    )


def _map_name(
    name: str, array: Any, key_map: KeyMap | None, src_fmt: str, dst_fmt: str
) -> tuple[str, Any] | str:
    """(destination name, value), or the reason the value is skipped."""
    if key_map is not None:
        mapped = key_map.apply(name, array)
        if mapped is KeyMap.DROP:
            return "dropped by the key map"
        if mapped is not None:
            return mapped
        if key_map.unmapped == "drop":
            return "not matched by the key map"
        if key_map.unmapped == "error":
            raise InvalidArgumentError(
                f"{name!r} is not matched by any rule of the key map, which says "
                "unmapped='error'; add a rule or a 'drop' pattern for it",
                key=name,
            )
    if src_fmt == "checkpoint" and dst_fmt != "checkpoint":
        target = checkpoint_key_to_name(name)
        if target is None:
            return "optimizer slot (not part of a state_dict)"
        return target, array
    if src_fmt == "checkpoint" and ATTRIBUTES in name and _SLOT_MARKER in name:
        return "optimizer slot (its variable and optimizer are not rebuilt)"
    return name, array
