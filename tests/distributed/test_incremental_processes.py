"""Incremental distributed saves in real multi-process jobs (issue 16 item 4).

A 2-rank torch.distributed (gloo) job and a 2-process ``jax.distributed`` job each save twice
with ``CheckpointOptions(incremental=True)`` (the second save async), delete the first
checkpoint and restore the second into fresh objects, bit for bit. The test then checks that the
second checkpoint's frozen values are the first one's inodes (only changed bytes were written)
and that TensorFlow reads the second checkpoint alone.

Run as a script, this file is one process of such a job:
``test_incremental_processes.py torch|jax WORKDIR [PORT COUNT INDEX]`` (rank and world of the
torch job come from RANK, WORLD_SIZE and TP_INIT_FILE). It writes ``result-<index>.json``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import jobs
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
INC = {"incremental": True}
MIB = 1 << 20
EMB = (2048, 256)  # 2 MiB, rows split between the ranks: 1 MiB each (a data file of its own)


# -- the job's processes -------------------------------------------------------------------------


def _data_files(prefix: Path) -> list[Path]:
    return sorted(prefix.parent.glob(prefix.name + ".data-*"))


def _sharing(first: Path, second: Path) -> dict[str, int]:
    """Bytes of ``second``'s data files that are ``first``'s inodes, and the other bytes."""
    old = {os.stat(p).st_ino for p in _data_files(first)}
    shared = new = 0
    for path in _data_files(second):
        if os.stat(path).st_ino in old:
            shared += path.stat().st_size
        else:
            new += path.stat().st_size
    return {"shared": shared, "new": new}


def _delete(prefix: Path) -> None:
    for path in [*_data_files(prefix), prefix.with_name(prefix.name + ".index")]:
        path.unlink()


def torch_job(workdir: Path) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import trackpoint as tp
    import trackpoint.distributed as tpd

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo", init_method=f"file://{os.environ['TP_INIT_FILE']}", rank=rank, world_size=world,
        timeout=timedelta(seconds=jobs.collective_timeout()),
    )  # fmt: skip

    def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(seed)  # the same on every rank: replicated values are equal
        model = torch.nn.Module()
        model.base = torch.nn.Linear(512, 512).requires_grad_(False)  # 1 MiB, frozen
        rows = EMB[0] // world
        full = torch.randn(*EMB)
        model.emb = torch.nn.Parameter(full[rank * rows : (rank + 1) * rows].clone(), False)
        tpd.mark_sharded(model.emb, EMB, offsets=(rank * rows, 0))
        model.adapter = torch.nn.Linear(512, 8)
        optimizer = torch.optim.Adam(model.adapter.parameters(), lr=0.1, foreach=False)
        step(model, optimizer)
        return model, optimizer

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        for p in model.adapter.parameters():
            p.grad = torch.randn_like(p)
        optimizer.step()

    def state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        out = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for i, s in enumerate(optimizer.state.values()):
            out.update({f"opt{i}.{k}": v.clone() for k, v in s.items()})
        return out

    model, optimizer = build(0)
    ckpt = tpd.DistributedCheckpoint(
        model=model, optimizer=optimizer, timeout=jobs.collective_timeout()
    )
    directory = workdir / "ckpts"
    first = Path(ckpt.save(directory / "ckpt", tp.CheckpointOptions(**INC)))
    step(model, optimizer)
    expected = state(model, optimizer)
    options = tp.CheckpointOptions(**INC, enable_async=True)
    second = Path(ckpt.save(directory / "ckpt", options))
    step(model, optimizer)  # after the call: must not reach the checkpoint
    ckpt.sync()
    ckpt.close()
    result: dict[str, Any] = {"second": str(second), **_sharing(first, second)}
    dist.barrier()
    if rank == 0:
        _delete(first)
    dist.barrier()
    fresh, fresh_optimizer = build(1)  # other values everywhere
    tpd.DistributedCheckpoint(
        model=fresh, optimizer=fresh_optimizer, timeout=jobs.collective_timeout()
    ).restore(second).assert_consumed()
    got = state(fresh, fresh_optimizer)
    result["differ"] = [k for k, v in expected.items() if not torch.equal(got[k], v)]
    dist.destroy_process_group()
    return result


def jax_job(workdir: Path, port: str, count: str, index: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    import trackpoint as tp
    import trackpoint.distributed as tpd

    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=int(count),
        process_id=int(index), initialization_timeout=int(jobs.init_timeout()),
    )  # fmt: skip
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d", None))
    full = np.random.default_rng(0).random(EMB, dtype=np.float32)
    frozen = jax.make_array_from_callback(EMB, rows, lambda idx: full[idx])
    tree = {"frozen": frozen, "adapter": jnp.zeros((64, 64)), "step": jnp.zeros((), jnp.int32)}
    ckpt = tpd.DistributedCheckpoint(state=tree, timeout=jobs.collective_timeout())
    directory = workdir / "ckpts"
    first = Path(ckpt.save(directory / "ckpt", tp.CheckpointOptions(**INC)))
    tree["adapter"] = tree["adapter"] + 1  # a new array: changed; "frozen" is the same array
    tree["step"] = tree["step"] + 1
    options = tp.CheckpointOptions(**INC, enable_async=True)
    second = Path(ckpt.save(directory / "ckpt", options))
    tree["adapter"] = tree["adapter"] + 100  # after the call: must not reach the checkpoint
    ckpt.sync()
    ckpt.close()
    result: dict[str, Any] = {"second": str(second), **_sharing(first, second)}
    if int(index) == 0:
        _delete(first)
    jobs.jax_barrier("deleted")  # through the coordination service: no gloo, no compilation
    target = {"frozen": jax.ShapeDtypeStruct(EMB, jnp.float32, sharding=rows),
              "adapter": jnp.zeros((64, 64)), "step": jnp.zeros((), jnp.int32)}  # fmt: skip
    restored = tp.jax.restore(second, {"state": target})["state"]
    local = [(s.index, np.asarray(s.data)) for s in restored["frozen"].addressable_shards]
    result["differ"] = [
        name for name, ok in [
            ("frozen", all(np.array_equal(v, full[i]) for i, v in local)),
            ("adapter", np.array_equal(np.asarray(restored["adapter"]), np.ones((64, 64)))),
            ("step", int(restored["step"]) == 1),
        ] if not ok
    ]  # fmt: skip
    return result


def _main() -> None:
    kind, workdir = sys.argv[1], Path(sys.argv[2])
    index = os.environ.get("RANK", sys.argv[-1])
    try:
        result = torch_job(workdir) if kind == "torch" else jax_job(workdir, *sys.argv[3:6])
        result["ok"] = True
    except Exception as exc:
        result = {"ok": False, "error": repr(exc), "traceback": traceback.format_exc()}
    (workdir / f"result-{index}.json").write_text(json.dumps(result))


# -- the tests -----------------------------------------------------------------------------------


def _launch(kind: str, count: int, workdir: Path) -> list[dict[str, Any]]:
    """Run the job (timeouts and the report of a failure: jobs.py); every process's result."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = jobs.job_env({
        "WORLD_SIZE": str(count), "TP_INIT_FILE": str(workdir / f"init-{time.monotonic_ns()}"),
    }, devices=1)  # fmt: skip
    procs = jobs.run_job(
        [[sys.executable, __file__, kind, str(workdir), port, str(count), str(i)]
         for i in range(count)],
        workdir,
        envs=[{**env, "RANK": str(i)} if kind == "torch" else env for i in range(count)],
        results=[workdir / f"result-{i}.json" for i in range(count)],
    )  # fmt: skip
    # Every failed process, not just the first: one that waits on a collective fails because
    # another one failed first, and that other one's output says why.
    jobs.check(procs)
    return [p.result for p in procs]


