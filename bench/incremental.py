"""Incremental checkpoints (issue 16): a LoRA-like fine-tune saved 10 times.

Run: ``.venv/bin/python bench/incremental.py [--small] [--saves 10] [--dir /dev/shm]
[--only trackpoint]``.

The state is a torch module with a frozen base (64 float32 weights, 1 GiB; ``--small``: 64 MiB)
and rank-8 LoRA adapters on every weight (8 MiB; ``--small``: 2 MiB), trained by Adam (its
moments double the adapters' bytes). Between saves one optimizer step changes the adapters and
Adam's state; the base never changes. Each system saves 10 times:

* trackpoint, full saves and ``CheckpointOptions(incremental=True)``, through a
  ``CheckpointManager``; the incremental saves also with the verification of linked data files
  turned off (``incremental._VERIFY_LINKED``, a private switch only this benchmark touches), to
  measure what verifying costs in the same run, and the verification time of each save;
* ``torch.save`` of the model and optimizer state dicts;
* safetensors (model tensors and Adam's tensors, flattened);
* torch.distributed.checkpoint (DCP) of the full state, and with
  ``StateDictOptions(ignore_frozen_params=True)`` (which leaves the base out: such a checkpoint
  cannot restore the model alone).

Per save: bytes newly written (sizes of files whose inode is new), time. Total disk: the
bytes of distinct inodes of all 10 checkpoints. To fit in memory when ``--dir`` is a RAM disk,
full-size systems delete each checkpoint once measured (their total is then the sum of the
per-save bytes, what keeping all 10 would take); incremental trackpoint keeps all 10 and its
total is measured on disk.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import trackpoint as tp  # noqa: E402
from trackpoint.saving import incremental  # noqa: E402

MIB = 1 << 20
_VERIFY_SECONDS: list[float] = []  # time in incremental.verify_files during the current save


def _time_verification() -> None:
    """Wrap ``incremental.verify_files`` so that each save's verification time is recorded."""
    real = incremental.verify_files

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            _VERIFY_SECONDS.append(time.perf_counter() - started)

    incremental.verify_files = timed  # type: ignore[assignment]


class LoraLinear(torch.nn.Module):
    def __init__(self, dim: int, rank: int) -> None:
        super().__init__()
        self.base = torch.nn.Parameter(torch.randn(dim, dim) * 0.02, requires_grad=False)
        self.lora_a = torch.nn.Parameter(torch.randn(rank, dim) * 0.01)
        self.lora_b = torch.nn.Parameter(torch.zeros(dim, rank))


