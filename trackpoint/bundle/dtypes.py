"""TensorFlow ``DataType`` values and their numpy dtypes (tf-checkpoint-format.md §5.2).

A bundle stores each tensor's element type as the ``DataType`` enum. Numeric types map to one
numpy dtype each (``ml_dtypes`` supplies bfloat16, the float8 family and the sub-byte ints,
which TensorFlow stores one element per byte exactly as ``ml_dtypes`` lays them out).
``DT_STRING`` maps to numpy object arrays of ``bytes`` (every byte kept: embedded and trailing
NULs, any length); on write, object arrays of ``bytes``/``str``, numpy 2's variable-width
``StringDType`` (kind ``T``) and the fixed-width ``S``/``U`` kinds are accepted too (``str`` is
stored as UTF-8). Fixed-width ``S`` elements are what numpy says they are: NUL-padded, so
trailing NUL bytes are padding and not saved (TensorFlow reads ``S`` arrays the same way);
binary values belong in object arrays.
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np

from trackpoint.errors import InvalidArgumentError

__all__ = [
    "DataType",
    "datatype_for",
    "element_size",
    "is_string_dtype",
    "numpy_dtype_for",
]


class DataType(enum.IntEnum):
    """TensorFlow's ``DataType`` enum, TF 2.21 numbering (types.proto)."""

    DT_INVALID = 0
    DT_FLOAT = 1
    DT_DOUBLE = 2
    DT_INT32 = 3
    DT_UINT8 = 4
    DT_INT16 = 5
    DT_INT8 = 6
    DT_STRING = 7
    DT_COMPLEX64 = 8
    DT_INT64 = 9
    DT_BOOL = 10
    DT_QINT8 = 11
    DT_QUINT8 = 12
    DT_QINT32 = 13
    DT_BFLOAT16 = 14
    DT_QINT16 = 15
    DT_QUINT16 = 16
    DT_UINT16 = 17
    DT_COMPLEX128 = 18
    DT_HALF = 19
    DT_RESOURCE = 20
    DT_VARIANT = 21
    DT_UINT32 = 22
    DT_UINT64 = 23
    DT_FLOAT8_E5M2 = 24
    DT_FLOAT8_E4M3FN = 25
    DT_FLOAT8_E4M3FNUZ = 26
    DT_FLOAT8_E4M3B11FNUZ = 27
    DT_FLOAT8_E5M2FNUZ = 28
    DT_INT4 = 29
    DT_UINT4 = 30
    DT_INT2 = 31
    DT_UINT2 = 32
    DT_FLOAT4_E2M1FN = 33


_D = DataType

# numpy kinds stored as DT_STRING: fixed-width bytes and unicode, object (elements checked when
# encoded), numpy 2's StringDType.
_STRING_KINDS = "SUOT"

# Builtin numpy kinds by (kind, itemsize). ml_dtypes types are matched by type first, because
# float8 types report kind "f" with itemsize 1.
_BUILTIN: dict[tuple[str, int], DataType] = {
    ("b", 1): _D.DT_BOOL,
    ("i", 1): _D.DT_INT8,
    ("i", 2): _D.DT_INT16,
    ("i", 4): _D.DT_INT32,
    ("i", 8): _D.DT_INT64,
    ("u", 1): _D.DT_UINT8,
    ("u", 2): _D.DT_UINT16,
    ("u", 4): _D.DT_UINT32,
    ("u", 8): _D.DT_UINT64,
    ("f", 2): _D.DT_HALF,
    ("f", 4): _D.DT_FLOAT,
    ("f", 8): _D.DT_DOUBLE,
    ("c", 8): _D.DT_COMPLEX64,
    ("c", 16): _D.DT_COMPLEX128,
}

