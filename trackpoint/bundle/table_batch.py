"""The one ``.index`` table builder: a whole table from sorted entries in one pass (§3).

:func:`build_table` reproduces TensorFlow's table builder byte for byte with the options the
bundle code uses (256 KiB blocks, restart interval 16, index restart interval 1, no
compression, an empty metaindex block, shortest-separator / short-successor index keys). It
takes every entry at once and computes the bytes with array operations: shared key prefixes
eight bytes at a time, the block boundaries of §3.5 per block rather than per entry, and the
entries' bytes as rows of a padded matrix squeezed by a mask; for the hundreds of thousands of
entries of a model of many small tensors, a per-entry loop would outweigh the tensors' own
bytes. ``tests/bundle/test_table_batch.py`` pins its output to bytes TensorFlow wrote and to a
reference of §3.5's steps.

Values come as :class:`Column` s, pieces that each entry's value concatenates, so that callers
that encode entries in a batch (:func:`~trackpoint.bundle.entry_batch.entry_columns`) never make
a ``bytes`` per entry; :func:`table_of_pairs` takes ``(key, value)`` pairs.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trackpoint.bundle.crc import crc32c, extend, mask
from trackpoint.bundle.table import (
    BLOCK_SIZE,
    FOOTER_SIZE,
    RESTART_INTERVAL,
    TABLE_MAGIC,
    BlockHandle,
    encode_varint,
)
from trackpoint.errors import InvalidArgumentError

__all__ = [
    "Column",
    "build_table",
    "short_successor",
    "shortest_separator",
    "table_of_pairs",
    "varint_bytes",
    "varint_sizes",
]

_MAGIC_BYTES = struct.pack("<Q", TABLE_MAGIC)
_NO_COMPRESSION = b"\x00"
# Keys are compared in windows of this many bytes; pairs that agree on a whole window (keys
# sharing over 128 bytes) are finished one by one in Python. Entries with a piece longer than
# this are laid out alone, so that no row pads a whole chunk of rows to its length.
_WINDOW = 128
# Rows handled at a time, bounding the padded matrices to a few MiB.
_ROWS = 32768
_U8 = np.dtype(np.uint8)
_I64 = np.dtype(np.int64)


def _shared_prefix(a: bytes, b: bytes) -> int:
    """Length of the common prefix of ``a`` and ``b``, compared in C (no per-byte loop)."""
    n = min(len(a), len(b))
    diff = int.from_bytes(a[:n], "big") ^ int.from_bytes(b[:n], "big")
    return n - (diff.bit_length() + 7) // 8


def shortest_separator(start: bytes, limit: bytes) -> bytes:
    """A short key K with ``start <= K < limit`` chosen exactly as LevelDB's bytewise comparator."""
    n = min(len(start), len(limit))
    i = 0
    while i < n and start[i] == limit[i]:
        i += 1
    if i >= n:
        return start  # one is a prefix of the other
    byte = start[i]
    if byte < 0xFF and byte + 1 < limit[i]:
        return start[:i] + bytes((byte + 1,))
    return start


def short_successor(key: bytes) -> bytes:
    """A short key >= ``key``: bump the first byte that is not 0xFF and cut after it."""
    for i, byte in enumerate(key):
        if byte != 0xFF:
            return key[:i] + bytes((byte + 1,))
    return key


class _BlockBuilder:
    """One block: prefix-compressed entries plus the restart array (§3.2)."""

    __slots__ = ("_buf", "_counter", "_interval", "_last_key", "_restarts")

    def __init__(self, interval: int) -> None:
        self._interval = interval
        self._buf = bytearray()
        self._restarts = [0]
        self._counter = 0
        self._last_key = b""

    @property
    def empty(self) -> bool:
        return not self._buf

    def estimated_size(self) -> int:
        return len(self._buf) + 4 * len(self._restarts) + 4

    def add(self, key: bytes, value: bytes) -> None:
        if self._counter < self._interval:
            shared = _shared_prefix(self._last_key, key)
            self._counter += 1
        else:
            shared = 0
            self._restarts.append(len(self._buf))
            self._counter = 1
        non_shared = len(key) - shared
        value_len = len(value)
        buf = self._buf
        if shared < 0x80 and non_shared < 0x80 and value_len < 0x80:
            buf += bytes((shared, non_shared, value_len))  # one byte per varint, the norm
        else:
            buf += encode_varint(shared) + encode_varint(non_shared) + encode_varint(value_len)
        buf += key[shared:]
        buf += value
        self._last_key = key

    def finish(self) -> bytes:
        tail = struct.pack(f"<{len(self._restarts) + 1}I", *self._restarts, len(self._restarts))
        block = bytes(self._buf) + tail
        self._buf = bytearray()
        self._restarts = [0]
        self._counter = 0
        self._last_key = b""
        return block


