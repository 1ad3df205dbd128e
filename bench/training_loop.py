"""Async saves in a training loop (issue 29): how long save() blocks, how much the loop slows.

Run: ``.venv/bin/python bench/training_loop.py [--workloads mlp,gpt2] [--steps 20] [--every 5]
[--reps 1] [--dir /dev/shm] [--systems ...] [--json out.json] [--quick]``.

Workloads (torch, CPU, Adam):

* ``mlp``: 4 ``Linear(2048, 2048)`` with ReLU between, batch 64 (192 MiB of parameters and
  Adam state);
* ``gpt2``: a GPT-2-style decoder (token + position embeddings, pre-norm blocks of causal
  self-attention and a 4x MLP, tied LM head; 6 layers, width 384, vocabulary 8192, context
  128, batch 4).

Systems, each running the same loop (``--steps`` timed steps after 2 warm-up steps, a save
every ``--every`` steps), interleaved in an order rotated every repetition:

* ``none``: no saves (the baseline of the slowdown);
* ``tp-async``: ``tp.Checkpoint.write`` with ``CheckpointOptions(enable_async=True)``;
* ``tp-lazy``: the same with ``lazy_snapshot=True``;
* ``tp-continuous``: a ``CheckpointManager`` with
  ``ContinuousCheckpointingPolicy(interval_steps=every)``, asked at every step
  (``maybe_save``), lazy async saves;
* ``dcp-async``: ``torch.distributed.checkpoint.async_save`` of the flat state dict (one-process
  gloo group), waiting for the previous save's future first;
* ``lightning-async``: Lightning's ``AsyncCheckpointIO(TorchCheckpointIO())``;
* ``tp-lightning-lazy``: ``tp.lightning.TrackpointCheckpointIO`` with async lazy saves, given the
  same flat dict (what Lightning hands a ``CheckpointIO``).

Figures: the median time a save call blocks, divided by one memory copy of the state, two ways:
the median time to clone every tensor (fresh buffers, page faults included: the issue's
reference, measured after each loop) and the median time to copy every tensor into preallocated
buffers right before each save call (the same moment, so the same load); the loop's time with
saves divided by the baseline's in the same repetition (median over repetitions); for
trackpoint, the writer thread's time per save and the time optimizer steps spent in the lazy
step pre-hook (finishing copies) per save. Every checkpoint is checked equal to the state at its
call: a digest (XXH3-128) of every tensor is taken right before the call, with the loop's clock
stopped (the reference copy too), and compared after the loop with the checkpoint read back
(restored into a fresh model and optimizer for trackpoint).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
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
import torch  # noqa: E402
import xxhash  # noqa: E402
from torch import nn  # noqa: E402

import trackpoint as tp  # noqa: E402
from trackpoint.management import ContinuousCheckpointingPolicy  # noqa: E402
from trackpoint.saving.lazy_snapshot import LazyCopy  # noqa: E402

GATE_SECONDS: list[float] = []  # time optimizer steps spent finishing lazy copies


def _time_gates() -> None:
    """Wrap ``LazyCopy.ensure`` (what a step pre-hook runs) to record its time per call."""
    real = LazyCopy.ensure

    def timed(self: LazyCopy, indices: Any) -> None:
        started = time.perf_counter()
        try:
            real(self, indices)
        finally:
            GATE_SECONDS.append(time.perf_counter() - started)

    LazyCopy.ensure = timed  # type: ignore[method-assign]


SYSTEMS = (
    "none", "tp-async", "tp-lazy", "tp-continuous", "tp-lightning-lazy", "dcp-async",
    "lightning-async",
)


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.register_buffer("mask", torch.triu(torch.full((context, context), -math.inf), 1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(n))
        for block in self.blocks:
            x = block(x, self.mask[:n, :n])
        return self.ln_f(x) @ self.wte.weight.T  # tied LM head


def build(workload: str, quick: bool) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    """The model and a function computing one batch's loss."""
    torch.manual_seed(0)
    if workload == "mlp":
        width = 256 if quick else 2048
        layers: list[nn.Module] = []
        for i in range(4):
            layers += [nn.Linear(width, width)] + ([nn.ReLU()] if i < 3 else [])
        mlp = nn.Sequential(*layers)
        x, y = torch.randn(64, width), torch.randn(64, width)
        return mlp, lambda: (mlp(x) - y).square().mean()
    vocab, width, depth, context, batch = (512, 64, 2, 32, 2) if quick else (8192, 384, 6, 128, 4)
    gpt = GPT(vocab, width, depth, 6 if width % 6 == 0 else 4, context)
    tokens = torch.randint(0, vocab, (batch, context + 1))

    def loss() -> torch.Tensor:
        logits = gpt(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))

    return gpt, loss


