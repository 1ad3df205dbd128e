"""Benchmark trackpoint against TensorFlow, torch, safetensors, numpy and a raw copy.

``make bench`` runs this file. One command prints one set of tables: every system is measured
interleaved in one process on the same tensors, and each workload runs in a process of its own
(``--in-process`` keeps them in this one), so what one workload leaves behind (a heap grown by
1 GiB of arrays, imported peers' caches) does not slow the next; peak RSS is measured per case
in a fresh child process (``--child``). ``--write-doc`` rewrites docs/performance.md
(``--from-json`` re-renders a run saved with ``--json`` without measuring). ``--quick --dry``
is a fast end-to-end check (tiny sizes, one repetition, no children, writes nothing).

Importable: ``from bench.run import main; main(["--quick", "--dry"])`` returns an exit code.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable as a package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench import measure, report, rss  # noqa: E402
from bench.cases import (  # noqa: E402
    CaseRunner,
    Source,
    describe,
    measure_async,
    probe,
    release_frozen,
)
from bench.many_report import many_tables, many_targets  # noqa: E402
from bench.systems import System, all_system_classes, make_systems  # noqa: E402
from bench.workloads import (  # noqa: E402
    MANY_LAYERS,
    MANY_LAYERS_QUICK,
    WORKLOADS,
    Workload,
    get_workloads,
    many_layer_count,
)

__all__ = ["main"]

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "performance.md"

log = logging.getLogger("bench")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n")[0])
    p.add_argument("--workloads", help=f"comma list of {','.join(WORKLOADS)} "
                   "(default: all but 4gib; 4gib needs --big)")
    p.add_argument("--big", action="store_true", help="add the 4 GiB workload")
    p.add_argument("--where", default="shm,disk", help="comma list of shm,disk")
    p.add_argument("--systems", help="comma list of "
                   f"{','.join(cls.key for cls in all_system_classes())} (default: all)")
    p.add_argument("--reps", type=int, help="repetitions per case (default 3; 1 with --quick)")
    p.add_argument("--case-budget", type=float, default=20.0,
                   help="seconds after which a case stops repeating (default 20)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, 1 repetition")
    p.add_argument("--many-layers", type=_layer_counts,
                   help="comma list of sizes of the many workload, in Linear(32,32) layers of "
                   f"8 values (default {','.join(map(str, MANY_LAYERS))}; "
                   f"{','.join(map(str, MANY_LAYERS_QUICK))} with --quick)")
    p.add_argument("--dry", action="store_true",
                   help="smoke check: one repetition, no RSS children, no pre-faulting, "
                   "writes nothing")
    p.add_argument("--rss", choices=("all", "trackpoint", "none"),
                   help="peak-RSS children for which systems (default all; none with --quick)")
    p.add_argument("--rss-where", help="location for peak-RSS children (default disk)")
    p.add_argument("--rss-workloads", default="1gib,4gib",
                   help="workloads that get peak-RSS children (default 1gib,4gib)")
    p.add_argument("--cold", action="store_true",
                   help="evict files from the page cache before each restore on disk")
    p.add_argument("--no-prefault", action="store_true", help="skip the memory pre-fault")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--disk-dir", default=str(RESULTS), help="parent of the disk location")
    p.add_argument("--write-doc", action="store_true", help=f"write {DOC.relative_to(REPO)}")
    p.add_argument("--json", help="also dump raw measurements to this file")
    p.add_argument("--from-json", metavar="PATH",
                   help="measure nothing: re-render a run saved with --json (with --write-doc)")
    p.add_argument("--in-process", action="store_true",
                   help="run every workload in this process (default: one child process "
                   "per workload; --dry always runs in this process)")
    p.add_argument("-v", "--verbose", action="store_true")
    child = p.add_argument_group("internal: one workload or one peak-RSS case per process")
    child.add_argument("--workload-child", metavar="PATH", help=argparse.SUPPRESS)
    child.add_argument("--prefault-gib", type=int, help=argparse.SUPPRESS)
    child.add_argument("--child", choices=("save", "restore"), help=argparse.SUPPRESS)
    child.add_argument("--workload", help=argparse.SUPPRESS)
    child.add_argument("--system", help=argparse.SUPPRESS)
    child.add_argument("--dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.reps is None:
        args.reps = 1 if (args.quick or args.dry) else 3
    if args.rss is None:
        args.rss = "none" if (args.quick or args.dry) else "all"
    if args.dry:
        args.rss = "none"
    return args


def _layer_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of positive integers")
    return counts


# -- one case ---------------------------------------------------------------------------------
def _prefault(nbytes: int) -> None:
    """Touch ``nbytes`` of memory once: first touches of guest memory on a VM are slow."""
    hold = []
    for _ in range(nbytes >> 30):
        a = np.empty(1 << 30, np.uint8)
        a.fill(1)
        hold.append(a)
    del hold


def _locations(args: argparse.Namespace) -> dict[str, str]:
    bases = {"shm": "/dev/shm", "disk": args.disk_dir}
    out = {}
    for name in args.where.split(","):
        if name not in bases:
            raise SystemExit(f"--where takes shm and/or disk, not {name!r}")
        base = bases[name]
        if name == "shm" and not os.path.isdir(base):
            log.warning("/dev/shm does not exist here; skipping the shm location")
            continue
        os.makedirs(base, exist_ok=True)
        out[name] = tempfile.mkdtemp(prefix="trackpoint-bench-", dir=base)
    return out


def _footnotes(run: report.RunResult, systems: list[System], reasons: dict[str, str],
               workloads: list[Workload], prefaulted: int) -> list[str]:
    notes = [
        "Saves are timed until durable: after each system returns, the harness fsyncs every "
        "file it wrote and their directory (trackpoint and the raw copy already fsync on their "
        "own; fsync of a clean file is nearly free). On /dev/shm (tmpfs) fsync does nothing.",
        "numpy tofile/fromfile and the raw copy store bytes only: the harness supplies shapes "
        "and dtypes on restore. The raw copy writes the state from one contiguous buffer "
        "(built untimed) with os.write and one fsync, and reads it back with readinto.",
        "Targets against TensorFlow use whichever of tf.train.Checkpoint and "
        "SaveV2/RestoreV2 was faster in that case. The raw-copy target compares saves only; "
        "restore ratios against the raw copy are in the tables.",
        "Async: the 1.5× memcpy target uses the copy into new buffers (ndarray.copy(), which "
        "pays page faults as any fresh snapshot does); the copy into preallocated buffers is "
        "shown for reference.",
    ] if any(w.kind == "tensors" for w in workloads) else []
    if any(w.kind == "many" for w in workloads):
        notes.append(
            "many: Linear(32, 32) layers with AdamW state (exp_avg, exp_avg_sq and a float32 "
            "step per parameter: 8 values per layer), the same arrays as a numpy nested dict, "
            "a torch ModuleList + AdamW and a JAX pytree. Every save and restore uses a fresh "
            "tp.Checkpoint; every system rebuilds its objects (untimed) before each repetition, "
            "so nothing an earlier call built is reused. Restores fill a zeroed model, "
            "optimizer (state initialised) or dict in place; the JAX row returns a new tree "
            "from tp.jax.restore. The torch peers save {'model': state_dict, 'optim': "
            "state_dict}: torch.save, then torch.load(weights_only=True) + both "
            "load_state_dict calls; DCP save/load in one process without a process group, "
            "loading in place into the target's state dicts."
        )
    if any(w.has_bf16 for w in workloads):
        ran = [s for s in systems if s.key not in reasons]
        native = [s.label for s in ran if s.stores_bf16 and s.has_metadata]
        views = [s.label for s in ran if not s.stores_bf16]
        text = "Mixed workload: bf16 is ml_dtypes.bfloat16 in numpy and is stored as bf16 by " + (
            ", ".join(native) + ". ")
        text += ("Stored as raw uint16 views (no bf16 support): " + ", ".join(views) + "."
                 if views else "No installed peer needed raw uint16 views.")
        notes.append(text)
    restore_note = ("Restores on disk read files just written, so mostly from the page "
                    "cache (warm)." if not run.cold else
                    "Restores on disk start with the files evicted from the page cache "
                    "(posix_fadvise DONTNEED), i.e. cold.")
    notes.append(restore_note)
    if prefaulted:
        notes.append(
            f"Before measuring, the harness touched {prefaulted / 2**30:.0f} GiB of memory once: "
            "on this virtual machine the first touch of guest memory is several times slower "
            "than later ones and would penalise whichever system happens to run first."
        )
    if run.machine.get("free page reporting", "").startswith("on"):
        notes.append(
            "This VM hands freed memory back to its host (virtio-balloon free page reporting), "
            "so reusing memory freed seconds earlier can cost host page faults again. Single "
            "repetitions can be 2–5× off (e.g. a 1 GiB write to page cache taking 3 s once, "
            "0.3 s the next time); medians absorb part of it. Compare ratios, and distrust a "
            "ratio that flips between runs."
        )
    if run.rss:
        notes.append(
            "Peak RSS: VmHWM counts pages of files a reader maps (trackpoint's and "
            "safetensors' mmap reads of /dev/shm or the page cache), so a restore can show "
            "the file's size there without allocating it; the anonymous-memory column "
            "(sampled every 2 ms, a lower bound) leaves mapped files out. The 'small' "
            "workload has no peak-RSS rows: its state is too small for the ratio to mean much."
        )
    notes.append(f"A case stops repeating after --reps ({run.reps}) repetitions or once it has "
                 "spent --case-budget seconds; 'runs' counts the repetitions behind a median.")
    if "tp" in reasons:
        notes.append(f"trackpoint.Checkpoint: {reasons['tp']}. trackpoint rows and targets "
                     "use the bundle API (BundleWriter/BundleReader); async is not measured.")
    for s in systems:
        if s.key in reasons and s.key != "tp":
            notes.append(f"{s.label}: {reasons[s.key]}.")
    return notes


# -- main -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.child:
        return rss.child_main(args)
    from rich.console import Console

    progress = Console(stderr=True, highlight=False, soft_wrap=True)
    out = Console(width=None if sys.stdout.isatty() else 160)
    if args.from_json:
        saved = report.RunResult.from_dict(json.loads(Path(args.from_json).read_text()))
        _output(args, saved, out, progress)
        return 0
    keys = args.workloads.split(",") if args.workloads else [
        w for w in WORKLOADS if w != "4gib" or args.big]
    if "4gib" in keys and not args.big:
        raise SystemExit("the 4gib workload needs --big")
    unknown = sorted(k for k in set(keys) - set(WORKLOADS) if many_layer_count(k) is None)
    if unknown:
        raise SystemExit(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)} "
                         "(or many-<layers>)")
    workloads = [w for k in keys
                 for w in get_workloads(k, quick=args.quick, many_layers=args.many_layers)]
    prefaulted = _prefault_bytes(args, workloads)
    if len(workloads) > 1 and not (args.dry or args.in_process or args.workload_child):
        run, failed = _run_isolated(args, workloads, prefaulted, progress)
    else:
        run, failed = _run_here(args, workloads, prefaulted, progress)
    run.duration_s = time.perf_counter() - started
    if args.workload_child:
        Path(args.workload_child).write_text(json.dumps(asdict(run), default=str))
        return 1 if failed else 0
    _output(args, run, out, progress)
    progress.print(f"bench finished in {run.duration_s / 60:.1f} min")
    return 1 if failed else 0


def _prefault_bytes(args: argparse.Namespace, workloads: list[Workload]) -> int:
    """Memory to touch before measuring: whole GiB, 5× the largest workload, at most 8 GiB."""
    if args.prefault_gib is not None:
        return args.prefault_gib << 30
    if args.quick or args.dry or args.no_prefault:
        return 0
    return min(5 * max(w.nbytes for w in workloads), 8 << 30) >> 30 << 30


def _child_argv(args: argparse.Namespace, workload: str, out: str, prefaulted: int) -> list[str]:
    """This run's options for one workload's process, which writes its RunResult to ``out``."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--workloads", workload,
            "--workload-child", out, "--prefault-gib", str(prefaulted >> 30),
            "--where", args.where, "--reps", str(args.reps), "--case-budget",
            str(args.case_budget), "--rss", args.rss, "--rss-workloads", args.rss_workloads,
            "--seed", str(args.seed), "--disk-dir", args.disk_dir]
    for flag, value in (("--systems", args.systems), ("--rss-where", args.rss_where)):
        if value:
            argv += [flag, value]
    for flag, on in (("--big", args.big), ("--quick", args.quick), ("--cold", args.cold),
                     ("--verbose", args.verbose)):
        if on:
            argv.append(flag)
    return argv


