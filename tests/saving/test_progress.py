"""Progress events of saves and restores: bytes staged, persisted, read; per shard; figures."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

import trackpoint as tp
from trackpoint import metrics
from trackpoint.saving import AsyncWriter, MaxShardSizePolicy, MultiDeviceSaver, ProgressEvent

KEYS = ("a", "b", "c", "d")


def _values() -> dict[str, np.ndarray]:
    return {
        "a": np.arange(100, dtype=np.float32),  # 400 bytes
        "b": np.ones(50, np.float64),  # 400 bytes
        "c": np.zeros(25, np.int32),  # 100 bytes
        "d": np.array(["x", "yz"], dtype=object),  # strings: 3 payload bytes
    }


def _numeric() -> dict[str, np.ndarray]:
    """What a ``Checkpoint`` takes directly (object arrays are refused)."""
    return {k: v for k, v in _values().items() if v.dtype != object}


def test_progress_event_is_exported_from_saving() -> None:
    from trackpoint.saving import saver
    from trackpoint.saving.progress import ProgressEvent as Defined

    assert ProgressEvent is Defined is saver.ProgressEvent
    assert tp.saving.ProgressEvent is Defined
    assert "ProgressEvent" in tp.saving.__all__


def test_sync_save_reports_each_shard_then_commit(prefix: str) -> None:
    events: list[ProgressEvent] = []
    options = tp.CheckpointOptions(sharding_policy=MaxShardSizePolicy(400), progress=events.append)
    MultiDeviceSaver({None: _values()}).save(prefix, options)

    *writes, commit = events
    assert {e.phase for e in writes} == {"write"} and commit.phase == "commit"
    num_shards = writes[0].num_shards
    assert num_shards >= 3 and len(writes) == num_shards
    # One event per persisted shard: every shard once, counts and bytes only grow.
    assert sorted(e.shard_id for e in writes) == list(range(num_shards))
    assert [e.shards_done for e in writes] == list(range(1, num_shards + 1))
    done = [e.bytes_done for e in writes]
    assert done == sorted(done) and done[-1] == writes[0].bytes_total == 903
    assert np.cumsum([e.shard_bytes for e in writes]).tolist() == done
    assert all(e.stats is None for e in writes)
    assert (commit.shards_done, commit.num_shards) == (num_shards, num_shards)
    assert commit.bytes_done == commit.bytes_total == 903
    assert isinstance(commit.stats, metrics.WriteStats)
    assert commit.stats.num_shards == num_shards and commit.stats.prefix == prefix


def test_async_save_stages_on_the_caller_thread(prefix: str) -> None:
    caller = threading.current_thread()
    seen: list[tuple[ProgressEvent, bool]] = []
    options = tp.CheckpointOptions(
        progress=lambda e: seen.append((e, threading.current_thread() is caller))
    )
    writer = AsyncWriter()
    try:
        writer.save(MultiDeviceSaver({None: _values()}), prefix, options)
        writer.sync()
    finally:
        writer.close()
    (stage, on_caller), *rest = seen
    assert stage.phase == "stage" and on_caller
    # Staged bytes are the host copy of the numeric arrays (strings are not copied).
    assert stage.bytes_done == stage.bytes_total > 0
    assert (stage.shards_done, stage.num_shards, stage.shard_id) == (0, 0, None)
    assert [e.phase for e, _ in rest] == ["write", "commit"]
    assert not any(on_caller for _, on_caller in rest)
    assert isinstance(rest[-1][0].stats, metrics.WriteStats)
    assert rest[-1][0].stats.mode == "async"


def test_restore_reports_bytes_read(prefix: str, make_holder) -> None:  # noqa: ANN001
    values = _values()
    MultiDeviceSaver({None: values}).save(
        prefix, tp.CheckpointOptions(sharding_policy=MaxShardSizePolicy(400))
    )
    holder = make_holder("h")
    events: list[ProgressEvent] = []
    MultiDeviceSaver({holder: {k: np.empty_like(v) for k, v in values.items()}}).restore(
        prefix, tp.CheckpointOptions(progress=events.append)
    )
    assert [e.phase for e in events] == ["read"] * len(KEYS)
    done = [e.bytes_done for e in events]
    assert done == sorted(done)
    numeric = sum(v.nbytes for k, v in values.items() if k != "d")
    assert events[-1].bytes_total == done[-1] >= numeric  # plus the object array's bytes
    assert all(e.num_shards == e.shards_done >= 3 for e in events)
    assert holder.calls and holder.calls[0]["a"].tolist() == values["a"].tolist()


def test_checkpoint_read_ends_with_its_figures(tmp_path) -> None:  # noqa: ANN001
    path = tp.Checkpoint(model=_numeric()).write(tmp_path / "ckpt")
    events: list[ProgressEvent] = []
    target = {k: np.zeros_like(v) for k, v in _numeric().items()}
    tp.Checkpoint(model=target).read(path, tp.CheckpointOptions(progress=events.append))
    assert [e.phase for e in events[:-1]] == ["read"] * len(events[:-1]) and len(events) > 1
    last = events[-1]
    assert last.phase == "restored" and isinstance(last.stats, metrics.ReadStats)
    data = (tmp_path / "ckpt.data-00000-of-00001").stat().st_size
    assert last.bytes_done == last.bytes_total == data == sum(last.stats.shard_bytes)
    assert target["a"].tolist() == _numeric()["a"].tolist()


def test_no_callback_no_events_and_still_figures(prefix: str) -> None:
    metrics.reset()
    MultiDeviceSaver({None: _numeric()}).save(prefix)
    assert metrics.snapshot()[metrics.SHARDS_WRITTEN] == {(): 1}
    metrics.reset()


def test_logging_example_from_the_docs(tmp_path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    # docs/metrics.md: log each save's and restore's figures from the progress callback.
    log = logging.getLogger("train")

    def log_figures(event: ProgressEvent) -> None:
        stats = event.stats
        if isinstance(stats, metrics.WriteStats):
            log.info(
                "saved %s: %d bytes in %d shards, blocked %.3fs",
                stats.prefix, stats.checkpoint_bytes, stats.num_shards, stats.blocking_seconds,
            )  # fmt: skip
        elif isinstance(stats, metrics.ReadStats):
            log.info("restored %s: %d bytes in %.3fs", stats.prefix, stats.checkpoint_bytes,
                     stats.seconds)  # fmt: skip

    options = tp.CheckpointOptions(progress=log_figures)
    ckpt = tp.Checkpoint(model=_numeric())
    with caplog.at_level(logging.INFO, logger="train"):
        path = ckpt.save(tmp_path / "ckpt", options)
        ckpt.restore(path, options)
    messages = [r.getMessage() for r in caplog.records if r.name == "train"]
    assert len(messages) == 2
    assert messages[0].startswith(f"saved {path}: ") and "in 1 shards" in messages[0]
    assert messages[1].startswith(f"restored {path}: ")
