"""One writer per directory: CheckpointManager and Checkpoint.save against a real second
process, a SIGKILLed holder, a fresh run that did not restore, and saves of one process."""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.errors import FailedPreconditionError
from trackpoint.storage import LocalStorage
from trackpoint.storage.lock import LOCK_FILENAME

# A training job: a manager on argv[1], one save, then it waits to be killed.
_JOB = """
import sys, time
import numpy as np
import trackpoint as tp
ckpt = tp.Checkpoint(w=np.full(3, 1.0))
manager = tp.CheckpointManager(ckpt, sys.argv[1], max_to_keep=3)
manager.save()
print("saved", flush=True)
time.sleep(120)
"""


@pytest.fixture
def job(
    tmp_path: Path, background_process: Callable[..., subprocess.Popen[str]]
) -> subprocess.Popen[str]:
    """Another process whose manager holds ``tmp_path / "run"`` and saved ckpt-1 there."""
    return background_process(_JOB, str(tmp_path / "run"), ready="saved")


class _NotCommitting:
    """A checkpoint saved by several processes, seen from one that does not commit."""

    is_coordinator = False

    def __init__(self, checkpoint: tp.Checkpoint) -> None:
        self._checkpoint = checkpoint

    def __getattr__(self, name: str) -> Any:
        return getattr(self._checkpoint, name)


def test_a_second_writer_fails_fast_naming_the_holder_and_takes_over_after_sigkill(
    tmp_path: Path,
    job: subprocess.Popen[str],
    pid_seen_by_another_process: Callable[[Path], int],
) -> None:
    run = tmp_path / "run"
    w = np.zeros(3)
    ckpt = tp.Checkpoint(w=w)
    holder = f"process {job.pid} on host {socket.gethostname()}"
    with pytest.raises(FailedPreconditionError, match=holder) as info:
        tp.CheckpointManager(ckpt, run, max_to_keep=3)
    assert str(run) in str(info.value)
    with pytest.raises(FailedPreconditionError, match=holder):
        ckpt.save(run / "ckpt")
    assert int(ckpt.save_counter.numpy()) == 0
    # write() keeps overwrite semantics, but not over the live writer's committed checkpoint.
    with pytest.raises(FailedPreconditionError, match=rf"(?s)ckpt-1.*{holder}"):
        ckpt.write(run / "ckpt-1")
    ckpt.write(run / "exported")
    # Reading is not writing: the other job's checkpoint restores while it runs.
    ckpt.restore(tp.latest_checkpoint(run)).assert_consumed()
    np.testing.assert_array_equal(w, 1.0)
    # A process that does not commit a distributed save takes no lock.
    follower = tp.CheckpointManager(_NotCommitting(ckpt), run, max_to_keep=3)  # type: ignore[arg-type]
    assert follower.latest_checkpoint == str(run / "ckpt-1")

    job.send_signal(signal.SIGKILL)
    job.wait()
    fresh = tp.Checkpoint(w=np.zeros(3))
    with tp.CheckpointManager(fresh, run, max_to_keep=3) as manager:
        assert manager.restore_or_initialize() == str(run / "ckpt-1")
        assert manager.save() == str(run / "ckpt-2")
        assert pid_seen_by_another_process(run) == os.getpid()
    assert manager.checkpoints == [str(run / "ckpt-1"), str(run / "ckpt-2")]
    assert tp.latest_checkpoint(run) == str(run / "ckpt-2")


