"""`trackpoint demo`: a child is SIGKILLed mid-training, resumes, and matches a clean run."""

from __future__ import annotations

import pytest

from trackpoint.cli.main import main


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_demo_resumes_after_sigkill_with_identical_weights(tmp_path, capsys, backend):
    if backend == "torch":
        pytest.importorskip("torch")
    code = main(["demo", "--dir", str(tmp_path), "--steps", "60", "--backend", backend])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "killed with SIGKILL" in out
    assert "exactly the weights" in out
    kept = sorted(p.name for p in (tmp_path / "crashed").glob("ckpt-*.index"))
    assert kept == ["ckpt-4.index", "ckpt-5.index", "ckpt-6.index"]
