"""Multi-process JAX: trackpoint vs Orbax saving and restoring global arrays, in the same run.

Run: ``.venv/bin/python bench/jax_distributed.py [--procs 2] [--mib 16] [--reps 3]
[--dir /dev/shm]``.

N processes (``jax.distributed`` on loopback, 2 CPU devices each) hold ``--mib`` MiB of
float32 state: 8 global arrays row-sharded over every device. Each process saves it with
trackpoint (``DistributedCheckpoint.write``: each process writes its shards, process 0
commits) and with Orbax (``StandardCheckpointer.save`` + ``wait_until_finished``), then
restores it into abstract targets of the same sharding (``tp.jax.restore`` and
``StandardCheckpointer.restore``). Each system gets a warm-up save and restore; then ``--reps``
timed calls of each, the systems alternating, every call started together on every process (a
barrier before, never inside, the timed region) and into a new directory. A call's time is the
slowest process's; the table prints the medians and the ratio trackpoint / Orbax (< 1.00:
trackpoint is faster). Small by default (a smoke run of the row); raise ``--mib`` to measure.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

_TENSORS = 8
_DEVICES_PER_PROCESS = 2


def _worker(directory: str, mib: int, reps: int, port: int, count: int, index: int) -> None:
    """One process: warm-ups, then ``reps`` timed calls per system; writes its times as JSON."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=count, process_id=index
    )
    import orbax.checkpoint as ocp

    import trackpoint as tp
    import trackpoint.distributed as tpd

    devices = jax.device_count()
    cols = 1024
    rows = max(devices, (mib << 20) // (_TENSORS * cols * 4) // devices * devices)
    mesh = jax.make_mesh((devices,), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))

    def make(i: int) -> jax.Array:
        def block(index: Any) -> np.ndarray:
            start = index[0].start or 0
            stop = index[0].stop or rows
            rng = np.random.default_rng(i * 1000 + start)
            return rng.standard_normal((stop - start, cols), dtype=np.float32)

        return jax.make_array_from_callback((rows, cols), sharding, block)

    state = {f"t{i:02d}": make(i) for i in range(_TENSORS)}
    abstract = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding) for k, v in state.items()
    }
    options = tp.CheckpointOptions(fsync=not directory.startswith("/dev/shm"))
    ckpt = tpd.DistributedCheckpoint(state=state, backend="jax")
    orbax = ocp.StandardCheckpointer()
    calls = {"n": 0, "timed": 0}

    def fresh(system: str) -> str:
        calls["n"] += 1
        return f"{directory}/{system}-{calls['n']}"

    def tp_save() -> str:
        return ckpt.write(fresh("tp") + "/ckpt", options)

    def orbax_save() -> str:
        path = fresh("orbax")
        orbax.save(path, state)
        orbax.wait_until_finished()
        return path

    def timed(call: Any) -> tuple[float, Any]:
        calls["timed"] += 1  # the same count on every process: the barrier's name
        multihost_utils.sync_global_devices(f"bench-{calls['timed']}")
        began = time.perf_counter()
        out = call()
        return time.perf_counter() - began, out

    def tp_restore(path: str) -> Any:
        out = tp.jax.restore(path, {"state": abstract})
        jax.block_until_ready(out)
        return out

    def orbax_restore(path: str) -> Any:
        out = orbax.restore(path, abstract)
        jax.block_until_ready(out)
        return out

    tp_restore(tp_save())  # warm-ups: imports, thread pools, compilation
    orbax_restore(orbax_save())
    times: dict[str, list[float]] = {
        k: [] for k in ("tp_save", "tp_restore", "orbax_save", "orbax_restore")
    }
    for _ in range(reps):
        seconds, path = timed(tp_save)
        times["tp_save"].append(seconds)
        times["tp_restore"].append(timed(functools.partial(tp_restore, path))[0])
        seconds, path = timed(orbax_save)
        times["orbax_save"].append(seconds)
        times["orbax_restore"].append(timed(functools.partial(orbax_restore, path))[0])
    ckpt.close()
    orbax.close()
    result = {"bytes": rows * cols * 4 * _TENSORS, "times": times}
    Path(directory, f"times-{index}.json").write_text(json.dumps(result))
    multihost_utils.sync_global_devices("bench-done")
    jax.distributed.shutdown()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(count: int, base: str, mib: int, reps: int) -> dict[str, float]:
    work = tempfile.mkdtemp(dir=base, prefix="tp-jaxdist-")
    port = _free_port()
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={_DEVICES_PER_PROCESS}",
        "JAX_PLATFORMS": "cpu",
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                work,
                "--mib",
                str(mib),
                "--reps",
                str(reps),
                "--port",
                str(port),
                "--count",
                str(count),
                "--index",
                str(i),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(count)
    ]
    try:
        for i, proc in enumerate(procs):
            _, err = proc.communicate(timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(f"process {i} of {count} failed:\n{err[-3000:]}")
        results = [json.loads(Path(work, f"times-{i}.json").read_text()) for i in range(count)]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    figures: dict[str, float] = {"bytes": results[0]["bytes"]}
    for phase in results[0]["times"]:
        slowest = [max(r["times"][phase][i] for r in results) for i in range(reps)]
        figures[phase] = statistics.median(slowest)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", default="2", help="process counts, comma-separated")
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.worker, args.mib, args.reps, args.port, args.count, args.index)
        return 0
    table = Table(
        title=f"multi-process JAX: trackpoint vs Orbax (median of {args.reps}, "
        f"slowest process; {_DEVICES_PER_PROCESS} CPU devices per process)"
    )
    for column in (
        "processes",
        "MiB",
        "tp save s",
        "orbax save s",
        "save tp/orbax",
        "tp restore s",
        "orbax restore s",
        "restore tp/orbax",
    ):
        table.add_column(column, justify="right")
    for count in [int(n) for n in args.procs.split(",")]:
        f = _run(count, args.dir, args.mib, args.reps)
        table.add_row(
            str(count),
            f"{f['bytes'] / 2**20:.0f}",
            f"{f['tp_save']:.3f}",
            f"{f['orbax_save']:.3f}",
            f"{f['tp_save'] / f['orbax_save']:.2f}",
            f"{f['tp_restore']:.3f}",
            f"{f['orbax_restore']:.3f}",
            f"{f['tp_restore'] / f['orbax_restore']:.2f}",
        )
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
