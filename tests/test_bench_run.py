"""bench/run.py measures each workload in a process of its own and merges them into one run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bench import report
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


def test_many_workload_runs_quick_dry_and_produces_its_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: dict[str, Any] = {}

    def capture(console: object, run: Any, tables: list[Any], targets: list[Any]) -> None:
        shown.update(run=run, tables=tables, targets=targets)

    monkeypatch.setattr(report, "render_rich", capture)
    argv = ["--quick", "--dry", "--workloads", "many", "--many-layers", "2,8", "--where", "shm"]
    assert main(argv) == 0
    run = shown["run"]
    assert set(run.workloads) == {"many-2", "many-8"}  # one workload per size
    assert [run.workloads[w]["tensors"] for w in ("many-2", "many-8")] == [16, 64]
    paths = ("tp-many-numpy", "tp-many-torch", "tp-many-jax", "torch-many", "dcp-many")
    for w in ("many-2", "many-8"):
        cases = run.cases[w]["shm"]
        assert tuple(cases) == paths  # the many systems only, every restore verified equal
        assert all(c.status == "ok" and len(c.restore_s) == 1 for c in cases.values()), cases
    (table,) = [t for t in shown["tables"] if t.title.startswith("many:")]
    assert [row[0] for row in table.rows] == [
        "trackpoint, numpy nested dict",
        "trackpoint, torch module + AdamW",
        "trackpoint, JAX pytree (tp.jax)",
        "torch.save/load + load_state_dict",
        "DCP save/load (1 process)",
    ]
    assert all("—" not in cell for row in table.rows for cell in row[1:-2]), table.rows
    verdicts = {t.id: t.verdict for t in shown["targets"] if t.scope == "many, shm"}
    assert len(verdicts) == 4 + 6 + 2 and set(verdicts.values()) <= {"PASS", "MISS"}, verdicts
    assert "many-tp-many-torch-restore-linear/shm" in verdicts
    assert "many-restore-vs-dcp-many/shm" in verdicts


def test_write_doc_carries_over_sections_other_benches_wrote() -> None:
    """bench/training_loop.py's lazy-snapshot section lives in docs/performance.md between
    ``kept`` markers; regenerating the doc from a run keeps it, word for word."""
    kept = "<!-- kept:lazy -->\n## Lazy snapshots\n\nfigures from another bench\n<!-- /kept -->\n"
    run = report.RunResult(quick=True, reps=1, workloads={}, locations={})
    text = report.render_markdown(run, [], [], previous="# Performance\n\n" + kept + "## Results\n")
    assert kept in text
    assert text.index(kept) < text.index("## Results")
    assert "figures from another bench" not in report.render_markdown(run, [], [])