def test_a_fresh_manager_that_did_not_restore_never_replaces_a_checkpoint(tmp_path: Path) -> None:
    with tp.CheckpointManager(tp.Checkpoint(w=np.full(2, 5.0)), tmp_path, max_to_keep=2) as old:
        first = old.save()
    before = (tmp_path / "ckpt-1.index").read_bytes()
    w = np.zeros(2)
    ckpt = tp.Checkpoint(w=w)
    manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=2)
    with pytest.raises(FailedPreconditionError) as info:
        manager.save(checkpoint_number=1)
    message = str(info.value)
    assert f"{first}.index exists" in message
    assert "restore_or_initialize()" in message and "checkpoint_number=2" in message
    assert info.value.path == first
    assert (tmp_path / "ckpt-1.index").read_bytes() == before
    assert int(ckpt.save_counter.numpy()) == 0  # nothing changed
    assert manager.latest_checkpoint == first and tp.latest_checkpoint(tmp_path) == first

    # Unnumbered, it continues after the directory's checkpoints (issue 27 #13).
    assert manager.save() == str(tmp_path / "ckpt-2")
    assert int(ckpt.save_counter.numpy()) == 2
    assert (tmp_path / "ckpt-1.index").read_bytes() == before
    assert manager.save(checkpoint_number=7) == str(tmp_path / "ckpt-7")  # counter 3
    manager.close()
    again = tp.CheckpointManager(tp.Checkpoint(w=w), tmp_path, max_to_keep=5)
    assert again.restore_or_initialize() == str(tmp_path / "ckpt-7")
    assert again.save() == str(tmp_path / "ckpt-4")  # restored counter 3: continues from it
    again.close()


def test_a_restored_checkpoint_may_roll_back_over_later_checkpoints(tmp_path: Path) -> None:
    w = np.zeros(2)
    ckpt = tp.Checkpoint(w=w)
    manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=None)
    first, _ = manager.save(), manager.save()
    manager.close()
    rolled = tp.Checkpoint(w=w)
    with tp.CheckpointManager(rolled, tmp_path, max_to_keep=None) as again:
        rolled.restore(first)
        w[:] = 3.0
        assert again.save() == str(tmp_path / "ckpt-2")  # TensorFlow's overwrite, as before
    rolled.restore(str(tmp_path / "ckpt-2"))
    np.testing.assert_array_equal(w, 3.0)


def test_checkpoint_save_of_a_fresh_checkpoint_never_replaces_a_checkpoint(
    tmp_path: Path,
) -> None:
    prefix = str(tmp_path / "ckpt")
    tp.Checkpoint(w=np.ones(2)).save(prefix)
    fresh = tp.Checkpoint(w=np.zeros(2))
    with pytest.raises(FailedPreconditionError, match=r"(?s)ckpt-1.*Restore first"):
        fresh.save(prefix)
    assert int(fresh.save_counter.numpy()) == 0
    fresh.restore(tp.latest_checkpoint(tmp_path))
    assert fresh.save(prefix) == f"{prefix}-2"


def test_saves_of_one_process_share_the_lock(
    tmp_path: Path, pid_seen_by_another_process: Callable[[Path], int]
) -> None:
    ckpt = tp.Checkpoint(w=np.arange(3.0))
    first = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=None)
    paths = [first.save(), ckpt.save(tmp_path / "ckpt")]
    assert paths == [str(tmp_path / f"ckpt-{n}") for n in (1, 2)]
    first.close()
    with pytest.raises(FailedPreconditionError, match="closed"):
        first.save()
    second = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=None)  # the first is closed
    assert second.save() == str(tmp_path / "ckpt-3")
    second.close()
    # The Checkpoint that saved into the directory still holds it, until it is collected.
    assert pid_seen_by_another_process(tmp_path) == os.getpid()
    del ckpt, first, second
    gc.collect()
    assert not (tmp_path / LOCK_FILENAME).exists()
    assert LocalStorage().lock_holder(str(tmp_path)) is None


def test_an_async_save_is_written_under_the_lock_and_close_waits_for_it(tmp_path: Path) -> None:
    w = np.arange(100_000, dtype=np.float64)
    ckpt = tp.Checkpoint(w=w)
    manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=1)
    options = tp.CheckpointOptions(enable_async=True)
    seen: list[bool] = []
    during = tp.CheckpointOptions(
        enable_async=True,
        write_callbacks=[lambda: seen.append((tmp_path / LOCK_FILENAME).exists())],
    )
    manager.save(options=options)
    path = manager.save(options=during)
    w[:] = -1.0  # after the snapshot: not in the file
    manager.close()  # waits for the background write, then releases the lock
    assert seen == [True]
    assert not (tmp_path / LOCK_FILENAME).exists()
    assert manager.latest_checkpoint == path == tp.latest_checkpoint(tmp_path)
    assert manager.checkpoints == [path]
    np.testing.assert_array_equal(
        tp.load_variable(path, "w/.ATTRIBUTES/VARIABLE_VALUE"), np.arange(100_000, dtype=np.float64)
    )
