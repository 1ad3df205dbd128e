"""CRC-32C (Castagnoli) and TensorFlow's checksum masking (tf-checkpoint-format.md §2.2).

Every checksum in a bundle is a CRC-32C stored *masked*: TensorFlow rotates the CRC and adds a
constant so that a CRC computed over bytes that themselves contain a CRC is not degenerate.
The hashing itself is the ``crc32c`` package (hardware-accelerated, releases the GIL on large
buffers), so callers hash numpy buffers and mmap slices without copying them.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

import crc32c as _crc32c

from trackpoint.bundle import threads

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = [
    "MASK_DELTA",
    "PARALLEL_HASH_BYTES",
    "crc32c",
    "crc32c_extend",
    "crc32c_in_background",
    "extend",
    "mask",
    "masked_crc32c",
    "unmask",
]

MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF


def crc32c(data: Buffer) -> int:
    """CRC-32C of ``data`` (any C-contiguous buffer: bytes, memoryview, numpy array)."""
    return _crc32c.crc32c(data)


def extend(crc: int, data: Buffer) -> int:
    """Continue the running CRC ``crc`` over ``data``: ``extend(crc32c(a), b) == crc32c(a + b)``."""
    return _crc32c.crc32c(data, crc)


def mask(crc: int) -> int:
    """Masked form of ``crc``: rotate right by 15 bits, then add ``MASK_DELTA`` (mod 2**32)."""
    crc &= _U32
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & _U32


def unmask(masked: int) -> int:
    """Inverse of :func:`mask`: subtract ``MASK_DELTA``, then rotate left by 15 bits."""
    rot = (masked - MASK_DELTA) & _U32
    return ((rot >> 17) | (rot << 15)) & _U32


# The C function itself, ``crc32c_extend(data, crc=0)``: ``extend(crc, data)`` without a Python
# call around it, for loops over many small tensors where that call costs as much as the hash.
crc32c_extend = _crc32c.crc32c


def masked_crc32c(data: Buffer) -> int:
    """``mask(crc32c(data))``: as stored in block trailers and ``BundleEntryProto.crc32c``."""
    return mask(_crc32c.crc32c(data))


# Buffers from this size on are worth hashing on a helper thread while the caller's thread
# does something else (writes the bytes, checks or copies other tensors): the hash releases
# the GIL, so the pass over memory overlaps instead of adding to the caller's time.
PARALLEL_HASH_BYTES = 4 << 20


def crc32c_in_background(data: Buffer, crc: int = 0) -> Future[int]:
    """``extend(crc, data)`` computed on a thread of the process's hashing pool.

    The pool (:mod:`trackpoint.bundle.threads`) is shared with every other hashing and made
    on first use; when the interpreter is exiting and no thread can start, the CRC is computed
    now and returned as a completed future. ``data`` must not change until the future is done.
    """
    return threads.submit(_crc32c.crc32c, data, crc)