def _run_isolated(args: argparse.Namespace, workloads: list[Workload], prefaulted: int,
                  progress: Any) -> tuple[report.RunResult, bool]:
    """Each workload in a fresh process, merged into one run; True on a failure.

    A workload measured after another in the same process inherits its heap and caches: the
    100,000-value dict measured after the 1 GiB one ran trackpoint's object layer up to 1.8×
    slower than alone, and its peers by other factors, so the ratios depended on the order.
    """
    run = report.RunResult(
        quick=args.quick, reps=args.reps, cold=args.cold, workloads={}, locations={},
        machine=measure.machine_info(REPO, {"shm": "/dev/shm", "disk": args.disk_dir}),
    )
    failed = False
    with tempfile.TemporaryDirectory(prefix="trackpoint-bench-") as tmp:
        for workload in workloads:
            out = os.path.join(tmp, f"{workload.key}.json")
            code = subprocess.call(_child_argv(args, workload.key, out, prefaulted))
            failed |= code != 0
            if not os.path.exists(out):
                progress.print(f"[bold red]{workload.key}: its process exited with {code} "
                               "before writing any result[/]")
                continue
            part = report.RunResult.from_dict(json.loads(Path(out).read_text()))
            run.workloads.update(part.workloads)
            run.locations.update(part.locations)
            run.cases.update(part.cases)
            run.async_.update(part.async_)
            run.rss.update(part.rss)
            run.rss_location = part.rss_location
            run.footnotes += [n for n in part.footnotes if n not in run.footnotes]
    run.footnotes.append("Each workload ran in a process of its own (its systems interleaved "
                         "in it), so no workload inherits the heap or caches another left.")
    return run, failed


