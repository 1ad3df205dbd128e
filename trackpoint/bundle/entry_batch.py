"""Serialized ``BundleEntryProto`` s of a whole bundle at once, with numpy (§5).

The writer records each tensor as a head (fields 1-2, dtype and shape: a few distinct byte
strings shared by many tensors, :func:`~trackpoint.bundle.entries.entry_head`) and three
integers (offset, size, masked CRC). :func:`entry_columns` serializes every entry in one pass:
the head, then ``offset`` (field 4), ``size`` (field 5) and ``crc32c`` (field 6, fixed32), each
left out when zero as protobuf does. Entry ``i`` is exactly ``entry_head(...) +
entry_tail(...)``, given as the row ``i`` of four columns that
:func:`~trackpoint.bundle.table_batch.build_table` lays out directly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trackpoint.bundle.table_batch import Column, varint_bytes, varint_sizes

__all__ = ["entry_columns"]

_U8 = np.dtype(np.uint8)
_I64 = np.dtype(np.int64)
_OFFSET_TAG = 0x20  # field 4, varint
_SIZE_TAG = 0x28  # field 5, varint
_CRC_TAG = 0x35  # field 6, fixed32


def _varint_field(tag: int, values: np.ndarray) -> Column:
    """Tag and varint of a field per entry; a zero value is left out (length 0)."""
    sizes = varint_sizes(values)
    width = int(sizes.max()) if len(values) else 1
    rows = np.empty((len(values), width + 1), _U8)
    rows[:, 0] = tag
    rows[:, 1:] = varint_bytes(values, sizes, width)
    return Column.of_matrix(rows, np.where(values != 0, sizes + 1, 0))


def entry_columns(
    heads: Sequence[bytes],
    head_ids: np.ndarray,
    offsets: np.ndarray,
    sizes: np.ndarray,
    masked_crcs: np.ndarray,
) -> list[Column]:
    """Entry ``i``: ``heads[head_ids[i]]``, then its nonzero fields 4-6, as table columns.

    Args:
        heads: distinct serialized heads (or whole entries, with zero offset, size and crc).
        head_ids: int64 index into ``heads`` per entry.
        offsets, sizes: int64 per entry, never negative.
        masked_crcs: the stored (masked) CRC32C per entry, as int64 in [0, 2**32).
    """
    n = len(head_ids)
    head_len = np.fromiter(map(len, heads), _I64, len(heads))
    head_start = np.cumsum(head_len) - head_len
    head = Column.of_buffer(
        np.frombuffer(b"".join(heads), _U8), head_start[head_ids], head_len[head_ids]
    )
    crc = np.empty((n, 5), _U8)
    crc[:, 0] = _CRC_TAG
    crc[:, 1:] = masked_crcs.astype("<u4").view(_U8).reshape(n, 4)
    return [
        head,
        _varint_field(_OFFSET_TAG, offsets),
        _varint_field(_SIZE_TAG, sizes),
        Column.of_matrix(crc, np.where(masked_crcs != 0, 5, 0)),
    ]
