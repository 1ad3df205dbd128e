"""Writing shards: each one a one-data-file bundle, several at a time on a thread pool."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from itertools import chain, compress
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np

from trackpoint.bundle.slice_spec import parse_slice_spec
from trackpoint.bundle.writer import BundleWriter
from trackpoint.saving.devices import DeviceValue
from trackpoint.saving.sharding import Shard
from trackpoint.saving.snapshot import as_array
from trackpoint.saving.staging import StagedValue, payload_nbytes
from trackpoint.storage import Storage

__all__ = ["payload_bytes", "write_shard", "write_shards"]

_DTYPE = attrgetter("dtype")
_NBYTES = attrgetter("nbytes")


def _unwrap(value: Any) -> Any:
    return value.value if isinstance(value, DeviceValue) else value


class _Whole(NamedTuple):
    """A shard whose keys each hold one whole ndarray, and where its strings are."""

    keys: list[str]
    arrays: list[np.ndarray]
    strings: list[int]
    """Positions of string values (the object graph): their stored size is not their payload."""


def _whole_arrays(shard: Shard) -> _Whole | None:
    """The shard's values if each key holds one whole ndarray, else None.

    The usual shard; found in C (issue 19: 100,000 small values), then written by
    ``BundleWriter.add_many``.
    """
    if type(shard) is not dict or not shard:
        return None
    inner = list(shard.values())
    if set(map(type, inner)) != {dict}:
        return None
    specs = list(chain.from_iterable(inner))
    if len(specs) != len(inner) or set(specs) != {""}:
        return None
    arrays = list(chain.from_iterable(map(dict.values, inner)))
    if set(map(type, arrays)) != {np.ndarray}:
        return None
    dtypes = list(map(_DTYPE, arrays))
    text = {dtype for dtype in set(dtypes) if dtype.kind in "OSU"}
    strings = list(compress(range(len(arrays)), map(text.__contains__, dtypes))) if text else []
    return _Whole(list(shard), arrays, strings)


def payload_bytes(shard: Shard) -> int:
    """Bytes of the values in ``shard`` (for progress reports)."""
    whole = _whole_arrays(shard)
    if whole is not None:
        total = int(sum(map(_NBYTES, whole.arrays)))
        for i in whole.strings:
            total += payload_nbytes(whole.arrays[i]) - whole.arrays[i].nbytes
        return total
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


def write_shard(prefix: str, shard: Shard, storage: Storage) -> int:
    """Write one shard as a one-data-file bundle (runs on a pool thread); return its payload.

    Whole values are handed to the writer together (``BundleWriter.add_many`` batches runs of
    small ones); slices and staged values in between are written where they come. The payload
    is :func:`payload_bytes` of the shard.
    """
    writer = BundleWriter(prefix, storage=storage)
    whole = _whole_arrays(shard)
    if whole is not None:
        try:
            names, values = whole.keys, whole.arrays
            payload = start = 0
            for i in [*whole.strings, len(values)]:  # numeric runs, each string in its place
                before = writer.bytes_written
                writer.add_many(names[start:i], values[start:i])
                payload += writer.bytes_written - before  # numeric: exactly their nbytes
                if i < len(values):
                    writer.add(names[i], values[i])
                    payload += payload_nbytes(values[i])
                start = i + 1
            writer.finish()
        except BaseException:
            writer.abort()
            raise
        return payload
    keys: list[str] = []
    arrays: list[np.ndarray] = []

    def flush() -> None:
        if keys:
            writer.add_many(keys, arrays)
            keys.clear()
            arrays.clear()

    try:
        for key, slices in shard.items():
            for spec, value in slices.items():
                if not spec:
                    if type(value) is np.ndarray:
                        keys.append(key)
                        arrays.append(value)
                        continue
                    if not isinstance(value, StagedValue):
                        keys.append(key)
                        arrays.append(as_array(_unwrap(value), key))
                        continue
                flush()
                parsed = parse_slice_spec(spec) if spec else None
                if isinstance(value, StagedValue):
                    value.write_to(writer, key, parsed)
                elif parsed is None:
                    writer.add(key, as_array(_unwrap(value), key))
                else:
                    writer.add_slice(key, parsed[0], parsed[1], as_array(_unwrap(value), key))
        flush()
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    return payload_bytes(shard)


def write_shards(
    jobs: Sequence[tuple[str, Shard, Storage]],
    workers: int,
    payloads: list[int] | None = None,
) -> Iterator[int]:
    """Write the shards, ``workers`` at a time; yield each one's index as it completes.

    ``payloads``, if given (one slot per job), receives each shard's payload bytes before its
    index is yielded. The first failure is raised once the running writes have stopped; queued
    ones are cancelled.
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
            payload = write_shard(*job)
            if payloads is not None:
                payloads[index] = payload
            yield index
        return
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in done:
                payload = future.result()  # re-raises the shard's error
                if payloads is not None:
                    payloads[futures[future]] = payload
                yield futures[future]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
