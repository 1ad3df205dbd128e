"""The ``.index`` file: a LevelDB-style sorted string table (tf-checkpoint-format.md §3).

:class:`TableBuilder` reproduces TensorFlow's table builder byte for byte with the options the
bundle code uses (256 KiB blocks, restart interval 16, index restart interval 1, no
compression, an empty metaindex block, shortest-separator / short-successor index keys).
:func:`read_table` does a full scan with every block trailer checksum verified; indexes are
small, so a list of pairs beats TensorFlow's seek-based iterator in simplicity and speed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from trackpoint.bundle.crc import crc32c, extend, mask, unmask
from trackpoint.errors import DataLossError, FailedPreconditionError, InvalidArgumentError

__all__ = [
    "BLOCK_SIZE",
    "FOOTER_SIZE",
    "TABLE_MAGIC",
    "BlockHandle",
    "TableBuilder",
    "read_table",
    "read_table_head",
    "shortest_separator",
    "short_successor",
]

BLOCK_SIZE = 262144
RESTART_INTERVAL = 16
FOOTER_SIZE = 48
TABLE_MAGIC = 0xDB4775248B80FB57
_MAGIC_BYTES = struct.pack("<Q", TABLE_MAGIC)
_TRAILER_SIZE = 5
_NO_COMPRESSION = 0
_SNAPPY = 1


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


def _shared_prefix(a: bytes, b: bytes) -> int:
    """Length of the common prefix of ``a`` and ``b``, compared in C (no per-byte loop)."""
    n = min(len(a), len(b))
    diff = int.from_bytes(a[:n], "big") ^ int.from_bytes(b[:n], "big")
    return n - (diff.bit_length() + 7) // 8


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


class TableBuilder:
    """Builds a table in memory, identical to TensorFlow's for the same sorted entries.

    Keys must arrive in strictly increasing bytewise order.
    """

    def __init__(self, *, block_size: int = BLOCK_SIZE) -> None:
        self._block_size = block_size
        self._out = bytearray()
        self._data = _BlockBuilder(RESTART_INTERVAL)
        self._index = _BlockBuilder(1)
        self._pending: BlockHandle | None = None
        self._last_key: bytes | None = None
        self._finished = False

    def add(self, key: bytes, value: bytes) -> None:
        """Append one entry (step numbers refer to §3.5).

        Raises:
            FailedPreconditionError: :meth:`finish` was called already.
            InvalidArgumentError: ``key`` does not sort after the previous key.
        """
        if self._finished:
            raise FailedPreconditionError(
                f"TableBuilder.add({key!r}) after finish: the table is complete; start a new one"
            )
        if self._last_key is not None and key <= self._last_key:
            raise InvalidArgumentError(
                f"table keys must be strictly increasing: {key!r} after {self._last_key!r}"
            )
        # Step 2: an entry of at least two blocks goes into a block of its own.
        if self._last_key is not None and len(key) + len(value) >= 2 * self._block_size:
            self._flush()
        # Step 3: the waiting index entry gets a separator between the two blocks.
        if self._pending is not None:
            assert self._last_key is not None
            sep = shortest_separator(self._last_key, key)
            self._index.add(sep, self._pending.encode())
            self._pending = None
        data = self._data
        data.add(key, value)
        self._last_key = key
        if data.estimated_size() >= self._block_size:
            self._flush()

    def _flush(self) -> None:
        if self._data.empty:
            return
        self._pending = self._write_block(self._data.finish())

    def _write_block(self, block: bytes) -> BlockHandle:
        handle = BlockHandle(len(self._out), len(block))
        crc = extend(crc32c(block), bytes((_NO_COMPRESSION,)))
        self._out += block
        self._out += struct.pack("<BI", _NO_COMPRESSION, mask(crc))
        return handle

    def finish(self) -> bytes:
        """Flush, write the metaindex, index block and footer; return the whole file.

        Raises:
            FailedPreconditionError: called twice.
        """
        if self._finished:
            raise FailedPreconditionError(
                "TableBuilder.finish called twice: the table was returned by the first call"
            )
        self._finished = True
        self._flush()
        metaindex = self._write_block(_BlockBuilder(RESTART_INTERVAL).finish())
        if self._pending is not None:
            assert self._last_key is not None
            self._index.add(short_successor(self._last_key), self._pending.encode())
            self._pending = None
        index = self._write_block(self._index.finish())
        handles = metaindex.encode() + index.encode()
        self._out += handles + bytes(FOOTER_SIZE - 8 - len(handles)) + _MAGIC_BYTES
        return bytes(self._out)


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


def read_table(data: bytes | memoryview, path: str) -> list[tuple[bytes, bytes]]:
    """All ``(key, value)`` pairs of a table file, in key order.

    Every block's trailer checksum is verified, and keys must be strictly increasing.

    Raises:
        DataLossError: the file is not a table or is damaged (message names ``path`` and the
            offset).
        InvalidArgumentError: a block is snappy-compressed.
    """
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