def _run_here(args: argparse.Namespace, workloads: list[Workload], prefaulted: int,
              progress: Any) -> tuple[report.RunResult, bool]:
    """Every workload in this process, systems interleaved; True on a failure."""
    kinds = {w.kind for w in workloads}
    systems = [s for s in make_systems(args.systems.split(",") if args.systems else None)
               if kinds & set(s.kinds)]
    locations = _locations(args)
    if not locations:
        raise SystemExit("no location to write to")
    failed = False
    try:
        reasons: dict[str, str] = {}
        ready: list[System] = []
        for s in systems:
            try:
                reason = s.unavailable()
            except Exception as exc:
                reason = f"not available ({describe(exc)})"
            if reason is None:
                try:
                    probe(s, next(iter(locations.values())))
                except Exception as exc:
                    reason = f"probe failed: {describe(exc)}"
                    log.debug("probe of %s failed", s.key, exc_info=True)
                    failed = True
            if reason:
                reasons[s.key] = reason
                progress.print(f"{s.label}: {reason}")
            else:
                ready.append(s)
        run = report.RunResult(
            quick=args.quick, reps=args.reps, cold=args.cold,
            workloads={w.key: {"title": w.title, "nbytes": w.nbytes, "tensors": len(w.specs),
                               "has_bf16": w.has_bf16, "kind": w.kind, "pid": os.getpid()}
                       for w in workloads},
            locations=locations,
            machine=measure.machine_info(REPO, {"shm": "/dev/shm", "disk": args.disk_dir}),
        )
        if prefaulted:
            progress.print(f"pre-faulting {prefaulted >> 30} GiB of memory")
            _prefault(prefaulted)
        rss_loc = args.rss_where or ("disk" if "disk" in locations else next(iter(locations)))
        run.rss_location = rss_loc
        for workload in workloads:
            failed |= _run_workload(args, workload, systems, ready, reasons, locations, run,
                                    progress)
        run.footnotes = _footnotes(run, systems, reasons, workloads, prefaulted)
    finally:
        for d in locations.values():
            shutil.rmtree(d, ignore_errors=True)
    return run, failed


