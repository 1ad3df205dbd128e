"""bench/run.py measures each workload in a process of its own and merges them into one run."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench.run import main


def test_each_workload_runs_in_its_own_process_and_the_results_merge(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    argv = ["--quick", "--workloads", "small,small-dict", "--where", "shm,disk",
            "--disk-dir", str(tmp_path / "disk"), "--systems", "tp,numpy", "--json", str(out)]
    assert main(argv) == 0
    run = json.loads(out.read_text())
    pids = {w: info["pid"] for w, info in run["workloads"].items()}
    assert set(pids) == {"small", "small-dict"}
    assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
    for workload in pids:
        assert set(run["cases"][workload]) == {"shm", "disk"}
        for case in run["cases"][workload]["shm"].values():
            assert case["status"] == "ok" and len(case["save_s"]) == 1, case
    assert sum("process of its own" in note for note in run["footnotes"]) == 1
    # Footnotes common to both processes are not repeated.
    assert len(run["footnotes"]) == len(set(run["footnotes"]))


def test_in_process_keeps_every_workload_here(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    argv = ["--quick", "--in-process", "--workloads", "small,small-dict", "--where", "disk",
            "--disk-dir", str(tmp_path / "disk"), "--systems", "numpy", "--json", str(out)]
    assert main(argv) == 0
    run = json.loads(out.read_text())
    assert {info["pid"] for info in run["workloads"].values()} == {os.getpid()}
