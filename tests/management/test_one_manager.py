"""One open CheckpointManager per directory within a process too (issue 27 #10).

Two managers of one directory in one process used to rewrite the state file each with its own
list, so one run's checkpoints were never pruned. The second now fails at once, as a manager in
another process does; a closed, ``with``-ended or garbage-collected manager frees the directory,
and the plug-ins that open managers (Keras callback, Lightning's checkpoint directories) still
work, across a fit that raised too.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.errors import FailedPreconditionError


def _index_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.index"))


def test_a_second_open_manager_of_one_process_fails_fast(tmp_path: Path) -> None:
    first_ckpt = tp.Checkpoint(w=np.zeros(2))
    first = tp.CheckpointManager(first_ckpt, tmp_path, max_to_keep=2)
    first.save()
    state = (tmp_path / "checkpoint").read_bytes()
    other = tp.Checkpoint(w=np.ones(2))
    here = f"{__file__}:"
    for directory, name in ((tmp_path, "ckpt"), (tmp_path, "other"), (tmp_path / ".", "ckpt")):
        with pytest.raises(FailedPreconditionError, match="another CheckpointManager") as info:
            tp.CheckpointManager(other, directory, max_to_keep=2, checkpoint_name=name)
        assert here in str(info.value)  # names where the open one was created
        assert str(tmp_path) in str(info.value)
    assert (tmp_path / "checkpoint").read_bytes() == state
    # The open one is unaffected: it keeps saving and pruning its own list.
    for _ in range(3):
        first.save()
    assert _index_files(tmp_path) == ["ckpt-3.index", "ckpt-4.index"]
    assert first.checkpoints == [str(tmp_path / "ckpt-3"), str(tmp_path / "ckpt-4")]
    # Checkpoint.save shares the directory with the manager, as before.
    assert first_ckpt.save(tmp_path / "ckpt") == str(tmp_path / "ckpt-5")
    first.close()
    second = tp.CheckpointManager(other, tmp_path, max_to_keep=2)
    second.close()


def test_a_symlinked_spelling_of_the_directory_is_the_same_directory(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with tp.CheckpointManager(tp.Checkpoint(w=np.zeros(2)), real, max_to_keep=1):
        with pytest.raises(FailedPreconditionError, match="another CheckpointManager"):
            tp.CheckpointManager(tp.Checkpoint(w=np.zeros(2)), tmp_path / "link", max_to_keep=1)


def test_a_closed_ended_or_collected_manager_frees_the_directory(tmp_path: Path) -> None:
    ckpt = tp.Checkpoint(w=np.zeros(2))
    with tp.CheckpointManager(ckpt, tmp_path, max_to_keep=1) as manager:
        manager.save()
    manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=1)
    manager.save()
    del manager  # dropped: reference counting frees it
    manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=1)
    manager.cycle = manager  # type: ignore[attr-defined]  # only the cyclic collector frees it
    del manager
    gc.disable()  # the new manager's own collection must find it
    try:
        manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=1)
    finally:
        gc.enable()
    assert manager.save() == str(tmp_path / "ckpt-3")
    assert _index_files(tmp_path) == ["ckpt-3.index"]
    manager.close()


class _NotCommitting:
    """A checkpoint saved by several processes, seen from one that does not commit."""

    is_coordinator = False

    def __init__(self, checkpoint: tp.Checkpoint) -> None:
        self._checkpoint = checkpoint

    def __getattr__(self, name: str) -> Any:
        return getattr(self._checkpoint, name)


def test_followers_of_a_distributed_save_do_not_count(tmp_path: Path) -> None:
    """Thread ranks of one process: only the committing rank's manager holds the directory."""
    ckpt = tp.Checkpoint(w=np.zeros(2))
    with tp.CheckpointManager(ckpt, tmp_path, max_to_keep=1) as manager:
        manager.save()
        follower = tp.CheckpointManager(_NotCommitting(ckpt), tmp_path, max_to_keep=1)  # type: ignore[arg-type]
        assert follower.latest_checkpoint == str(tmp_path / "ckpt-1")


def test_lightning_checkpoint_directories_are_written_again(tmp_path: Path) -> None:
    from trackpoint.integrations.lightning_state import write_checkpoint_dict

    path = str(tmp_path / "epoch=1.ckpt")
    assert write_checkpoint_dict({"epoch": 1, "w": np.zeros(2)}, path).endswith("ckpt-1")
    assert write_checkpoint_dict({"epoch": 2, "w": np.ones(2)}, path).endswith("ckpt-2")
    assert _index_files(Path(path)) == ["ckpt-2.index"]


_KERAS_REFIT = """
import sys
import numpy as np
import keras
import trackpoint as tp

class Interrupt(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise KeyboardInterrupt

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
x, y = np.zeros((8, 2), "float32"), np.zeros((8, 1), "float32")
callback = tp.keras.TrackpointCheckpoint(sys.argv[1], max_to_keep=2)
try:
    model.fit(x, y, epochs=3, verbose=0, callbacks=[callback, Interrupt()])
except KeyboardInterrupt:
    pass
model.fit(x, y, epochs=2, verbose=0, callbacks=[callback])  # the same callback, fit again
print(tp.latest_checkpoint(sys.argv[1]))
"""


@pytest.mark.slow  # Keras fits (and its import): ~18 s here
def test_the_keras_callback_fits_again_after_an_interrupted_fit(tmp_path: Path) -> None:
    pytest.importorskip("keras")
    pytest.importorskip("jax")
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "JAX_PLATFORMS": "cpu",
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    result = subprocess.run(
        [sys.executable, "-c", _KERAS_REFIT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str(tmp_path / "ckpt-4")
    assert _index_files(tmp_path) == ["ckpt-3.index", "ckpt-4.index"]
