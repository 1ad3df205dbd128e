"""Reading exactly what a rank needs, in few requests: the read plan and a prefetching storage.

A rank restoring a sharded model needs its own boxes of each sharded tensor plus the replicated
values. :class:`IndexView` maps each request (checkpoint key, region) to the byte ranges that
hold it, from the checkpoint's parsed index (:class:`~trackpoint.bundle.index.BundleIndex`):
the whole entry of an unsliced tensor, or only the stored slices that intersect the region
(tf-checkpoint-format.md §8.4). :func:`coalesce` merges
the ranges of each data file that lie close together, and :class:`PrefetchedStorage` fetches
the merged ranges concurrently, one request each, then serves the bundle reader's reads from
memory. On object stores that turns one request per tensor into a few per file; on a local disk
the reader's mmap is already as good, so the restore skips this there.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trackpoint.bundle.index import BundleIndex
from trackpoint.bundle.naming import data_filename
from trackpoint.bundle.slice_spec import TensorSlice, parse_slice_spec
from trackpoint.errors import DataLossError
from trackpoint.storage import RangeReader, Storage
from trackpoint.storage.base import DelegatingStorage

if TYPE_CHECKING:
    from typing_extensions import Self

    from trackpoint.bundle.layout import Layout

__all__ = ["ByteRange", "IndexView", "PrefetchedStorage", "coalesce", "read_requests"]

logger = logging.getLogger(__name__)

OPTIMIZER_SLOT_MARK = "/.OPTIMIZER_SLOT/"


@dataclass(frozen=True, slots=True)
class ByteRange:
    """``size`` bytes at ``offset`` of the file ``path``."""

    path: str
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class IndexView:
    """Where every tensor and slice of a checkpoint lies, from its parsed index.

    Raises (``load``):
        NotFoundError: the index does not exist.
        DataLossError: it is damaged.
    """

    index: BundleIndex

    @classmethod
    def load(cls, prefix: str, storage: Storage) -> IndexView:
        """Read and parse ``prefix.index``."""
        return cls(BundleIndex.load(prefix, storage))

    def keys(self) -> list[str]:
        """Checkpoint keys (slice entries hidden)."""
        return self.index.keys()

    def has_slot_variables(self) -> bool:
        """True if the checkpoint holds optimizer slot state."""
        return any(OPTIMIZER_SLOT_MARK in key for key in self.index.keys())

    def _range(self, layout: Layout) -> ByteRange:
        path = data_filename(self.index.prefix, layout.shard_id, self.index.num_shards)
        return ByteRange(path, layout.offset, layout.size)

    def ranges(self, key: str, region: TensorSlice | None = None) -> list[ByteRange]:
        """The bytes reading ``region`` of ``key`` touches (None: the whole tensor).

        Unknown keys give no ranges: the reader reports them as missing itself.

        Raises:
            DataLossError: the entry of ``key``, or of one of its stored slices, is damaged.
        """
        index = self.index
        if not index.has_tensor(key):
            return []
        layout = index.layout(key)
        if not layout.slices:
            return [self._range(layout)]
        return [
            self._range(index.slice_layout(key, stored))
            for stored in layout.slices
            if region is None
            or (stored.rank == region.rank and stored.intersect(region) is not None)
        ]


def coalesce(
    ranges: Iterable[ByteRange], *, max_gap: int, max_size: int
) -> dict[str, list[tuple[int, int]]]:
    """Per file, sorted ``(start, stop)`` spans covering ``ranges``.

    Neighbouring ranges are merged while the gap between them is at most ``max_gap`` bytes
    (reading a little extra costs less than another request) and the span stays within
    ``max_size`` (large spans are fetched in parallel instead); a single range larger than
    ``max_size`` is one span.
    """
    by_path: dict[str, list[tuple[int, int]]] = {}
    for item in ranges:
        if item.size > 0:
            by_path.setdefault(item.path, []).append((item.offset, item.offset + item.size))
    spans: dict[str, list[tuple[int, int]]] = {}
    for path, items in by_path.items():
        items.sort()
        merged: list[tuple[int, int]] = []
        for start, stop in items:
            if merged:
                first, last = merged[-1]
                if start <= last + max_gap and max(stop, last) - first <= max_size:
                    merged[-1] = (first, max(stop, last))
                    continue
            merged.append((start, stop))
        spans[path] = merged
    return spans


class _BytesReader(RangeReader):
    """Reads of bytes held in memory, with the fallback reader for anything not held."""

    def __init__(
        self, path: str, size: int, spans: Sequence[tuple[int, bytes]],
        fallback: RangeReader | None,
    ) -> None:
        self.path = path
        self._size = size
        self._spans = spans
        self._starts = [start for start, _ in spans]
        self._fallback = fallback

    @property
    def size(self) -> int:
        # docstring inherited
        return self._size

    def read(self, offset: int, length: int) -> memoryview:
        # docstring inherited
        i = bisect.bisect_right(self._starts, offset) - 1
        if i >= 0:
            start, data = self._spans[i]
            if offset + length <= start + len(data):
                return memoryview(data)[offset - start : offset - start + length]
        if self._fallback is None:
            raise DataLossError(
                f"Requested {length} bytes but read {max(0, self._size - offset)} at offset "
                f"{offset} of {self.path}", path=self.path,
            )
        return self._fallback.read(offset, length)

    def close(self) -> None:
        # docstring inherited; the shared fallback reader is closed by PrefetchedStorage.release
        return None


class PrefetchedStorage(DelegatingStorage):
    """``inner`` plus the index and the byte spans of one restore, held in memory.

    Call order: construct with the index bytes -> :meth:`fetch` the planned ranges -> use as the
    restore's storage (reads of held bytes cost nothing; others go to ``inner``) ->
    :meth:`release` drops the bytes (later reads, e.g. deferred restorations, go to ``inner``).
    Thread-safe for reads. Writes are passed through untouched.
    """

    def __init__(self, inner: Storage, index: IndexView) -> None:
        super().__init__(inner)
        self._index_path = index.index.path
        self._index_bytes: bytes | None = index.index.data
        self._files: dict[str, tuple[int, list[tuple[int, bytes]]]] = {}
        self._readers: dict[str, RangeReader] = {}
        self.requests = 0
        """Range requests :meth:`fetch` made (for tests and benchmarks)."""

    def fetch(
        self, ranges: Iterable[ByteRange], *, workers: int = 8, max_gap: int = 1 << 20,
        max_size: int = 64 << 20,
    ) -> None:
        """Read the coalesced spans of ``ranges``, ``workers`` requests at a time."""
        spans = coalesce(ranges, max_gap=max_gap, max_size=max_size)
        for path in spans:
            self._readers[path] = self.inner.open_range_reader(path)
        jobs = [(path, start, stop) for path, items in spans.items() for start, stop in items]

        def read(job: tuple[str, int, int]) -> tuple[str, int, bytes]:
            path, start, stop = job
            reader = self._readers[path]
            return path, start, bytes(reader.read(start, min(stop, reader.size) - start))

        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs) or 1))) as pool:
            results = list(pool.map(read, jobs))
        for path, start, data in results:
            size = self._readers[path].size
            self._files.setdefault(path, (size, []))[1].append((start, data))
        for _, held in self._files.values():
            held.sort(key=lambda item: item[0])
        self.requests += len(jobs)
        logger.debug("prefetched %d bytes of %d files in %d requests",
                     sum(len(d) for _, _, d in results), len(spans), len(jobs))

    def release(self) -> None:
        """Drop the held bytes and close the readers; reads go to ``inner`` from now on."""
        self._files.clear()
        self._index_bytes = None
        readers, self._readers = list(self._readers.values()), {}
        for reader in readers:
            reader.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- Storage ---------------------------------------------------------------------------
    def open_range_reader(self, path: str) -> RangeReader:
        # docstring inherited
        index = self._index_bytes
        if path == self._index_path and index is not None:
            return _BytesReader(path, len(index), [(0, index)], None)
        held = self._files.get(path)
        if held is not None:
            return _BytesReader(path, held[0], held[1], self._readers.get(path))
        return self.inner.open_range_reader(path)

    def __repr__(self) -> str:
        return f"PrefetchedStorage({self.inner!r}, {len(self._files)} files held)"


def read_requests(tensors: Any) -> list[tuple[str, TensorSlice | None]]:
    """``(checkpoint key, region)`` of every value a graph's live objects would restore.

    ``tensors`` is ``SerializedGraph.tensors``: a value under a key is restored whole, a
    ``{slice spec: value}`` mapping only in those regions.
    """
    requests: list[tuple[str, TensorSlice | None]] = []
    for _, values in tensors.items():
        for key, value in values.items():
            if isinstance(value, dict) or hasattr(value, "items"):
                for spec in value:
                    parsed = parse_slice_spec(spec) if spec else None
                    requests.append((key, parsed[1] if parsed else None))
            else:
                requests.append((key, None))
    return requests
