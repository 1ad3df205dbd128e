"""The ``.index`` file: a LevelDB-style sorted string table (tf-checkpoint-format.md §3).

Its format (blocks, trailers, footer) and the one table reader, :func:`read_table`: a full scan
with every block trailer checksum verified, into columns (keys, and each value a span of the
file). Indexes are small enough that a full scan beats TensorFlow's seek-based iterator in
simplicity and speed. The one table builder is :func:`~trackpoint.bundle.table_batch.build_table`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from trackpoint.bundle.crc import crc32c, extend, unmask
from trackpoint.errors import DataLossError, InvalidArgumentError

__all__ = [
    "BLOCK_SIZE",
    "FOOTER_SIZE",
    "TABLE_MAGIC",
    "BlockHandle",
    "TableColumns",
    "encode_varint",
    "read_table",
    "read_table_head",
    "varints_at",
]

BLOCK_SIZE = 262144
RESTART_INTERVAL = 16
FOOTER_SIZE = 48
TABLE_MAGIC = 0xDB4775248B80FB57
_MAGIC_BYTES = struct.pack("<Q", TABLE_MAGIC)
_TRAILER_SIZE = 5
_NO_COMPRESSION = 0
_SNAPPY = 1
_I64 = np.dtype(np.int64)
# Entries decoded per restart run before the run is left to Python: TensorFlow restarts every
# 16 entries, so a longer run means a table made otherwise.
_MAX_RUN = 64


# One-byte varints, the common case for lengths and shared-prefix sizes.
_ONE_BYTE = tuple(bytes((i,)) for i in range(0x80))


def encode_varint(value: int) -> bytes:
    """Protobuf/LevelDB varint (LEB128) of a non-negative integer."""
    if value < 0x80:
        return _ONE_BYTE[value]
    if value < 0x4000:  # two and three bytes: offsets, sizes and node ids of most files
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value < 0x200000:
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint(buf: bytes | memoryview, pos: int, end: int, what: str) -> tuple[int, int]:
    """Decode a varint64 at ``pos``; raise ValueError (mapped by callers) when malformed."""
    result = 0
    shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError(f"bad varint in {what}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


@dataclass(frozen=True, slots=True)
class BlockHandle:
    """Where a block sits in the table file (§3.4); ``size`` excludes the 5-byte trailer."""

    offset: int
    size: int

    def encode(self) -> bytes:
        return encode_varint(self.offset) + encode_varint(self.size)


# -- reading ------------------------------------------------------------------------------


def _corrupt(path: str, offset: int, what: str) -> DataLossError:
    return DataLossError(
        f"Corrupted index file {path} at offset {offset}: {what}. The checkpoint is damaged; "
        "restore it from another copy or an earlier checkpoint",
        path=path,
    )


def _read_block(data: memoryview, handle: BlockHandle, path: str) -> memoryview:
    """The contents of the block at ``handle`` after checking its trailer (§3.3)."""
    end = handle.offset + handle.size + _TRAILER_SIZE
    if end > len(data) - FOOTER_SIZE:
        raise _corrupt(path, handle.offset, f"block of {handle.size} bytes runs past the end")
    contents = data[handle.offset : handle.offset + handle.size]
    kind = data[handle.offset + handle.size]
    (stored,) = struct.unpack_from("<I", data, handle.offset + handle.size + 1)
    actual = extend(crc32c(contents), bytes((kind,)))
    if unmask(stored) != actual:
        raise _corrupt(
            path,
            handle.offset,
            f"block checksum does not match: stored {unmask(stored)} vs. calculated {actual}",
        )
    if kind == _SNAPPY:
        raise InvalidArgumentError(
            f"Index file {path} has a snappy-compressed block at offset {handle.offset}; "
            "snappy-compressed index not supported (TensorFlow >= 1.2 never writes one). "
            "Re-save the checkpoint with a current TensorFlow",
            path=path,
        )
    if kind != _NO_COMPRESSION:
        raise _corrupt(path, handle.offset, f"unknown block compression type {kind}")
    return contents


def _block_entries(block: memoryview, base: int, path: str) -> list[tuple[bytes, bytes]]:
    """Decode every entry of one block (§3.2); ``base`` is its file offset, for messages."""
    size = len(block)
    if size < 4:
        raise _corrupt(path, base, "block too short for its restart count")
    (num_restarts,) = struct.unpack_from("<I", block, size - 4)
    limit = size - 4 * (num_restarts + 1)
    if num_restarts == 0 or limit < 0:
        raise _corrupt(path, base, f"bad restart count {num_restarts}")
    entries: list[tuple[bytes, bytes]] = []
    key = b""
    pos = 0
    raw = bytes(block[:limit])
    append = entries.append
    while pos < limit:
        start = pos
        # Three varints; one byte each in practice, so that case skips the decoder.
        if pos + 3 <= limit and raw[pos] < 0x80 and raw[pos + 1] < 0x80 and raw[pos + 2] < 0x80:
            shared, non_shared, value_len = raw[pos], raw[pos + 1], raw[pos + 2]
            pos += 3
        else:
            try:
                shared, pos = _varint(raw, pos, limit, "entry")
                non_shared, pos = _varint(raw, pos, limit, "entry")
                value_len, pos = _varint(raw, pos, limit, "entry")
            except ValueError:
                raise _corrupt(path, base + start, "bad entry header") from None
        end = pos + non_shared
        if shared > len(key) or end + value_len > limit:
            raise _corrupt(path, base + start, "entry runs past the end of its block")
        key = key[:shared] + raw[pos:end]
        pos = end + value_len
        append((key, raw[end:pos]))
    return entries


def _read_entries(data: bytes | memoryview, path: str) -> list[tuple[bytes, bytes]]:
    """All ``(key, value)`` pairs, decoded entry by entry: :func:`read_table` for the tables its
    array decode declines (restart runs longer than TensorFlow writes, damage), which this
    words exactly (message names ``path`` and the offset)."""
    data = memoryview(data).cast("B")
    result: list[tuple[bytes, bytes]] = []
    for sep, handle in _data_blocks(data, path):
        entries = _block_entries(_read_block(data, handle, path), handle.offset, path)
        if entries and (entries[-1][0] > sep or (result and entries[0][0] <= result[-1][0])):
            raise _corrupt(path, handle.offset, "block keys out of order with the index")
        result.extend(entries)
    for i in range(1, len(result)):
        if result[i][0] <= result[i - 1][0]:
            raise _corrupt(path, 0, f"keys out of order near {result[i][0]!r}")
    return result


def read_table_head(data: bytes | memoryview, path: str) -> tuple[list[tuple[bytes, bytes]], int]:
    """The pairs of a table's first data block (checksum verified), and its number of blocks.

    Enough to read a bundle's header entry and to learn whether it holds more, without
    decoding a large index.

    Raises:
        The errors of :func:`read_table`, for the footer, the index block and the first block.
    """
    data = memoryview(data).cast("B")
    blocks = _data_blocks(data, path)
    if not blocks:
        return [], 0
    handle = blocks[0][1]
    return _block_entries(_read_block(data, handle, path), handle.offset, path), len(blocks)


def _data_blocks(data: memoryview, path: str) -> list[tuple[bytes, BlockHandle]]:
    """(separator key, handle) of every data block, from the footer and the index block."""
    size = len(data)
    if size < FOOTER_SIZE:
        raise _corrupt(path, 0, f"file is {size} bytes, shorter than a {FOOTER_SIZE}-byte footer")
    footer = size - FOOTER_SIZE
    if bytes(data[size - 8 :]) != _MAGIC_BYTES:
        raise _corrupt(path, size - 8, "not an sstable (bad magic number)")
    try:
        pos = footer
        meta_off, pos = _varint(data, pos, size - 8, "footer")
        meta_size, pos = _varint(data, pos, size - 8, "footer")
        index_off, pos = _varint(data, pos, size - 8, "footer")
        index_size, pos = _varint(data, pos, size - 8, "footer")
    except ValueError:
        raise _corrupt(path, footer, "bad block handle in footer") from None
    del meta_off, meta_size  # always empty in bundles (§3.7)
    index_handle = BlockHandle(index_off, index_size)
    index = _block_entries(_read_block(data, index_handle, path), index_off, path)
    handles = []
    for sep, value in index:
        try:
            off, p = _varint(value, 0, len(value), "handle")
            length, p = _varint(value, p, len(value), "handle")
        except ValueError:
            raise _corrupt(path, index_off, f"bad block handle for index key {sep!r}") from None
        handles.append((sep, BlockHandle(off, length)))
    return handles


@dataclass(frozen=True, slots=True)
class TableColumns:
    """A table's entries in key order: ``keys[i]`` holds ``data[starts[i]:ends[i]]``."""

    keys: list[bytes]
    data: bytes
    starts: np.ndarray
    ends: np.ndarray

    def value(self, i: int) -> bytes:
        return self.data[int(self.starts[i]) : int(self.ends[i])]

    def pairs(self) -> list[tuple[bytes, bytes]]:
        """Every ``(key, value)``, in key order."""
        data = self.data
        spans = zip(self.starts.tolist(), self.ends.tolist())
        return [(key, data[a:b]) for key, (a, b) in zip(self.keys, spans)]

    @classmethod
    def of_pairs(cls, pairs: list[tuple[bytes, bytes]]) -> TableColumns:
        lengths = np.fromiter((len(v) for _, v in pairs), _I64, len(pairs))
        ends = np.cumsum(lengths)
        return cls([k for k, _ in pairs], b"".join(v for _, v in pairs), ends - lengths, ends)


