"""A crash while a CheckpointManager prunes never leaves the state file naming a deleted
checkpoint (issue 27 #9): the state file is rewritten without the pruned checkpoints first, then
they are deleted. Checked with a failure injected between the steps, with SIGKILLs at fixed
points of the deletion and at random moments, and readers tolerate a listed-but-missing old
checkpoint (TensorFlow deletes before it records).

Set TRACKPOINT_CRASH_TRIALS for a longer soak of the random kills.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.management import manager as manager_module
from trackpoint.management.state_file import checkpoint_exists, get_checkpoint_state

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")

_KEY = "w/.ATTRIBUTES/VARIABLE_VALUE"

# Saves in a loop (ckpt-N holds N), keeping one checkpoint; argv[2] picks where it dies:
# "random" waits for the parent's SIGKILL, the others SIGKILL themselves at the first pruning.
_CHILD = """
import os, signal, sys
import numpy as np
import trackpoint as tp
from trackpoint.management import manager as manager_module
directory, mode = sys.argv[1], sys.argv[2]
w = np.zeros(3)
ckpt = tp.Checkpoint(w=w)
manager = tp.CheckpointManager(ckpt, directory, max_to_keep=1)
manager.restore_or_initialize()
real = manager_module.remove_checkpoint

def die_while_removing(path, **kwargs):
    if mode == "after-index":
        os.remove(path + ".index")
    elif mode == "after-delete":
        real(path, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)

if mode != "random":
    manager_module.remove_checkpoint = die_while_removing
ready = False
while True:
    w[:] = int(ckpt.save_counter.numpy()) + 1
    manager.save(options=tp.CheckpointOptions(fsync=False))
    if not ready:  # one save committed: every trial makes progress, however loaded the machine
        print("ready", flush=True)
        ready = True
"""


def _assert_state_names_only_existing_checkpoints(directory: Path) -> list[int]:
    """Every checkpoint the state file names exists and holds its number; returns them."""
    state = get_checkpoint_state(directory)
    if state is None:
        return []
    named = [*state.all_model_checkpoint_paths, state.model_checkpoint_path]
    for prefix in named:
        assert checkpoint_exists(prefix), (prefix, os.listdir(directory))
        number = int(prefix.rsplit("-", 1)[1])
        np.testing.assert_array_equal(tp.load_variable(prefix, _KEY), np.full(3, number))
    assert tp.latest_checkpoint(directory) == state.model_checkpoint_path
    return sorted(int(p.rsplit("-", 1)[1]) for p in named)


def _run_child(directory: Path, mode: str, kill_after: float | None = None) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(directory), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n", child.stderr and child.stderr.read()
        if kill_after is not None:
            time.sleep(kill_after)
            child.send_signal(signal.SIGKILL)
        child.wait(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        assert child.stdout is not None and child.stderr is not None
        child.stdout.close()
        errors = child.stderr.read()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL, errors


@pytest.mark.parametrize("mode", ["before-delete", "after-index", "after-delete"])
def test_sigkill_at_each_step_of_pruning_leaves_a_state_file_naming_existing_checkpoints(
    tmp_path: Path, mode: str
) -> None:
    _run_child(tmp_path, mode)
    assert _assert_state_names_only_existing_checkpoints(tmp_path) == [2, 2]
    # The next run resumes from it and prunes as usual.
    _run_child(tmp_path, "random", kill_after=0.3)
    assert _assert_state_names_only_existing_checkpoints(tmp_path)[-1] > 2


@pytest.mark.slow  # many crash trials: ~12 s here
def test_sigkill_at_random_moments_never_leaves_the_state_file_naming_a_deleted_checkpoint(
    tmp_path: Path,
) -> None:
    rng = random.Random(int(os.environ.get("SEED", "27")))
    trials = int(os.environ.get("TRACKPOINT_CRASH_TRIALS", "50")) // 5
    newest = 0
    for _ in range(trials):
        _run_child(tmp_path, "random", kill_after=rng.uniform(0.0, 0.2))
        named = _assert_state_names_only_existing_checkpoints(tmp_path)
        if named:
            assert named[-1] >= newest  # a resumed run never goes back
            newest = named[-1]
    assert newest >= trials  # each child committed at least one save before its kill


class _Crash(BaseException):
    """Stands for the process dying: nothing after it runs."""


def test_a_failure_between_deleting_and_recording_never_names_the_deleted_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = np.zeros(3)
    ckpt = tp.Checkpoint(w=w)
    manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=1)
    w[:] = 1
    first = manager.save()
    real = manager_module.remove_checkpoint
    seen: list[list[str]] = []

    def remove_then_crash(path: str, **kwargs: object) -> None:
        state = get_checkpoint_state(tmp_path)
        assert state is not None
        seen.append(list(state.all_model_checkpoint_paths))
        real(path)
        raise _Crash

    monkeypatch.setattr(manager_module, "remove_checkpoint", remove_then_crash)
    w[:] = 2
    with pytest.raises(_Crash):
        manager.save()
    second = str(tmp_path / "ckpt-2")
    assert seen == [[second]]  # when the deletion began, the state file had let go of it
    assert not checkpoint_exists(first)
    assert _assert_state_names_only_existing_checkpoints(tmp_path) == [2, 2]
    monkeypatch.undo()
    manager.close()


def test_a_listed_but_missing_old_checkpoint_is_forgotten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What TensorFlow's manager leaves when killed while pruning (it deletes, then records)."""
    w = np.zeros(3)
    ckpt = tp.Checkpoint(w=w)
    with tp.CheckpointManager(ckpt, tmp_path, max_to_keep=None) as manager:
        for n in (1, 2, 3):
            w[:] = n
            manager.save()
    tp.management.state_file.remove_checkpoint(str(tmp_path / "ckpt-1"))
    assert tp.latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-3")
    fresh = tp.Checkpoint(w=w)
    with caplog.at_level(logging.WARNING):
        manager = tp.CheckpointManager(fresh, tmp_path, max_to_keep=2)
    assert "ckpt-1.index does not exist" in caplog.text
    assert manager.checkpoints == [str(tmp_path / "ckpt-2"), str(tmp_path / "ckpt-3")]
    assert manager.restore_or_initialize() == str(tmp_path / "ckpt-3")
    w[:] = 4
    assert manager.save() == str(tmp_path / "ckpt-4")
    assert manager.checkpoints == [str(tmp_path / "ckpt-3"), str(tmp_path / "ckpt-4")]
    assert _assert_state_names_only_existing_checkpoints(tmp_path) == [3, 4, 4]
    manager.close()
