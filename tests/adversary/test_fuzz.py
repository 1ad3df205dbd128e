"""The structured fuzzer's seeded slice in ``make test`` (``make fuzz`` runs 100,000 cases).

Runs ``python -m tests.adversary.fuzz`` in a child process (its workers cap their address
space and time each case; the invariant is in ``fuzzer.py``). A failure prints every distinct
finding with its minimized mutation and the command that replays it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEED = 20261126
CASES = 1200


@pytest.mark.slow  # 1,200 cases on 2 worker processes: ~58 s on a loaded 2-core machine
def test_structured_fuzzer_seeded_slice_finds_nothing():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, "-m", "tests.adversary.fuzz", "--cases", str(CASES), "--seed",
         str(SEED), "--jobs", "2", "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540,
    )
    report = result.stdout + result.stderr[-3000:]
    assert f"({CASES}), jobs 2: 0 findings" in result.stdout, report
    assert result.returncode == 0, report


def test_fuzzer_finds_a_planted_wrong_value(tmp_path, monkeypatch):
    """The invariant is not vacuous: a reader that returns a wrong value is a finding."""
    from tests.adversary.fuzz_sources import build_sources
    from tests.adversary.fuzzer import Fuzzer
    from trackpoint.management.reader import CheckpointReader

    fuzzer = Fuzzer(str(tmp_path), build_sources(str(tmp_path / "sources"), ["numpy"]))
    real = CheckpointReader.get_tensor
    monkeypatch.setattr(CheckpointReader, "get_tensor", lambda self, key: real(self, key) * 0
                        if key.startswith("counts/") else real(self, key))
    findings = [fuzzer.run(7, case) for case in range(40)]
    assert any(f is not None and f.signature == "get_tensor: wrong value" for f in findings)