def _output(args: argparse.Namespace, run: report.RunResult, out: Any, progress: Any) -> None:
    """Print the tables and targets; write --json and --write-doc unless --dry."""
    tables = report.build_tables(run) + many_tables(run)
    targets = report.evaluate_targets(run) + many_targets(run)
    if run.quick or args.dry:
        out.print("[bold yellow]quick/dry run: tiny sizes or one pass; "
                  "the numbers below mean nothing[/]")
    report.render_rich(out, run, tables, targets)
    if args.dry:
        return
    if args.json and not args.from_json:
        Path(args.json).write_text(json.dumps(asdict(run), indent=1, default=str))
    if args.write_doc:
        previous = DOC.read_text() if DOC.exists() else ""
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_text(report.render_markdown(run, tables, targets, previous))
        progress.print(f"wrote {DOC}")


def _run_workload(args: argparse.Namespace, workload: Workload, systems: list[System],
                  ready: list[System], reasons: dict[str, str], locations: dict[str, str],
                  run: report.RunResult, progress: Any) -> bool:
    """Throughput at every location, then peak RSS in children; True on a failure."""
    progress.print(f"[bold]{workload.key}: {workload.title}[/] "
                   f"({workload.nbytes / 2**20:.1f} MiB)")
    # The source and every prepared object are freed when this returns, before the children.
    started = time.perf_counter()
    failed = _measure_throughput(args, workload, systems, ready, reasons, locations, run,
                                 progress)
    progress.print(f"  {workload.key}: throughput took {time.perf_counter() - started:.0f} s")
    gc.collect()
    rss_dir = locations.get(run.rss_location or "")
    if args.rss != "none" and rss_dir and workload.key in args.rss_workloads.split(","):
        chosen = [s for s in ready if cases_ok(run, workload.key, s.key)
                  and (args.rss == "all" or s.group == "trackpoint")]
        results, rss_failed = rss.measure_rss(args, workload, chosen, rss_dir, progress)
        run.rss[workload.key] = results
        failed |= rss_failed
    return failed