def _check_alone(tf: Any, second: Path) -> None:
    """TensorFlow and trackpoint read the same values from ``second`` (the first is gone)."""
    import trackpoint as tp

    assert not list(second.parent.glob("ckpt-1.*"))
    reader = tf.train.load_checkpoint(str(second))
    ours = tp.load_checkpoint(second)
    keys = [k for k in reader.get_variable_to_shape_map() if k != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    assert keys
    for key in keys:
        np.testing.assert_array_equal(reader.get_tensor(key), ours.get_tensor(key), err_msg=key)


@pytest.mark.slow  # 2 gloo ranks: ~24 s
def test_gloo_ranks_link_unchanged_files_and_tensorflow_reads_the_result(
    tmp_path: Path, tf: Any
) -> None:
    pytest.importorskip("torch")
    results = _launch("torch", 2, tmp_path)
    for result in results:
        assert result["differ"] == []  # restored bit for bit, after ckpt-1 was deleted
    second = Path(results[0]["second"])
    # Both ranks' emb rows (1 MiB each) and the 1 MiB base were linked, not written.
    assert results[0]["shared"] >= 3 * MIB
    assert results[0]["new"] < 256 << 10  # adapter, Adam's state, counter, object graph
    _check_alone(tf, second)
    reader = tf.train.load_checkpoint(str(second))
    assert reader.get_variable_to_shape_map()["model/emb/.ATTRIBUTES/VARIABLE_VALUE"] == list(EMB)


@pytest.mark.slow  # 2 jax processes: ~26 s
def test_jax_processes_link_the_same_arrays_and_tensorflow_reads_the_result(
    tmp_path: Path, tf: Any
) -> None:
    pytest.importorskip("jax")
    results = _launch("jax", 2, tmp_path)
    for result in results:
        assert result["differ"] == []
    second = Path(results[0]["second"])
    assert results[0]["shared"] >= 2 * MIB  # each process's rows of the frozen array
    assert results[0]["new"] < 256 << 10
    _check_alone(tf, second)


if __name__ == "__main__":
    _main()
