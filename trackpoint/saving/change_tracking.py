"""Change signals of saved values: when is a value the same as in the previous checkpoint?

Incremental saves (:mod:`trackpoint.saving.incremental`, docs/incremental.md) skip a value only
when it is certainly unchanged; a wrong "unchanged" would put stale bytes into a checkpoint
without a word. Each value gets a *token* at the moment of the save, compared with the token
recorded when the previous checkpoint was written:

* An exact signal, a :class:`ValueVersion`, where a trackable can give one: the value is a pure
  function of an *immutable* object (a ``jax.Array``), so the same object means the same
  value. The holder is kept through a weak reference, so a new object at a recycled address
  never passes for the old one. Trackables offer signals through ``_value_versions()``
  (:class:`SupportsValueVersions`).
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
import weakref
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import xxhash

from trackpoint.graph.keys import local_name, unescape_local_name
from trackpoint.saving.sharding import ShardableTensor

__all__ = [
    "SupportsValueVersions",
    "Token",
    "ValueKey",
    "ValueVersion",
    "content_digest",
    "same_token",
    "value_tokens",
]

ValueKey = tuple[str, str]
"""A value of one save: (checkpoint key, slice spec)."""

# Non-contiguous and big-endian arrays are hashed this many bytes at a time.
_CHUNK_BYTES = 8 << 20


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


def content_digest(array: np.ndarray) -> bytes:
    """XXH3-128 of what a data file stores for ``array``: dtype, shape, then the bytes.

    Numbers are hashed as little-endian C-order bytes (the file's form), strings as each
    element's length and bytes, so two arrays get equal digests iff a checkpoint would store
    the same value for them (up to XXH3-128 collisions: about 2**-128 per pair for data not
    crafted to collide).
    """
    digest = xxhash.xxh3_128()
    dtype = array.dtype
    if dtype.hasobject or dtype.kind in "SUT":
        digest.update(f"strings{array.shape}".encode())
        for item in array.reshape(-1).tolist():
            data = _string_bytes(item)
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
        return digest.digest()
    digest.update(f"{dtype.name}{array.shape}".encode())
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder == "big"):
        dtype = dtype.newbyteorder("<")
        array = array.astype(dtype)
    if array.ndim == 0:
        array = array.reshape(1)
    if array.flags.c_contiguous:
        digest.update(memoryview(array.reshape(-1).view(np.uint8)))
        return digest.digest()
    row = max(1, array[0].nbytes) if array.shape[0] else 1
    step = max(1, _CHUNK_BYTES // row)
    for start in range(0, array.shape[0], step):
        piece = np.ascontiguousarray(array[start : start + step])
        digest.update(memoryview(piece.reshape(-1).view(np.uint8)))
    return digest.digest()


def value_tokens(tensors: Sequence[ShardableTensor]) -> dict[ValueKey, Token]:
    """The token of every value: its trackable's exact version if it has one, else a digest."""
    versions: dict[int, Mapping[str, ValueVersion | None]] = {}
    tokens: dict[ValueKey, Token] = {}
    for st in tensors:
        trackable = st.trackable
        version: ValueVersion | None = None
        if trackable is not None and hasattr(type(trackable), "_value_versions"):
            known = versions.get(id(trackable))
            if known is None:
                known = versions[id(trackable)] = trackable._value_versions()
            version = known.get(unescape_local_name(local_name(st.checkpoint_key)))
        key = (st.checkpoint_key, st.slice_spec)
        tokens[key] = version if version is not None else content_digest(st.tensor)
    return tokens
