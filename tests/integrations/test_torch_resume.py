"""A resumed run in a fresh process follows the uninterrupted trajectory bit for bit.

MLP + conv with batch norm and dropout, Adam on one part and SGD with momentum plus a StepLR
schedule on the other, data drawn from a checkpointed torch.Generator, the global RNG
checkpointed too; deterministic algorithms, one thread. The first process saves asynchronously
while it keeps training (the snapshot must be the state at save time).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

WORKER = Path(__file__).with_name("torch_resume_worker.py")
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
        assert any(name.endswith(":exp_avg") for name in full.files)
        assert any(name.endswith(":momentum_buffer") for name in full.files)
        for name in full.files:
            a, b = full[name], resumed[name]
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert a.tobytes() == b.tobytes(), name
