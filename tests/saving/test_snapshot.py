"""The one snapshot type: what sets a save apart is declared on it; the writer asks only that."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from trackpoint.errors import CheckpointError, DataLossError
from trackpoint.metrics import registry as metrics
from trackpoint.saving import CheckpointOptions, MultiDeviceSaver, SaveSnapshot
from trackpoint.saving.async_writer import AsyncWriter
from trackpoint.saving.staging import MIN_STAGING_BYTES, Stager
from trackpoint.storage import MemoryStorage


def _snapshot(**values: np.ndarray) -> SaveSnapshot:
    return MultiDeviceSaver({None: values}).snapshot()


def test_an_ordinary_snapshot_declares_nothing_and_completes_at_once() -> None:
    snapshot = _snapshot(w=np.arange(4.0))
    assert (snapshot.shards, snapshot.stager, snapshot.plan) == (None, None, None)
    assert snapshot.complete() is snapshot
    snapshot.abandon(RuntimeError("the write failed"))  # nothing to release: no error


def test_copy_keeps_the_plan_and_drops_shards_cut_from_the_live_arrays() -> None:
    live = np.arange(6.0)
    planned = _snapshot(w=live)
    plan = object()  # any plan rides along unchanged (incremental.py sets its own)
    cut = SaveSnapshot(planned.tensors_by_task, shards=(("", {}),), plan=plan)
    copied = cut.copy()
    assert copied.plan is plan
    assert copied.shards is None and copied.stager is None
    (st,) = copied.tensors_by_task[""]
    live[:] = -1
    np.testing.assert_array_equal(st.tensor, np.arange(6.0))


def test_abandon_wakes_a_caller_waiting_for_staging_space() -> None:
    # The caller stages into a full buffer nobody writes out: only the snapshot's abandon()
    # (what the writer thread calls when its write fails) lets it return.
    stager = Stager(MIN_STAGING_BYTES)
    values = np.arange(4 * MIN_STAGING_BYTES // 8, dtype=np.float64)  # 4 buffers' worth
    shards = stager.stage_shards([("", {"w": {"": values}})])
    staged = SaveSnapshot({}, shards=tuple(shards), stager=stager)
    returned: list[bool] = []
    caller = threading.Thread(target=lambda: returned.append(stager.stage(metrics.begin_write())))
    caller.start()
    caller.join(0.2)
    assert caller.is_alive()  # waiting for space
    staged.abandon(DataLossError("disk gone"))
    caller.join(30)
    assert returned == [False]  # told the write failed, not raised at the caller


def test_a_staged_save_whose_write_fails_returns_and_sync_raises_the_write_error() -> None:
    storage = MemoryStorage()
    storage.fail_writes_after(0)
    saver = MultiDeviceSaver({None: {"w": np.ones(50_000, np.float32)}})
    writer = AsyncWriter()
    options = CheckpointOptions(enable_async=True, max_staging_bytes=MIN_STAGING_BYTES)
    writer.save(saver, "mem/ckpt", options, storage=storage)
    with pytest.raises(CheckpointError, match="No space left") as caught:
        writer.sync()
    assert "staging" not in str(caught.value)  # the stager's private signal never surfaces
    writer.close()


class _Unfinishable:
    """A snapshot of a kind the writer does not know: it asks only the Snapshot protocol."""

    def __init__(self) -> None:
        self.abandoned: list[BaseException | None] = []

    def complete(self) -> SaveSnapshot:
        raise DataLossError("a copy found its value changed")

    def abandon(self, error: BaseException | None = None) -> None:
        self.abandoned.append(error)


def test_the_writer_thread_completes_the_snapshot_and_abandons_it_when_that_fails() -> None:
    writer = AsyncWriter()
    snapshot = _Unfinishable()
    saver = MultiDeviceSaver({None: {"w": np.ones(3)}})
    writer._submit(
        (saver, snapshot, "mem/ckpt", CheckpointOptions(), MemoryStorage(), metrics.begin_write())
    )
    with pytest.raises(DataLossError, match="changed") as caught:
        writer.sync()
    assert snapshot.abandoned == [caught.value]
    writer.close()
