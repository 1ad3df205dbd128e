"""Reading a Lightning (or Fabric) checkpoint dict back from its TensorFlow V2 checkpoint.

The inverse of :func:`trackpoint.integrations.lightning_state.write_checkpoint_dict`: the JSON
value gives the dict's structure, each reference in it is replaced by the checkpoint value it
names, as a torch tensor (dtype, ``requires_grad``, ``Parameter``-ness restored; placed by
``map_location``) or a numpy array. A value referenced twice (tied weights) loads once.
"""

from __future__ import annotations

import json
import pathlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.keys import (
    ATTRIBUTES,
    SAVE_COUNTER,
    VARIABLE_VALUE_KEY,
    checkpoint_key,
    variable_key,
)
from trackpoint.integrations.lightning_state import (
    CHECKPOINT_DICT_NAME,
    FORMAT_VERSION,
    ORDERED_TAG,
    PATH_TAG,
    TORCH_TAG,
    VALUE_TAG,
    MapLocation,
    ValueRef,
)
from trackpoint.integrations.torch_tensors import tensor_from_numpy
from trackpoint.management import load_checkpoint
from trackpoint.tracking.python_state import PYTHON_STATE, bytes_of
from trackpoint.tracking.state_json import loads

__all__ = ["read_checkpoint_dict"]

_PATHS: dict[str, type[pathlib.PurePath]] = {
    cls.__name__: cls
    for cls in (pathlib.PurePosixPath, pathlib.PureWindowsPath, pathlib.PosixPath,
                pathlib.WindowsPath, pathlib.Path, pathlib.PurePath)
}


