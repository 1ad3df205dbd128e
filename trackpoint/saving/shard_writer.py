"""Writing shards: each one a one-data-file bundle, several at a time on a thread pool."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from itertools import chain, compress, repeat
from operator import attrgetter, is_, methodcaller, or_, truth
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
_TEXT_KINDS = "OSU"  # stored as strings: their payload is not their nbytes


def _unwrap(value: Any) -> Any:
    return value.value if isinstance(value, DeviceValue) else value


class _Flat(NamedTuple):
    """A shard's values in one list each, and where the values that are not a whole numeric
    ndarray stand (slices, strings, staged values, other objects): each of those is written
    in its place, the runs between them together."""

    keys: list[str]
    specs: list[str]
    values: list[Any]
    odd: list[int]


def _flatten(shard: Shard) -> _Flat:
    """``shard`` as parallel lists, found in C for the usual shard (issue 19: 100,000 small
    whole arrays)."""
    inner = list(shard.values())
    counts = list(map(len, inner))
    keys = list(chain.from_iterable(map(repeat, shard, counts)))
    specs: list[str] = list(chain.from_iterable(inner))
    values = list(chain.from_iterable(map(methodcaller("values"), inner)))
    arrays = list(map(is_, map(type, values), repeat(np.ndarray)))
    if all(arrays):
        dtypes = list(map(_DTYPE, values))
    else:
        dtypes = [value.dtype if plain else None for value, plain in zip(values, arrays)]
    text = {dtype for dtype in set(dtypes) if dtype is None or dtype.kind in _TEXT_KINDS}
    odd = list(compress(range(len(values)), map(or_, map(text.__contains__, dtypes),
                                                map(truth, specs))))  # fmt: skip
    return _Flat(keys, specs, values, odd)


def _payload(value: Any) -> int:
    """Payload bytes of one value that is not a whole numeric ndarray."""
    if isinstance(value, StagedValue):
        return value.nbytes
    return payload_nbytes(np.asarray(_unwrap(value)))


def payload_bytes(shard: Shard) -> int:
    """Bytes of the values in ``shard`` (for progress reports)."""
    flat = _flatten(shard)
    if not flat.odd:
        return int(sum(map(_NBYTES, flat.values)))
    odd = set(flat.odd)
    total = sum(value.nbytes for i, value in enumerate(flat.values) if i not in odd)
    return int(total) + sum(_payload(flat.values[i]) for i in flat.odd)


def write_shard(prefix: str, shard: Shard, storage: Storage) -> int:
    """Write one shard as a one-data-file bundle (runs on a pool thread); return its payload.

    The runs of whole numeric arrays are handed to the writer together
    (``BundleWriter.add_many`` batches runs of small ones); each other value (a slice, a string,
    a staged value) is written where it stands. The payload is :func:`payload_bytes` of the
    shard.
    """
    writer = BundleWriter(prefix, storage=storage)
    keys, specs, values, odd = _flatten(shard)
    try:
        payload = start = 0
        for index in [*odd, len(values)]:
            if start < index:
                before = writer.bytes_written
                writer.add_many(keys[start:index], values[start:index])
                payload += writer.bytes_written - before  # numeric: exactly their nbytes
            if index < len(values):
                payload += _write_one(writer, keys[index], specs[index], values[index])
            start = index + 1
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    return payload


def _write_one(writer: BundleWriter, key: str, spec: str, value: Any) -> int:
    """Write a value that is not a whole numeric ndarray; returns its payload bytes."""
    parsed = parse_slice_spec(spec) if spec else None
    if isinstance(value, StagedValue):
        value.write_to(writer, key, parsed)
        return int(value.nbytes)
    array = as_array(_unwrap(value), key)
    if parsed is None:
        writer.add(key, array)
    else:
        writer.add_slice(key, parsed[0], parsed[1], array)
    return payload_nbytes(array)


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
