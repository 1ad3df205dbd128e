"""A reference for the table builder: TensorFlow's steps (§3.5), one entry at a time.

Only tests use it: ``build_table`` computes the same bytes for all entries at once, and the
tests pin the two to each other on arbitrary tables (and both to bytes TensorFlow wrote).
"""

from __future__ import annotations

import struct

from trackpoint.bundle.crc import crc32c, extend, mask
from trackpoint.bundle.table import (
    BLOCK_SIZE,
    FOOTER_SIZE,
    RESTART_INTERVAL,
    TABLE_MAGIC,
    BlockHandle,
)
from trackpoint.bundle.table_batch import _BlockBuilder, short_successor, shortest_separator

__all__ = ["reference_table"]


def reference_table(pairs: list[tuple[bytes, bytes]], block_size: int = BLOCK_SIZE) -> bytes:
    """The table of ``pairs`` (keys strictly increasing), built as TensorFlow's builder does."""
    out = bytearray()
    data = _BlockBuilder(RESTART_INTERVAL)
    index = _BlockBuilder(1)
    pending: BlockHandle | None = None
    last: bytes | None = None

    def write_block(block: bytes) -> BlockHandle:
        handle = BlockHandle(len(out), len(block))
        out.extend(block)
        out.extend(struct.pack("<BI", 0, mask(extend(crc32c(block), b"\x00"))))
        return handle

    for key, value in pairs:
        assert last is None or key > last, "keys must be strictly increasing"
        if last is not None and len(key) + len(value) >= 2 * block_size and not data.empty:
            pending = write_block(data.finish())  # step 2: a big entry starts a block
        if pending is not None:  # step 3: a separator between the two blocks
            assert last is not None
            index.add(shortest_separator(last, key), pending.encode())
            pending = None
        data.add(key, value)
        last = key
        if data.estimated_size() >= block_size:
            pending = write_block(data.finish())
    if not data.empty:
        pending = write_block(data.finish())
    metaindex = write_block(_BlockBuilder(RESTART_INTERVAL).finish())
    if pending is not None:
        assert last is not None
        index.add(short_successor(last), pending.encode())
    handles = metaindex.encode() + write_block(index.finish()).encode()
    out.extend(handles + bytes(FOOTER_SIZE - 8 - len(handles)) + struct.pack("<Q", TABLE_MAGIC))
    return bytes(out)