def varint_sizes(values: np.ndarray) -> np.ndarray:
    """Bytes of the varint (LEB128) of each non-negative int64 in ``values`` (1 to 10)."""
    sizes = np.ones(values.shape, _I64)
    for bits in range(7, 64, 7):
        sizes += values >= (1 << bits)
    return sizes


def varint_bytes(values: np.ndarray, sizes: np.ndarray, width: int) -> np.ndarray:
    """The varints of ``values`` as rows of a ``(n, width)`` uint8 matrix, zero-padded.

    ``sizes`` is :func:`varint_sizes` of ``values``; ``width`` at least its maximum.
    """
    u = values.astype(np.uint64)
    out = np.zeros((len(values), width), _U8)
    for k in range(width):
        byte = ((u >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(_U8)
        byte |= np.where(sizes > k + 1, 0x80, 0).astype(_U8)
        out[:, k] = np.where(sizes > k, byte, 0)
    return out


@dataclass(frozen=True, slots=True)
class Column:
    """One byte string per entry: entry ``i``'s is its first ``lengths[i]`` bytes of row ``i``
    of ``matrix``, or ``lengths[i]`` bytes of ``buf`` from ``starts[i]``.

    Build one with :meth:`of_matrix`, :meth:`of_buffer`, :meth:`of_bytes` or :meth:`varints`.
    """

    lengths: np.ndarray
    matrix: np.ndarray | None
    buf: np.ndarray | None  # zero-padded by _WINDOW bytes, so that windows never run off it
    starts: np.ndarray | None

    @classmethod
    def of_matrix(cls, matrix: np.ndarray, lengths: np.ndarray) -> Column:
        return cls(lengths, matrix, None, None)

    @classmethod
    def of_buffer(cls, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> Column:
        return cls(lengths, None, np.concatenate([buf, np.zeros(_WINDOW, _U8)]), starts)

    @classmethod
    def of_bytes(cls, values: Sequence[bytes]) -> Column:
        lengths = np.fromiter(map(len, values), _I64, len(values))
        starts = np.cumsum(lengths) - lengths
        return cls.of_buffer(np.frombuffer(b"".join(values), _U8), starts, lengths)

    @classmethod
    def varints(cls, values: np.ndarray) -> Column:
        sizes = varint_sizes(values)
        width = int(sizes.max()) if len(values) else 1
        return cls(sizes, varint_bytes(values, sizes, width), None, None)

    @property
    def longest(self) -> np.ndarray:
        """Entries whose piece here exceeds ``_WINDOW`` bytes (taken from a buffer)."""
        if self.matrix is not None:
            return np.zeros(len(self.lengths), bool)
        longest: np.ndarray = self.lengths > _WINDOW
        return longest

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` as a zero-padded matrix (padding beyond each length is arbitrary)."""
        if self.matrix is not None:
            taken: np.ndarray = self.matrix[rows]
            return taken
        assert self.buf is not None and self.starts is not None
        width = max(1, int(self.lengths[rows].max()))
        windows = np.lib.stride_tricks.sliding_window_view(self.buf, width)
        taken = windows[self.starts[rows]]  # one memcpy per row
        return taken


def _records(rows: np.ndarray, columns: Sequence[Column]) -> np.ndarray:
    """The entries ``rows`` laid end to end: each row's pieces, in column order.

    The columns' rows are gathered side by side into one zero-padded matrix and the padding
    squeezed out with a boolean mask, which keeps row-major order.
    """
    matrices = [column.take(rows) for column in columns]
    keep = [
        np.arange(matrix.shape[1]) < column.lengths[rows][:, None]
        for matrix, column in zip(matrices, columns)
    ]
    records: np.ndarray = np.concatenate(matrices, axis=1)[np.concatenate(keep, axis=1)]
    return records


def _shared_with_previous(
    keys: Sequence[bytes], kbuf: np.ndarray, kstart: np.ndarray, check: bool = True
) -> np.ndarray:
    """Length of the common prefix of each key with the one before it (0 for the first).

    Raises:
        InvalidArgumentError: the keys are not strictly increasing.
    """
    n = len(keys)
    klen = np.diff(kstart)
    shared = np.zeros(n, _I64)
    if n < 2:
        return shared
    width = min(_WINDOW, -(-int(klen.max()) // 8) * 8 or 8)
    padded = np.concatenate([kbuf, np.zeros(width, _U8)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, width)
    for lo in range(0, n - 1, _ROWS):
        hi = min(n, lo + _ROWS + 1)  # rows lo..hi-1: the pairs (lo, lo+1) .. (hi-2, hi-1)
        words = np.ascontiguousarray(windows[kstart[lo:hi]]).view("<u8")
        diff = words[1:] ^ words[:-1]
        nonzero = diff != 0
        first = nonzero.argmax(axis=1)
        word = diff[np.arange(len(diff)), first]
        low = word & (~word + np.uint64(1))  # the lowest set bit: the first differing byte
        byte = np.zeros(len(diff), _I64)
        for shift in range(8, 64, 8):
            byte += low >= np.uint64(1 << shift)
        shared[lo + 1 : hi] = np.where(nonzero.any(axis=1), first * 8 + byte, width)
    shorter = np.minimum(klen[1:], klen[:-1])
    shared[1:] = np.minimum(shared[1:], shorter)
    for i in (np.flatnonzero(shared[1:] == width) + 1).tolist():  # a whole window agrees
        shared[i] = _shared_prefix(keys[i - 1], keys[i])  # finish in Python
    # Strictly increasing: a proper prefix before its extension, else a smaller first difference.
    last = len(kbuf) - 1
    ok = np.where(
        shared[1:] == shorter,
        klen[:-1] < klen[1:],
        kbuf[np.minimum(kstart[:-2] + shared[1:], last)]
        < kbuf[np.minimum(kstart[1:-1] + shared[1:], last)],
    )
    if check and not ok.all():
        i = int(np.flatnonzero(~ok)[0]) + 1
        raise InvalidArgumentError(
            f"table keys must be strictly increasing: {keys[i]!r} after {keys[i - 1]!r}"
        )
    return shared


def _block_ends(
    restart_size: np.ndarray, size: np.ndarray, big: np.ndarray, block_size: int
) -> list[int]:
    """The index one past the last entry of each data block, as TensorFlow closes them (§3.5).

    ``restart_size``/``size``: each entry's bytes when it starts a restart / when it does not;
    ``big``: entries of at least two blocks, which begin a block of their own (step 2).
    """
    n = len(size)
    ends: list[int] = []
    bigs = np.flatnonzero(big).tolist()
    next_big = 0
    mean = max(1.0, float(size.mean()))
    start = 0
    while start < n:
        while next_big < len(bigs) and bigs[next_big] <= start:
            next_big += 1
        limit = bigs[next_big] if next_big < len(bigs) else n  # flush before the big entry
        window = int(block_size / mean * 1.25) + 2 * RESTART_INTERVAL
        while True:
            stop = min(limit, start + window)
            pos = np.arange(stop - start, dtype=_I64)
            restart = pos % RESTART_INTERVAL == 0
            sizes = np.where(restart, restart_size[start:stop], size[start:stop])
            estimate = np.cumsum(sizes) + 4 * (pos // RESTART_INTERVAL + 1) + 4  # step 5
            full = np.flatnonzero(estimate >= block_size)
            if len(full):
                end = start + int(full[0]) + 1
                break
            if stop == limit:
                end = limit
                break
            window *= 2
        ends.append(end)
        start = end
    return ends


def table_of_pairs(
    pairs: Sequence[tuple[bytes, bytes]], *, block_size: int = BLOCK_SIZE, ordered: bool = True
) -> bytes:
    """:func:`build_table` of ``(key, value)`` pairs.

    Raises:
        InvalidArgumentError: the keys are not strictly increasing (with ``ordered``).
    """
    values = Column.of_bytes([value for _, value in pairs])
    keys = [key for key, _ in pairs]
    return build_table(keys, [values], block_size=block_size, ordered=ordered)


def build_table(
    keys: Sequence[bytes],
    values: Sequence[Column],
    *,
    block_size: int = BLOCK_SIZE,
    ordered: bool = True,
) -> bytes:
    """The table file of ``keys`` (strictly increasing) and their values, as one ``bytes``.

    Entry ``i``'s value is the concatenation of row ``i`` of every column in ``values``.
    ``ordered=False`` writes the keys as given, repeats and disorder included: tables no
    reader accepts, which only tests of damaged files want.

    Raises:
        InvalidArgumentError: the keys are not strictly increasing (with ``ordered``).
    """
    out = bytearray()
    index = _BlockBuilder(1)
    if keys:
        data, ends, handles = _data_blocks(keys, values, block_size, ordered)
        out += data
        for k, handle in enumerate(handles):
            last = keys[ends[k] - 1]
            if k + 1 < len(ends):
                index.add(shortest_separator(last, keys[ends[k]]), handle.encode())
            else:
                index.add(short_successor(last), handle.encode())
    # The metaindex block (always empty, §3.7), the index block and the footer (§3.8).
    metaindex = _append_block(out, _BlockBuilder(RESTART_INTERVAL).finish())
    index_handle = _append_block(out, index.finish())
    footer = metaindex.encode() + index_handle.encode()
    out += footer + bytes(FOOTER_SIZE - 8 - len(footer)) + _MAGIC_BYTES
    return bytes(out)


def _append_block(out: bytearray, block: bytes) -> BlockHandle:
    handle = BlockHandle(len(out), len(block))
    out += block
    out += _NO_COMPRESSION + struct.pack("<I", mask(extend(crc32c(block), _NO_COMPRESSION)))
    return handle


def _data_blocks(
    keys: Sequence[bytes], values: Sequence[Column], block_size: int, ordered: bool
) -> tuple[bytes, list[int], list[BlockHandle]]:
    """Every data block with its trailer, laid end to end; each block's end entry; handles."""
    n = len(keys)
    kbuf = np.frombuffer(b"".join(keys), _U8)
    kstart = np.zeros(n + 1, _I64)
    np.cumsum(np.fromiter(map(len, keys), _I64, n), out=kstart[1:])
    klen = np.diff(kstart)
    vlen = sum((column.lengths for column in values), np.zeros(n, _I64))
    shared = _shared_with_previous(keys, kbuf, kstart, ordered)
    vsize = varint_sizes(vlen)
    restart_size = 1 + varint_sizes(klen) + vsize + klen + vlen
    size = varint_sizes(shared) + varint_sizes(klen - shared) + vsize + (klen - shared) + vlen
    ends = _block_ends(restart_size, size, klen + vlen >= 2 * block_size, block_size)
    # Which entries restart (shared = 0): every 16th from each block's first.
    ends_arr = np.asarray(ends, _I64)
    begins = np.concatenate([[0], ends_arr[:-1]])
    first = np.repeat(begins, ends_arr - begins)
    restart = (np.arange(n, dtype=_I64) - first) % RESTART_INTERVAL == 0
    shared = np.where(restart, 0, shared)
    non_shared = klen - shared
    entry_size = np.where(restart, restart_size, size)
    # Each block: its entries, then one fixed32 per restart and their count, then the trailer.
    cum = np.concatenate([[0], np.cumsum(entry_size)])
    restarts_per_block = np.add.reduceat(restart.astype(_I64), begins)
    entries_bytes = cum[ends_arr] - cum[begins]
    block_bytes = entries_bytes + 4 * (restarts_per_block + 1)
    block_start = np.concatenate([[0], np.cumsum(block_bytes + len(_NO_COMPRESSION) + 4)])
    buf = np.zeros(int(block_start[-1]), _U8)
    columns = [
        Column.varints(shared),
        Column.varints(non_shared),
        Column.varints(vlen),
        Column.of_buffer(kbuf, kstart[:-1] + shared, non_shared),
        *values,
    ]
    long = np.zeros(n, bool)
    for column in columns:
        long |= column.longest
    longs = np.flatnonzero(long).tolist()
    bounds = sorted({0, n, *range(_ROWS, n, _ROWS), *longs, *(i + 1 for i in longs)})
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        records = _records(np.arange(lo, hi), columns)
        # Copy each block's part of the chunk: blocks are apart by their tails in ``buf``.
        done = 0
        for k in range(int(np.searchsorted(ends_arr, lo, side="right")), len(ends)):
            a, b = max(lo, int(begins[k])), min(hi, ends[k])
            if a >= b:
                break
            at = int(block_start[k] + cum[a] - cum[begins[k]])
            nbytes = int(cum[b] - cum[a])
            buf[at : at + nbytes] = records[done : done + nbytes]
            done += nbytes
    handles = []
    restart_at = np.flatnonzero(restart)
    cuts = np.searchsorted(restart_at, ends_arr).tolist()
    for k in range(len(ends)):
        start = int(block_start[k])
        offsets = cum[restart_at[(cuts[k - 1] if k else 0) : cuts[k]]] - cum[begins[k]]
        tail = np.concatenate([offsets, [len(offsets)]]).astype("<u4").view(_U8)
        at = start + int(entries_bytes[k])
        buf[at : at + len(tail)] = tail
        end = int(start + block_bytes[k])
        crc = mask(extend(crc32c(buf[start:end]), _NO_COMPRESSION))
        buf[end + 1 : end + 5] = np.frombuffer(struct.pack("<I", crc), _U8)
        handles.append(BlockHandle(start, int(block_bytes[k])))
    return buf.tobytes(), ends, handles
