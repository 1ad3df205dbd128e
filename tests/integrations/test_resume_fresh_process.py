"""A training run resumed in a fresh process follows the uninterrupted one bit for bit.

Each worker trains FIRST steps, checkpoints in the background while it keeps training, and
records the whole run; ``resume`` builds the model from another seed in a new process, restores,
and trains to the same step. Every recorded array must match byte for byte.

* torch: MLP + conv with batch norm and dropout, Adam on one part and SGD with momentum plus a
  StepLR schedule on the other, data from a checkpointed torch.Generator, the global RNG too.
* jax: pure-JAX MLP with dropout, optax Adam; params, Adam state, step and a typed PRNG key,
  restored with ``tp.jax.restore``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

FIRST, THEN = 5, 6


def _torch_recorded(files: list[str]) -> None:
    assert any(name.endswith(":exp_avg") for name in files)
    assert any(name.endswith(":momentum_buffer") for name in files)


def _jax_recorded(files: list[str]) -> None:
    assert len(files) > 10  # params, Adam's mu/nu/count, step, key


@pytest.mark.slow  # training runs in fresh processes: ~21 s each here
@pytest.mark.parametrize(
    ("worker", "modules", "recorded"),
    [
        ("torch_resume_worker.py", ("torch",), _torch_recorded),
        ("jax_resume_worker.py", ("jax", "optax"), _jax_recorded),
    ],
    ids=["torch", "jax"],
)
def test_fresh_process_resume_matches_uninterrupted_run_bit_for_bit(
    tmp_path, worker, modules, recorded
):
    for module in modules:
        pytest.importorskip(module)
    for mode in ("train", "resume"):
        result = subprocess.run(
            [sys.executable, str(Path(__file__).with_name(worker)), mode, str(tmp_path),
             str(FIRST), str(THEN)],
            capture_output=True, text=True, timeout=300,
        )
        assert result.returncode == 0, result.stderr
    with np.load(tmp_path / "train.npz") as full, np.load(tmp_path / "resume.npz") as resumed:
        assert sorted(full.files) == sorted(resumed.files)
        assert len(full["losses"]) == THEN
        recorded(full.files)
        for name in full.files:
            a, b = full[name], resumed[name]
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert a.tobytes() == b.tobytes(), name
