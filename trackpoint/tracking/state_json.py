"""JSON for framework state that is plain Python: optimizer hyperparameters, scheduler and RNG
states, counters.

Adapters store such state as one ``PythonState`` bytes value (``.ATTRIBUTES/py_state``). Loading
a file never runs code (DESIGN.md), so the bytes are strict JSON, never pickle. What JSON lacks
is written as small tagged objects, so values come back with their Python types:

* tuples ``{"__tuple__": [...]}``; non-finite floats ``{"__float__": "nan" | "inf" | "-inf"}``;
* bytes ``{"__bytes__": "<base64>"}``; dicts with non-str keys ``{"__dict__": [[k, v], ...]}``;
* numpy arrays ``{"__ndarray__": {"dtype": "<f4", "shape": [2], "data": "<base64>"}}``
  (little-endian, C order), numpy scalars as Python numbers;
* anything an integration's ``default`` hook turns into a tagged dict (torch tensors).

A str-keyed dict that looks like a tag is written as ``__dict__`` pairs, so no user data can
be mistaken for one.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from trackpoint.bundle.dtypes import datatype_for, is_string_dtype
from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.python_state import PythonState

__all__ = ["JsonState", "array_from_json", "array_to_json", "dumps", "loads"]

_TUPLE = "__tuple__"
_FLOAT = "__float__"
_BYTES = "__bytes__"
_DICT = "__dict__"
_NDARRAY = "__ndarray__"
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

Default = Callable[[Any], "dict[str, Any] | None"]
"""Turns a value the codec does not know into a one-key tagged dict, or returns None."""


def array_to_json(array: np.ndarray, *, what: str) -> dict[str, Any]:
    """A numpy array as ``{"dtype", "shape", "data"}`` (base64 of little-endian C-order bytes).

    Raises:
        InvalidArgumentError: the dtype cannot be stored (object, strings, structured).
    """
    dtype = array.dtype
    if is_string_dtype(dtype):
        raise InvalidArgumentError(
            f"{what} holds a numpy array of dtype {dtype}; only numeric and bool arrays can be "
            "stored in JSON state"
        )
    datatype_for(dtype)  # rejects datetime, structured, float128, ... with a clear message
    little = dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
    data = np.ascontiguousarray(array, dtype=little).tobytes()
    return {
        "dtype": little.str if little.kind != "V" else little.name,
        "shape": list(array.shape),
        "data": base64.b64encode(data).decode("ascii"),
    }


def array_from_json(spec: Mapping[str, Any], *, what: str) -> np.ndarray:
    """The writable numpy array that :func:`array_to_json` encoded.

    Raises:
        InvalidArgumentError: the encoding is malformed.
    """
    try:
        dtype_name = spec["dtype"]
        shape = tuple(int(d) for d in spec["shape"])
        data = base64.b64decode(spec["data"], validate=True)
        dtype = _dtype_from_name(dtype_name)
        array = np.frombuffer(data, dtype=dtype).reshape(shape)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{what}: malformed array in JSON state ({exc})") from exc
    return array.copy()


def _dtype_from_name(name: str) -> np.dtype[Any]:
    try:
        dtype = np.dtype(name)
    except TypeError:
        import ml_dtypes

        dtype = np.dtype(getattr(ml_dtypes, name))
    if dtype.kind in "OSUVMm" and dtype.name not in _ml_dtype_names():
        raise ValueError(f"dtype {name!r} is not a numeric dtype")
    return dtype


def _ml_dtype_names() -> frozenset[str]:
    import ml_dtypes

    return frozenset(
        name for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                          "float8_e5m2fnuz", "int4", "uint4")
        if hasattr(ml_dtypes, name)
    )


def _is_tag_like(mapping: Mapping[Any, Any]) -> bool:
    return len(mapping) == 1 and all(
        isinstance(k, str) and k.startswith("__") and k.endswith("__") for k in mapping
    )


def _encode(value: Any, where: str, default: Default | None) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):  # np.bool_ is neither (bool was handled above)
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if math.isfinite(number):
            return number
        return {_FLOAT: "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf")}
    if isinstance(value, (bytes, bytearray)):
        return {_BYTES: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, np.ndarray):
        return {_NDARRAY: array_to_json(value, what=where)}
    if isinstance(value, list):
        return [_encode(v, f"{where}[{i}]", default) for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(v, f"{where}[{i}]", default) for i, v in enumerate(value)]}
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value) and not _is_tag_like(value):
            return {k: _encode(v, f"{where}[{k!r}]", default) for k, v in value.items()}
        return {
            _DICT: [
                [_encode(k, f"{where} key {k!r}", default), _encode(v, f"{where}[{k!r}]", default)]
                for k, v in value.items()
            ]
        }
    if default is not None:
        tagged = default(value)
        if tagged is not None:
            return tagged
    raise InvalidArgumentError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which cannot be "
        "stored as JSON state (no pickle is used); keep such state as numbers, strings, lists, "
        "dicts, numpy arrays or tensors"
    )


def _decode(value: Any, where: str, hooks: Mapping[str, Callable[[Any], Any]]) -> Any:
    if isinstance(value, list):
        return [_decode(v, f"{where}[{i}]", hooks) for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        (tag, body), = value.items()
        if tag == _TUPLE:
            return tuple(_decode(v, f"{where}[{i}]", hooks) for i, v in enumerate(body))
        if tag == _FLOAT:
            if body not in _NON_FINITE:
                raise InvalidArgumentError(f"{where}: unknown float {body!r} in JSON state")
            return _NON_FINITE[body]
        if tag == _BYTES:
            return base64.b64decode(body)
        if tag == _NDARRAY:
            return array_from_json(body, what=where)
        if tag == _DICT:
            return {
                _hashable(_decode(k, where, hooks)): _decode(v, f"{where}[{k!r}]", hooks)
                for k, v in body
            }
        if tag in hooks:
            return hooks[tag](body)
    return {k: _decode(v, f"{where}[{k!r}]", hooks) for k, v in value.items()}


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def dumps(value: Any, *, what: str, default: Default | None = None) -> bytes:
    """``value`` as strict JSON bytes (UTF-8), with the tags in the module docstring.

    Args:
        value: numbers, strings, None, lists, tuples, dicts, bytes, numpy arrays and whatever
            ``default`` converts.
        what: names the state in errors (e.g. ``"scheduler state_dict"``).
        default: converts values of other types to a tagged dict (or returns None).

    Raises:
        InvalidArgumentError: a value cannot be stored (names its place in ``value``).
    """
    encoded = _encode(value, what, default)
    return json.dumps(encoded, allow_nan=False, separators=(",", ":")).encode("utf-8")


def loads(
    data: bytes, *, what: str, hooks: Mapping[str, Callable[[Any], Any]] | None = None
) -> Any:
    """The value :func:`dumps` encoded; ``hooks`` decode an integration's tags.

    Raises:
        InvalidArgumentError: ``data`` is not JSON state (names ``what``).
    """
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgumentError(
            f"{what}: the saved state is not valid JSON ({exc}); was it written by another "
            "program under the same checkpoint key?"
        ) from exc
    return _decode(parsed, what, hooks or {})


class JsonState(PythonState, dict[str, Any]):
    """A dict of plain Python values (ints, floats, strings, lists, numpy arrays) saved as JSON.

    Plain values in ordinary tracked dicts and lists are checkpointed too (``plain_values.py``);
    a JsonState also holds numpy arrays, and a restore replaces its whole contents in place
    (keys the checkpoint lacks are dropped), so references to this dict stay valid.

    Example:
        >>> progress = JsonState(epoch=0, best_loss=float("inf"))
        >>> ckpt = tp.Checkpoint(model=model, progress=progress)
        >>> progress["epoch"] += 1
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        dict.__init__(self, *args, **kwargs)

    def serialize(self) -> bytes:
        # docstring inherited
        return dumps(dict(self), what="JsonState")

    def deserialize(self, data: bytes) -> None:
        # docstring inherited
        self._prepare_deserialize(data)()

    def _prepare_deserialize(self, data: bytes) -> Callable[[], None]:
        # docstring inherited
        values = loads(data, what="JsonState")
        if not isinstance(values, dict):
            raise InvalidArgumentError(
                f"JsonState: the checkpoint holds a {type(values).__name__}, not a dict"
            )

        def apply() -> None:
            self.clear()
            self.update(values)

        return apply

    def __repr__(self) -> str:
        return f"JsonState({dict.__repr__(self)})"

    __hash__ = None
