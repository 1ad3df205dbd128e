"""Continuous checkpointing (issue 29): fixed steps always, idle moments in between."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.errors import FailedPreconditionError, InvalidArgumentError
from trackpoint.management import ContinuousCheckpointingPolicy
from trackpoint.management.continuous import ContinuousSaves
from trackpoint.saving import MultiDeviceSaver

ASYNC = tp.CheckpointOptions(enable_async=True)


class FakeWriter:
    pending = False


class FakeCheckpoint:
    def __init__(self) -> None:
        self._self_async = FakeWriter()


class FakeManager:
    """Records the steps it was asked to save."""

    def __init__(self) -> None:
        self.checkpoint = FakeCheckpoint()
        self.saved: list[int] = []

    def save(
        self, checkpoint_number: Any = None, check_interval: bool = True, options: Any = None
    ) -> str:
        self.saved.append(checkpoint_number)
        return f"ckpt-{checkpoint_number}"


def test_policy_saves_fixed_steps_even_while_a_write_runs() -> None:
    manager = FakeManager()
    saves = ContinuousSaves(ContinuousCheckpointingPolicy(interval_steps=5))
    manager.checkpoint._self_async.pending = True  # a write is running throughout
    for step in range(1, 16):
        saves.maybe_save(manager, step)
    assert manager.saved == [5, 10, 15]


def test_policy_saves_between_fixed_steps_only_when_idle() -> None:
    manager = FakeManager()
    saves = ContinuousSaves(ContinuousCheckpointingPolicy(interval_steps=10))
    running = {3, 4, 5, 8}  # steps during which a write is still running
    for step in range(1, 11):
        manager.checkpoint._self_async.pending = step in running
        saves.maybe_save(manager, step)
    assert manager.saved == [1, 2, 6, 7, 9, 10]
    assert saves.maybe_save(manager, 10) is None  # a step is saved once


def test_policy_minimum_interval_between_idle_saves() -> None:
    now = [0.0]
    manager = FakeManager()
    saves = ContinuousSaves(
        ContinuousCheckpointingPolicy(minimum_interval_secs=2.0), clock=lambda: now[0]
    )
    for step in range(1, 8):
        saves.maybe_save(manager, step)
        now[0] += 1.0
    assert manager.saved == [1, 3, 5, 7]


def test_policy_arguments_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="interval_steps"):
        ContinuousCheckpointingPolicy(interval_steps=0)
    with pytest.raises(InvalidArgumentError, match="minimum_interval_secs"):
        ContinuousCheckpointingPolicy(minimum_interval_secs=-1)
    with pytest.raises(InvalidArgumentError, match="save_policy"):
        ContinuousSaves(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="step"):
        ContinuousSaves(ContinuousCheckpointingPolicy()).maybe_save(FakeManager(), -1)


@pytest.fixture
def hold_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Background writes wait for this event before writing."""
    release = threading.Event()
    real = MultiDeviceSaver.save_snapshot

    def held(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        assert release.wait(30)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MultiDeviceSaver, "save_snapshot", held)
    yield release
    release.set()


def test_manager_maybe_save_skips_steps_while_its_async_write_runs(tmp_path, hold_writes) -> None:  # noqa: ANN001
    weights = tp.Variable(np.zeros(8, np.float32))
    ckpt = tp.Checkpoint(weights=weights)
    policy = ContinuousCheckpointingPolicy(interval_steps=100)
    with tp.CheckpointManager(ckpt, tmp_path, max_to_keep=None, save_policy=policy) as manager:
        first = manager.maybe_save(1, options=ASYNC)
        assert first == os.path.join(tmp_path, "ckpt-1")
        assert manager.maybe_save(2, options=ASYNC) is None  # ckpt-1 is still being written
        hold_writes.set()
        ckpt.sync()
        assert manager.maybe_save(3, options=ASYNC) == os.path.join(tmp_path, "ckpt-3")
        ckpt.sync()
        assert manager.latest_checkpoint == os.path.join(tmp_path, "ckpt-3")
        assert manager.checkpoints == [first, os.path.join(tmp_path, "ckpt-3")]


def test_manager_maybe_save_needs_a_policy(tmp_path) -> None:  # noqa: ANN001
    ckpt = tp.Checkpoint(weights=tp.Variable(np.zeros(2, np.float32)))
    with tp.CheckpointManager(ckpt, tmp_path, max_to_keep=1) as manager:
        with pytest.raises(FailedPreconditionError, match="save_policy"):
            manager.maybe_save(1)
