"""``Checkpoint.save`` picks one backend, with ``options.fsync``, for the checkpoint and the
state file that names it (issue 28: storage and prefix resolved once at the API edge)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import trackpoint as tp


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The path of every file or directory fsynced from now on."""
    seen: list[str] = []
    real = os.fsync

    def counting(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else "?")
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return seen


def test_save_without_fsync_flushes_nothing_not_even_the_state_file(
    tmp_path: Path, fsyncs: list[str]
) -> None:
    ckpt = tp.Checkpoint(w=np.arange(3.0))
    path = ckpt.save(str(tmp_path / "ckpt"), tp.CheckpointOptions(fsync=False))
    assert fsyncs == []
    assert tp.latest_checkpoint(str(tmp_path)) == path


def test_save_with_fsync_flushes_the_checkpoint_and_the_state_file(
    tmp_path: Path, fsyncs: list[str]
) -> None:
    if not os.path.exists("/proc/self/fd"):
        pytest.skip("names fsynced files through /proc/self/fd (Linux)")
    ckpt = tp.Checkpoint(w=np.arange(3.0))
    path = ckpt.save(str(tmp_path / "ckpt"))
    assert tp.latest_checkpoint(str(tmp_path)) == path
    names = {os.path.basename(p) for p in fsyncs}
    # Files are fsynced under their temporary names, before the rename.
    assert any(".index" in n for n in names), names
    assert any(n.startswith("checkpoint.tmp") for n in names), names  # the state file
    assert str(tmp_path) in fsyncs  # the directory, so the renames survive a crash


def test_a_given_storage_serves_the_state_file_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    storage = tp.storage.MemoryStorage()
    ckpt = tp.Checkpoint(w=np.arange(3.0))
    options = tp.CheckpointOptions(storage=storage)
    path = ckpt.save("run/ckpt", options)
    assert storage.exists("run/checkpoint") and storage.exists(path + ".index")
    assert not os.path.exists("run")  # nothing on local disk
    w = np.zeros(3)
    tp.Checkpoint(w=w).restore("run", options).assert_consumed()
    assert w.tolist() == [0.0, 1.0, 2.0]