def varints_at(
    buf: np.ndarray, pos: np.ndarray, width: int = 5
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, positions after, ok) of the varints of at most ``width`` bytes at ``pos``
    (``buf`` padded by ``width``); 5 bytes: varint32s, 9: values below 2**63."""
    value = np.zeros(len(pos), _I64)
    done = np.zeros(len(pos), bool)
    after = pos.copy()
    for k in range(width):
        byte = buf[pos + k].astype(_I64)
        todo = ~done
        value |= np.where(todo, (byte & 0x7F) << (7 * k), 0)
        after += todo
        done |= byte < 0x80
        if done.all():
            break
    return value, after, done


def read_table(data: bytes, path: str) -> TableColumns:
    """Every entry of the table file ``data``, in key order, each value a span of ``data``.

    Every block's trailer checksum is verified, and keys must be strictly increasing. The
    entry headers of every restart run of every block are decoded at once (the entries between
    two restart points follow each other, but the runs are independent), and only the keys are
    built in Python; a table this decode declines (damage, or restart runs longer than
    TensorFlow writes) is decoded entry by entry, which words the error.

    Raises:
        DataLossError: the file is not a table or is damaged (message names ``path`` and the
            offset).
        InvalidArgumentError: a block is snappy-compressed.
    """
    scanned = _scan(data, path)
    return scanned if scanned is not None else TableColumns.of_pairs(_read_entries(data, path))


def _scan(data: bytes, path: str) -> TableColumns | None:
    """The columns, or None when :func:`_read_entries` must decide (it raises or agrees)."""
    view = memoryview(data)
    blocks = _data_blocks(view, path)  # the footer and the index block, checked
    run_starts: list[np.ndarray] = []
    run_ends: list[np.ndarray] = []
    block_limits: list[tuple[int, int, bytes]] = []
    for separator, handle in blocks:
        _read_block(view, handle, path)  # checks the trailer
        if handle.size < 4:
            return None
        (count,) = struct.unpack_from("<I", data, handle.offset + handle.size - 4)
        limit = handle.size - 4 * (count + 1)
        if count == 0 or limit < 0:
            return None
        restarts = np.frombuffer(data, "<u4", count, handle.offset + limit).astype(_I64)
        if restarts[0] != 0 or (count > 1 and (np.diff(restarts) <= 0).any()):
            return None
        if restarts[-1] >= limit and limit:
            return None
        if limit:  # an empty block has no entries
            run_starts.append(handle.offset + restarts)
            run_ends.append(handle.offset + np.append(restarts[1:], limit))
        block_limits.append((handle.offset, handle.offset + limit, separator))
    if not run_starts:
        return TableColumns([], data, np.zeros(0, _I64), np.zeros(0, _I64))
    starts = np.concatenate(run_starts)
    ends = np.concatenate(run_ends)
    buf = np.concatenate([np.frombuffer(data, np.uint8), np.zeros(16, np.uint8)])
    steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    pos = starts.copy()
    active = np.arange(len(starts))
    for _ in range(_MAX_RUN):
        if not len(active):
            break
        shared, after, ok1 = varints_at(buf, pos[active])
        non_shared, after, ok2 = varints_at(buf, after)
        value_len, after, ok3 = varints_at(buf, after)
        value_start = after + non_shared
        following = value_start + value_len
        if not (ok1 & ok2 & ok3 & (following <= ends[active])).all():
            return None
        steps.append((active, shared, after, value_start, following))
        pos[active] = following
        active = active[following < ends[active]]
    else:
        if len(active):
            return None
    return _columns(data, starts, steps, block_limits)


def _columns(
    data: bytes,
    starts: np.ndarray,
    steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    block_limits: list[tuple[int, int, bytes]],
) -> TableColumns | None:
    """Order the decoded entries run by run, check their keys, and build the keys."""
    per_run = np.zeros(len(starts), _I64)
    for active, *_ in steps:
        per_run[active] += 1
    first = np.cumsum(per_run) - per_run
    n = int(per_run.sum())
    shared = np.empty(n, _I64)
    key_start = np.empty(n, _I64)
    value_start = np.empty(n, _I64)
    value_end = np.empty(n, _I64)
    for step, (active, sh, ks, vs, ve) in enumerate(steps):
        rows = first[active] + step
        shared[rows], key_start[rows], value_start[rows], value_end[rows] = sh, ks, vs, ve
    # A key may share at most the previous key of its block; a block's first key shares none.
    key_len = shared + (value_start - key_start)
    previous = np.concatenate([[0], key_len[:-1]])
    block_first = np.searchsorted(key_start, [lo for lo, _, _ in block_limits])
    previous[block_first[block_first < n]] = 0
    if (shared > previous).any():
        return None
    # Keys must strictly increase: within a block, an equal key shares all of the previous one
    # and adds nothing; the order itself is checked below, in C, by sorting.
    previous_len = np.concatenate([[-1], key_len[:-1]])
    previous_len[block_first[block_first < n]] = -1
    if ((shared == previous_len) & (key_len == previous_len)).any():
        return None
    keys: list[bytes] = []
    append = keys.append
    key = b""
    for cut, lo, hi in zip(shared.tolist(), key_start.tolist(), value_start.tolist()):
        key = key[:cut] + data[lo:hi] if cut else data[lo:hi]
        append(key)
    across = [i for i in block_first.tolist() if 0 < i < n]  # a block's first key
    if sorted(keys) != keys or any(keys[i - 1] == keys[i] for i in across):
        return None  # _read_entries words the error
    block_last = np.searchsorted(key_start, [hi for _, hi, _ in block_limits]) - 1
    for (_, _, separator), lo, last in zip(block_limits, block_first.tolist(), block_last.tolist()):
        if last >= lo and keys[last] > separator:
            return None
    return TableColumns(keys, data, value_start, value_end)