def flat_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every tensor of the training state by a flat name (live tensors, not copies)."""
    out = {f"model.{k}": v for k, v in model.state_dict().items()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, param in enumerate(params):
        for key, value in optimizer.state.get(param, {}).items():
            if isinstance(value, torch.Tensor):
                out[f"optim.{index}.{key}"] = value
    return out


def digests(state: dict[str, torch.Tensor]) -> dict[str, bytes]:
    return {
        k: xxhash.xxh3_128_digest(np.ascontiguousarray(v.detach().numpy()).view(np.uint8))
        for k, v in state.items()
    }


def clone_seconds(model: nn.Module, optimizer: torch.optim.Optimizer, reps: int = 5) -> float:
    """Median time to clone every tensor of the state: one memory copy."""
    tensors = list(flat_state(model, optimizer).values())
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        copies = [t.clone() for t in tensors]
        times.append(time.perf_counter() - started)
        del copies
    return statistics.median(times)


class System:
    """One way of saving inside the loop."""

    name = ""
    asks_every_step = False  # True: save() is called every step and decides itself

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, root: str) -> None:
        self.model, self.optimizer, self.root = model, optimizer, root
        self.written: list[tuple[str, dict[str, bytes]]] = []
        self.background: list[float] = []  # trackpoint: writer-thread seconds per save

    def wants(self, step: int, every: int) -> bool:
        return step % every == 0

    def save(self, step: int) -> str | None:
        raise NotImplementedError

    def drain(self) -> None: ...

    def read(self, path: str) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class TpAsync(System):
    name = "tp-async"
    lazy = False

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.ckpt = tp.Checkpoint(model=self.model, optimizer=self.optimizer)
        self.options = tp.CheckpointOptions(
            enable_async=True, lazy_snapshot=self.lazy, progress=self._progress
        )

    def _progress(self, event: Any) -> None:
        if event.stats is not None:  # the commit: the writer thread's time for this save
            self.background.append(event.stats.background_seconds)

    def save(self, step: int) -> str | None:
        return self.ckpt.write(os.path.join(self.root, f"{self.name}-{step}"), self.options)

    def drain(self) -> None:
        self.ckpt.sync()

    def read(self, path: str) -> dict[str, torch.Tensor]:
        model = copy.deepcopy(self.model)
        optimizer = type(self.optimizer)(model.parameters(), **self.optimizer.defaults)
        tp.Checkpoint(model=model, optimizer=optimizer).read(path).assert_consumed()
        return flat_state(model, optimizer)


class TpLazy(TpAsync):
    name = "tp-lazy"
    lazy = True


class TpContinuous(TpLazy):
    name = "tp-continuous"
    asks_every_step = True

    def __init__(self, *args: Any, every: int = 5) -> None:
        super().__init__(*args)
        policy = ContinuousCheckpointingPolicy(interval_steps=every)
        self.manager = tp.CheckpointManager(
            self.ckpt, os.path.join(self.root, self.name), max_to_keep=None, save_policy=policy
        )

    def wants(self, step: int, every: int) -> bool:
        return self.manager._continuous.should_save(step, self.ckpt)  # type: ignore[union-attr]

    def save(self, step: int) -> str | None:
        return self.manager.maybe_save(step, options=self.options)

    def drain(self) -> None:
        self.ckpt.sync()
        self.manager.close()


class DcpAsync(System):
    name = "dcp-async"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        import torch.distributed as dist

        if not dist.is_initialized():
            store = dist.FileStore(os.path.join(self.root, "dcp-store"), 1)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        self.future: Any = None

    def save(self, step: int) -> str | None:
        import torch.distributed.checkpoint as dcp

        if self.future is not None:
            self.future.result()
        path = os.path.join(self.root, f"{self.name}-{step}")
        self.future = dcp.async_save(flat_state(self.model, self.optimizer), checkpoint_id=path)
        return path

    def drain(self) -> None:
        if self.future is not None:
            self.future.result()

    def read(self, path: str) -> dict[str, torch.Tensor]:
        import torch.distributed.checkpoint as dcp

        state = {k: torch.empty_like(v) for k, v in flat_state(self.model, self.optimizer).items()}
        dcp.load(state, checkpoint_id=path)
        return state


class _CheckpointIOSystem(System):
    """A Lightning ``CheckpointIO`` plug-in handed the flat dict Lightning would hand it."""

    io: Any

    def save(self, step: int) -> str | None:
        path = os.path.join(self.root, f"{self.name}-{step}.ckpt")
        self.io.save_checkpoint(flat_state(self.model, self.optimizer), path)
        return path

    def drain(self) -> None:
        self.io.teardown()

    def read(self, path: str) -> dict[str, torch.Tensor]:
        loaded: dict[str, torch.Tensor] = self.io.load_checkpoint(path)
        return loaded


class LightningAsync(_CheckpointIOSystem):
    """Lightning's ``AsyncCheckpointIO`` over ``TorchCheckpointIO`` (clones every tensor)."""

    name = "lightning-async"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

        self.io = AsyncCheckpointIO(TorchCheckpointIO())

    def read(self, path: str) -> dict[str, torch.Tensor]:
        loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
        return loaded


