"""`trackpoint demo`: a child is SIGKILLed mid-training, resumes, and matches a clean run."""

from __future__ import annotations

import os
import re

import pytest

import trackpoint as tp
from trackpoint.cli.main import main


@pytest.mark.slow  # two demo processes per backend, one killed: 17-50 s each here
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_demo_resumes_after_sigkill_with_identical_weights(tmp_path, capsys, backend):
    if backend == "torch":
        pytest.importorskip("torch")
    code = main(["demo", "--dir", str(tmp_path), "--steps", "60", "--backend", backend])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "killed with SIGKILL" in out
    # The step reported is the one committed on disk, and the resumed run starts there.
    committed = re.search(r"latest committed checkpoint on disk is \S+, step (\d+)", out)
    resumed = re.search(r"resumed from \S+ at step (\d+)", out)
    assert committed and resumed, out
    assert committed.group(1) == resumed.group(1)
    assert "exactly the weights" in out
    kept = sorted(p.name for p in (tmp_path / "crashed").glob("ckpt-*.index"))
    assert kept[-3:] == ["ckpt-4.index", "ckpt-5.index", "ckpt-6.index"]
    # A kill between recording ckpt-6 and deleting ckpt-3 leaves ckpt-3, still listed in the
    # state file (deleted by the next save); every checkpoint on disk is listed, none orphaned.
    state = tp.get_checkpoint_state(str(tmp_path / "crashed"))
    listed = sorted(os.path.basename(p) + ".index" for p in state.all_model_checkpoint_paths)
    assert kept == listed and len(kept) <= 4