def _measure_throughput(args: argparse.Namespace, workload: Workload, systems: list[System],
                        ready: list[System], reasons: dict[str, str],
                        locations: dict[str, str], run: report.RunResult,
                        progress: Any) -> bool:
    """Interleaved repetitions of every ready system at every location; True on a failure."""
    failed = False
    systems = [s for s in systems if workload.kind in s.kinds]
    ready = [s for s in ready if workload.kind in s.kinds]
    source = Source(workload, args.seed)
    run.cases[workload.key] = {}
    # Runners outlive the location loop: small workloads reuse prepared objects at both places.
    runners = {s.key: CaseRunner(s, source) for s in ready}
    tp = next((s for s in ready if s.async_capable), None)
    for loc, loc_dir in locations.items():
        cases = {s.key: report.CaseResult(s.key, s.label, s.group) for s in systems}
        for s in systems:
            if s.key in reasons:
                cases[s.key].status, cases[s.key].detail = "unavailable", reasons[s.key]
        run.cases[workload.key][loc] = cases
        # Slow peers on workloads above their cap run once per location (not dropped); naming
        # them in --systems gives them the usual repetitions.
        capped = set()
        for s in ready:
            cap = s.max_default_tensors
            if cap is not None and len(workload.specs) > cap and not args.systems:
                capped.add(s.key)
                cases[s.key].detail = (f"1 repetition by default above {cap:,} tensors "
                                       f"(slow); --systems {s.key} repeats it")
        async_result = report.AsyncResult() if tp else None
        for rep in range(args.reps):
            order = ready[rep % len(ready):] + ready[:rep % len(ready)] if ready else []
            for s in order:
                case, runner = cases[s.key], runners[s.key]
                if case.status != "ok" or (rep and runner.spent.get(loc, 0) >= args.case_budget):
                    continue
                if rep and s.key in capped:
                    continue
                try:
                    save_s, restore_s, problem = runner.run_once(
                        loc, loc_dir, args.cold and loc == "disk")
                except Exception as exc:
                    case.status, case.detail, problem = "error", describe(exc), None
                    log.debug("%s", traceback.format_exc())
                else:
                    if problem:
                        case.status, case.detail = "mismatch", problem
                if case.status != "ok":
                    progress.print(f"  {loc} {s.label}: {case.status.upper()} {case.detail}")
                    runner.close()
                    failed = True
                    continue
                case.save_s.append(save_s)
                case.restore_s.append(restore_s)
                gb = workload.nbytes / report.GB
                if workload.kind == "many":
                    us = 1e6 / len(workload.specs)
                    rates = (f"{save_s * us:.3g} µs/value", f"{restore_s * us:.3g} µs/value")
                else:
                    rates = (f"{gb / save_s:.3g} GB/s", f"{gb / restore_s:.3g} GB/s")
                progress.print(f"  {loc} rep {rep + 1}/{args.reps} {s.label}: save "
                               f"{rates[0]} ({save_s:.3g} s), restore "
                               f"{rates[1]} ({restore_s:.3g} s)")
            if tp and async_result and async_result.status == "ok" and cases[tp.key].ok:
                try:
                    measure_async(tp, source, loc_dir, async_result, check=rep == 0)
                except Exception as exc:
                    async_result.status, async_result.detail = "error", describe(exc)
                    failed = True
        if async_result is not None:
            if not async_result.block_s and async_result.status == "ok":
                async_result.status, async_result.detail = "skipped", "sync save did not run"
            run.async_.setdefault(workload.key, {})[loc] = async_result
    for s in ready:
        cases_wall = {loc: runners[s.key].spent.get(loc, 0.0) for loc in locations}
        for loc, by_sys in run.cases[workload.key].items():
            by_sys[s.key].wall_s = round(cases_wall[loc], 2)
    for runner in runners.values():
        runner.close()
    release_frozen()
    return failed


def cases_ok(run: report.RunResult, workload: str, system: str) -> bool:
    """True when ``system`` ran cleanly at every location of ``workload``."""
    return all(by_sys[system].ok for by_sys in run.cases[workload].values())


if __name__ == "__main__":
    sys.exit(main())
