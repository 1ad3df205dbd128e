"""Distributed save/restore throughput with 1, 2, 4 processes, and the merge cost of many shards.

Run: ``.venv/bin/python bench/distributed.py [--mib 256] [--reps 5] [--dir /dev/shm]
[--procs 1,2,4] [--shards 1,10,100,1000]``.

1. The same state (``--mib`` MiB: 16 float32 tensors, each row-sharded over the processes) is
   saved with ``DistributedCheckpoint.write`` by N gloo processes (each writes its rows, rank 0
   merges) and restored by N processes (each reads its rows), ``--reps`` times in one process
   group after a warm-up save and restore. Only the calls are timed (the slowest rank's time
   of each call; process start, gloo setup and barriers are outside). The median of each N is
   printed as a ratio to N = 1 (< 1.00: faster), with the throughput and the CPU time summed
   over the ranks. On a machine with fewer cores than processes the ratios measure overhead
   rather than scaling; the CPU column shows it whatever the cores.
2. Merge cost: N one-file shards, each holding one row block of 8 sharded tensors (as N ranks
   write them), are merged into one checkpoint by ``merge_bundles``; the time per merge and per
   shard is printed for N = 1 ... 1000. This is the coordinator's serial part of every save.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

_TENSORS = 16


def _rows(total: int, world: int, rank: int) -> tuple[int, int]:
    base, extra = divmod(total, world)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def _worker(directory: str, mib: int, init: str, reps: int) -> None:
    """One rank: ``reps`` timed saves and restores; rank 0 prints the figures as JSON.

    Warm-up save and restore first (connections, thread pools, lazy imports), then each
    timed call starts together on every rank (a barrier before, never inside, the timed
    region) and is timed on each rank by itself; a collective call's time is the slowest
    rank's. CPU time (all threads of a rank) is summed over the ranks: it shows whether
    the total work grows with the number of processes, whatever the machine's cores.
    """
    import torch.distributed as dist

    import trackpoint as tp
    import trackpoint.distributed as tpd

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    cols = 1024
    rows = max(world, (mib << 20) // (_TENSORS * cols * 4))
    start, count = _rows(rows, world, rank)
    rng = np.random.default_rng(rank)
    values = {
        f"t{i:02d}": tpd.Slice(rng.standard_normal((count, cols), dtype=np.float32),
                               (rows, cols), (start, 0))
        for i in range(_TENSORS)
    }
    options = tp.CheckpointOptions(fsync=not directory.startswith("/dev/shm"))
    ckpt = tpd.DistributedCheckpoint(**values)
    ckpt.read(ckpt.write(f"{directory}/warmup", options), options)  # first-use costs excluded

    def timed(call: Any) -> tuple[float, float]:
        dist.barrier()
        wall, cpu = time.perf_counter(), time.process_time()
        call()
        return time.perf_counter() - wall, time.process_time() - cpu

    mine: dict[str, list[tuple[float, float]]] = {"save": [], "restore": []}
    path = f"{directory}/ckpt"
    for _ in range(reps):
        mine["save"].append(timed(lambda: ckpt.write(path, options)))
        for value in values.values():
            value.local[:] = 0
        mine["restore"].append(timed(lambda: ckpt.read(path, options).assert_consumed()))
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        result: dict[str, Any] = {"bytes": rows * cols * 4 * _TENSORS}
        for phase in ("save", "restore"):
            runs = [[ranks[phase][i] for ranks in gathered] for i in range(reps)]
            result[phase] = statistics.median(max(w for w, _ in run) for run in runs)
            result[f"{phase}_cpu"] = statistics.median(sum(c for _, c in run) for run in runs)
        print(json.dumps(result))
    dist.destroy_process_group()


def _run(world: int, base: str, mib: int, reps: int) -> dict[str, float]:
    work = tempfile.mkdtemp(dir=base, prefix="tp-dist-")
    init = os.path.join(work, "init")
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", work, "--mib", str(mib), "--init", init,
             "--reps", str(reps)],
            stdout=subprocess.PIPE, text=True,
            env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1"},
        )
        for r in range(world)
    ]
    try:
        outputs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a rank failed with {world} processes: {outputs}")
    return json.loads(outputs[0].strip().splitlines()[-1])


def _throughput_table(args: argparse.Namespace) -> Table:
    counts = [int(n) for n in args.procs.split(",")]
    results = {n: _run(n, args.dir, args.mib, args.reps) for n in counts}
    nbytes = int(results[counts[0]]["bytes"])
    table = Table(title=f"N processes vs one ({nbytes / 2**20:.0f} MiB on {args.dir}, median of "
                  f"{args.reps} calls; ratio < 1.00 is faster; cpu: summed over the ranks)")
    for column in ("processes", "save", "save GiB/s", "save cpu", "restore", "restore GiB/s",
                   "restore cpu"):
        table.add_column(column, justify="right")
    base = results[counts[0]]
    for n in counts:
        cells = [str(n)]
        for phase in ("save", "restore"):
            median, cpu = results[n][phase], results[n][f"{phase}_cpu"]
            cells += [f"{median / base[phase]:.2f}x", f"{nbytes / median / 2**30:.2f}",
                      f"{cpu * 1e3:.0f} ms"]
        table.add_row(*cells)
    return table


def _merge_table(args: argparse.Namespace) -> Table:
    from trackpoint.bundle.merge import merge_bundles
    from trackpoint.bundle.slice_spec import TensorSlice, format_slice_spec
    from trackpoint.saving.shard_writer import write_shard
    from trackpoint.storage import LocalStorage

    storage = LocalStorage(fsync=False)
    table = Table(title=f"merging N shards into one checkpoint ({args.dir}, median of "
                  f"{args.reps})")
    for column in ("shards", "index entries", "merge", "per shard"):
        table.add_column(column, justify="right")
    block = np.ones((4, 16), dtype=np.float32)
    for n in [int(s) for s in args.shards.split(",")]:
        full = (4 * n, 16)
        times = []
        for _ in range(args.reps):
            work = tempfile.mkdtemp(dir=args.dir, prefix="tp-merge-")
            try:
                prefixes = []
                for i in range(n):
                    spec = format_slice_spec(full, TensorSlice.from_bounds((4 * i, 0), (4, 16)))
                    shard = {f"t{k}": {spec: block} for k in range(8)}
                    prefixes.append(f"{work}/part-{i:05d}-of-{n:05d}")
                    write_shard(prefixes[-1], shard, storage)
                began = time.perf_counter()
                merge_bundles(prefixes, f"{work}/ckpt", storage=storage)
                times.append(time.perf_counter() - began)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        median = statistics.median(times)
        table.add_row(str(n), str(8 * (n + 1)), f"{median * 1e3:.1f} ms",
                      f"{median / n * 1e3:.3f} ms")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else
                        tempfile.gettempdir())
    parser.add_argument("--procs", default="1,2,4")
    parser.add_argument("--shards", default="1,10,100,1000")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--init", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.worker, args.mib, args.init, args.reps)
        return 0
    console = Console()
    console.print(_throughput_table(args))
    console.print(_merge_table(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
