"""Bounded async snapshots (CheckpointOptions.max_staging_bytes): staged while written (J1)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import threading

import ml_dtypes
import numpy as np
import pytest

import trackpoint as tp
from trackpoint.bundle.reader import BundleReader
from trackpoint.bundle.writer import BundleWriter
from trackpoint.errors import CheckpointError
from trackpoint.saving import CheckpointOptions, MultiDeviceSaver
from trackpoint.saving import staging as staging_module
from trackpoint.saving.async_writer import AsyncWriter
from trackpoint.saving.staging import MIN_STAGING_BYTES, Stager
from trackpoint.storage import MemoryStorage

BOUND = 8192  # staged whole up to 2 KiB, in pieces above


def _state() -> dict[str, np.ndarray]:
    """Values of every kind the stager treats differently, several larger than the bound."""
    return {
        "big": np.arange(30_000, dtype=np.float32).reshape(100, 300),
        "huge_row": np.arange(5_000, dtype=np.float64).reshape(1, 5_000),  # rows split too
        "fortran": np.asfortranarray(np.arange(3_000, dtype=np.float64).reshape(30, 100)),
        "strided": np.arange(8_000, dtype=np.int16)[::2],
        "big_endian": np.arange(3_000, dtype=">i4"),
        "bf16": np.arange(4_000, dtype=np.float32).astype(ml_dtypes.bfloat16),
        "small": np.ones(3),
        "names": np.array([b"alpha", b"beta"]),
        "empty": np.zeros((0, 3), np.float32),
        "scalar": np.array(2.5, np.float32),
    }


def _files(prefix: str) -> dict[str, bytes]:
    out = {}
    for path in sorted(glob.glob(prefix + ".*")):
        with open(path, "rb") as f:
            out[os.path.basename(path).split(".", 1)[1]] = f.read()
    return out


def _clobber(state: dict[str, np.ndarray]) -> None:
    for value in state.values():
        if value.dtype.kind != "S":
            value[...] = 7


@pytest.mark.parametrize(
    ("policy", "threads"),
    [(None, None), (tp.sharding.MaxShardSizePolicy(40_000), 2)],
    ids=["one-shard", "sharded"],
)
def test_j1_staged_save_is_byte_identical_to_sync_and_snapshots_at_call(
    tmp_path, policy, threads
) -> None:  # noqa: ANN001
    sync = tp.Checkpoint(**_state()).write(
        str(tmp_path / "sync"), CheckpointOptions(sharding_policy=policy)
    )
    state = _state()
    ckpt = tp.Checkpoint(**state)
    options = CheckpointOptions(
        enable_async=True, max_staging_bytes=BOUND, sharding_policy=policy,
        num_io_threads=threads,
    )  # fmt: skip
    staged = ckpt.write(str(tmp_path / "staged"), options)
    _clobber(state)  # right after the call: must not reach the file
    ckpt.sync()
    expected = _files(sync)
    assert len(expected) > (2 if policy else 1)
    assert _files(staged) == expected


def test_j1_updates_after_return_do_not_leak_while_the_tail_is_written(
    tmp_path, monkeypatch
) -> None:  # noqa: ANN001
    release = threading.Event()
    real_add = BundleWriter.add

    def gated_add(self, key, array):  # noqa: ANN001, ANN202
        if key == "w2":
            assert release.wait(30)  # the writer is still busy when the caller returns
        return real_add(self, key, array)

    monkeypatch.setattr(BundleWriter, "add", gated_add)
    w1 = np.full(4_000, 1.0, np.float32)  # 16 KB: streamed in pieces
    w2 = np.full(100, 2.0, np.float32)  # staged whole, written last
    saver = MultiDeviceSaver({None: {"w1": w1, "w2": w2}})
    writer = AsyncWriter()
    options = CheckpointOptions(enable_async=True, max_staging_bytes=BOUND)
    writer.save(saver, str(tmp_path / "ckpt"), options)
    assert writer.pending
    w1[:] = -1
    w2[:] = -1
    release.set()
    writer.sync()
    with BundleReader(str(tmp_path / "ckpt")) as reader:
        np.testing.assert_array_equal(reader.read("w1"), np.full(4_000, 1.0, np.float32))
        np.testing.assert_array_equal(reader.read("w2"), np.full(100, 2.0, np.float32))
    writer.close()


def test_staging_buffer_is_bounded_and_reused(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    seen = []
    real_stage = Stager.stage

    def spy(self, timing):  # noqa: ANN001, ANN202
        real_stage(self, timing)
        seen.append((self.buffer, self.capacity, self.peak_bytes, self.staged_bytes))

    state = _state()
    saver = MultiDeviceSaver({None: state})
    writer = AsyncWriter()
    options = CheckpointOptions(enable_async=True, max_staging_bytes=BOUND)
    monkeypatch.setattr(Stager, "stage", spy)
    writer.save(saver, str(tmp_path / "a"), options)
    writer.save(saver, str(tmp_path / "b"), options)
    writer.close()
    (buf1, cap, peak1, staged), (buf2, _, peak2, _) = seen
    numeric = sum(v.nbytes for v in state.values() if v.dtype.kind != "S")
    assert cap == BOUND and buf1.nbytes == BOUND and buf2 is buf1
    assert 0 < peak1 <= BOUND and 0 < peak2 <= BOUND
    assert staged == numeric + state["names"].nbytes > 3 * BOUND


def test_tiny_bound_is_raised_to_the_minimum(tmp_path) -> None:  # noqa: ANN001
    values = np.arange(100, dtype=np.complex128)
    writer = AsyncWriter()
    options = CheckpointOptions(enable_async=True, max_staging_bytes=1)
    writer.save(MultiDeviceSaver({None: {"c": values}}), str(tmp_path / "c"), options)
    writer.close()
    assert Stager(1).capacity == MIN_STAGING_BYTES
    with BundleReader(str(tmp_path / "c")) as reader:
        np.testing.assert_array_equal(reader.read("c"), values)


def test_pre_sliced_values_over_the_bound_are_streamed(tmp_path) -> None:  # noqa: ANN001
    full = np.arange(4 * 3_000, dtype=np.float32).reshape(4, 3_000)
    specs = {"4 3000 0,2:0,3000": full[:2], "4 3000 2,2:0,3000": full[2:]}
    saver = MultiDeviceSaver({None: {"p": specs}})
    saver.save(str(tmp_path / "sync"))
    writer = AsyncWriter()
    options = CheckpointOptions(enable_async=True, max_staging_bytes=BOUND)
    writer.save(saver, str(tmp_path / "staged"), options)
    writer.close()
    assert _files(str(tmp_path / "staged")) == _files(str(tmp_path / "sync"))


def test_background_failure_unblocks_the_caller_and_is_raised_by_sync() -> None:
    storage = MemoryStorage()
    storage.fail_writes_after(0)
    saver = MultiDeviceSaver({None: {"w": np.ones(50_000, np.float32)}})  # 25 buffers' worth
    writer = AsyncWriter()
    options = CheckpointOptions(enable_async=True, max_staging_bytes=BOUND)
    writer.save(saver, "mem/ckpt", options, storage=storage)  # returns, does not hang
    with pytest.raises(CheckpointError, match="No space left"):
        writer.sync()
    assert not storage.exists("mem/ckpt.index")
    storage.clear_faults()
    writer.save(saver, "mem/ckpt", options, storage=storage)
    writer.close()
    with BundleReader("mem/ckpt", storage=storage) as reader:
        np.testing.assert_array_equal(reader.read("w"), np.ones(50_000, np.float32))


def test_copy_failure_is_raised_by_the_call_and_nothing_is_committed(
    tmp_path, monkeypatch
) -> None:  # noqa: ANN001
    calls = []
    real_copyto = np.copyto

    def failing_copyto(dst, src):  # noqa: ANN001, ANN202
        calls.append(1)
        if len(calls) == 3:
            raise MemoryError("simulated")
        real_copyto(dst, src)

    monkeypatch.setattr(staging_module.np, "copyto", failing_copyto)
    saver = MultiDeviceSaver({None: {"w": np.ones(10_000, np.float32)}})
    writer = AsyncWriter()
    options = CheckpointOptions(enable_async=True, max_staging_bytes=BOUND)
    with pytest.raises(MemoryError, match="simulated"):
        writer.save(saver, str(tmp_path / "ckpt"), options)
    writer.sync()  # the aborted write is not reported a second time
    assert not os.path.exists(str(tmp_path / "ckpt.index"))
    monkeypatch.setattr(staging_module.np, "copyto", real_copyto)
    writer.save(saver, str(tmp_path / "ckpt"), options)
    writer.close()
    assert os.path.exists(str(tmp_path / "ckpt.index"))


def test_staged_save_reports_async_figures_and_a_stage_event(tmp_path) -> None:  # noqa: ANN001
    events = []
    options = CheckpointOptions(enable_async=True, max_staging_bytes=BOUND, progress=events.append)
    ckpt = tp.Checkpoint(w=np.ones(10_000, np.float32))
    ckpt.write(str(tmp_path / "ckpt"), options)
    ckpt.sync()
    stage = [e for e in events if e.phase == "stage"]
    assert len(stage) == 1 and stage[0].bytes_done >= 40_000  # + the graph's pointer
    commit = events[-1]
    assert commit.phase == "commit" and commit.stats is not None
    assert commit.stats.mode == "async" and commit.stats.blocking_seconds > 0


def test_tf_reads_a_staged_checkpoint(tmp_path, tf) -> None:  # noqa: ANN001
    state = _state()
    expected = {k: np.array(v, copy=True) for k, v in state.items()}
    ckpt = tp.Checkpoint(**state)
    path = ckpt.write(
        str(tmp_path / "ckpt"), CheckpointOptions(enable_async=True, max_staging_bytes=BOUND)
    )
    _clobber(state)
    ckpt.sync()
    reader = tf.train.load_checkpoint(path)
    for name in ("big", "fortran", "strided", "big_endian", "huge_row", "empty"):
        got = reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE")
        np.testing.assert_array_equal(got, expected[name])
    assert reader.get_tensor("names/.ATTRIBUTES/VARIABLE_VALUE").tolist() == [b"alpha", b"beta"]


_RSS_CHILD = """
import json, sys
import numpy as np
import trackpoint as tp

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