_ML_NAMES: dict[DataType, str] = {
    _D.DT_BFLOAT16: "bfloat16",
    _D.DT_FLOAT8_E5M2: "float8_e5m2",
    _D.DT_FLOAT8_E4M3FN: "float8_e4m3fn",
    _D.DT_FLOAT8_E4M3FNUZ: "float8_e4m3fnuz",
    _D.DT_FLOAT8_E4M3B11FNUZ: "float8_e4m3b11fnuz",
    _D.DT_FLOAT8_E5M2FNUZ: "float8_e5m2fnuz",
    _D.DT_INT4: "int4",
    _D.DT_UINT4: "uint4",
    _D.DT_INT2: "int2",
    _D.DT_UINT2: "uint2",
    _D.DT_FLOAT4_E2M1FN: "float4_e2m1fn",
}
# Only the types this ml_dtypes release provides.
_ML: dict[DataType, np.dtype] = {
    dt: np.dtype(getattr(ml_dtypes, name))
    for dt, name in _ML_NAMES.items()
    if hasattr(ml_dtypes, name)
}
_ML_BY_TYPE: dict[type, DataType] = {d.type: dt for dt, d in _ML.items()}

# Quantized types hold plain integers on disk; they are read as those integers but never
# written (numpy has no way to say "quantized").
_QUANTIZED: dict[DataType, np.dtype] = {
    _D.DT_QINT8: np.dtype(np.int8),
    _D.DT_QUINT8: np.dtype(np.uint8),
    _D.DT_QINT16: np.dtype(np.int16),
    _D.DT_QUINT16: np.dtype(np.uint16),
    _D.DT_QINT32: np.dtype(np.int32),
}

_NUMPY: dict[DataType, np.dtype] = {
    **{
        dt: np.dtype(f"<{kind}{size}") if kind != "b" else np.dtype(bool)
        for (kind, size), dt in _BUILTIN.items()
    },
    **_ML,
    **_QUANTIZED,
    _D.DT_STRING: np.dtype(object),
}


def _name(value: int) -> str:
    try:
        return DataType(value).name
    except ValueError:
        return f"unknown DataType {value}"


def datatype_for(dtype: np.dtype, *, key: str | None = None) -> DataType:
    """The ``DataType`` under which an array of ``dtype`` is stored.

    Byte order is ignored here (the writer converts to little-endian). ``S``, ``U``, object and
    ``StringDType`` dtypes map to ``DT_STRING``; object elements are checked when they are
    encoded.

    Raises:
        InvalidArgumentError: numpy has no TensorFlow equivalent for ``dtype`` (datetime,
            structured, void, float128, ...).
    """
    dtype = np.dtype(dtype)
    found = _ML_BY_TYPE.get(dtype.type)
    if found is not None:
        return found
    if dtype.kind in _STRING_KINDS:
        return _D.DT_STRING
    if dtype.fields is None and dtype.subdtype is None:
        found = _BUILTIN.get((dtype.kind, dtype.itemsize))
        if found is not None:
            return found
    where = f" for key '{key}'" if key is not None else ""
    raise InvalidArgumentError(
        f"Unsupported dtype {dtype}{where}: TensorFlow checkpoints store bool, (u)int8-64, "
        "float16/32/64, complex64/128, bfloat16, float8, int4/uint4 and strings; "
        "convert the array to one of these first",
        key=key,
    )


def numpy_dtype_for(datatype: int, *, key: str | None = None, path: str | None = None) -> np.dtype:
    """The numpy dtype a tensor of ``datatype`` is read as (little-endian; strings: object).

    Raises:
        InvalidArgumentError: ``datatype`` cannot be represented (DT_VARIANT, DT_RESOURCE,
            reference types, DT_INVALID, or a type this ml_dtypes release lacks).
    """
    dtype: np.dtype | None = _NUMPY.get(datatype)  # type: ignore[call-overload]
    if dtype is None:
        where = f" of key '{key}'" if key is not None else ""
        where += f" in {path}" if path is not None else ""
        raise InvalidArgumentError(
            f"Cannot read tensor{where}: dtype {_name(datatype)} has no numpy equivalent "
            "(variant, resource and reference tensors cannot be decoded without TensorFlow)",
            key=key,
            path=path,
        )
    return dtype


def element_size(datatype: int) -> int | None:
    """Bytes per element on disk, or ``None`` for variable-size types (strings, variants)."""
    if datatype == _D.DT_STRING:
        return None
    dtype: np.dtype | None = _NUMPY.get(datatype)  # type: ignore[call-overload]
    return None if dtype is None else dtype.itemsize


def is_string_dtype(dtype: np.dtype) -> bool:
    """True for numpy dtypes stored as ``DT_STRING`` (``S``, ``U``, object, ``StringDType``)."""
    return np.dtype(dtype).kind in _STRING_KINDS
