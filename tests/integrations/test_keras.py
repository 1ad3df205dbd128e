"""Keras 3 through ``tp.keras`` on the jax and torch backends, each in a subprocess.

A fit resumed with ``tp.keras.restore`` in a fresh process (another seed, other layer names)
ends bit for bit where the uninterrupted fit does; ``TrackpointCheckpoint`` keeps
``max_to_keep`` checkpoints, saves every ``save_freq`` batches (in the background with
``enable_async``) or only the best (weights only), under keys named by the variables' paths.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

FIRST, THEN = 3, 1
WORKER = Path(__file__).with_name("keras_worker.py")


def _checkpoints(names: list[str]) -> list[int]:
    return sorted(int(n[len("ckpt-"):-len(".index")]) for n in names if n.endswith(".index"))


@pytest.mark.slow  # fits in fresh processes: ~56-67 s each here
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_keras_fit_resumed_in_a_fresh_process_matches_uninterrupted_fit(tmp_path, backend):
    pytest.importorskip("keras")
    pytest.importorskip(backend)
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3",
           "JAX_PLATFORMS": "cpu"}
    # The model has an unseeded Dropout: on the torch backend its masks come from torch's
    # global generator, which the checkpoint must carry (issue 27 #16).
    runs = [("train",), ("resume", "callback")]
    if backend == "jax":  # no start-up draws on jax: restoring before fit is exact too
        runs.append(("resume", "restore"))
    for mode, *how in runs:
        result = subprocess.run(
            [sys.executable, str(WORKER), mode, str(tmp_path), str(FIRST), str(THEN), *how],
            capture_output=True, text=True, timeout=300, env=env,
        )
        assert result.returncode == 0, result.stderr[-3000:]

    resumed_files = ["resume.npz"] + (["resume-restore.npz"] if backend == "jax" else [])
    for resumed_file in resumed_files:
        with np.load(tmp_path / "full.npz") as full, np.load(tmp_path / resumed_file) as resumed:
            assert sorted(full.files) == sorted(resumed.files)
            assert len([name for name in full.files if name.startswith("optimizer")]) > 2
            for name in full.files:
                a, b = full[name], resumed[name]
                assert a.dtype == b.dtype and a.shape == b.shape, (resumed_file, name)
                assert a.tobytes() == b.tobytes(), (resumed_file, name)

    train = json.loads((tmp_path / "train.json").read_text())
    assert _checkpoints(train["full"]) == [FIRST + THEN - 1, FIRST + THEN]  # max_to_keep=2
    assert _checkpoints(train["run"]) == [FIRST - 1, FIRST]
    assert _checkpoints(train["batches"]) == list(range(1, 5 * FIRST // 2 + 1))  # every 2
    assert "checkpoint" in train["run"]
    # Keys are the variables' paths relative to the model and the optimizer.
    assert "model/dense_2/kernel/.ATTRIBUTES/VARIABLE_VALUE" in train["keys"]
    assert "optimizer/iteration/.ATTRIBUTES/VARIABLE_VALUE" in train["keys"]
    assert "epoch/.ATTRIBUTES/VARIABLE_VALUE" in train["keys"]
    assert "rng/python/.ATTRIBUTES/py_state" in train["keys"]
    assert "rng/numpy/.ATTRIBUTES/py_state" in train["keys"]
    assert ("rng/torch/cpu/.ATTRIBUTES/VARIABLE_VALUE" in train["keys"]) == (backend == "torch")
    assert not any(key.startswith("rng/") for key in train["best_keys"])  # weights only
    assert not any(key.startswith("optimizer/") for key in train["best_keys"])
    assert 1 <= len(_checkpoints(train["best"])) <= FIRST

    resume = json.loads((tmp_path / "resume.json").read_text())
    assert resume["epoch"] == FIRST
    assert "incompatible tensor with shape (4, 8)" in resume["wrong_error"]
    assert "Nothing was restored" in resume["wrong_error"]
    assert "only in the model" in resume["deeper_error"]
    assert resume["best_epoch"] >= 1
    assert resume["best_optimizer_built"] is False  # a weights-only checkpoint