class TpLightningLazy(_CheckpointIOSystem):
    """Lightning's plug-in path: ``TrackpointCheckpointIO`` with async lazy saves."""

    name = "tp-lightning-lazy"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.io = tp.lightning.TrackpointCheckpointIO(
            tp.CheckpointOptions(enable_async=True, lazy_snapshot=True)
        )


def make(name: str, model: nn.Module, optimizer: torch.optim.Optimizer, root: str,
         every: int) -> System | None:  # fmt: skip
    if name == "none":
        return None
    if name == "tp-continuous":
        return TpContinuous(model, optimizer, root, every=every)
    kinds = {"tp-async": TpAsync, "tp-lazy": TpLazy, "dcp-async": DcpAsync,
             "lightning-async": LightningAsync, "tp-lightning-lazy": TpLightningLazy}  # fmt: skip
    return kinds[name](model, optimizer, root)


def run_loop(workload: str, name: str, args: argparse.Namespace, root: str) -> dict[str, Any]:
    """One loop of one system on a fresh model: timings, then verification of every save."""
    model, loss_fn = build(workload, args.quick)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step() -> None:
        optimizer.zero_grad()
        loss_fn().backward()
        optimizer.step()

    for _ in range(2):  # warm-up: Adam's state exists from here on
        step()
    GATE_SECONDS.clear()
    system = make(name, model, optimizer, root, args.every)
    live = list(flat_state(model, optimizer).values())
    preallocated = [torch.empty_like(t) for t in live]  # the reference copy's buffers
    copies: list[float] = []  # one copy of the state into them, right before each save
    blocked: list[float] = []
    paused = 0.0
    started = time.perf_counter()
    for number in range(1, args.steps + 1):
        step()
        if system is None:
            continue
        wanted = system.wants(number, args.every)
        if not wanted and not system.asks_every_step:
            continue
        pause = time.perf_counter()
        reference = None
        if wanted:
            reference = digests(flat_state(model, optimizer))
            copy_started = time.perf_counter()
            for target, source in zip(preallocated, live):
                target.copy_(source)
            copies.append(time.perf_counter() - copy_started)
        paused += time.perf_counter() - pause
        call = time.perf_counter()
        path = system.save(number)
        if path is not None:
            blocked.append(time.perf_counter() - call)
            pause = time.perf_counter()
            if reference is None:  # nothing ran since the call: the state is still the call's
                reference = digests(flat_state(model, optimizer))
            system.written.append((path, reference))
            paused += time.perf_counter() - pause
    loop = time.perf_counter() - started - paused
    drain_started = time.perf_counter()
    if system is not None:
        system.drain()
    drain = time.perf_counter() - drain_started
    checked = mismatched = 0
    if system is not None:
        for path, reference in system.written:
            got = digests(system.read(path))
            checked += 1
            if got != reference:
                mismatched += 1
                bad = sorted(k for k in reference if got.get(k) != reference[k])
                print(f"  MISMATCH {name} {path}: {bad[:5]}", file=sys.stderr)
            target = path if os.path.isdir(path) else None
            if target:
                shutil.rmtree(target, ignore_errors=True)
        for entry in os.listdir(root):  # trackpoint files, torch.save files
            full = os.path.join(root, entry)
            if entry != "dcp-store":
                shutil.rmtree(full, ignore_errors=True) if os.path.isdir(full) else os.remove(full)
    state_bytes = sum(t.nbytes for t in flat_state(model, optimizer).values())
    return {
        "system": name, "loop_s": loop, "drain_s": drain, "blocked_s": blocked,
        "saves": len(blocked), "checked": checked, "mismatched": mismatched,
        "clone_s": clone_seconds(model, optimizer), "state_bytes": state_bytes,
        "step_s": loop / args.steps,
        "background_s": system.background if system is not None else [],
        "gate_s": list(GATE_SECONDS),
        "copy_s": copies,
    }  # fmt: skip


