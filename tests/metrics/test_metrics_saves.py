"""The figures real saves and reads record: present, plausible, equal to the files' bytes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import trackpoint as tp
from trackpoint import metrics
from trackpoint.bundle import BundleReader
from trackpoint.errors import DataLossError
from trackpoint.saving import ProgressEvent


@pytest.fixture(autouse=True)
def fresh_metrics() -> Iterator[None]:
    metrics.reset()
    yield
    metrics.reset()


def _state() -> dict[str, np.ndarray]:
    return {
        "a": np.arange(3000, dtype=np.float32),
        "b": np.ones((40, 40)),
        "c": np.zeros(10, np.int32),
    }


def _files(directory: Path, base: str = "ckpt") -> tuple[list[int], int]:
    """(bytes of each data file in order, bytes of the index) on disk."""
    data = sorted(directory.glob(f"{base}.data-*"))
    return [f.stat().st_size for f in data], (directory / f"{base}.index").stat().st_size


def _write(ckpt: tp.Checkpoint, prefix: Path, **options: object) -> list[ProgressEvent]:
    events: list[ProgressEvent] = []
    ckpt.write(prefix, tp.CheckpointOptions(progress=events.append, **options))  # type: ignore[arg-type]
    ckpt.sync()
    return events


def test_sync_write_figures_equal_the_files(tmp_path: Path) -> None:
    policy = tp.sharding.MaxShardSizePolicy(8192)
    events = _write(tp.Checkpoint(model=_state()), tmp_path / "ckpt", sharding_policy=policy)
    stats = events[-1].stats
    assert isinstance(stats, metrics.WriteStats)
    data, index = _files(tmp_path)
    assert len(data) >= 3
    assert stats.num_shards == len(data)
    assert stats.shard_bytes == tuple(data)
    assert stats.checkpoint_bytes == sum(data) + index
    assert stats.mode == "sync" and stats.background_seconds == 0
    assert stats.blocking_seconds > 0 and stats.sharding_seconds >= 0
    assert stats.sharding_policy == policy.description
    assert stats.training_seconds is None  # the first write

    snap = metrics.snapshot()
    assert snap[metrics.SHARDS_WRITTEN] == {(): len(data)}
    assert snap[metrics.BYTES_WRITTEN] == {(): stats.checkpoint_bytes}
    size = snap[metrics.CHECKPOINT_SIZE][()]
    assert (size["count"], size["sum"]) == (1, stats.checkpoint_bytes)
    (blocking,) = snap[metrics.WRITE_DURATION].values()
    assert snap[metrics.WRITE_DURATION] == {(("mode", "sync"), ("phase", "blocking")): blocking}
    assert blocking["sum"] == pytest.approx(stats.blocking_seconds)
    assert (("policy", policy.description),) in snap[metrics.SHARDING_POLICY_DURATION]
    assert snap[metrics.TRAINING_TIME_BETWEEN_WRITES] == {}


def test_async_write_figures(tmp_path: Path) -> None:
    caller = threading.current_thread()
    threads: list[tuple[str, bool]] = []

    def progress(event: ProgressEvent) -> None:
        threads.append((event.phase, threading.current_thread() is caller))
        events.append(event)

    events: list[ProgressEvent] = []
    ckpt = tp.Checkpoint(model=_state())
    ckpt.write(tmp_path / "ckpt", tp.CheckpointOptions(enable_async=True, progress=progress))
    ckpt.sync()
    stats = events[-1].stats
    assert isinstance(stats, metrics.WriteStats)
    data, index = _files(tmp_path)
    assert stats.mode == "async"
    assert stats.shard_bytes == tuple(data) and stats.checkpoint_bytes == sum(data) + index
    assert stats.blocking_seconds > 0 and stats.background_seconds > 0
    # Staging happens on the caller's thread, everything after it on the writer thread.
    assert threads[0] == ("stage", True)
    assert all(not on_caller for _, on_caller in threads[1:])
    assert [phase for phase, _ in threads[1:]] == ["write"] * len(data) + ["commit"]

    durations = metrics.snapshot()[metrics.WRITE_DURATION]
    blocking = durations[(("mode", "async"), ("phase", "blocking"))]
    background = durations[(("mode", "async"), ("phase", "background"))]
    assert blocking["sum"] == pytest.approx(stats.blocking_seconds)
    assert background["sum"] == pytest.approx(stats.background_seconds)
    assert metrics.snapshot()[metrics.BYTES_WRITTEN] == {(): stats.checkpoint_bytes}


def test_training_time_between_writes(tmp_path: Path) -> None:
    ckpt = tp.Checkpoint(model=_state())
    first = _write(ckpt, tmp_path / "one")[-1].stats
    second = _write(ckpt, tmp_path / "two", enable_async=True)[-1].stats
    third = _write(ckpt, tmp_path / "three")[-1].stats
    assert isinstance(first, metrics.WriteStats) and first.training_seconds is None
    assert isinstance(second, metrics.WriteStats) and isinstance(third, metrics.WriteStats)
    assert second.training_seconds is not None and second.training_seconds >= 0
    assert third.training_seconds is not None and third.training_seconds >= 0
    training = metrics.snapshot()[metrics.TRAINING_TIME_BETWEEN_WRITES][()]
    assert training["count"] == 2
    assert training["sum"] == pytest.approx(second.training_seconds + third.training_seconds)
    bytes_written = metrics.snapshot()[metrics.BYTES_WRITTEN][()]
    assert (
        bytes_written == first.checkpoint_bytes + second.checkpoint_bytes + third.checkpoint_bytes
    )


def test_read_figures(tmp_path: Path) -> None:
    policy = tp.sharding.MaxShardSizePolicy(8192)
    path = tp.Checkpoint(model=_state()).write(
        tmp_path / "ckpt", tp.CheckpointOptions(sharding_policy=policy)
    )
    metrics.reset()
    target = {k: np.zeros_like(v) for k, v in _state().items()}
    events: list[ProgressEvent] = []
    tp.Checkpoint(model=target).read(path, tp.CheckpointOptions(progress=events.append))
    np.testing.assert_array_equal(target["a"], _state()["a"])

    stats = events[-1].stats
    assert events[-1].phase == "restored"
    assert isinstance(stats, metrics.ReadStats)
    data, index = _files(tmp_path)
    assert stats.shard_bytes == tuple(data) and stats.num_shards == len(data)
    assert stats.checkpoint_bytes == sum(data) + index
    assert stats.seconds > 0
    snap = metrics.snapshot()
    read = snap[metrics.READ_DURATION][()]
    assert read["count"] == 1 and read["sum"] == pytest.approx(stats.seconds)
    # Every tensor is read once; the index once or twice (object graph, then values).
    (bytes_read,) = snap[metrics.BYTES_READ].values()
    assert sum(data) + index <= bytes_read <= sum(data) + 2 * index
    assert snap[metrics.CHECKSUM_FAILURES] == {}


def _read_damaged(how: str, path: str, key: str) -> None:
    if how == "checkpoint":
        tp.Checkpoint(model={"a": np.zeros(1000, np.float32)}).read(path)
        return
    with BundleReader(path) as reader:
        if how == "read":
            reader.read(key)  # the fast path
        elif how == "read_slice":
            reader.read_slice(key, "0,10")
        else:
            reader.verify()


@pytest.mark.parametrize("how", ["read", "read_slice", "verify", "checkpoint"])
def test_checksum_failures_are_counted(tmp_path: Path, how: str) -> None:
    state = {"a": np.arange(1000, dtype=np.float32)}
    path = tp.Checkpoint(model=state).write(tmp_path / "ckpt")
    key = "model/a/.ATTRIBUTES/VARIABLE_VALUE"
    with BundleReader(path) as reader:
        offset = reader.entry(key).offset
    data_file = tmp_path / "ckpt.data-00000-of-00001"
    raw = bytearray(data_file.read_bytes())
    raw[offset + 5] ^= 0xFF
    data_file.write_bytes(bytes(raw))
    metrics.reset()
    with pytest.raises(DataLossError, match="Checksum does not match"):
        _read_damaged(how, path, key)
    assert metrics.snapshot()[metrics.CHECKSUM_FAILURES] == {(): 1}


def test_async_save_blocks_less_than_it_writes_in_the_background(tmp_path: Path) -> None:
    # 128 MiB: the blocking part copies it into host buffers (reused by the second save, so
    # no page faults), the background part checksums it, writes it and fsyncs it.
    state = {f"w{i}": np.full(8 << 20, i, dtype=np.float32) for i in range(4)}
    ckpt = tp.Checkpoint(model=state)
    options = tp.CheckpointOptions(enable_async=True, num_io_threads=1)
    events: list[ProgressEvent] = []
    ckpt.write(tmp_path / "first", options)
    ckpt.sync()  # else the second save's blocking part includes waiting for the first
    ckpt.write(tmp_path / "second", tp.CheckpointOptions(
        enable_async=True, num_io_threads=1, progress=events.append))  # fmt: skip
    ckpt.sync()
    stats = events[-1].stats
    assert isinstance(stats, metrics.WriteStats) and stats.mode == "async"
    assert stats.checkpoint_bytes > 128 << 20
    assert stats.blocking_seconds < stats.background_seconds
