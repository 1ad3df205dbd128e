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
from trackpoint.errors import CheckpointError, DataLossError, InvalidArgumentError
from trackpoint.tracking.python_state import PythonState

__all__ = ["MAX_DEPTH", "JsonState", "array_from_json", "array_to_json", "dumps", "loads"]

MAX_DEPTH = 100
"""Lists, dicts and tuples nested deeper than this are refused: on save (InvalidArgumentError)
and on read (DataLossError), so decoding and restoring in place never run out of stack."""

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
        DataLossError: the encoding is malformed (it comes from a file).
    """
    try:
        dtype_name = spec["dtype"]
        shape = tuple(int(d) for d in spec["shape"])
        data = base64.b64decode(spec["data"], validate=True)
        dtype = _dtype_from_name(dtype_name)
        array = np.frombuffer(data, dtype=dtype).reshape(shape)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise DataLossError(f"{what}: malformed array in JSON state ({exc})") from exc
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


def _encode(value: Any, where: str, default: Default | None, depth: int = 0) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if depth > MAX_DEPTH:
        raise InvalidArgumentError(
            f"{where} is nested more than {MAX_DEPTH} levels deep, which JSON state does not "
            "store (a reader refuses deeper state as damaged); flatten it, or keep it in a "
            "tp.PythonState of your own"
        )
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
    deeper = depth + 1
    if isinstance(value, list):
        return [_encode(v, f"{where}[{i}]", default, deeper) for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(v, f"{where}[{i}]", default, deeper)
                         for i, v in enumerate(value)]}  # fmt: skip
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value) and not _is_tag_like(value):
            return {k: _encode(v, f"{where}[{k!r}]", default, deeper) for k, v in value.items()}
        return {
            _DICT: [
                [_encode(k, f"{where} key {k!r}", default, deeper),
                 _encode(v, f"{where}[{k!r}]", default, deeper)]
                for k, v in value.items()
            ]  # fmt: skip
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


def _decode(
    value: Any, where: str, hooks: Mapping[str, Callable[[Any], Any]], depth: int = 0
) -> Any:
    if not isinstance(value, (list, dict)):
        return value
    if depth > MAX_DEPTH:
        raise DataLossError(f"{where}: the saved state is nested more than {MAX_DEPTH} levels deep")
    depth += 1
    if isinstance(value, list):
        return [_decode(v, f"{where}[{i}]", hooks, depth) for i, v in enumerate(value)]
    if len(value) == 1:
        (tag, body), = value.items()
        if tag == _TUPLE:
            return tuple(_decode(v, f"{where}[{i}]", hooks, depth) for i, v in enumerate(body))
        if tag == _FLOAT:
            if body not in _NON_FINITE:
                raise DataLossError(f"{where}: unknown float {body!r} in JSON state")
            return _NON_FINITE[body]
        if tag == _BYTES:
            return base64.b64decode(body, validate=True)  # strict: damage is not skipped
        if tag == _NDARRAY:
            return array_from_json(body, what=where)
        if tag == _DICT:
            return {
                _hashable(_decode(k, where, hooks, depth)): _decode(
                    v, f"{where}[{k!r}]", hooks, depth
                )
                for k, v in body
            }
        if tag in hooks:
            return hooks[tag](body)
    return {k: _decode(v, f"{where}[{k!r}]", hooks, depth) for k, v in value.items()}


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
        DataLossError: ``data`` is not JSON state (names ``what``): not JSON, nested more than
            ``MAX_DEPTH`` levels, an integer of more digits than Python converts, a malformed
            tag. Nothing is decoded halfway: the caller has changed nothing yet.
    """
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError: JSONDecodeError, or an integer past sys.get_int_max_str_digits();
        # RecursionError: nesting deeper than the interpreter's stack (before MAX_DEPTH).
        raise DataLossError(
            f"{what}: the saved state is not valid JSON state ({_short(exc)}); the checkpoint "
            "is damaged, or another program wrote this key"
        ) from None
    try:
        return _decode(parsed, what, hooks or {})
    except CheckpointError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError,
            RecursionError) as exc:  # a tag whose body has the wrong form (hooks included)
        raise DataLossError(
            f"{what}: the saved state is malformed JSON state ({type(exc).__name__}: "
            f"{_short(exc)}); the checkpoint is damaged, or another program wrote this key"
        ) from None  # fmt: skip


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:200] + "..."


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
