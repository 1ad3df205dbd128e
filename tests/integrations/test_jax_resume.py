"""A JAX training run resumed in a fresh process follows the uninterrupted one bit for bit.

Pure-JAX MLP with dropout, optax Adam; the checkpoint (params, Adam state, step, typed PRNG
key) is saved in the background while training continues, then restored with
``tp.jax.restore`` into a model built from another seed in a new process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("optax")

WORKER = Path(__file__).with_name("jax_resume_worker.py")
FIRST, THEN = 5, 6


def _run(mode: str, directory: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(WORKER), mode, str(directory), str(FIRST), str(THEN)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr


def test_fresh_process_resume_matches_uninterrupted_run_bit_for_bit(tmp_path):
    _run("train", tmp_path)
    _run("resume", tmp_path)
    with np.load(tmp_path / "train.npz") as full, np.load(tmp_path / "resume.npz") as resumed:
        assert sorted(full.files) == sorted(resumed.files)
        assert len(full["losses"]) == THEN
        assert len(full.files) > 10  # params, Adam's mu/nu/count, step, key
        for name in full.files:
            a, b = full[name], resumed[name]
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert a.tobytes() == b.tobytes(), name
