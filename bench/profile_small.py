"""Where the time of saving and restoring many small values goes (issue 19): phase by phase.

Run: ``.venv/bin/python bench/profile_small.py [--count 100000] [--reps 5] [--dir /dev/shm]
[--cprofile 25]``.

The state is ``bench/run.py``'s small-dict workload (float32 values of 64–191 elements in one
flat dict with ``/`` in the keys). Four operations, as the bench times them: a save and a
restore through one ``tp.Checkpoint`` used again and again (a training loop), and through a
fresh ``tp.Checkpoint`` each time, next to ``safetensors.numpy`` on the same dict. Each phase
is the wall time spent in one of trackpoint's steps (the steps are wrapped for the run, so a
phase is exact and costs no sampling), median over the repetitions; ``--cprofile N`` adds the
N functions with the most own time for each operation (cProfile slows Python code about 1.5×,
so read its figures as shares, not times).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import gc
import io
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import trackpoint as tp  # noqa: E402
from bench.workloads import _small_dict, zeros_like_specs  # noqa: E402
from trackpoint.checkpoint import checkpoint as checkpoint_module  # noqa: E402
from trackpoint.checkpoint import load_status, replay, restore  # noqa: E402
from trackpoint.management import reader  # noqa: E402
from trackpoint.saving import saver  # noqa: E402

# (owner, attribute, phase): the steps of a save and of a restore; none calls another.
_SAVE_STEPS = (
    (checkpoint_module.Checkpoint, "__init__", "Checkpoint(state=d): track the dict"),
    (checkpoint_module, "serialize_graph", "walk the objects, encode the graph"),
    (saver.MultiDeviceSaver, "__init__", "saver: entries and keys"),
    (saver.MultiDeviceSaver, "save", "saver.save: shard, write, commit"),
)
_RESTORE_STEPS = (
    (checkpoint_module.Checkpoint, "__init__", "Checkpoint(state=d): track the dict"),
    (reader.CheckpointReader, "__init__", "open the checkpoint, parse the index"),
    (replay.RestoreReplay, "load_graph", "parse the graph, decode the index entries"),
    (restore.CheckpointPosition, "_walk", "walk: bind nodes to objects, plan"),
    (replay.WalkReplay, "replay", "replay the last read's walk"),
    (restore.RestoreCoordinator, "_restore_values", "read, check and copy the values"),
    (replay, "_keep", "fingerprint the structure for the next read"),
    (load_status.CheckpointLoadStatus, "assert_consumed", "assert_consumed()"),
)


class Phases:
    """Wraps each step so its wall time adds up per operation."""

    def __init__(self, steps: tuple[tuple[Any, str, str], ...]) -> None:
        self.spent: dict[str, float] = collections.defaultdict(float)
        self._steps = steps
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> Phases:
        for owner, name, label in self._steps:
            original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            self._saved.append((owner, name, original))
            setattr(owner, name, self._timed(original, label))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def _timed(self, function: Callable[..., Any], label: str) -> Callable[..., Any]:
        spent = self.spent

        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - start

        return timed


def _measure(operation: Callable[[], Any], reps: int, steps: Any) -> tuple[float, dict[str, float]]:
    """Median total seconds and median seconds per phase over ``reps`` runs."""
    totals: list[float] = []
    per_phase: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(reps):
        gc.collect()  # as bench/cases.py does before each timed operation
        with Phases(steps) as phases:
            start = time.perf_counter()
            operation()
            totals.append(time.perf_counter() - start)
        for label, seconds in phases.spent.items():
            per_phase[label].append(seconds)
    return statistics.median(totals), {k: statistics.median(v) for k, v in per_phase.items()}


def _report(title: str, total: float, phases: dict[str, float], peer: float | None,
            steps: Any) -> None:
    ratio = f", {peer / total:.2f}× safetensors" if peer else ""
    print(f"\n{title}: {total * 1e3:.0f} ms{ratio}")
    for _, _, label in steps:  # the steps do not nest: their times add up
        if label in phases:
            print(f"  {label:<44} {phases[label] * 1e3:7.1f} ms {phases[label] / total:6.1%}")
    rest = total - sum(phases.values())
    print(f"  {'the rest (calls between the steps, freeing)':<44} {rest * 1e3:7.1f} ms "
          f"{rest / total:6.1%}")


def _cprofile(operation: Callable[[], Any], top: int) -> None:
    gc.collect()
    profile = cProfile.Profile()
    profile.runcall(operation)
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
    print(out.getvalue().split("\n", 4)[-1].rstrip())


def _run(title: str, operation: Callable[[], Any], steps: Any, peers: dict[str, float],
         args: argparse.Namespace) -> None:
    total, phases = _measure(operation, args.reps, steps)
    _report(title, total, phases, peers.get(title.split(",")[0]), steps)
    if args.cprofile:
        _cprofile(operation, args.cprofile)


def _repeated(state: dict[str, np.ndarray], target: dict[str, np.ndarray], prefix: str,
              peers: dict[str, float], args: argparse.Namespace) -> None:
    """One Checkpoint saving, one restoring, again and again (what a training loop does)."""
    one, into = tp.Checkpoint(state=state), tp.Checkpoint(state=target)
    one.write(prefix)
    into.read(prefix).assert_consumed()
    _run("save, one Checkpoint again", lambda: one.write(prefix), _SAVE_STEPS, peers, args)
    _run("restore, one Checkpoint again", lambda: into.read(prefix).assert_consumed(),
         _RESTORE_STEPS, peers, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="also print the N functions with the most own time")
    args = parser.parse_args(argv)

    workload = _small_dict(args.count)
    rng = np.random.default_rng(0)
    state = {s.name: rng.standard_normal(s.shape).astype(s.dtype) for s in workload.specs}
    target = zeros_like_specs(workload.specs)
    directory = tempfile.mkdtemp(prefix="tp-profile-", dir=args.dir)
    prefix = os.path.join(directory, "ckpt")
    try:
        import safetensors.numpy as stn
    except ImportError:
        stn = None
    peers: dict[str, float] = {}
    try:
        if stn is not None:
            path = os.path.join(directory, "state.safetensors")
            peers["save"] = _measure(lambda: stn.save_file(state, path), args.reps, ())[0]
            peers["restore"] = _measure(lambda: stn.load_file(path), args.reps, ())[0]
        print(f"{workload.title}, {args.count:,} values into {directory}, "
              f"medians of {args.reps}")
        gc.collect()
        gc.freeze()  # the program's own objects, as bench/cases.py does
        _repeated(state, target, prefix, peers, args)
        # The repeated Checkpoints are gone: their arrays' adapters are not reused below.
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        _run("save, a fresh Checkpoint", lambda: tp.Checkpoint(state=state).write(prefix),
             _SAVE_STEPS, peers, args)
        _run("restore, a fresh Checkpoint",
             lambda: tp.Checkpoint(state=target).read(prefix).assert_consumed(),
             _RESTORE_STEPS, peers, args)
    finally:
        gc.unfreeze()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