def summarize(workload: str, results: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per system: median blocked ÷ one copy, median slowdown ÷ baseline, checks."""
    rows = []
    names = [r["system"] for r in results[0]]
    clone = statistics.median(r["clone_s"] for rep in results for r in rep)
    for name in names:
        runs = [r for rep in results for r in rep if r["system"] == name]
        blocked = [b for r in runs for b in r["blocked_s"]]
        slowdowns = []
        for rep in results:
            base = next(r for r in rep if r["system"] == "none")["loop_s"]
            slowdowns.append(next(r for r in rep if r["system"] == name)["loop_s"] / base)
        rows.append({
            "workload": workload, "system": name,
            "state_MiB": runs[0]["state_bytes"] / 2**20,
            "step_s": statistics.median(r["step_s"] for r in runs),
            "saves": sum(r["saves"] for r in runs),
            "blocked_ms": 1e3 * statistics.median(blocked) if blocked else None,
            "blocked_per_copy": statistics.median(blocked) / clone if blocked else None,
            "slowdown": statistics.median(slowdowns),
            "slowdowns": slowdowns,
            "drain_s": statistics.median(r["drain_s"] for r in runs),
            "checked": sum(r["checked"] for r in runs),
            "mismatched": sum(r["mismatched"] for r in runs),
            "clone_ms": 1e3 * clone,
            "copy_ms": 1e3 * statistics.median(copied) if (copied := [
                c for r in runs for c in r["copy_s"]]) else None,
            "blocked_per_preallocated_copy": statistics.median(blocked)
            / statistics.median(copied) if blocked and copied else None,
            "background_ms": 1e3 * statistics.median(bg) if (bg := [
                b for r in runs for b in r["background_s"]]) else None,
            "gate_ms_total_per_save": 1e3 * sum(g for r in runs for g in r["gate_s"])
            / max(1, sum(r["saves"] for r in runs)),
        })  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="mlp,gpt2")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true", help="tiny models (a smoke test)")
    args = parser.parse_args()
    _time_gates()
    systems = args.systems.split(",")
    if "none" not in systems:
        systems.insert(0, "none")
    root = tempfile.mkdtemp(prefix="tp-loop-", dir=args.dir)
    all_rows = []
    try:
        for workload in args.workloads.split(","):
            results = []
            for rep in range(args.reps):
                order = systems[rep % len(systems) :] + systems[: rep % len(systems)]
                print(f"{workload} rep {rep + 1}/{args.reps}: {', '.join(order)}", file=sys.stderr)
                results.append([run_loop(workload, name, args, root) for name in order])
            rows = summarize(workload, results)
            all_rows += rows
            print(f"\n{workload}: state {rows[0]['state_MiB']:.0f} MiB, one copy (clone) "
                  f"{rows[0]['clone_ms']:.1f} ms, {args.steps} steps, save every {args.every}, "
                  f"{args.reps} rep(s), load average {os.getloadavg()[0]:.1f}")  # fmt: skip
            print(
                "| system | step (s) | saves | save() blocks (ms) | ÷ clone | ÷ copy at the call "
                "| loop slowdown "
                "| drain (s) | writer thread per save (ms) | step waits per save (ms) "
                "| checkpoints equal to the state at the call |"
            )
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            for r in rows:
                blocked = "—" if r["blocked_ms"] is None else f"{r['blocked_ms']:.1f}"
                ratio = "—" if r["blocked_per_copy"] is None else f"{r['blocked_per_copy']:.2f}x"
                per_copy = r["blocked_per_preallocated_copy"]
                ratio += " | —" if per_copy is None else f" | {per_copy:.2f}x"
                background = "—" if r["background_ms"] is None else f"{r['background_ms']:.0f}"
                gate = (
                    f"{r['gate_ms_total_per_save']:.1f}" if r["system"].startswith("tp-") else "—"
                )
                print(f"| {r['system']} | {r['step_s']:.3f} | {r['saves']} | {blocked} | {ratio} "
                      f"| {r['slowdown']:.3f}x | {r['drain_s']:.2f} | {background} | {gate} "
                      f"| {r['checked'] - r['mismatched']}/{r['checked']} |")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        info = {"load_average": os.getloadavg(), "torch": torch.__version__, "args": vars(args)}
        Path(args.json).write_text(json.dumps({"info": info, "rows": all_rows}, indent=1))
    return 1 if any(r["mismatched"] for r in all_rows) else 0


if __name__ == "__main__":
    sys.exit(main())
