"""CheckpointManager (semantics E1–E7) and its use of the state file."""

from __future__ import annotations

import logging
import os
import pathlib

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.management.state_file import checkpoint_exists, get_checkpoint_state


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _index_files(directory) -> list[str]:
    return sorted(p for p in os.listdir(directory) if p.endswith(".index"))


def test_e1_max_to_keep_deletes_oldest(tmp_path):
    ckpt = tp.Checkpoint(v=np.arange(4.0))
    manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=3)
    paths = [manager.save() for _ in range(4)]
    assert paths == [str(tmp_path / f"ckpt-{i}") for i in range(1, 5)]
    assert not checkpoint_exists(paths[0])
    assert not any(name.startswith("ckpt-1.") for name in os.listdir(tmp_path))
    assert manager.checkpoints == paths[1:]
    assert _index_files(tmp_path) == ["ckpt-2.index", "ckpt-3.index", "ckpt-4.index"]
    assert tp.latest_checkpoint(tmp_path) == paths[-1]


def test_e1_keep_all_and_recover(tmp_path):
    ckpt = tp.Checkpoint(v=np.arange(4.0))
    manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=None)
    paths = [manager.save() for _ in range(5)]
    assert manager.checkpoints == paths
    assert len(_index_files(tmp_path)) == 5
    manager.close()  # one open manager per directory and process
    # A new manager recovers the active set and applies its own max_to_keep on the next save.
    again = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=2)
    assert again.checkpoints == paths
    assert again.latest_checkpoint == paths[-1]
    newest = again.save()
    assert again.checkpoints == [paths[-1], newest]
    assert _index_files(tmp_path) == ["ckpt-5.index", "ckpt-6.index"]


def test_e1_invalid_arguments(tmp_path):
    ckpt = tp.Checkpoint()
    with pytest.raises(ValueError, match="max_to_keep"):
        tp.CheckpointManager(ckpt, tmp_path, max_to_keep=0)
    with pytest.raises(ValueError, match="step_counter"):
        tp.CheckpointManager(ckpt, tmp_path, max_to_keep=1, checkpoint_interval=5)
    # Not a checkpoint (a number, the state itself): refused before the directory is touched.
    for wrong in (123, {"w": np.zeros(3)}, np.zeros(3)):
        with pytest.raises(tp.errors.InvalidArgumentError, match="tp.Checkpoint"):
            tp.CheckpointManager(wrong, tmp_path / "never", max_to_keep=1)  # type: ignore[arg-type]
    assert not (tmp_path / "never").exists()


def test_e2_keep_checkpoint_every_n_hours(tmp_path):
    d = str(tmp_path)
    clock = Clock(3.0)
    ckpt = tp.Checkpoint()
    first = tp.CheckpointManager(ckpt, d, max_to_keep=2, clock=clock)
    names = {i: os.path.join(d, f"ckpt-{i}") for i in range(1, 7)}
    first_time = clock.now = 10000.0
    first.save()
    second_time = clock.now = first_time + 3610.0
    first.save()
    state = get_checkpoint_state(d)
    assert list(state.all_model_checkpoint_timestamps) == [first_time, second_time]
    assert first.checkpoints == [names[1], names[2]]
    assert first.latest_checkpoint == names[2]
    first.close()

    second = tp.CheckpointManager(ckpt, d, max_to_keep=2, keep_checkpoint_every_n_hours=1.5,
                                  clock=clock)
    assert second.checkpoints == [names[1], names[2]]
    third_time = clock.now = second_time + 3600.0 * 0.2
    second.save()
    assert checkpoint_exists(names[1]) and checkpoint_exists(names[2])
    assert second.checkpoints == [names[2], names[3]]
    assert get_checkpoint_state(d).last_preserved_timestamp == first_time
    fourth_time = clock.now = third_time + 3600.0 * 0.5
    second.save()
    assert checkpoint_exists(names[1]) and not checkpoint_exists(names[2])
    assert second.checkpoints == [names[3], names[4]]
    clock.now = fourth_time + 3600.0 * 0.5
    second.save()
    assert second.checkpoints == [names[4], names[5]]
    assert get_checkpoint_state(d).last_preserved_timestamp == first_time
    second.close()

    third = tp.CheckpointManager(ckpt, d, max_to_keep=2, keep_checkpoint_every_n_hours=1.5,
                                 clock=clock)
    assert third.latest_checkpoint == names[5]
    clock.now += 10.0
    third.save()
    assert get_checkpoint_state(d).last_preserved_timestamp == fourth_time
    for i in (1, 4, 5, 6):
        assert checkpoint_exists(names[i]), i
    for i in (2, 3):
        assert not checkpoint_exists(names[i]), i
    assert third.checkpoints == [names[5], names[6]]


