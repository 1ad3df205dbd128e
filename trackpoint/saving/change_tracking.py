"""Change signals of saved values: when is a value the same as in the previous checkpoint?

Incremental saves (:mod:`trackpoint.saving.incremental`, docs/incremental.md) skip a value only
when it is certainly unchanged; a wrong "unchanged" would put stale bytes into a checkpoint
without a word. Each value gets a *token* at the moment of the save, compared with the token
recorded when the previous checkpoint was written:

* An exact signal, a :class:`ValueVersion`, where a trackable can give one *and the save trusts
  it* (``CheckpointOptions(trust_immutable_arrays=True)``): the value is a pure function of an
  object believed immutable (a ``jax.Array``), so the same object means the same value. The
  holder is kept through a weak reference, so a new object at a recycled address never passes
  for the old one. Trackables offer signals through ``_value_versions()``
  (:class:`SupportsValueVersions`). Not trusted by default: a CPU ``jax.Array`` can be written
  in place through DLPack (``torch.from_dlpack(array).add_(1)``), so by default its bytes are
  hashed like a numpy array's.
* Otherwise a 128-bit content digest (XXH3-128, ~19 GB/s here: one pass over memory) of
  exactly what the data file stores: the dtype, the shape and the little-endian C-order bytes;
  for strings every element's length and bytes. numpy arrays, ``tp.Variable`` s and torch
  tensors are hashed: none of them has an exact signal. A numpy array can change through any
  view; a ``tp.Variable``'s array is reachable in place (``Variable.array``, ``np.asarray``,
  ``Variable.wrap``); torch's ``tensor._version`` misses writes through ``tensor.data``,
  ``tensor.numpy()`` views and fused optimizer kernels (``torch.optim.AdamW(fused=True)``
  leaves it unchanged while it updates parameters and state).
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import xxhash

from trackpoint.bundle import threads
from trackpoint.graph.keys import local_name, unescape_local_name
from trackpoint.saving.sharding import ShardableTensor

__all__ = [
    "SupportsValueVersions",
    "Token",
    "ValueKey",
    "ValueVersion",
    "content_digest",
    "content_digests",
    "run_shared",
    "same_token",
    "value_tokens",
    "value_versions",
]

ValueKey = tuple[str, str]
"""A value of one save: (checkpoint key, slice spec)."""

# Non-contiguous and big-endian arrays are hashed this many bytes at a time.
_CHUNK_BYTES = 8 << 20
# Arrays larger than this are hashed as runs of rows of about this size (see content_digest).
_SEGMENT_BYTES = 32 << 20
# Below this many bytes per save, hashing on one thread beats handing work to others.
_PARALLEL_BYTES = 16 << 20


@dataclass(frozen=True, slots=True, eq=False)
class ValueVersion:
    """An exact change signal: the value is determined by ``holder`` (immutable) and ``state``.

    Two versions match when their holder is the same live object and their states are equal.
    """

    holder: weakref.ref[Any]
    """The immutable object the value is read from, held weakly."""
    state: Hashable = None
    """Anything else the value depends on (None for most)."""

    def matches(self, other: object) -> bool:
        """True if ``other`` is a version of the same live holder in the same state."""
        if not isinstance(other, ValueVersion):
            return False
        held = self.holder()
        return held is not None and held is other.holder() and self.state == other.state


@runtime_checkable
class SupportsValueVersions(Protocol):
    """A trackable with exact change signals for some of its values.

    Implement it only where the signal is exact: an object that may be written in place
    (through a view, an alias or a kernel that bypasses bookkeeping) must not offer one.
    """

    def _value_versions(self) -> Mapping[str, ValueVersion | None]:
        """Value name (as in ``_serialize_to_tensors``) -> its version, or None: hash it."""
        ...


Token = ValueVersion | bytes
"""What a save records per value: an exact version, or a content digest."""


def same_token(old: Token | None, new: Token) -> bool:
    """True if a value with token ``new`` is certainly the one recorded with ``old``."""
    if old is None:
        return False
    if isinstance(new, ValueVersion):
        return new.matches(old)
    return isinstance(old, bytes) and old == new


def _string_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8", "surrogatepass")
    return repr(item).encode("utf-8")  # never stored: the save refuses it; just distinct


_DTYPE_NAMES: dict[np.dtype[Any], str] = {}  # dtype.name is computed in Python at each call


def _header(array: np.ndarray) -> tuple[np.ndarray, bytes | None]:
    """(the array as the file stores numbers: little-endian, at least 1-D; its header), or
    (the array, None) for strings."""
    dtype = array.dtype
    if dtype.hasobject or dtype.kind in "SUT":
        return array, None
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    header = f"{name}{array.shape}".encode()
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder == "big"):
        array = array.astype(dtype.newbyteorder("<"))
    return (array.reshape(1) if array.ndim == 0 else array), header


def _hash_strings(array: np.ndarray) -> bytes:
    digest = xxhash.xxh3_128()
    digest.update(f"strings{array.shape}".encode())
    for item in array.reshape(-1).tolist():
        data = _string_bytes(item)
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.digest()


def _hash_rows(array: np.ndarray, start: int = 0, stop: int | None = None) -> bytes:
    """XXH3-128 of the C-order bytes of ``array[start:stop]`` (no header)."""
    part = array[start:stop]
    if part.flags.c_contiguous:
        return xxhash.xxh3_128_digest(memoryview(part.reshape(-1).view(np.uint8)))
    digest = xxhash.xxh3_128()
    row = max(1, part[0].nbytes) if part.shape[0] else 1
    step = max(1, _CHUNK_BYTES // row)
    for begin in range(0, part.shape[0], step):
        piece = np.ascontiguousarray(part[begin : begin + step])
        digest.update(memoryview(piece.reshape(-1).view(np.uint8)))
    return digest.digest()


def _segments(array: np.ndarray) -> list[tuple[int, int]]:
    """Row ranges of a large array hashed separately (and in parallel): [] if it is small."""
    if array.nbytes <= _SEGMENT_BYTES or array.shape[0] < 2:
        return []
    row = max(1, array[0].nbytes)
    step = max(1, _SEGMENT_BYTES // row)
    return [(i, min(i + step, array.shape[0])) for i in range(0, array.shape[0], step)]


def _combine(header: bytes, parts: Sequence[bytes]) -> bytes:
    digest = xxhash.xxh3_128(header)
    digest.update(b"segments")
    for part in parts:
        digest.update(part)
    return digest.digest()


def content_digest(array: np.ndarray) -> bytes:
    """XXH3-128 of what a data file stores for ``array``: dtype, shape, then the bytes.

    Numbers are hashed as little-endian C-order bytes (the file's form), strings as each
    element's length and bytes, so two arrays get equal digests iff a checkpoint would store
    the same value for them (up to XXH3-128 collisions: about 2**-128 per pair for data not
    crafted to collide). An array over 32 MiB is hashed as 32 MiB runs of rows whose digests
    are hashed together (so that :func:`value_tokens` can hash the runs in parallel): still a
    function of exactly the stored form.
    """
    array, header = _header(array)
    if header is None:
        return _hash_strings(array)
    segments = _segments(array)
    if segments:
        return _combine(header, [_hash_rows(array, a, b) for a, b in segments])
    return xxhash.xxh3_128_digest(header + _hash_rows(array))


def value_versions(
    tensors: Sequence[ShardableTensor], *, trust: bool = False
) -> dict[ValueKey, ValueVersion]:
    """The exact versions of the values that have one (cheap: no bytes are read).

    Take them when the values are snapshotted: a version names the holder *now*.
    ``trust``: the save's ``trust_immutable_arrays``; without it there are none (every value
    is hashed), since an "immutable" array can still be written in place through DLPack.
    """
    versions: dict[int, Mapping[str, ValueVersion | None]] = {}
    out: dict[ValueKey, ValueVersion] = {}
    if not trust:
        return out
    for st in tensors:
        trackable = st.trackable
        if trackable is None or not hasattr(type(trackable), "_value_versions"):
            continue
        known = versions.get(id(trackable))
        if known is None:
            known = versions[id(trackable)] = trackable._value_versions()
        version = known.get(unescape_local_name(local_name(st.checkpoint_key)))
        if version is not None:
            out[(st.checkpoint_key, st.slice_spec)] = version
    return out


def run_shared(work: Callable[[], None]) -> None:
    """Run ``work`` on the calling thread and, at once, on threads of the process's hashing pool
    (:mod:`trackpoint.bundle.threads`; up to 4 threads in all, never more than the machine's
    cores); return when every run has.

    ``work`` takes jobs from a queue of its own until it is empty: hashing (XXH3, crc32c)
    releases the GIL, so the threads hash at once, and no thread waits while others work.

    Raises:
        The first error a run raised (after every run ended).
    """
    helpers = [threads.submit(work) for _ in range(threads.hash_threads() - 1)]
    try:
        work()
    finally:
        for helper in helpers:
            helper.result()  # re-raises a helper's error


def _digests(arrays: Sequence[np.ndarray]) -> list[bytes]:
    """``content_digest`` of each array; large inputs on several threads.

    xxhash releases the GIL while it hashes, so the threads hash at once: the work is cut into
    jobs of whole arrays and 32 MiB runs of large ones, taken largest first by the calling
    thread and ``threads - 1`` pool threads alike (no thread waits while others hash, and one
    pool task per thread rather than one per job).
    """
    total = sum(int(a.nbytes) for a in arrays)
    if total < _PARALLEL_BYTES or threads.hash_threads() < 2:
        return [content_digest(a) for a in arrays]
    prepared = [_header(a) for a in arrays]
    jobs: list[tuple[int, int, int, int]] = []  # (bytes, array index, start, stop; -1: whole)
    segments: list[list[tuple[int, int]]] = []
    for i, (array, header) in enumerate(prepared):
        runs = _segments(array) if header is not None else []
        segments.append(runs)
        if not runs:
            jobs.append((int(array.nbytes), i, -1, -1))
        for start, stop in runs:
            jobs.append((int(array[start:stop].nbytes), i, start, stop))
    jobs.sort(key=lambda job: -job[0])
    results: dict[tuple[int, int], bytes] = {}
    queue = iter(jobs)
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                job = next(queue, None)
            if job is None:
                return
            _, i, start, stop = job
            array, header = prepared[i]
            if header is None:
                digest = _hash_strings(array)
            elif start < 0:
                digest = xxhash.xxh3_128_digest(header + _hash_rows(array))
            else:
                digest = _hash_rows(array, start, stop)
            results[(i, start)] = digest

    run_shared(work)
    out = []
    for i, (_, header) in enumerate(prepared):
        if not segments[i]:
            out.append(results[(i, -1)])
        else:
            assert header is not None
            out.append(_combine(header, [results[(i, start)] for start, _ in segments[i]]))
    return out


def content_digests(arrays: Sequence[np.ndarray]) -> list[bytes]:
    """``[content_digest(a) for a in arrays]``, on several threads when there is enough to hash
    (an incremental save also hashes the bytes of the data files it links: linking.py)."""
    return _digests(arrays)


def value_tokens(
    tensors: Sequence[ShardableTensor],
    versions: Mapping[ValueKey, ValueVersion] | None = None,
    *,
    trust: bool = False,
) -> dict[ValueKey, Token]:
    """The token of every value: its exact version if it has one, else its content digest.

    ``versions``: taken earlier by :func:`value_versions`, when the values were snapshotted
    (an async distributed save hashes its copies later); by default taken now, and only if
    ``trust`` (see :func:`value_versions`).
    """
    if versions is None:
        versions = value_versions(tensors, trust=trust)
    tokens: dict[ValueKey, Token] = {}
    hashed: list[ShardableTensor] = []
    for st in tensors:
        key = (st.checkpoint_key, st.slice_spec)
        version = versions.get(key)
        if version is not None:
            tokens[key] = version
        else:
            hashed.append(st)
    for st, digest in zip(hashed, _digests([st.tensor for st in hashed])):
        tokens[(st.checkpoint_key, st.slice_spec)] = digest
    return tokens
