"""AsyncWriter: snapshot at call time, one background writer, errors at sync() (J1)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from trackpoint.bundle.reader import BundleReader
from trackpoint.errors import CheckpointError, FailedPreconditionError
from trackpoint.saving import CheckpointOptions, MultiDeviceSaver, SaveSnapshot
from trackpoint.saving.async_writer import AsyncWriter
from trackpoint.storage import MemoryStorage

KEY = "w/.ATTRIBUTES/VARIABLE_VALUE"


def _read(prefix: str, key: str = KEY, storage=None) -> np.ndarray:  # noqa: ANN001
    with BundleReader(prefix, storage=storage) as reader:
        return reader.read(key)


def test_j1_values_are_snapshotted_at_call_time(prefix) -> None:  # noqa: ANN001
    weights = np.zeros(1000, np.float32)
    calls = []
    saver = MultiDeviceSaver(
        {None: {KEY: weights, "step": lambda: calls.append(threading.current_thread()) or
                np.int64(len(calls))}}
    )
    writer = AsyncWriter()
    assert writer.save(saver, prefix + "-1") == prefix + "-1"
    weights += 1  # in-place training step right after the call
    assert writer.save(saver, prefix + "-2") == prefix + "-2"
    weights += 1
    writer.sync()
    assert not writer.pending
    np.testing.assert_array_equal(_read(prefix + "-1"), np.zeros(1000))
    np.testing.assert_array_equal(_read(prefix + "-2"), np.ones(1000))
    assert _read(prefix + "-2", "step") == 2
    assert calls == [threading.current_thread()] * 2  # callables run on the caller's thread
    writer.close()


def test_back_to_back_saves_serialize_and_do_not_share_buffers(prefix, monkeypatch) -> None:  # noqa: ANN001
    release = threading.Event()
    real = MultiDeviceSaver.save_snapshot
    log = []

    def slow_save_snapshot(self, snapshot, target, options=None, **kwargs):  # noqa: ANN001, ANN003, ANN202
        log.append(("start", os.path.basename(target)))
        if target.endswith("-1"):
            assert release.wait(30)
        result = real(self, snapshot, target, options, **kwargs)
        log.append(("end", os.path.basename(target)))
        return result

    monkeypatch.setattr(MultiDeviceSaver, "save_snapshot", slow_save_snapshot)
    weights = np.zeros(64, np.float32)
    saver = MultiDeviceSaver({None: {KEY: weights}})
    writer = AsyncWriter()
    writer.save(saver, prefix + "-1")
    weights += 5
    second = threading.Thread(target=writer.save, args=(saver, prefix + "-2"))
    second.start()
    time.sleep(0.05)  # give the second save a chance to (wrongly) overwrite the first snapshot
    release.set()
    second.join()
    writer.sync()
    assert log == [("start", "ckpt-1"), ("end", "ckpt-1"), ("start", "ckpt-2"), ("end", "ckpt-2")]
    np.testing.assert_array_equal(_read(prefix + "-1"), np.zeros(64))
    np.testing.assert_array_equal(_read(prefix + "-2"), np.full(64, 5))


def test_background_error_is_raised_by_sync_then_cleared() -> None:
    storage = MemoryStorage()
    saver = MultiDeviceSaver({None: {KEY: np.ones(4)}})
    writer = AsyncWriter()
    storage.fail_writes_after(0)
    writer.save(saver, "mem/ckpt-1", storage=storage)  # returns: the failure is in the background
    with pytest.raises(CheckpointError, match="No space left"):
        writer.sync()
    writer.sync()  # raised once
    storage.clear_faults()
    assert not storage.exists("mem/ckpt-1.index")
    writer.save(saver, "mem/ckpt-2", storage=storage)
    writer.sync()
    np.testing.assert_array_equal(_read("mem/ckpt-2", storage=storage), np.ones(4))


def test_background_error_is_raised_by_the_next_save() -> None:
    storage = MemoryStorage()
    saver = MultiDeviceSaver({None: {KEY: np.ones(4)}})
    writer = AsyncWriter()
    storage.fail_writes_after(0)
    writer.save(saver, "mem/ckpt-1", storage=storage)
    storage_ok = MemoryStorage()
    with pytest.raises(CheckpointError, match="No space left"):
        writer.save(saver, "mem/ckpt-2", storage=storage_ok)
    assert not storage_ok.exists("mem/ckpt-2.index")  # the failed call started nothing


def test_write_callbacks_run_after_the_background_commit(prefix) -> None:  # noqa: ANN001
    seen = []
    options = CheckpointOptions(
        enable_async=True,
        write_callbacks=[lambda p: seen.append(
            (p, os.path.exists(p + ".index"), threading.current_thread().name))],
    )
    writer = AsyncWriter()
    writer.save(MultiDeviceSaver({None: {KEY: np.ones(2)}}), prefix, options)
    writer.sync()
    assert seen == [(prefix, True, "trackpoint-async-save")]


def test_state_over_max_staging_bytes_is_staged_in_chunks(prefix) -> None:  # noqa: ANN001
    # Details in test_staging.py; here: still an async save, with the same result.
    writer = AsyncWriter()
    options = CheckpointOptions(enable_async=True, max_staging_bytes=300)
    values = np.arange(1000.0)
    writer.save(MultiDeviceSaver({None: {KEY: values}}), prefix, options)
    values[:] = 0
    writer.sync()
    np.testing.assert_array_equal(_read(prefix), np.arange(1000.0))


def test_closed_writer_refuses_saves(prefix) -> None:  # noqa: ANN001
    writer = AsyncWriter()
    writer.save(MultiDeviceSaver({None: {KEY: np.ones(2)}}), prefix)
    writer.close()
    assert os.path.exists(prefix + ".index")
    with pytest.raises(FailedPreconditionError, match="closed"):
        writer.save(MultiDeviceSaver({None: {KEY: np.ones(2)}}), prefix)


def test_snapshot_copy_reuses_buffers_of_the_same_shape() -> None:
    values = {"a": np.arange(6, dtype=np.float32).reshape(2, 3, order="F"), "b": np.ones(2)}
    saver = MultiDeviceSaver({None: values})
    buffers: dict = {}
    first = saver.snapshot().copy(buffers)
    tensors = {st.checkpoint_key: st.tensor for st in first.tensors_by_task[""]}
    assert tensors["a"] is not values["a"] and tensors["a"].flags.c_contiguous
    values["a"] += 10
    second = saver.snapshot().copy(buffers)
    again = {st.checkpoint_key: st.tensor for st in second.tensors_by_task[""]}
    assert again["a"] is tensors["a"]  # overwritten in place, no new allocation
    np.testing.assert_array_equal(again["a"], values["a"])
    assert isinstance(second, SaveSnapshot) and set(buffers) == {("a", ""), ("b", "")}


_EXIT_CHILD = """
import sys, time
import numpy as np
from trackpoint.saving import MultiDeviceSaver
from trackpoint.saving.async_writer import AsyncWriter
real = MultiDeviceSaver.save_snapshot
def slow(self, *args, **kwargs):
    time.sleep(0.3)
    return real(self, *args, **kwargs)
MultiDeviceSaver.save_snapshot = slow
writer = AsyncWriter()
writer.save(MultiDeviceSaver({None: {"k": np.arange(5)}}), sys.argv[1])
# exit without sync(): the exit handler must wait for the write
"""


def test_pending_save_completes_at_interpreter_exit(prefix) -> None:  # noqa: ANN001
    subprocess.run([sys.executable, "-c", _EXIT_CHILD, prefix], check=True, timeout=120)
    np.testing.assert_array_equal(_read(prefix, "k"), np.arange(5))
