"""Async saving through Checkpoint and CheckpointManager: same files as sync, ordering, waits."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.errors import CheckpointError

ASYNC = tp.CheckpointOptions(enable_async=True)


def _state(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((64, 32)).astype(np.float32),
        "b": rng.standard_normal(32).astype(np.float64),
        "ids": np.arange(10, dtype=np.int64),
        "name": np.array([b"alpha", b"beta"]),
    }


def _files(prefix: str) -> dict[str, bytes]:
    import glob
    import os

    return {os.path.basename(p).split(".", 1)[1]: open(p, "rb").read()
            for p in sorted(glob.glob(prefix + ".*"))}


def test_async_files_are_byte_identical_to_sync(tmp_path):
    sync_path = tp.Checkpoint(model=_state(), step=tp.Variable(np.int64(3))).save(
        str(tmp_path / "sync" / "ckpt"))
    ckpt = tp.Checkpoint(model=_state(), step=tp.Variable(np.int64(3)))
    async_path = ckpt.save(str(tmp_path / "async" / "ckpt"), ASYNC)
    ckpt.sync()
    assert _files(sync_path) == _files(async_path)


def test_back_to_back_async_saves_keep_order_and_values(tmp_path):
    state = _state()
    ckpt = tp.Checkpoint(model=state)
    paths = []
    for i in range(5):
        state["ids"][:] = i
        paths.append(ckpt.save(str(tmp_path / "ckpt"), ASYNC))
    ckpt.sync()
    assert paths == [str(tmp_path / f"ckpt-{i}") for i in range(1, 6)]
    assert tp.latest_checkpoint(str(tmp_path)) == paths[-1]
    for i, path in enumerate(paths):
        assert (tp.load_variable(path, "model/ids/.ATTRIBUTES/VARIABLE_VALUE") == i).all()
        assert tp.load_variable(path, "save_counter/.ATTRIBUTES/VARIABLE_VALUE") == i + 1


def test_manager_async_save_stores_the_right_save_counter(tmp_path):
    ckpt = tp.Checkpoint(model=_state())
    manager = tp.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2)
    for _ in range(3):
        manager.save(options=ASYNC)
    manager.sync()
    assert manager.checkpoints == [str(tmp_path / "ckpt-2"), str(tmp_path / "ckpt-3")]
    assert tp.load_variable(manager.latest_checkpoint,
                            "save_counter/.ATTRIBUTES/VARIABLE_VALUE") == 3
    fresh = tp.Checkpoint(model=_state(1))
    fresh.restore(manager.latest_checkpoint).assert_consumed()
    assert int(fresh.save_counter.numpy()) == 3


def test_read_waits_for_a_pending_async_write(tmp_path, monkeypatch):
    from trackpoint.saving import saver as saver_module

    release = threading.Event()
    original = saver_module.MultiDeviceSaver.save_snapshot

    def slow(self, *args, **kwargs):
        assert release.wait(30)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(saver_module.MultiDeviceSaver, "save_snapshot", slow)
    state = _state()
    ckpt = tp.Checkpoint(model=state)
    path = ckpt.write(str(tmp_path / "ckpt"), ASYNC)
    state["w"][:] = 0
    threading.Timer(0.2, release.set).start()
    ckpt.read(path).assert_consumed()  # would raise NotFoundError had it not waited
    assert np.array_equal(state["w"], _state()["w"])


def test_async_error_is_raised_by_sync_and_nothing_is_committed(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"not a directory")
    ckpt = tp.Checkpoint(model=_state())
    ckpt.write(str(blocker / "ckpt"), ASYNC)
    with pytest.raises(CheckpointError):
        ckpt.sync()
    ckpt.sync()  # reported once
    path = ckpt.save(str(tmp_path / "ok" / "ckpt"), ASYNC)
    ckpt.sync()
    assert tp.latest_checkpoint(str(tmp_path / "ok")) == path


def test_fixed_width_bytes_restore_in_place_and_too_long_strings_are_refused(tmp_path):
    path = tp.Checkpoint(names=np.array([b"alpha", b"be"])).write(str(tmp_path / "ckpt"))
    target = np.array([b"", b""], dtype="S5")
    tp.Checkpoint(names=target).read(path).assert_consumed()
    assert target.tolist() == [b"alpha", b"be"]
    narrow = np.array([b"", b""], dtype="S3")
    with pytest.raises(tp.errors.InvalidArgumentError, match="5 bytes.*S3"):
        tp.Checkpoint(names=narrow).read(path)
    assert narrow.tolist() == [b"", b""]
