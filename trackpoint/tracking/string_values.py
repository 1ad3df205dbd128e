"""String values of variables and tracked arrays (TensorFlow's ``tf.string``).

A checkpoint's ``DT_STRING`` value is read as a numpy object array of ``bytes`` that keeps every
byte (tf-checkpoint-format.md §6.2). What a holder keeps of it:

* A ``tp.Variable`` built from strings without ``dtype=`` (Python ``bytes``/``str`` and lists of
  them, object arrays of ``bytes``/``str``, ``StringDType``, ``S`` or ``U`` arrays) holds an
  object array of ``bytes``, as a ``tf.Variable`` of ``tf.string`` does: a ``str`` is stored as
  its UTF-8 bytes and ``.numpy()`` gives ``bytes`` back. Values of any length then fit.
* A tracked numpy array is restored in place, so it keeps its dtype: an object array gets
  ``bytes`` elements (``str`` elements, decoded from UTF-8, if all its elements were ``str``);
  ``U`` and ``StringDType`` arrays get decoded ``str``; ``S`` arrays get the bytes.
* A value a fixed-width holder cannot keep exactly (longer than its width; a trailing NUL,
  which numpy drops as padding; not UTF-8 for a ``str`` holder) raises
  :class:`~trackpoint.errors.InvalidArgumentError` naming the element, before anything
  changes: binary strings are never silently cut.

Object arrays holding anything but ``bytes``/``str`` are refused: saving them would need pickle.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trackpoint.errors import InvalidArgumentError

__all__ = ["check_string_elements", "fit_strings", "is_string_array", "to_bytes_array"]

_STRING_KINDS = "SUOT"  # fixed-width bytes, fixed-width unicode, object, StringDType
_KEEP_EVERY_BYTE = "hold it in an object array of bytes (dtype=object), which keeps every byte"


def is_string_array(array: np.ndarray) -> bool:
    """True if ``array`` holds (or, for object arrays, may hold) strings."""
    return array.dtype.kind in _STRING_KINDS


def _index(flat_index: int, shape: tuple[int, ...]) -> str:
    """Readable position of the ``flat_index``-th element (row-major) of an array of ``shape``."""
    if len(shape) == 1:
        return str(flat_index)
    return str(tuple(int(i) for i in np.unravel_index(flat_index, shape)))


def _refuse(item: Any, flat_index: int, shape: tuple[int, ...], what: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"cannot checkpoint {what} of numpy dtype object holding {type(item).__name__} "
        f"(element {_index(flat_index, shape)}): string values hold bytes or str only, and "
        "other Python objects would need pickle. Use a numeric, bool or string array"
    )


def check_string_elements(array: np.ndarray, *, what: str) -> None:
    """Check that every element of the object array ``array`` is ``bytes`` or ``str``.

    Raises:
        InvalidArgumentError: an element is another Python object (names its type and index).
    """
    for i, item in enumerate(array.reshape(-1).tolist()):
        if not isinstance(item, (bytes, bytearray, str)):
            raise _refuse(item, i, array.shape, what)


def _bytes_elements(array: np.ndarray, what: str) -> list[bytes]:
    """Every element of a string array as ``bytes``, row-major (``str`` encoded as UTF-8)."""
    items = array.reshape(-1).tolist()
    kind = array.dtype.kind
    if kind == "S":
        return items
    if kind in "UT":
        return [item.encode("utf-8", "surrogatepass") for item in items]
    out: list[bytes] = []
    for i, item in enumerate(items):
        if isinstance(item, bytes):
            out.append(item if type(item) is bytes else bytes(item))
        elif isinstance(item, str):
            out.append(item.encode("utf-8", "surrogatepass"))
        elif isinstance(item, bytearray):
            out.append(bytes(item))
        else:
            raise _refuse(item, i, array.shape, what)
    return out


def _filled(shape: tuple[int, ...], dtype: np.dtype[Any], values: list[Any]) -> np.ndarray:
    out = np.empty(shape, dtype=dtype)
    if values:
        out.reshape(-1)[:] = values  # element by element: lists of bytes are not split
    return out


def to_bytes_array(array: np.ndarray, *, what: str) -> np.ndarray:
    """A new object array of ``bytes`` with the elements of the string array ``array``.

    Raises:
        InvalidArgumentError: an object element is neither ``bytes`` nor ``str``.
    """
    return _filled(array.shape, np.dtype(object), _bytes_elements(array, what))


def _decoded(
    elements: list[bytes], shape: tuple[int, ...], dtype: np.dtype[Any], what: str
) -> list[str]:
    out = []
    for i, item in enumerate(elements):
        try:
            out.append(item.decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidArgumentError(
                f"cannot restore {what}: element {_index(i, shape)} of the saved value is not "
                f"valid UTF-8, so its numpy dtype {dtype} (str elements) cannot keep it; "
                f"{_KEEP_EVERY_BYTE}"
            ) from None
    return out


def _check_width(
    values: list[Any],
    width: int,
    unit: str,
    dtype: np.dtype[Any],
    what: str,
    shape: tuple[int, ...],
) -> None:
    """Refuse values numpy would cut (too long) or strip (a trailing NUL is padding to it)."""
    for i, item in enumerate(values):
        if len(item) > width or item[-1:] in (b"\x00", "\x00"):
            problem = (
                f"has {len(item)} {unit}, more than the {width} its numpy dtype {dtype} holds"
                if len(item) > width
                else f"ends with a NUL, which its numpy dtype {dtype} would drop as padding"
            )
            raise InvalidArgumentError(
                f"cannot restore {what}: element {_index(i, shape)} of the saved value "
                f"{problem}; {_KEEP_EVERY_BYTE}"
            )


def fit_strings(saved: np.ndarray, target: np.ndarray, *, what: str) -> np.ndarray:
    """The string array ``saved`` as an array of ``target``'s dtype, without losing a byte.

    ``target`` is the holder the value will be copied into (its shape is checked by the
    caller); the result has ``target.dtype`` and ``saved.shape``.

    Raises:
        InvalidArgumentError: the holder cannot keep an element exactly (too long for a
            fixed width, a trailing NUL in a fixed-width holder, not UTF-8 for a ``str``
            holder), or ``saved`` holds objects other than ``bytes``/``str``.
    """
    dtype = target.dtype
    elements = _bytes_elements(saved, what)
    shape = saved.shape
    kind = dtype.kind
    values: list[Any]
    if kind == "S":
        _check_width(elements, dtype.itemsize, "bytes", dtype, what, shape)
        values = elements
    elif kind == "U":
        values = _decoded(elements, shape, dtype, what)
        _check_width(values, dtype.itemsize // 4, "characters", dtype, what, shape)
    elif kind == "T":
        values = _decoded(elements, shape, dtype, what)
    elif target.size and all(isinstance(item, str) for item in target.reshape(-1).tolist()):
        values = _decoded(elements, shape, dtype, what)  # an object array of str stays str
    else:
        values = elements
    return _filled(shape, dtype, values)