state = {}
for i in range(int(sys.argv[2])):  # 16 MiB each, written in place: no temporaries
    a = np.empty(4 << 20, np.float32)
    a.fill(i)
    state[f"t{i:02d}"] = a
ckpt = tp.Checkpoint(**state)
options = tp.CheckpointOptions(enable_async=True, max_staging_bytes=32 << 20, fsync=False)
tp.Checkpoint(x=np.ones(3)).write(sys.argv[1] + "/warm")  # imports, first-use setup
base = status("VmRSS")
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
except OSError:
    pass
path = ckpt.write(sys.argv[1] + "/ckpt", options)
for a in state.values():
    a.fill(-1.0)  # in-place update right after the call returns
ckpt.sync()
peak = status("VmHWM")
print(json.dumps({"extra": peak - base, "state": sum(a.nbytes for a in state.values())}))
"""


def test_staged_save_peak_memory_stays_under_the_bound(tmp_path) -> None:  # noqa: ANN001
    proc = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, str(tmp_path), "25"],  # 400 MiB
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # A full copy would add 400 MiB; the 32 MiB buffer plus interpreter noise stays far below.
    assert result["extra"] < 96 << 20, result
    with BundleReader(str(tmp_path / "ckpt")) as reader:
        for i in (0, 24):
            value = reader.read(f"t{i:02d}/.ATTRIBUTES/VARIABLE_VALUE", copy=False)
            assert value.shape == (4 << 20,) and value[0] == i and value[-1] == i


def test_sync_save_allocates_no_copy_of_the_state(tmp_path) -> None:  # noqa: ANN001
    child = _RSS_CHILD.replace(
        'options = tp.CheckpointOptions(enable_async=True, max_staging_bytes=32 << 20, '
        'fsync=False)',
        "options = tp.CheckpointOptions(fsync=False)",
    )
    assert child != _RSS_CHILD
    proc = subprocess.run(
        [sys.executable, "-c", child, str(tmp_path), "8"],  # 128 MiB
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["extra"] < 32 << 20, result  # a copy would add 128 MiB