def _model(small: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    dim = 512 if small else 2048  # 64 x dim^2 float32: 64 MiB or 1 GiB
    return torch.nn.ModuleList([LoraLinear(dim, 8) for _ in range(64)])


def _train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """One Adam step on random gradients: adapters and Adam state change, the base does not."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.randn_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _changed_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    state = sum(
        t.numel() * t.element_size()
        for s in optimizer.state.values()
        for t in s.values()
        if torch.is_tensor(t)
    )
    return trainable + state


def _inodes(directory: str) -> dict[int, int]:
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            st = os.stat(os.path.join(root, name))
            out[st.st_ino] = st.st_size
    return out


def _run(
    name: str,
    save: Callable[[int, str], str | None],
    directory: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    saves: int,
    *,
    keep: bool,
) -> dict[str, object]:
    work = tempfile.mkdtemp(dir=directory, prefix=f"tp-inc-{name.split()[0]}-")
    seen: dict[int, int] = {}
    times, written, verify = [], [], []
    try:
        for step in range(1, saves + 1):
            _train_step(model, optimizer)
            gc.collect()
            _VERIFY_SECONDS.clear()
            started = time.perf_counter()
            path = save(step, work)
            times.append(time.perf_counter() - started)
            verify.append(sum(_VERIFY_SECONDS))
            now = _inodes(work)
            written.append(sum(size for ino, size in now.items() if ino not in seen))
            seen.update(now)
            if not keep and path is not None:
                for entry in os.listdir(work):
                    full = os.path.join(work, entry)
                    if entry.startswith(os.path.basename(path)):
                        shutil.rmtree(full) if os.path.isdir(full) else os.remove(full)
                seen = _inodes(work)  # freed inode numbers are reused by the next save
        total = sum(_inodes(work).values()) if keep else sum(written)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"name": name, "times": times, "written": written, "total": total, "verify": verify}


def _systems(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple]:
    def trackpoint_save(inc: bool, verify: bool = True) -> Callable[[int, str], str | None]:
        options = tp.CheckpointOptions(incremental=inc)
        managers: list[tp.CheckpointManager] = []  # one Checkpoint (one history) per system

        def save(step: int, work: str) -> str | None:
            if not managers:
                ckpt = tp.Checkpoint(model=model, optimizer=optimizer)
                managers.append(tp.CheckpointManager(ckpt, work, max_to_keep=None))
            incremental._VERIFY_LINKED = verify
            try:
                return managers[0].save(options=options)
            finally:
                incremental._VERIFY_LINKED = True

        return save

    def torch_save(step: int, work: str) -> str:
        path = os.path.join(work, f"step-{step}.pt")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        return path

    def safetensors_save(step: int, work: str) -> str:
        from safetensors.torch import save_file

        tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
        for i, state in enumerate(optimizer.state.values()):
            for k, v in state.items():
                if torch.is_tensor(v):
                    tensors[f"optimizer.{i}.{k}"] = v.reshape(v.shape or (1,))
        path = os.path.join(work, f"step-{step}.safetensors")
        save_file(tensors, path)
        return path

    def dcp_save(frozen: bool) -> Callable[[int, str], str]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        def save(step: int, work: str) -> str:
            options = StateDictOptions(ignore_frozen_params=not frozen)
            model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
            path = os.path.join(work, f"step-{step}")
            dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=path)
            return path

        return save

    return [
        ("trackpoint full", trackpoint_save(False), False),
        ("trackpoint incremental", trackpoint_save(True), True),
        ("trackpoint incremental, links unverified", trackpoint_save(True, verify=False), True),
        ("torch.save", torch_save, False),
        ("safetensors", safetensors_save, False),
        ("DCP full", dcp_save(True), False),
        ("DCP ignore_frozen_params", dcp_save(False), False),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="64 MiB base instead of 1 GiB")
    parser.add_argument("--saves", type=int, default=10)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    parser.add_argument(
        "--only", default="", help="run only the systems whose name starts with this "
        "(e.g. 'trackpoint'); the ratios need 'trackpoint full'",
    )  # fmt: skip
    args = parser.parse_args()
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    console = Console(width=150)
    _time_verification()
    model = _model(args.small)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    _train_step(model, optimizer)  # Adam's state exists from the first save on
    base = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    changed = _changed_bytes(model, optimizer)
    directory = args.dir or tempfile.gettempdir()
    os.makedirs(directory, exist_ok=True)
    console.print(
        f"base {base / MIB:.0f} MiB frozen, {changed / MIB:.1f} MiB changed per step "
        f"(adapters + Adam), {args.saves} saves into {directory}"
    )
    results = []
    for name, save, keep in _systems(model, optimizer):
        if not name.startswith(args.only) and name != "trackpoint full":
            continue
        with contextlib.redirect_stderr(open(os.devnull, "w")):  # noqa: SIM115
            results.append(
                _run(name, save, directory, model, optimizer, args.saves, keep=keep)
            )
        r = results[-1]
        console.print(f"  {name}: done in {sum(r['times']):.1f} s")  # type: ignore[arg-type]

    full = next(r for r in results if r["name"] == "trackpoint full")
    full_time = statistics.median(full["times"])  # type: ignore[arg-type]
    table = Table(title=f"{args.saves} saves of a LoRA-like state ({directory})")
    for column in ("system", "save 1 s", "saves 2+ s (median)", "vs full trackpoint",
                   "save 1 MiB", "saves 2+ MiB written (median)", "total disk MiB"):
        table.add_column(column, justify="left" if column == "system" else "right")
    for r in results:
        times, written = r["times"], r["written"]
        later_t = statistics.median(times[1:])  # type: ignore[index]
        later_w = statistics.median(written[1:])  # type: ignore[index]
        table.add_row(
            str(r["name"]), f"{times[0]:.3f}", f"{later_t:.3f}",  # type: ignore[index]
            f"{later_t / full_time:.1%}", f"{written[0] / MIB:.1f}",  # type: ignore[index]
            f"{later_w / MIB:.1f}", f"{r['total'] / MIB:.0f}",  # type: ignore[operator]
        )  # fmt: skip
    console.print(table)

    inc = next(r for r in results if r["name"] == "trackpoint incremental")
    worst_written = max(inc["written"][1:])  # type: ignore[index]
    worst_time = max(inc["times"][1:])  # type: ignore[index]
    median_time = statistics.median(inc["times"][1:])  # type: ignore[arg-type]
    console.print("incremental save times (s): "
                  + " ".join(f"{t:.3f}" for t in inc["times"]))  # type: ignore[attr-defined]
    verified = [v for v in inc["verify"][1:] if v]  # type: ignore[index]
    if verified:
        console.print(
            f"link verification (saves 2-{args.saves}): median "
            f"{statistics.median(verified) * 1e3:.1f} ms, max {max(verified) * 1e3:.1f} ms "
            f"(of a median incremental save of {median_time * 1e3:.1f} ms); per save: "
            + " ".join(f"{v * 1e3:.1f}" for v in inc["verify"])  # type: ignore[attr-defined]
        )
    bare = next((r for r in results if r["name"].endswith("unverified")), None)
    if bare is not None:
        bare_time = statistics.median(bare["times"][1:])  # type: ignore[arg-type,index]
        console.print(
            f"incremental saves 2-{args.saves}, median: {median_time * 1e3:.1f} ms verified, "
            f"{bare_time * 1e3:.1f} ms unverified ({median_time / bare_time - 1:+.0%})"
        )
    budget = (base + args.saves * changed) * 1.05
    checks = [
        (f"saves 2-{args.saves} write <= 2x the changed bytes",
         f"max {worst_written / MIB:.1f} MiB vs 2 x {changed / MIB:.1f} MiB",
         worst_written <= 2 * changed),
        (f"saves 2-{args.saves} take <= 10% of a full save (median; max shown)",
         f"median {median_time:.3f} s ({median_time / full_time:.1%}), max {worst_time:.3f} s "
         f"({worst_time / full_time:.1%}) vs full {full_time:.3f} s",
         median_time <= 0.1 * full_time),
        ("total disk <= base + saves x changed + 5%",
         f"{inc['total'] / MIB:.0f} MiB vs {budget / MIB:.0f} MiB",  # type: ignore[operator]
         inc["total"] <= budget),  # type: ignore[operator]
    ]  # fmt: skip
    targets = Table(title="targets (trackpoint incremental)")
    for column in ("target", "measured", "met"):
        targets.add_column(column)
    for what, measured, met in checks:
        targets.add_row(what, measured, "yes" if met else "[bold red]NO[/]")
    console.print(targets)
    return 0 if all(met for *_, met in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
