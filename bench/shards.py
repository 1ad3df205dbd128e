"""Does writing N shards on N threads cost anything over one shard? (issue: MultiDeviceSaver)

Run: ``.venv/bin/python bench/shards.py [--mib 512] [--reps 3] [--dirs /dev/shm,/tmp]``.
Saves the same state (64 float32 tensors) through ``tp.Checkpoint.write`` with
``MaxShardSizePolicy(total / N)`` and ``num_io_threads=N``, interleaving N = 1, 2, 4 in every
repetition, and prints the median time of each N as a ratio to N = 1 (< 1.00: faster).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import trackpoint as tp  # noqa: E402


def _state(total_bytes: int, count: int = 64) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    per = total_bytes // count // 4
    return {f"t{i:02d}": rng.standard_normal(per, dtype=np.float32) for i in range(count)}


def _time_save(state: dict[str, np.ndarray], directory: str, shards: int, fsync: bool) -> float:
    total = sum(a.nbytes for a in state.values())
    policy = None if shards == 1 else tp.sharding.MaxShardSizePolicy(-(-total // shards))
    options = tp.CheckpointOptions(sharding_policy=policy, num_io_threads=shards, fsync=fsync)
    work = tempfile.mkdtemp(dir=directory, prefix="tp-shards-")
    try:
        start = time.perf_counter()
        path = tp.Checkpoint(**state).write(f"{work}/ckpt", options)
        elapsed = time.perf_counter() - start
        files = [p for p in Path(work).iterdir() if ".data-" in p.name]
        assert len(files) >= shards, (path, files)
        return elapsed
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dirs", default="/dev/shm," + tempfile.gettempdir())
    parser.add_argument("--shards", default="1,2,4")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.shards.split(",")]
    state = _state(args.mib << 20)
    table = Table(title=f"N shards on N threads vs one shard ({args.mib} MiB, median of "
                  f"{args.reps}; ratio < 1.00 is faster)")
    table.add_column("directory")
    for n in counts:
        table.add_column(f"{n} shard(s)", justify="right")
    for directory in args.dirs.split(","):
        fsync = not directory.startswith("/dev/shm")
        times: dict[int, list[float]] = {n: [] for n in counts}
        _time_save(state, directory, 1, fsync)  # warm-up
        for _ in range(args.reps):
            for n in counts:
                times[n].append(_time_save(state, directory, n, fsync))
        base = statistics.median(times[counts[0]])
        table.add_row(directory, *(f"{statistics.median(times[n]) / base:.2f}x" for n in counts))
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
