"""The layouts of every entry of an index at once, with numpy (§5).

Parsing a ``BundleEntryProto`` per key costs a few microseconds in Python, more than reading a
small tensor. Nearly every entry has one form, the one TensorFlow and trackpoint write for an
unsliced tensor: ``08 <dtype> 12 <n> <shape>`` (fields 1-2, one byte each for tag, dtype and
length), then any of fields 3 (``shard_id``), 4 (``offset``), 5 (``size``) as varints and 6
(``crc32c``, fixed32), in that order, each at most once, and nothing else. :func:`common_layouts`
decodes that form for all entries with array operations, and the distinct heads once each
through protobuf (:meth:`LayoutDecoder.head_kind`); every other entry (slices, unknown or
repeated fields, long varints, damage) is left to :meth:`LayoutDecoder.decode`, which words
the errors. For an entry of this form both give the same :class:`Layout`.
"""

from __future__ import annotations

from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np

from trackpoint.bundle.crc import MASK_DELTA
from trackpoint.bundle.layout import Layout, LayoutDecoder
from trackpoint.bundle.table import varints_at

if TYPE_CHECKING:
    from trackpoint.bundle.layout import _Kind
    from trackpoint.bundle.table import TableColumns

__all__ = ["common_layouts"]

_I64 = np.dtype(np.int64)
_U8 = np.dtype(np.uint8)
_U32 = 0xFFFFFFFF
# Heads up to this many bytes are told apart as fixed-width rows; longer ones one by one.
_HEAD_ROW = 32


def common_layouts(
    decoder: LayoutDecoder, table: TableColumns, rows: np.ndarray, num_shards: int
) -> tuple[np.ndarray, list[Layout]]:
    """The layouts of the entries of common form among table rows ``rows``.

    Returns a mask over ``rows`` of those decoded here and their layouts, in row order. The
    others are left to :meth:`LayoutDecoder.decode`.

    Args:
        decoder: the index's decoder, whose head kinds (and cache) this shares.
        table: the index's entries.
        rows: the table rows to decode (tensor entries).
        num_shards: the header's shard count.
    """
    starts, ends = table.starts[rows], table.ends[rows]
    buf = np.concatenate([np.frombuffer(table.data, _U8), np.zeros(_HEAD_ROW + 16, _U8)])
    ok = ends - starts > 3
    head = [buf[np.where(ok, starts + k, 0)] for k in range(4)]
    ok &= (head[0] == 0x08) & (head[1] < 0x80) & (head[2] == 0x12) & (head[3] < 0x80)
    head_len = 4 + head[3].astype(_I64)
    pos = starts + head_len
    ok &= pos <= ends
    fields = []
    for tag in (0x18, 0x20, 0x28):  # shard_id, offset, size
        has = ok & (pos < ends) & (buf[np.minimum(pos, len(buf) - 1)] == tag)
        value, after, good = varints_at(buf, np.where(has, pos + 1, 0), 9)
        good &= after <= ends
        ok &= ~has | good
        fields.append(np.where(has, value, 0))
        pos = np.where(has, after, pos)
    has = ok & (pos < ends) & (buf[np.minimum(pos, len(buf) - 1)] == 0x35)
    ok &= ~has | (pos + 5 <= ends)
    at = np.where(has, pos + 1, 0)[:, None] + np.arange(4)
    masked = np.where(has, buf[at].astype(_I64) @ (1 << np.arange(0, 32, 8)), 0)
    pos = np.where(has, pos + 5, pos)
    shard, offset, size = fields
    ok &= (pos == ends) & (shard < 1 << 31)
    kinds, kind_of = _kinds_of(decoder, table.data, buf, ok, starts, head_len)
    ok &= kind_of >= 0
    kind_of, shard, offset, size, masked = (a[ok] for a in (kind_of, shard, offset, size, masked))
    # Per kind, as object arrays, so that every column below is one C-level gather.
    per_kind = np.empty((len(kinds) + 1, 4), object)
    for k, kind in enumerate(kinds):
        per_kind[k] = (kind.datatype, kind.dtype, kind.shape, kind.strings)
    nbytes = np.array([k.nbytes for k in kinds] + [0], _I64)[kind_of]
    elements = np.array([k.elements for k in kinds] + [0], _I64)[kind_of]
    strings = np.array([k.strings for k in kinds] + [False], bool)[kind_of]
    # Readable exactly as LayoutDecoder.decode says (offset and size are below 2**63).
    fits = np.where(
        nbytes >= 0, size == nbytes, strings & (size >= elements + np.where(size, 4, 0))
    )
    readable = fits & (shard < num_shards)
    rot = (masked - MASK_DELTA) & _U32  # crc.unmask()
    crc = ((rot >> 17) | (rot << 15)) & _U32
    chosen = per_kind[kind_of]
    columns = zip(
        chosen[:, 0].tolist(),
        chosen[:, 1].tolist(),
        chosen[:, 2].tolist(),
        shard.tolist(),
        offset.tolist(),
        size.tolist(),
        crc.tolist(),
        chosen[:, 3].tolist(),
        readable.tolist(),
        repeat(()),
        repeat(b""),  # the index has the entry, should an error need to quote it
    )
    # tuple.__new__ over zip: every Layout made in C, not through Layout's Python __new__.
    return ok, list(map(tuple.__new__, repeat(Layout), columns))


def _kinds_of(
    decoder: LayoutDecoder,
    data: bytes,
    buf: np.ndarray,
    ok: np.ndarray,
    starts: np.ndarray,
    head_len: np.ndarray,
) -> tuple[list[_Kind], np.ndarray]:
    """The distinct kinds of the heads of rows ``ok``, and per row its kind's index (-1: none)."""
    kinds: list[_Kind] = []
    kind_of = np.full(len(ok), -1, _I64)
    rows = np.flatnonzero(ok)
    if not len(rows):
        return kinds, kind_of
    width = -(-int(head_len[rows].max()) // 8) * 8
    if width <= _HEAD_ROW:  # equal rows are equal heads: the length is their 4th byte
        windows = np.lib.stride_tricks.sliding_window_view(buf, width)[starts[rows]]
        windows = np.where(np.arange(width) < head_len[rows][:, None], windows, 0).astype(_U8)
        words = windows.view("<u8")
        # One 64-bit number per head; two different heads with equal numbers would show below.
        number = words[:, 0].copy()
        for column in range(1, words.shape[1]):
            number = (number * np.uint64(0x9E3779B97F4A7C15)) ^ words[:, column]
        _, first, inverse = np.unique(number, return_index=True, return_inverse=True)
        if not (words[first][inverse.ravel()] == words).all():
            _, first, inverse = np.unique(
                windows.view(f"V{width}").ravel(), return_index=True, return_inverse=True
            )
        heads = [row[: 4 + row[3]] for row in (windows[i].tobytes() for i in first.tolist())]
    else:
        spans = zip(starts[rows].tolist(), (starts[rows] + head_len[rows]).tolist())
        found: dict[bytes, int] = {}
        inverse = np.fromiter(
            (found.setdefault(data[a:b], len(found)) for a, b in spans), _I64, len(rows)
        )
        heads = list(found)
    index = []
    for head in heads:
        kind = decoder.head_kind(head)
        index.append(-1 if kind is None else len(kinds))
        if kind is not None:
            kinds.append(kind)
    kind_of[rows] = np.asarray(index, _I64)[inverse.ravel()]
    return kinds, kind_of
