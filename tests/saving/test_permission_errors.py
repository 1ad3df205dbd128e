"""Permission errors on local disk (simulated: the tests run as root, where chmod does not bind)
give a clear CheckpointError naming the file, and the previous checkpoint stays the latest."""

from __future__ import annotations

import errno
import io
import os

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.errors import CheckpointError


def _deny(monkeypatch, what: str) -> None:
    real_fileio, real_replace = io.FileIO, os.replace

    def fileio(path, mode="r", *args, **kwargs):
        if "w" in mode and what in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_fileio(path, mode, *args, **kwargs)

    def replace(src, dst, *args, **kwargs):
        if what in str(dst):
            raise PermissionError(errno.EACCES, "Permission denied", str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(io, "FileIO", fileio)
    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("what", ["_temp_", ".index", ".data-", "checkpoint"])
def test_permission_denied_keeps_previous_checkpoint(tmp_path, monkeypatch, what):
    weights = np.arange(6, dtype=np.float32)
    ckpt = tp.Checkpoint(w=weights)
    first = ckpt.save(str(tmp_path / "ckpt"))
    weights += 1
    with monkeypatch.context() as patch:
        _deny(patch, what)
        with pytest.raises(CheckpointError, match=r"(?i)permission denied") as info:
            ckpt.save(str(tmp_path / "ckpt"))
    assert str(tmp_path) in str(info.value)
    if what != "checkpoint":  # the state file is written after the commit point
        assert not os.path.exists(str(tmp_path / "ckpt-2.index"))
        assert not [n for n in os.listdir(tmp_path) if "_temp_" in n]
    assert tp.latest_checkpoint(str(tmp_path)) == first
    restored = np.zeros(6, np.float32)
    tp.Checkpoint(w=restored).restore(tp.latest_checkpoint(str(tmp_path))).assert_consumed()
    assert restored.tolist() == list(range(6))
