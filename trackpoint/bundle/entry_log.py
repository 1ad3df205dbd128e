"""The entries of a bundle being written, kept as numbers until the index is built (§3, §5).

A :class:`~trackpoint.bundle.writer.BundleWriter` records each stored tensor here under its
index key as a tuple: a head id (its dtype and shape, serialized once per distinct pair: a model
repeats a few), its offset, size and CRC.
:meth:`EntryLog.index_bytes` serializes every entry and builds the sorted table in one pass
(:func:`~trackpoint.bundle.entry_batch.entry_columns`,
:func:`~trackpoint.bundle.table_batch.build_table`), byte-identical to serializing each
``BundleEntryProto`` and building the table of the pairs in key order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from trackpoint.bundle.crc import MASK_DELTA
from trackpoint.bundle.dtypes import DataType
from trackpoint.bundle.entries import entry_head, entry_slices
from trackpoint.bundle.entry_batch import entry_columns
from trackpoint.bundle.slice_spec import TensorSlice
from trackpoint.bundle.table_batch import build_table

__all__ = ["NO_CRC", "EntryLog", "Partitioned", "Row"]

# (head id, offset, size, CRC32C of the stored bytes, unmasked): one stored tensor.
Row = tuple[int, int, int, int]
# The CRC of a row whose entry has no field 6 (the header, a partitioned tensor's full entry).
NO_CRC = -1
_U32 = 0xFFFFFFFF


@dataclass(slots=True)
class Partitioned:
    """The full-tensor entry of a partitioned tensor while its slices are added (§8.1)."""

    datatype: DataType
    shape: tuple[int, ...]
    slices: list[TensorSlice] = field(default_factory=list)


class EntryLog:
    """Index keys and entry fields of one bundle, in the order they were added.

    ``rows`` maps each index key to its :data:`Row`, or to the :class:`Partitioned` full entry
    of a partitioned tensor (also listed in ``partitioned``) until :meth:`index_bytes`. The
    writer's hot path stores rows directly; one dict store per tensor is the cheapest record.
    """

    __slots__ = ("heads", "partitioned", "rows", "shape_heads")

    def __init__(self) -> None:
        self.rows: dict[bytes, Row | Partitioned] = {}
        self.partitioned: dict[bytes, Partitioned] = {}
        # Serialized heads (fields 1-2), and per DataType the head id of each shape.
        self.heads: list[bytes] = []
        self.shape_heads: dict[int, dict[tuple[int, ...], int]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def head_id(self, datatype: int, shape: tuple[int, ...]) -> int:
        """The id of the head of ``datatype`` and ``shape``, serialized on first use."""
        by_shape = self.shape_heads.get(datatype)
        if by_shape is None:
            by_shape = self.shape_heads[datatype] = {}
        head = by_shape.get(shape)
        if head is None:
            head = by_shape[shape] = self._new_head(entry_head(datatype, shape))
        return head

    def _new_head(self, head: bytes) -> int:
        self.heads.append(head)
        return len(self.heads) - 1

    def partition(self, key: bytes, full: Partitioned) -> None:
        """Record ``full`` as the (new) partitioned tensor ``key``."""
        self.rows[key] = full
        self.partitioned[key] = full

    def index_bytes(self, header: bytes) -> bytes:
        """The whole ``.index`` file: ``header`` under key ``""`` and every entry, sorted.

        Call once, at the end: the full entries of partitioned tensors are serialized now.
        """
        rows = self.rows
        for key, full in self.partitioned.items():  # head and slice list, fields 3-6 unset (§8.1)
            value = entry_head(full.datatype, full.shape) + entry_slices(full.slices)
            rows[key] = (self._new_head(value), 0, 0, NO_CRC)
        keys = sorted(rows)
        fields = np.empty((len(keys) + 1, 4), np.int64)
        fields[0] = (self._new_head(header), 0, 0, NO_CRC)
        fields[1:] = np.fromiter(
            chain.from_iterable(map(rows.__getitem__, keys)),  # type: ignore[arg-type]
            np.int64,
            4 * len(keys),
        ).reshape(-1, 4)
        crc = fields[:, 3]
        masked = ((((crc >> 15) | (crc << 17)) & _U32) + MASK_DELTA) & _U32  # crc.mask()
        values = entry_columns(
            self.heads, fields[:, 0], fields[:, 1], fields[:, 2], np.where(crc < 0, 0, masked)
        )
        return build_table([b"", *keys], values)
