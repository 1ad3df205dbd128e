"""The safetensors file format, read and written with numpy only (no torch, no pickle).

A safetensors file is an 8-byte little-endian header length, a JSON header
``{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__":
{str: str}}`` padded with spaces to a multiple of 8, then the tensors' little-endian C-order
bytes, back to back (https://github.com/huggingface/safetensors, "Format"). bfloat16 and float8
come through ``ml_dtypes``, so every dtype the format shares with TensorFlow checkpoints
converts without torch. Reads are zero-copy views of an mmap (local files); writes stream one
tensor at a time into a temporary file that replaces the destination when complete.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from trackpoint.errors import DataLossError, InvalidArgumentError
from trackpoint.storage import locate
from trackpoint.storage.base import RangeReader, Storage

__all__ = ["SafetensorsFile", "read_safetensors", "write_safetensors"]

_MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's limit

_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype("<u1"),
    "I8": np.dtype("<i1"),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "C64": np.dtype("<c8"),
}
_NAMES: dict[np.dtype[Any], str] = {dtype: name for name, dtype in _DTYPES.items()}


def _dtype_name(dtype: np.dtype[Any], name: str, path: str) -> str:
    found = _NAMES.get(dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype)
    if found is None:
        raise InvalidArgumentError(
            f"tensor {name!r} has dtype {dtype}, which safetensors cannot store (it holds "
            f"{', '.join(sorted(_DTYPES))}); convert it first or drop it with a --map rule",
            path=path,
            key=name,
        )
    return found


@dataclass(slots=True)
class SafetensorsFile:
    """An open safetensors file: its tensors as read-only views valid until :meth:`close`."""

    path: str
    tensors: dict[str, np.ndarray]
    """Tensors in file order (zero-copy views of the mapped file)."""
    metadata: dict[str, str]
    """The ``__metadata__`` strings ({} when absent)."""
    _reader: RangeReader

    def close(self) -> None:
        self.tensors = {}
        self._reader.close()

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _corrupt(path: str, what: str) -> DataLossError:
    return DataLossError(f"{path} is not a valid safetensors file: {what}", path=path)


def read_safetensors(path: str, *, storage: Storage | None = None) -> SafetensorsFile:
    """Open a safetensors file; tensors are zero-copy views of its bytes.

    ``storage`` serves ``path`` if given (the caller picked it already), else the backend
    ``path``'s syntax picks.

    Raises:
        NotFoundError: the file does not exist.
        DataLossError: the header or offsets are malformed, or the file is truncated.
    """
    reader = locate(path, storage=storage).storage.open_range_reader(path)
    try:
        size = reader.size
        if size < 8:
            raise _corrupt(path, f"{size} bytes, shorter than the 8-byte header length")
        (header_len,) = struct.unpack("<Q", reader.read(0, 8))
        if header_len > min(_MAX_HEADER, size - 8):
            raise _corrupt(path, f"header length {header_len} exceeds the file ({size} bytes)")
        try:
            header = json.loads(bytes(reader.read(8, header_len)).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _corrupt(path, f"header is not JSON ({exc})") from exc
        if not isinstance(header, dict):
            raise _corrupt(path, "header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        data_start = 8 + header_len
        data_size = size - data_start
        tensors: dict[str, np.ndarray] = {}
        for name, info in sorted(header.items(), key=lambda kv: _begin(kv[1])):
            tensors[name] = _tensor(reader, path, name, info, data_start, data_size)
        return SafetensorsFile(path, tensors, {str(k): str(v) for k, v in metadata.items()}, reader)
    except BaseException:
        reader.close()
        raise


def _begin(info: Any) -> int:
    try:
        return int(info["data_offsets"][0])
    except (KeyError, TypeError, ValueError, IndexError):
        return -1


def _tensor(
    reader: RangeReader, path: str, name: str, info: Any, data_start: int, data_size: int
) -> np.ndarray:
    try:
        dtype = _DTYPES[info["dtype"]]
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(x) for x in info["data_offsets"])
    except KeyError as exc:
        raise _corrupt(path, f"tensor {name!r}: missing or unknown {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise _corrupt(path, f"tensor {name!r}: malformed entry {info!r}") from exc
    count = int(np.prod(shape, dtype=np.int64))
    if any(d < 0 for d in shape) or not 0 <= begin <= end <= data_size:
        raise _corrupt(path, f"tensor {name!r}: offsets [{begin}, {end}) outside the data")
    if end - begin != count * dtype.itemsize:
        raise _corrupt(
            path, f"tensor {name!r}: {end - begin} bytes for shape {list(shape)} of {info['dtype']}"
        )
    raw = reader.read(data_start + begin, end - begin)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


def write_safetensors(
    path: str,
    tensors: Iterable[tuple[str, np.ndarray]],
    *,
    metadata: dict[str, str] | None = None,
    progress: Callable[[int], None] | None = None,
    storage: Storage | None = None,
) -> int:
    """Write ``tensors`` (name, array) in order as a safetensors file; return the data bytes.

    The file appears complete or not at all where the storage can rename atomically.
    ``storage`` serves ``path`` if given, else the backend ``path``'s syntax picks.

    Raises:
        InvalidArgumentError: a dtype safetensors lacks (names the tensor), or a duplicate name.
    """
    items = list(tensors)
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, array in items:
        if name in header or name == "__metadata__":
            raise InvalidArgumentError(f"tensor name {name!r} appears twice", path=path, key=name)
        nbytes = int(array.nbytes)
        header[name] = {
            "dtype": _dtype_name(array.dtype, name, path),
            "shape": list(array.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    storage = locate(path, storage=storage).storage
    parent = storage.dirname(path)
    if parent:
        storage.makedirs(parent)
    with storage.open_atomic(path) as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for _, array in items:
            little = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else None
            contiguous = np.require(array, dtype=little, requirements="C")
            out.write(memoryview(contiguous.reshape(-1).view(np.uint8)))
            if progress is not None:
                progress(int(contiguous.nbytes))
    return offset