def test_e3_clock_reset(tmp_path, caplog):
    d = str(tmp_path)
    clock = Clock(10000.0)
    ckpt = tp.Checkpoint()
    first = tp.CheckpointManager(ckpt, d, max_to_keep=1, keep_checkpoint_every_n_hours=1.0,
                                 clock=clock)
    p1 = first.save()
    clock.now += 3600.0
    p2 = first.save()
    clock.now += 3600.0
    p3 = first.save()
    assert not checkpoint_exists(p1) and checkpoint_exists(p2) and checkpoint_exists(p3)
    assert first.checkpoints == [p3]
    assert get_checkpoint_state(d).last_preserved_timestamp == 13600.0
    clock.now = 5000.0
    first.close()
    with caplog.at_level(logging.WARNING):
        second = tp.CheckpointManager(ckpt, d, max_to_keep=1, clock=clock)
    assert "behind the last preserved checkpoint timestamp" in caplog.text
    assert checkpoint_exists(p2)
    assert second.latest_checkpoint == p3
    assert second.checkpoints == []
    clock.now += 10.0
    p4 = second.save()
    assert checkpoint_exists(p2) and checkpoint_exists(p3)
    assert second.latest_checkpoint == p4 and second.checkpoints == [p4]
    clock.now += 10.0
    p5 = second.save()
    assert checkpoint_exists(p2) and checkpoint_exists(p3)
    assert second.checkpoints == [p5]
    state = get_checkpoint_state(d)
    assert state.last_preserved_timestamp == 5000.0
    assert list(state.all_model_checkpoint_timestamps) == [5020.0]


def test_e4_continue_from_unmanaged(tmp_path):
    prefix = os.path.join(tmp_path, "unusual_prefix")
    ckpt = tp.Checkpoint()
    first_path = ckpt.save(prefix)
    second_path = ckpt.save(prefix)
    del ckpt
    ckpt = tp.Checkpoint()
    manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=2)
    ckpt.restore(manager.latest_checkpoint)
    assert int(ckpt.save_counter.numpy()) == 2
    third = manager.save()
    assert manager.checkpoints == [third]
    fourth = manager.save()
    fifth = manager.save()
    assert manager.checkpoints == [fourth, fifth]
    assert checkpoint_exists(first_path) and checkpoint_exists(second_path)
    assert not checkpoint_exists(third)
    assert third.endswith("ckpt-3")


def test_e5_custom_numbering_and_name(tmp_path):
    step = tp.Variable(np.int64(0))
    ckpt = tp.Checkpoint(step=step)
    manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=2, checkpoint_name="model")
    for i in range(5):
        path = manager.save(checkpoint_number=step)
        assert path.endswith(f"model-{2 * i}")
        step.assign(step.numpy() + 2)
    assert int(ckpt.save_counter.numpy()) == 5
    last = manager.save(checkpoint_number=32)
    assert last.endswith("model-32")
    assert manager.latest_checkpoint == last == tp.latest_checkpoint(tmp_path)
    assert list(get_checkpoint_state(tmp_path).all_model_checkpoint_paths) == [path, last]


def test_e6_restore_or_initialize(tmp_path):
    v = np.zeros(3)
    calls = []
    ckpt = tp.Checkpoint(v=v)
    manager = tp.CheckpointManager(ckpt, pathlib.Path(tmp_path), max_to_keep=1,
                                   init_fn=lambda: calls.append(1))
    assert manager.restore_or_initialize() is None
    assert calls == [1]
    v[:] = 7
    saved = manager.save()
    v[:] = 0
    manager.close()
    again = tp.CheckpointManager(ckpt, pathlib.Path(tmp_path), max_to_keep=1)
    restored = again.restore_or_initialize()
    assert isinstance(restored, str) and restored == saved
    np.testing.assert_array_equal(v, [7, 7, 7])
    assert calls == [1]


def test_e7_checkpoint_interval(tmp_path):
    step = tp.Variable(np.int64(0))
    ckpt = tp.Checkpoint(step=step)
    manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=None, step_counter=step,
                                   checkpoint_interval=2)
    saved = []
    for i in range(8):
        step.assign(i)
        saved.append(manager.save() is not None)
    assert saved == [True, False, True, False, True, False, True, False]
    step.assign(6)
    assert manager.save() is None  # same step as the last save
    step.assign(7)
    assert manager.save(check_interval=False) is not None
    # A manager that restores records the restored step as the last checkpointed one.
    step.assign(100)
    manager.close()
    again = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=None, step_counter=step,
                                 checkpoint_interval=2)
    again.restore_or_initialize()
    assert int(step.numpy()) == 7
    assert again.save() is None
    step.assign(8)
    assert again.save() is None
    step.assign(9)
    assert again.save() is not None


def test_state_file_written_only_after_commit(tmp_path, monkeypatch):
    """The manager never names or deletes anything for a checkpoint that failed to commit."""
    ckpt = tp.Checkpoint(v=np.ones(2))
    manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=1)
    good = manager.save()
    before = (tmp_path / "checkpoint").read_bytes()

    def boom(*args, **kwargs):
        raise OSError("simulated failure during write")

    monkeypatch.setattr(ckpt, "write", boom)
    with pytest.raises(OSError, match="simulated"):
        manager.save()
    assert (tmp_path / "checkpoint").read_bytes() == before
    assert checkpoint_exists(good)
    assert manager.latest_checkpoint == good
