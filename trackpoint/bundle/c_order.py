"""Any numpy array as C-order little-endian bytes in bounded pieces, as data files store it (§4).

Strided, Fortran-ordered and big-endian arrays cannot be written from their own buffer; they are
converted a few MiB at a time so a save of a huge such array never holds a second copy of it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator

import numpy as np

__all__ = ["CHUNK_BYTES", "c_order_chunks", "is_little_endian"]

CHUNK_BYTES = 8 << 20
"""Copies of arrays that cannot be written as they are are made this many bytes at a time."""


def is_little_endian(dtype: np.dtype) -> bool:
    """True if ``dtype`` stores its elements little-endian (or has no byte order)."""
    order = dtype.byteorder
    return order in "<|" or (order == "=" and sys.byteorder == "little")


def c_order_chunks(array: np.ndarray, dtype: np.dtype) -> Iterator[np.ndarray]:
    """Yield C-order, ``dtype`` copies of consecutive row-major pieces of ``array``.

    Splits along the first axis whose trailing block fits in :data:`CHUNK_BYTES`, so the number
    of pieces is about ``nbytes / CHUNK_BYTES`` and each piece is at most that size.
    """
    if array.ndim == 0:
        yield np.ascontiguousarray(array.reshape(1), dtype=dtype)
        return
    limit = CHUNK_BYTES
    shape = array.shape
    itemsize = dtype.itemsize
    axis = 0
    while axis < len(shape) - 1 and math.prod(shape[axis + 1 :]) * itemsize > limit:
        axis += 1
    row_bytes = math.prod(shape[axis + 1 :]) * itemsize
    step = max(1, limit // max(row_bytes, 1))
    for outer in np.ndindex(*shape[:axis]):
        sub = array[outer]
        for start in range(0, shape[axis], step):
            yield np.ascontiguousarray(sub[start : start + step], dtype=dtype)
