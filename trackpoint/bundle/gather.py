"""Many small tensors as a few buffers: the batch behind ``BundleWriter.add_many`` (§6).

A model's state is often tens of thousands of tensors of a few hundred bytes. Writing each one
costs Python work per tensor (a ``tobytes`` copy, a CRC call, an entry) several times the cost
of its bytes. Here a run of small C-contiguous tensors of one dtype is copied into one buffer by
``np.concatenate`` and every tensor's CRC32C is taken over its slice of that buffer, which the
copy has just brought into the cache, with the per-tensor steps done by ``map`` in C. The bytes
and CRCs are the same as adding the tensors one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from trackpoint.bundle.crc import crc32c_extend

__all__ = ["GatheredChunk", "gather_chunks", "small_runs"]

_NBYTES = attrgetter("nbytes")
_DTYPE = attrgetter("dtype")
_C_CONTIGUOUS = attrgetter("flags.c_contiguous")


def small_runs(
    arrays: Sequence[np.ndarray], is_fast: Callable[[np.dtype], bool], limit: int
) -> tuple[list[tuple[int, int, bool]], np.ndarray]:
    """Split ``arrays`` into consecutive runs ``(start, stop, gathered)``; also their sizes.

    A gathered run holds arrays of one dtype that ``is_fast`` says is written from its raw
    buffer (asked once per distinct dtype), each C-contiguous and under ``limit`` bytes; every
    other array is a run of its own. The sizes (``nbytes``, int64) serve :func:`gather_chunks`.
    """
    n = len(arrays)
    sizes = np.fromiter(map(_NBYTES, arrays), np.int64, n)
    if n == 0:
        return [], sizes
    dtypes = list(map(_DTYPE, arrays))
    code_of = {dt: (i if is_fast(dt) else -1) for i, dt in enumerate(dict.fromkeys(dtypes))}
    codes = np.fromiter(map(code_of.__getitem__, dtypes), np.int64, n)
    ok = codes >= 0
    ok &= sizes < limit
    ok &= np.fromiter(map(_C_CONTIGUOUS, arrays), np.bool_, n)
    # A run ends where eligibility or dtype changes, and after every ineligible array.
    ends = np.flatnonzero((ok[1:] != ok[:-1]) | (codes[1:] != codes[:-1]) | ~ok[:-1]) + 1
    bounds = [0, *ends.tolist(), n]
    flags = ok[bounds[:-1]].tolist()
    return [(a, b, f) for a, b, f in zip(bounds[:-1], bounds[1:], flags)], sizes


@dataclass(frozen=True, slots=True)
class GatheredChunk:
    """Consecutive tensors of a gathered run, stored back to back in ``data``."""

    data: bytes
    """Their bytes, in order."""
    count: int
    """How many tensors."""
    offsets: list[int]
    """Each tensor's offset in the data file."""
    sizes: list[int]
    """Each tensor's size in bytes."""
    crcs: list[int]
    """Each tensor's CRC32C (unmasked)."""


def gather_chunks(
    arrays: Sequence[np.ndarray], sizes: np.ndarray, chunk_bytes: int, offset: int
) -> Iterator[GatheredChunk]:
    """Copy a gathered run into buffers of about ``chunk_bytes``; CRC each tensor there.

    ``arrays`` is one run from :func:`small_runs` and ``sizes`` their sizes, to be written at
    ``offset`` of the data file. Yields chunks in order, so memory stays at one chunk whatever
    the run's total size. Each tensor is hashed right after the chunk's copy has read it, while
    its bytes are in the cache; ``bytes.join`` and the CRC read C-contiguous arrays of any
    dtype through the buffer protocol, without a format.
    """
    n = len(arrays)
    ends = np.cumsum(sizes)
    total = int(ends[-1]) if n else 0
    # Split where the running total crosses each multiple of chunk_bytes (at least one tensor).
    cuts = np.searchsorted(ends, np.arange(chunk_bytes, total, chunk_bytes))
    bounds = sorted({0, n, *np.minimum(cuts + 1, n).tolist()})
    offsets = ends - sizes + offset
    for a, b in zip(bounds[:-1], bounds[1:]):
        part = arrays[a:b]
        data = b"".join(part)
        crcs = list(map(crc32c_extend, part))
        yield GatheredChunk(data, b - a, offsets[a:b].tolist(), sizes[a:b].tolist(), crcs)
