"""The model the distributed tests shard, its reference values, and the launcher of rank processes.

The model has one value of each kind a rank can hold:

* ``emb``: an embedding whose rows are split into blocks (uneven for 3 ranks), ``mark_sharded``
  with offsets (tensor parallelism by hand);
* ``flat``: a ``(6, 5)`` weight held as FSDP-style flat runs of its 30 elements, ``mark_sharded``
  with ``flat_start`` (the runs cross row boundaries);
* ``dt``: a DTensor sharded by rows over a 1-D device mesh (only when torch.distributed runs);
* ``lin``: a linear layer replicated on every rank (written once).

Adam takes one step with gradients that depend only on the element's place in the full tensor,
so the full values of every parameter and optimizer slot are known: :func:`reference` computes
them in one process, and every rank compares its part against them.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import jobs
import numpy as np
import torch

V, D = 10, 4  # emb: full shape
FLAT = (6, 5)  # flat: full shape
DT = (6, 3)  # dt: full shape
H = 3  # lin: D -> H

WORKER = Path(__file__).with_name("dist_worker.py")


def key(path: str, slot: str | None = None) -> str:
    """The checkpoint key of ``model.<path>`` (or of its Adam slot)."""
    base = "model/" + path.replace(".", "/")
    if slot is None:
        return f"{base}/.ATTRIBUTES/VARIABLE_VALUE"
    return f"{base}/.OPTIMIZER_SLOT/optimizer/{slot}/.ATTRIBUTES/VARIABLE_VALUE"


def full_value(name: str, shape: tuple[int, ...], version: int) -> np.ndarray:
    """The deterministic full value of parameter ``name`` at ``version``."""
    seed = sum(map(ord, name))
    n = math.prod(shape)
    return (np.cos(np.arange(n, dtype=np.float32) * 0.37 + seed) + version).astype(
        np.float32
    ).reshape(shape)


def full_grad(shape: tuple[int, ...]) -> np.ndarray:
    n = math.prod(shape)
    return np.sin(np.arange(n, dtype=np.float32) * 0.11).astype(np.float32).reshape(shape)


def rows_of(n: int, world: int, rank: int) -> tuple[int, int]:
    """(start, count) of rank's block when ``n`` rows are split into ``world`` blocks."""
    base, extra = divmod(n, world)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


class Model(torch.nn.Module):
    def __init__(self, rank: int, world: int, version: int, *, dtensor: bool) -> None:
        super().__init__()
        import trackpoint.distributed as tpd

        start, count = rows_of(V, world, rank)
        self.emb = torch.nn.Embedding(count, D)
        self.lin = torch.nn.Linear(D, H)
        fstart, fcount = rows_of(math.prod(FLAT), world, rank)
        with torch.no_grad():
            self.emb.weight.copy_(torch.from_numpy(full_value("emb", (V, D), version)[
                start : start + count]))
            flat = full_value("flat", FLAT, version).reshape(-1)[fstart : fstart + fcount]
            self.flat = torch.nn.Parameter(torch.from_numpy(flat.copy()))
            self.lin.weight.copy_(torch.from_numpy(full_value("lin.weight", (H, D), version)))
            self.lin.bias.copy_(torch.from_numpy(full_value("lin.bias", (H,), version)))
        tpd.mark_sharded(self.emb.weight, (V, D), offsets=(start, 0))
        tpd.mark_sharded(self.flat, FLAT, flat_start=fstart)
        self.regions = {
            "emb.weight": (slice(start, start + count),),
            "flat": ("flat", fstart, fcount),
        }
        if dtensor:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import Shard, distribute_tensor

            mesh = init_device_mesh("cpu", (world,))
            full = torch.from_numpy(full_value("dt", DT, version))
            self.dt = torch.nn.Parameter(distribute_tensor(full, mesh, [Shard(0)]))
            offset = self.dt.__create_chunk_list__()[0].offsets[0]
            rows = self.dt.to_local().shape[0]
            self.regions["dt"] = (slice(offset, offset + rows),)

    def local(self, name: str) -> torch.Tensor:
        value = self.get_parameter(name)
        if hasattr(value, "to_local"):
            value = value.to_local()
        return value.detach()

    def part(self, name: str, full: np.ndarray) -> np.ndarray:
        """The part of ``full`` (a full value of ``name``) this rank holds."""
        region = self.regions.get(name)
        if region is None:
            return full
        if region[0] == "flat":
            return full.reshape(-1)[region[1] : region[1] + region[2]]
        return full[region]


def train_step(model: Model, optimizer: torch.optim.Optimizer) -> None:
    """One Adam step whose gradients depend only on each element's place in the full tensor."""
    shapes = {"emb.weight": (V, D), "flat": FLAT, "dt": DT, "lin.weight": (H, D), "lin.bias": (H,)}
    for name, param in model.named_parameters():
        full = torch.from_numpy(full_grad(shapes[name]))
        if hasattr(param, "device_mesh"):  # a DTensor: the same placements as the parameter
            from torch.distributed.tensor import distribute_tensor

            param.grad = distribute_tensor(full, param.device_mesh, param.placements)
        else:
            param.grad = torch.from_numpy(model.part(name, full.numpy()).copy()).view(param.shape)
    optimizer.step()
    optimizer.zero_grad()


def build(rank: int, world: int, version: int, *, dtensor: bool) -> tuple[Model, Any]:
    model = Model(rank, world, version, dtensor=dtensor)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    return model, optimizer


def reference(version: int) -> dict[str, np.ndarray]:
    """Full values of every checkpoint key after ``version``'s training step (one process)."""
    model, optimizer = build(0, 1, version, dtensor=False)
    model.dt = torch.nn.Parameter(torch.from_numpy(full_value("dt", DT, version)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    train_step(model, optimizer)
    out = {}
    for name, param in model.named_parameters():
        out[key(name)] = param.detach().numpy().reshape(
            {"flat": FLAT}.get(name, tuple(param.shape)))
        for slot in ("exp_avg", "exp_avg_sq"):
            value = optimizer.state[param][slot].numpy()
            out[key(name, slot)] = value.reshape({"flat": FLAT}.get(name, value.shape))
    return out


def launch(
    scenario: str, world: int, workdir: Path, *args: str, env: dict[str, str] | None = None,
) -> list[jobs.Process]:
    """Run ``dist_worker.py scenario`` as ``world`` gloo ranks (timeouts: jobs.py, sized for a
    loaded machine); kill any still alive at the end. The ranks' results, indexed by rank."""
    init = workdir / f"init-{scenario}-{time.monotonic_ns()}"
    base = jobs.job_env({**(env or {}), "WORLD_SIZE": str(world), "TP_INIT_FILE": str(init)})
    return jobs.run_job(
        [[sys.executable, str(WORKER), scenario, str(workdir), *args] for _ in range(world)],
        workdir,
        envs=[{**base, "RANK": str(rank)} for rank in range(world)],
    )


def report(results: list[jobs.Process]) -> str:
    return jobs.report(results)
