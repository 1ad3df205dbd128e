"""A whole ``.index`` table read into columns in one pass, with numpy (§3.2, §3.9).

:func:`~trackpoint.bundle.table.read_table` decodes entry after entry in Python and makes a
``bytes`` for every value; for the hundreds of thousands of entries of a model of many small
tensors that loop costs more than reading their tensors. :func:`scan_table` decodes the entry
headers of every restart run of every block at once (the entries between two restart points
follow each other, but the runs are independent), keeps each value as a span of the file, and
builds only the keys in Python. Anything it does not expect, damage included, makes it defer
to :func:`read_table`, so results and errors stay exactly those of the one reader.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from trackpoint.bundle.table import _data_blocks, _read_block, read_table

__all__ = ["TableColumns", "scan_table", "varints_at"]

_I64 = np.dtype(np.int64)
# Entries decoded per restart run before the run is left to Python: TensorFlow restarts every
# 16 entries, so a longer run means a table made otherwise.
_MAX_RUN = 64


@dataclass(frozen=True, slots=True)
class TableColumns:
    """A table's entries in key order: ``keys[i]`` holds ``data[starts[i]:ends[i]]``."""

    keys: list[bytes]
    data: bytes
    starts: np.ndarray
    ends: np.ndarray

    def value(self, i: int) -> bytes:
        return self.data[int(self.starts[i]) : int(self.ends[i])]

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


def scan_table(data: bytes, path: str) -> TableColumns:
    """Every entry of the table file ``data``, as :func:`read_table` returns them.

    Raises:
        The errors of :func:`read_table`: DataLossError for a damaged file (naming ``path``),
        InvalidArgumentError for a snappy-compressed block.
    """
    scanned = _scan(data, path)
    return scanned if scanned is not None else TableColumns.of_pairs(read_table(data, path))


def _scan(data: bytes, path: str) -> TableColumns | None:
    """The columns, or None when :func:`read_table` must decide (it raises or agrees)."""
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
        return None  # read_table words the error
    block_last = np.searchsorted(key_start, [hi for _, hi, _ in block_limits]) - 1
    for (_, _, separator), lo, last in zip(block_limits, block_first.tolist(), block_last.tolist()):
        if last >= lo and keys[last] > separator:
            return None
    return TableColumns(keys, data, value_start, value_end)
