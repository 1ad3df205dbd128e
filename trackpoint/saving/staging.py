"""Bounded async snapshots: values staged through one reusable buffer while they are written.

``CheckpointOptions.max_staging_bytes`` caps the host memory an async save may hold beyond the
state itself. When the state is larger, :class:`Stager` copies the values, in the order the
shard writers consume them, into a ring buffer of that many bytes; the writer thread writes
each staged value (a value larger than a quarter of the buffer goes through in pieces,
``BundleWriter.add_chunks``) and frees its bytes, which the copying reuses. The caller's call
returns once every value is copied, so later in-place updates never reach the file; what is
still staged then is written in the background. The files are byte-identical to a synchronous
save of the same values (same shards, same order, same bytes).

Space is handed out in allocation order and freed in any order (shards may be written on
several threads); the free region only grows over a freed prefix, which keeps the accounting
simple and never deadlocks: values are staged in shard order and a shard's writer consumes them
in that order, so the oldest staged value always belongs to a writer that can finish it.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from trackpoint.errors import _StagingAborted
from trackpoint.metrics import registry as metrics
from trackpoint.saving.devices import DeviceValue
from trackpoint.saving.snapshot import as_array

if TYPE_CHECKING:
    from trackpoint.bundle.slice_spec import TensorSlice
    from trackpoint.bundle.writer import BundleWriter
    from trackpoint.saving.sharding import Shard

__all__ = [
    "MIN_STAGING_BYTES",
    "StagedValue",
    "Stager",
    "payload_nbytes",
]

logger = logging.getLogger(__name__)

# Staged regions start on cache-line boundaries: copies into them and hashing stay aligned.
_ALIGN = 64
# Below this the bound is raised to it: a staged piece holds at least one element of any dtype.
MIN_STAGING_BYTES = 4 * _ALIGN

_COPY, _WHOLE, _PIECES = 0, 1, 2


def _little_endian(dtype: np.dtype) -> np.dtype:
    order = dtype.byteorder
    if order == ">" or (order == "=" and sys.byteorder == "big"):
        return dtype.newbyteorder("<")
    return dtype


def payload_nbytes(array: np.ndarray) -> int:
    """Payload bytes of ``array`` for progress reports (strings: their lengths, roughly)."""
    if array.dtype.kind in "OSU":
        return sum(len(x) if isinstance(x, (bytes, str)) else 0 for x in array.reshape(-1).tolist())
    return int(array.nbytes)


def _pieces(array: np.ndarray, limit: int) -> Iterator[np.ndarray]:
    """Views of ``array`` that together are its elements in C order, each <= ``limit`` bytes.

    Whole leading-axis rows are grouped while a row fits; a row that does not is split
    recursively, down to runs of elements of a 1-D array.
    """
    if array.nbytes <= limit or array.ndim == 0:
        yield array
        return
    if array.ndim == 1:
        step = max(1, limit // array.itemsize)
        for start in range(0, array.shape[0], step):
            yield array[start : start + step]
        return
    row = array[0].nbytes
    if row <= limit:
        step = max(1, limit // max(row, 1))
        for start in range(0, array.shape[0], step):
            yield array[start : start + step]
        return
    for i in range(array.shape[0]):
        yield from _pieces(array[i], limit)


class _Block:
    """One allocation of the ring: logical ``[start, end)`` (padding at the wrap included)."""

    __slots__ = ("end", "freed")

    def __init__(self, end: int) -> None:
        self.end = end
        self.freed = False


class StagedValue:
    """A shard's placeholder for one value: filled by the stager, consumed by ``write_to``.

    ``nbytes`` is the payload size for progress reports (strings: their lengths).
    """

    __slots__ = (
        "_array",
        "_block",
        "_done",
        "_pieces",
        "_stager",
        "dtype",
        "kind",
        "nbytes",
        "shape",
        "source",
    )

    def __init__(self, stager: Stager, source: np.ndarray, kind: int, nbytes: int) -> None:
        self._stager = stager
        self.source: np.ndarray | None = source
        self.kind = kind
        self.nbytes = nbytes
        self.shape = source.shape
        self.dtype = source.dtype if kind == _COPY else _little_endian(source.dtype)
        self._array: np.ndarray | None = None  # the staged copy (kinds _COPY, _WHOLE)
        self._block: _Block | None = None
        self._pieces: collections.deque[tuple[_Block, np.ndarray]] = collections.deque()
        self._done = False

    def write_to(
        self, writer: BundleWriter, key: str, parsed: tuple[tuple[int, ...], TensorSlice] | None
    ) -> None:
        """Add this value to ``writer`` under ``key`` (one slice of it if ``parsed``)."""
        stager = self._stager
        if self.kind == _PIECES:
            chunks = self._chunks()
            if parsed is None:
                writer.add_chunks(key, self.dtype, self.shape, chunks)
            else:
                writer.add_chunks(
                    key, self.dtype, self.shape, chunks, full_shape=parsed[0],
                    tensor_slice=parsed[1],
                )  # fmt: skip
            return
        if not self._done:
            stager.wait_for(self)
        array, block = self._array, self._block
        assert array is not None
        self._array = self._block = None
        if parsed is None:
            writer.add(key, array)
        else:
            writer.add_slice(key, parsed[0], parsed[1], array)
        if block is not None:
            stager.free(block)

    def _chunks(self) -> Iterator[np.ndarray]:
        """The staged pieces as they arrive; each is freed when the next one is asked for."""
        stager = self._stager
        while True:
            if not self._pieces:
                if self._done:
                    return
                stager.wait_for(self)
                continue
            block, view = self._pieces.popleft()
            yield view
            stager.free(block)


class Stager:
    """Copies the values of an async save through a ring buffer of ``capacity`` bytes.

    Made on the caller's thread with the shards of the save (:meth:`stage_shards`), which hold
    :class:`StagedValue` s in place of arrays; :meth:`stage` then copies every value in order,
    blocking while the buffer is full, and returns once all are copied.

    Args:
        capacity: bytes of the staging buffer (at least ``MIN_STAGING_BYTES``).
        buffer: a uint8 buffer of an earlier stager, reused when it has this capacity.
    """

    def __init__(self, capacity: int, buffer: np.ndarray | None = None) -> None:
        capacity = max(int(capacity), MIN_STAGING_BYTES)
        if buffer is None or buffer.size != capacity:
            buffer = np.empty(capacity, np.uint8)
        self.buffer = buffer
        self.capacity = capacity
        # Values up to a quarter of the buffer are staged whole; larger ones in such pieces,
        # so copying and writing overlap.
        self._piece = max(capacity // 4 // _ALIGN * _ALIGN, _ALIGN)
        self._head = 0  # logical bytes handed out (the ring position is head % capacity)
        self._tail = 0  # logical bytes freed, over a prefix of the allocations
        self._blocks: collections.deque[_Block] = collections.deque()
        self._cond = threading.Condition()
        self._values: list[StagedValue] = []
        self._error: BaseException | None = None
        self.staged_bytes = 0
        self.peak_bytes = 0
        self._timing: metrics.WriteTiming | None = None

    # -- setting up ----------------------------------------------------------------------
    def stage_shards(
        self, shards: Sequence[tuple[str, Shard]]
    ) -> list[tuple[str, Shard]]:
        """The shards with every value replaced by its placeholder, in staging order."""
        out: list[tuple[str, Shard]] = []
        for task, shard in shards:
            staged: Shard = {}
            for key, slices in shard.items():
                for spec, value in slices.items():
                    if isinstance(value, DeviceValue):
                        value = value.value
                    staged.setdefault(key, {})[spec] = self._add(as_array(value, key))
            out.append((task, staged))
        return out

    def _add(self, array: np.ndarray) -> StagedValue:
        if array.dtype.kind in "OSUV" or array.nbytes == 0:
            value = StagedValue(self, array, _COPY, payload_nbytes(array))
        else:
            kind = _WHOLE if array.nbytes <= self._piece else _PIECES
            value = StagedValue(self, array, kind, array.nbytes)
        self._values.append(value)
        return value

    # -- the caller's side ---------------------------------------------------------------
    def stage(self, timing: metrics.WriteTiming) -> bool:
        """Copy every value, in order; returns when all are copied.

        The caller's part of the save (``timing``, from ``metrics.begin_write()``) ends with
        the copying: :meth:`caller_timing` then has its blocking time.

        Returns:
            True once every value is copied; False if the write failed meanwhile (:meth:`abort`;
            the write's error is reported by whoever ran the write).

        Raises:
            Exception: copying a value failed; the write is then aborted too.
        """
        try:
            for value in self._values:
                source = value.source
                assert source is not None
                value.source = None  # the owner's array is not kept past this point
                if value.kind == _COPY:
                    self._publish(value, np.array(source, copy=True), None, done=True)
                elif value.kind == _WHOLE:
                    block, view = self._alloc(source.nbytes)
                    staged = view.view(value.dtype).reshape(source.shape)
                    np.copyto(staged, source)
                    self._publish(value, staged, block, done=True)
                else:
                    for piece in _pieces(source, self._piece):
                        block, view = self._alloc(piece.nbytes)
                        np.copyto(view.view(value.dtype).reshape(piece.shape), piece)
                        self._publish(value, view, block, done=False)
                    self._finish(value)
                self.staged_bytes += source.nbytes
        except _StagingAborted:
            return False
        except BaseException as exc:
            self.abort(exc)
            raise
        finally:
            self._values = []
            ended = metrics.end_blocking(timing)  # training resumes
            with self._cond:
                self._timing = ended
                self._cond.notify_all()
        return True

    def caller_timing(self) -> metrics.WriteTiming:
        """The save's timing with its blocking part set; waits for :meth:`stage` to return."""
        with self._cond:
            while self._timing is None:
                self._cond.wait()
            return self._timing

    def _alloc(self, nbytes: int) -> tuple[_Block, np.ndarray]:
        """``nbytes`` of the ring (padded to ``_ALIGN``), waiting while they are in use."""
        size = -(-nbytes // _ALIGN) * _ALIGN
        capacity = self.capacity
        with self._cond:
            while True:
                if self._error is not None:
                    raise _StagingAborted(f"staging stopped: {self._error}")
                position = self._head % capacity
                pad = capacity - position if position + size > capacity else 0
                end = self._head + pad + size
                if end - self._tail <= capacity:
                    break
                self._cond.wait()
            start = (self._head + pad) % capacity
            self._head = end
            self.peak_bytes = max(self.peak_bytes, end - self._tail)
            block = _Block(end)
            self._blocks.append(block)
        return block, self.buffer[start : start + nbytes]

    def _publish(
        self, value: StagedValue, array: np.ndarray, block: _Block | None, *, done: bool
    ) -> None:
        with self._cond:
            if done:
                value._array, value._block = array, block
                value._done = True
            else:
                assert block is not None
                value._pieces.append((block, array))
            self._cond.notify_all()

    def _finish(self, value: StagedValue) -> None:
        with self._cond:
            value._done = True
            self._cond.notify_all()

    # -- the writer's side ---------------------------------------------------------------
    def wait_for(self, value: StagedValue) -> None:
        """Block until ``value`` is complete or has a piece to write."""
        with self._cond:
            while not value._done and not value._pieces:
                if self._error is not None:
                    raise _StagingAborted(
                        f"staging stopped before a value was copied: {self._error}"
                    )
                self._cond.wait()

    def free(self, block: _Block) -> None:
        """Give ``block`` back; the ring's free space grows once every older block is free."""
        with self._cond:
            block.freed = True
            blocks = self._blocks
            while blocks and blocks[0].freed:
                self._tail = blocks.popleft().end
            self._cond.notify_all()

    def abort(self, error: BaseException) -> None:
        """Wake both sides: waiting for space or for a value now raises."""
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

