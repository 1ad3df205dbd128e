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
from trackpoint.saving.staging import StagedValue, payload_nbytes
from trackpoint.storage import Storage

__all__ = ["payload_bytes", "write_shard", "write_shards"]


def _unwrap(value: Any) -> Any:
    return value.value if isinstance(value, DeviceValue) else value


def payload_bytes(shard: Shard) -> int:
    """Bytes of the values in ``shard`` (for progress reports)."""
    total = 0
    for slices in shard.values():
        for value in slices.values():
            if type(value) is np.ndarray and value.dtype.kind not in "OSU":
                total += value.nbytes
            elif isinstance(value, StagedValue):
                total += value.nbytes
            else:
                total += payload_nbytes(np.asarray(_unwrap(value)))
    return total


def write_shard(prefix: str, shard: Shard, storage: Storage) -> None:
    """Write one shard as a one-data-file bundle (runs on a pool thread)."""
    writer = BundleWriter(prefix, storage=storage)
    try:
        add = writer.add
        for key, slices in shard.items():
            for spec, value in slices.items():
                if spec:
                    parsed = parse_slice_spec(spec)
                    if isinstance(value, StagedValue):
                        value.write_to(writer, key, parsed)
                    elif parsed is None:
                        add(key, as_array(_unwrap(value), key))
                    else:
                        writer.add_slice(key, parsed[0], parsed[1], as_array(_unwrap(value), key))
                elif type(value) is np.ndarray:
                    add(key, value)
                elif isinstance(value, StagedValue):
                    value.write_to(writer, key, None)
                else:
                    add(key, as_array(_unwrap(value), key))
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