class _Decoder:
    """Turns the JSON back into the dict, reading each referenced value once."""

    def __init__(
        self, values: Mapping[str, np.ndarray], map_location: MapLocation, path: str
    ) -> None:
        self._values = values
        self._map_location = map_location
        self._path = path
        self._tensors: dict[str, Any] = {}
        self.hooks: dict[str, Callable[[Any], Any]] = {
            VALUE_TAG: self._value,
            ORDERED_TAG: self._ordered,
            TORCH_TAG: _torch_value,
            PATH_TAG: _path_value,
        }

    def _value(self, body: Any) -> Any:
        try:
            ref = ValueRef(**body)
        except TypeError as exc:
            raise InvalidArgumentError(
                f"{self._path}: malformed value reference {body!r} in the Lightning checkpoint"
            ) from exc
        cached = self._tensors.get(ref.key)
        if cached is not None:
            return cached  # tied tensors load as one tensor, as torch.load gives them
        array = self._values.get(ref.key)
        if array is None:
            raise InvalidArgumentError(
                f"{self._path}: the Lightning checkpoint refers to {ref.key}, which it does not "
                "hold; was it edited by another program?",
                path=self._path, key=ref.key,
            )
        value: Any = array if ref.kind == "numpy" else self._tensor(ref, array)
        self._tensors[ref.key] = value
        return value

    def _tensor(self, ref: ValueRef, array: np.ndarray) -> torch.Tensor:
        dtype = getattr(torch, ref.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise InvalidArgumentError(
                f"{self._path}: {ref.key} names torch dtype {ref.dtype!r}, which this torch does "
                "not have", path=self._path, key=ref.key,
            )
        tensor = _map(tensor_from_numpy(array, dtype), ref.device, self._map_location)
        if ref.parameter:
            return torch.nn.Parameter(tensor, requires_grad=ref.requires_grad)
        if ref.requires_grad and (tensor.is_floating_point() or tensor.is_complex()):
            tensor.requires_grad_(True)
        return tensor

    def _ordered(self, body: Any) -> OrderedDict[Any, Any]:
        items = self._decode_nested(body["items"])
        result: OrderedDict[Any, Any] = OrderedDict(items)
        metadata = self._decode_nested(body["metadata"])
        if metadata is not None:
            result._metadata = metadata  # type: ignore[attr-defined]
        return result

    def decode(self, data: bytes) -> Any:
        """The value JSON ``data`` encodes, with tensors in place of their references."""
        return loads(data, what=self._path, hooks=self.hooks)

    def _decode_nested(self, encoded: Any) -> Any:
        # A tag's body arrives as raw JSON: decode it like a document of its own.
        return self.decode(json.dumps(encoded).encode("utf-8"))


def _torch_value(body: Mapping[str, Any]) -> Any:
    if "size" in body:
        return torch.Size(body["size"])
    if "dtype" in body:
        return getattr(torch, body["dtype"])
    return torch.device(body["device"])


def _path_value(body: Mapping[str, Any]) -> pathlib.PurePath:
    cls = _PATHS.get(body["type"], pathlib.PurePath)
    try:
        return cls(body["path"])
    except NotImplementedError:  # a WindowsPath read on Linux (or back): keep the pure form
        return pathlib.PureWindowsPath(body["path"]) if "Windows" in body["type"] else (
            pathlib.PurePosixPath(body["path"]))


def _map(tensor: torch.Tensor, saved_device: str, map_location: MapLocation) -> torch.Tensor:
    """``tensor`` (on the CPU) where ``map_location`` sends a tensor saved on ``saved_device``."""
    if map_location is None:
        return tensor
    if callable(map_location):
        moved = map_location(tensor, saved_device)
        if not isinstance(moved, torch.Tensor):
            raise InvalidArgumentError(
                f"map_location returned a {type(moved).__name__} for a tensor saved on "
                f"{saved_device}; it must return a tensor (e.g. lambda t, loc: t.cuda())"
            )
        return moved
    if isinstance(map_location, Mapping):
        target = torch.device(map_location.get(saved_device, saved_device))
    else:
        target = torch.device(map_location)
    return tensor if target.type == "cpu" else tensor.to(target)


def read_checkpoint_dict(path: str, *, map_location: MapLocation = None) -> dict[str, Any]:
    """The dict ``write_checkpoint_dict`` saved at ``path``, tensors on the CPU by default.

    Args:
        path: the checkpoint directory (or a prefix inside it).
        map_location: where tensors go, as for ``torch.load``: None keeps them on the CPU
            (Lightning's default), a device or device string moves all, a dict maps saved
            device strings (``{"cuda:1": "cuda:0"}``), a callable ``(tensor, saved_device)``
            returns the tensor to use.

    Raises:
        NotFoundError: no committed checkpoint at ``path``.
        InvalidArgumentError: the checkpoint was not written from a Lightning dict.
        DataLossError: the files are damaged.
    """
    with load_checkpoint(path) as reader:
        key = checkpoint_key(CHECKPOINT_DICT_NAME, PYTHON_STATE)
        if not reader.has_tensor(key):
            raise InvalidArgumentError(
                f"{path} is a TensorFlow checkpoint, but not one written from a Lightning "
                f"checkpoint dict (it has no {key}); restore it with tp.Checkpoint(...).read() "
                "instead",
                path=path, key=key,
            )
        data = bytes_of(reader.get_tensor(key))
        suffix, counter = ATTRIBUTES + VARIABLE_VALUE_KEY, variable_key(SAVE_COUNTER)
        value_keys = [k for k in reader.keys() if k.endswith(suffix) and k != counter]
        values = dict(zip(value_keys, reader.bundle.read_many(value_keys)))
    decoder = _Decoder(values, map_location, path)
    saved = decoder.decode(data)
    found = saved.get("format") if isinstance(saved, dict) else None
    if found != FORMAT_VERSION:
        raise InvalidArgumentError(
            f"{path}: unknown Lightning checkpoint format {found!r} (this trackpoint reads "
            f"format {FORMAT_VERSION}); was it written by a newer trackpoint?",
            path=path,
        )
    result = saved["checkpoint"]
    if not isinstance(result, dict):
        raise InvalidArgumentError(
            f"{path}: the Lightning checkpoint holds a {type(result).__name__}, not a dict",
            path=path,
        )
    return result
