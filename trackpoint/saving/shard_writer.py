"""Writing shards: each one a one-data-file bundle, several at a time on a thread pool."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from trackpoint.bundle.slice_spec import parse_slice_spec
from trackpoint.bundle.writer import BundleWriter
from trackpoint.saving.devices import DeviceValue
from trackpoint.saving.sharding import Shard
from trackpoint.saving.snapshot import as_array
from trackpoint.storage import Storage

__all__ = ["payload_bytes", "write_shard", "write_shards"]


def _unwrap(value: Any) -> Any:
    return value.value if isinstance(value, DeviceValue) else value


def _nbytes(array: np.ndarray) -> int:
    """Payload bytes for progress reports (strings: their lengths, roughly)."""
    if array.dtype.kind in "OSU":
        return sum(len(x) if isinstance(x, (bytes, str)) else 0 for x in array.reshape(-1).tolist())
    return int(array.nbytes)


def payload_bytes(shard: Shard) -> int:
    """Bytes of the values in ``shard`` (for progress reports)."""
    values = (value for slices in shard.values() for value in slices.values())
    return sum(_nbytes(np.asarray(_unwrap(value))) for value in values)


def write_shard(prefix: str, shard: Shard, storage: Storage) -> None:
    """Write one shard as a one-data-file bundle (runs on a pool thread)."""
    writer = BundleWriter(prefix, storage=storage)
    try:
        for key, slices in shard.items():
            for spec, value in slices.items():
                array = as_array(_unwrap(value), key)
                parsed = parse_slice_spec(spec) if spec else None
                if parsed is None:
                    writer.add(key, array)
                else:
                    writer.add_slice(key, parsed[0], parsed[1], array)
        writer.finish()
    except BaseException:
        writer.abort()
        raise


def write_shards(
    jobs: Sequence[tuple[str, Shard, Storage]], workers: int
) -> Iterator[int]:
    """Write the shards, ``workers`` at a time; yield each one's index as it completes.

    The first failure is raised once the running writes have stopped; queued ones are cancelled.
    """
    pool = None
    if workers > 1 and len(jobs) > 1:
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trackpoint-save")
        try:
            futures = {pool.submit(write_shard, *job): i for i, job in enumerate(jobs)}
        except RuntimeError:
            # The interpreter is exiting (an async save finishing in the exit handler):
            # concurrent.futures accepts no more work, so write on this thread.
            pool.shutdown(wait=True)
            pool = None
    if pool is None:
        for index, job in enumerate(jobs):
            write_shard(*job)
            yield index
        return
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in done:
                future.result()  # re-raises the shard's error
                yield futures[future]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
