"""A state file names only checkpoints in its own directory (issue 27 #3).

A hostile ``checkpoint`` file (``../victim/ckpt-1``, an absolute path or URL elsewhere) is refused
with a ``DataLossError`` by every reader and by ``CheckpointManager``, which therefore never
deletes outside its directory; what TensorFlow writes (relative names, TF1's absolute paths into
the directory, also after the directory was moved) still reads.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.errors import DataLossError, InvalidArgumentError
from trackpoint.management.state_file import get_checkpoint_state, write_checkpoint_state
from trackpoint.storage import storage_for


def _victim(tmp_path: Path) -> tuple[Path, bytes]:
    """A checkpoint in another directory, and the bytes of its index."""
    victim = tmp_path / "victim"
    with tp.CheckpointManager(tp.Checkpoint(w=np.full(2, 9.0)), victim, max_to_keep=1) as m:
        m.save()
    return victim, (victim / "ckpt-1.index").read_bytes()


def _state(directory: Path, latest: str, *others: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f'model_checkpoint_path: "{latest}"']
    lines += [f'all_model_checkpoint_paths: "{p}"' for p in (*others, latest)]
    (directory / "checkpoint").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("kind", ["relative", "absolute"])
def test_readers_refuse_a_latest_checkpoint_outside_the_directory(
    tmp_path: Path, kind: str
) -> None:
    victim, _ = _victim(tmp_path)
    run = tmp_path / "run"
    entry = "../victim/ckpt-1" if kind == "relative" else str(victim / "ckpt-1")
    _state(run, entry)
    state_file = str(run / "checkpoint")
    with pytest.raises(DataLossError, match="outside") as info:
        tp.latest_checkpoint(run)
    assert entry in str(info.value) and info.value.path == state_file
    w = np.zeros(2)
    for read in (
        lambda: tp.Checkpoint(w=w).restore(str(run)),
        lambda: tp.load_checkpoint(str(run)),
        lambda: get_checkpoint_state(run),
    ):
        with pytest.raises(DataLossError, match="outside"):
            read()
    np.testing.assert_array_equal(w, 0.0)  # nothing was read from the victim


def test_a_manager_never_deletes_outside_its_directory(tmp_path: Path) -> None:
    victim, index = _victim(tmp_path)
    run = tmp_path / "run"
    with tp.CheckpointManager(tp.Checkpoint(w=np.ones(2)), run, max_to_keep=1) as manager:
        manager.save()
    for entry in ("../victim/ckpt-1", str(victim / "ckpt-1")):
        _state(run, "ckpt-1", entry)  # the latest is fine; an older entry points away
        with pytest.raises(DataLossError, match="outside"):
            tp.CheckpointManager(tp.Checkpoint(w=np.ones(2)), run, max_to_keep=1)
        assert (victim / "ckpt-1.index").read_bytes() == index
        assert sorted(p.name for p in victim.iterdir() if p.name.startswith("ckpt-1.")) == [
            "ckpt-1.data-00000-of-00001",
            "ckpt-1.index",
        ]
    # The refusing manager released the directory: a fixed state file works again.
    _state(run, "ckpt-1")
    with tp.CheckpointManager(tp.Checkpoint(w=np.ones(2)), run, max_to_keep=1) as manager:
        assert manager.latest_checkpoint == str(run / "ckpt-1")


def test_write_refuses_a_checkpoint_outside_the_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="not inside"):
        write_checkpoint_state(tmp_path / "run", str(tmp_path / "other" / "ckpt-1"))
    with pytest.raises(InvalidArgumentError, match="not inside"):
        write_checkpoint_state(tmp_path / "run", "../ckpt-1")
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_urls_outside_the_directory_are_refused() -> None:
    base = f"memory://trackpoint-confined-{uuid.uuid4().hex}"
    victim, run = f"{base}/victim", f"{base}/run"
    tp.Checkpoint(w=np.ones(2)).write(f"{victim}/ckpt-5")
    tp.Checkpoint(w=np.ones(2)).write(f"{run}/ckpt-1")
    storage = storage_for(run)
    for entry in (f"{victim}/ckpt-5", "../victim/ckpt-5", f"{base}/run-other/ckpt-7"):
        storage.write_atomic(f"{run}/checkpoint", f'model_checkpoint_path: "{entry}"\n'.encode())
        with pytest.raises(DataLossError, match="outside"):
            tp.latest_checkpoint(run)
        storage.write_atomic(
            f"{run}/checkpoint",
            f'model_checkpoint_path: "ckpt-1"\nall_model_checkpoint_paths: "{entry}"\n'
            'all_model_checkpoint_paths: "ckpt-1"\n'.encode(),
        )
        with pytest.raises(DataLossError, match="outside"):
            tp.CheckpointManager(tp.Checkpoint(w=np.ones(2)), run, max_to_keep=1)
        assert storage.exists(f"{victim}/ckpt-5.index")
    storage.write_atomic(f"{run}/checkpoint", f'model_checkpoint_path: "{run}/ckpt-1"\n'.encode())
    assert tp.latest_checkpoint(run) == f"{run}/ckpt-1"


def _tf_v1_state(tf: Any, directory: Path, numbers: list[int]) -> None:
    """A state file as TF1's Saver writes it: absolute paths (save_relative_paths=False),
    with timestamps, so a manager manages (and prunes) them."""
    from tensorflow.python.checkpoint import checkpoint_management as cm

    paths = [str(directory / f"ckpt-{n}") for n in numbers]
    now = time.time()
    cm.update_checkpoint_state_internal(
        str(directory),
        paths[-1],
        paths,
        save_relative_paths=False,
        all_model_checkpoint_timestamps=[now - 10.0 + n for n in numbers],
        last_preserved_timestamp=now - 100.0,
    )


def test_tensorflow_written_state_files_still_work(tmp_path: Path, tf: Any) -> None:
    # tf.train.CheckpointManager: relative names.
    tf_dir = tmp_path / "tf"
    tf_manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(w=tf.Variable([1.0, 2.0])), str(tf_dir), max_to_keep=2
    )
    for _ in range(3):
        tf_manager.save()
    w = np.zeros(2, np.float32)
    with tp.CheckpointManager(tp.Checkpoint(w=w), tf_dir, max_to_keep=2) as manager:
        assert manager.restore_or_initialize() == str(tf_dir / "ckpt-3")
        assert manager.checkpoints == [str(tf_dir / "ckpt-2"), str(tf_dir / "ckpt-3")]
    np.testing.assert_array_equal(w, [1.0, 2.0])

    # TF1 Saver: absolute paths into the directory.
    v1 = tmp_path / "v1"
    with tp.CheckpointManager(tp.Checkpoint(w=np.arange(2.0)), v1, max_to_keep=None) as m:
        for _ in range(3):
            m.save()
    _tf_v1_state(tf, v1, [1, 2, 3])
    assert str(v1 / "ckpt-1") in (v1 / "checkpoint").read_text()  # absolute, as TF1 writes
    assert tp.latest_checkpoint(v1) == str(v1 / "ckpt-3")
    assert tf.train.latest_checkpoint(str(v1)) == str(v1 / "ckpt-3")
    # The same directory under another name (a symbolic link) is that directory.
    (tmp_path / "alias").symlink_to(v1)
    assert tp.latest_checkpoint(tmp_path / "alias") == str(tmp_path / "alias" / "ckpt-3")
    # A copy while the original is still there: its absolute paths point out of it.
    copy = tmp_path / "copy"
    shutil.copytree(v1, copy, ignore=shutil.ignore_patterns(".trackpoint.lock"))
    with pytest.raises(DataLossError, match="outside"):
        tp.latest_checkpoint(copy)
    # Moved: the paths are read in the new place, and a manager prunes there.
    moved = tmp_path / "moved"
    shutil.move(v1, moved)
    assert tp.latest_checkpoint(moved) == str(moved / "ckpt-3")
    assert list(get_checkpoint_state(moved).all_model_checkpoint_paths) == [
        str(moved / f"ckpt-{n}") for n in (1, 2, 3)
    ]
    with tp.CheckpointManager(tp.Checkpoint(w=np.zeros(2)), moved, max_to_keep=1) as manager:
        assert manager.restore_or_initialize() == str(moved / "ckpt-3")
        manager.save()
    assert sorted(p.name for p in moved.glob("*.index")) == ["ckpt-4.index"]
    assert sorted(p.name for p in copy.glob("*.index")) == [f"ckpt-{n}.index" for n in (1, 2, 3)]
    # TensorFlow reads what the manager wrote there.
    assert tf.train.latest_checkpoint(str(moved)) == str(moved / "ckpt-4")


def test_a_directory_downloaded_from_another_store_reads_its_absolute_paths(
    tmp_path: Path,
) -> None:
    """TF1 state files name ``gs://bucket/run/ckpt-3``; the local copy is read locally, and
    the other store is not asked anything."""
    tp.Checkpoint(w=np.ones(2)).write(tmp_path / "ckpt-3")
    remote = f"memory://trackpoint-never-{uuid.uuid4().hex}/run"
    _state(tmp_path, f"{remote}/ckpt-3", f"{remote}/ckpt-2")
    state = get_checkpoint_state(tmp_path)
    assert state.model_checkpoint_path == str(tmp_path / "ckpt-3")
    assert list(state.all_model_checkpoint_paths) == [
        str(tmp_path / "ckpt-2"),
        str(tmp_path / "ckpt-3"),
    ]
    # An entry outside both the directory and the old one is still refused.
    _state(tmp_path, f"{remote}/ckpt-3", f"{remote}-other/ckpt-2")
    with pytest.raises(DataLossError, match="outside"):
        get_checkpoint_state(tmp_path)
