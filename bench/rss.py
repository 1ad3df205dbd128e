"""Peak RSS: each save and each restore in a fresh process (``bench/run.py --child``)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import measure, report
from bench.cases import describe, probe
from bench.systems import System, make_systems, to_stored_specs, to_stored_state
from bench.workloads import Workload, get_workload

__all__ = ["child_main", "measure_rss"]

RUN_PY = Path(__file__).resolve().parent / "run.py"


def child_main(args: argparse.Namespace) -> int:
    """``--child save|restore``: one operation in this fresh process; prints one JSON line."""
    system = make_systems([args.system])[0]
    reason = system.unavailable()
    if reason:
        print(json.dumps({"error": reason}))
        return 0
    workload = get_workload(args.workload, quick=args.quick)
    prefix = os.path.join(args.dir, "ckpt")
    try:
        # Warm up lazy imports and first-call setup on a tiny state, outside the measurement.
        probe(system, args.dir)
        if args.child == "save":
            native = system.prepare_save(to_stored_state(system, workload.generate(args.seed)))
            gc.collect()
            base = measure.proc_status()
            reset = measure.reset_peak_rss()
            with measure.AnonPeakSampler() as anon:
                system.save(native, prefix)
                measure.fsync_tree(args.dir)
            extra, anon_extra = 0, anon.peak - base["RssAnon"]
        else:
            gc.collect()
            base = measure.proc_status()
            template = system.make_template(to_stored_specs(system, workload.specs))
            reset = measure.reset_peak_rss()
            with measure.AnonPeakSampler() as anon:
                restored = system.restore(prefix, template)
            del restored
            extra = -workload.nbytes
            anon_extra = anon.peak - base["RssAnon"] - workload.nbytes
        peak = measure.proc_status()["VmHWM"]
    except Exception as exc:
        print(json.dumps({"error": describe(exc)}))
        return 1
    out = {"extra": peak - base["VmRSS"] + extra, "anon_extra": anon_extra, "hwm_reset": reset}
    print(json.dumps(out))
    return 0


def _run_child(args: argparse.Namespace, op: str, workload: str, system: str,
               directory: str) -> dict[str, Any]:
    cmd = [sys.executable, str(RUN_PY), "--child", op, "--workload", workload,
           "--system", system, "--dir", directory, "--seed", str(args.seed)]
    if args.quick:
        cmd.append("--quick")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    except subprocess.TimeoutExpired:
        return {"error": "child timed out"}
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": f"child exited {proc.returncode}: {tail[0][:160]}"}


def measure_rss(args: argparse.Namespace, workload: Workload, systems: list[System],
                loc_dir: str, console: Any) -> tuple[dict[str, report.RssResult], bool]:
    """Peak RSS of each system's save and restore, each in its own child process."""
    out, failed = {}, False
    for system in systems:
        directory = tempfile.mkdtemp(prefix=f"rss-{system.key}-", dir=loc_dir)
        try:
            saved = _run_child(args, "save", workload.key, system.key, directory)
            restored = (_run_child(args, "restore", workload.key, system.key, directory)
                        if "error" not in saved else {"error": "save failed"})
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        errors = [f"{op}: {r['error']}" for op, r in (("save", saved), ("restore", restored))
                  if "error" in r]
        failed |= bool(errors)
        if not saved.get("hwm_reset", True):
            errors.append("VmHWM could not be reset: peaks include setup")
        out[system.key] = report.RssResult(
            label=system.label,
            save_extra=saved.get("extra"), save_anon_extra=saved.get("anon_extra"),
            restore_extra=restored.get("extra"), restore_anon_extra=restored.get("anon_extra"),
            detail="; ".join(errors),
        )
        console.print(f"  peak RSS {workload.key} {system.label}: "
                      f"{out[system.key].detail or 'done'}", highlight=False)
    return out, failed

