"""``trackpoint demo``: train, checkpoint, get SIGKILLed, resume, and prove nothing was lost.

A small numpy MLP is trained with SGD + momentum under a ``CheckpointManager`` in a child
process. The child is killed with SIGKILL at a random moment after its first checkpoint, then a
fresh process resumes from ``latest_checkpoint`` and finishes. A second, uninterrupted run is the
reference: the resumed run must end with bit-identical weights.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from trackpoint.cli.output import Output

__all__ = ["run", "train"]

SAVE_EVERY = 10
MAX_TO_KEEP = 3
SIZES = (256, 512, 10)


def _init_params(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d_in, d_hidden, d_out = SIZES
    return {
        "w1": (rng.standard_normal((d_in, d_hidden)) / np.sqrt(d_in)).astype(np.float32),
        "b1": np.zeros(d_hidden, np.float32),
        "w2": (rng.standard_normal((d_hidden, d_out)) / np.sqrt(d_hidden)).astype(np.float32),
        "b2": np.zeros(d_out, np.float32),
    }


def _batch(seed: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Each step's data depends only on (seed, step), so a resumed run sees the same data."""
    rng = np.random.default_rng([seed, step])
    x = rng.standard_normal((256, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[2], size=256)
    return x, y


def _train_step(params: dict[str, np.ndarray], velocity: dict[str, np.ndarray],
                x: np.ndarray, y: np.ndarray, lr: float = 0.05, momentum: float = 0.9) -> float:
    h = np.maximum(x @ params["w1"] + params["b1"], 0)
    logits = h @ params["w2"] + params["b2"]
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    loss = float(-np.log(p[np.arange(len(y)), y] + 1e-9).mean())
    g_logits = p
    g_logits[np.arange(len(y)), y] -= 1
    g_logits /= len(y)
    grads = {"w2": h.T @ g_logits, "b2": g_logits.sum(0)}
    g_h = (g_logits @ params["w2"].T) * (h > 0)
    grads["w1"] = x.T @ g_h
    grads["b1"] = g_h.sum(0)
    for name, g in grads.items():
        v = velocity[name]
        v *= momentum
        v += g.astype(np.float32)
        params[name] -= lr * v  # in place: the checkpoint tracks these very arrays
    return loss


class _NumpyRun:
    """The numpy MLP with SGD + momentum; the checkpoint tracks its arrays in place."""

    name = "numpy MLP, SGD with momentum"

    def __init__(self, seed: int) -> None:
        self.params = _init_params(seed)
        self.velocity = {k: np.zeros_like(v) for k, v in self.params.items()}

    def state(self) -> dict[str, Any]:
        return {"params": self.params, "velocity": self.velocity}

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        return _train_step(self.params, self.velocity, x, y)


class _TorchRun:
    """The same MLP in PyTorch with Adam and a step LR schedule: plain torch objects."""

    name = "PyTorch MLP, Adam + StepLR"

    def __init__(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        d_in, d_hidden, d_out = SIZES
        self.torch = torch
        self.model = torch.nn.Sequential(
            torch.nn.Linear(d_in, d_hidden), torch.nn.ReLU(), torch.nn.Linear(d_hidden, d_out)
        )
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=50, gamma=0.5)

    def state(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        torch = self.torch
        loss = torch.nn.functional.cross_entropy(
            self.model(torch.from_numpy(x)), torch.from_numpy(y)
        )
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        return float(loss.detach())


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def backend_run(backend: str, seed: int) -> _NumpyRun | _TorchRun:
    """The model to train: PyTorch when ``backend`` is "torch" (or "auto" and torch imports)."""
    if backend == "torch" or (backend == "auto" and _torch_available()):
        return _TorchRun(seed)
    return _NumpyRun(seed)


def train(directory: str, steps: int, seed: int, emit: Any = None,
          backend: str = "numpy") -> dict[str, Any]:
    """Train to ``steps``, resuming from ``directory``'s latest checkpoint if there is one."""
    import trackpoint as tp

    run = backend_run(backend, seed)
    step = tp.Variable(np.int64(0), name="step")
    ckpt = tp.Checkpoint(**run.state(), step=step)
    manager = tp.CheckpointManager(ckpt, directory, max_to_keep=MAX_TO_KEEP)
    resumed_from = manager.restore_or_initialize()
    emit = emit or (lambda **kw: None)
    emit(event="start", step=int(step.numpy()), resumed_from=resumed_from)
    # The last progress event of each save carries its figures (tp.metrics.WriteStats).
    figures: list[Any] = []
    options = tp.CheckpointOptions(
        progress=lambda e: figures.append(e.stats) if e.stats is not None else None
    )
    save_ms = []
    loss = float("nan")
    while int(step.numpy()) < steps:
        x, y = _batch(seed, int(step.numpy()))
        loss = run.step(x, y)
        step.assign(step.numpy() + 1)
        if int(step.numpy()) % SAVE_EVERY == 0:
            t0 = time.perf_counter()
            path = manager.save(options=options)
            save_ms.append((time.perf_counter() - t0) * 1e3)
            stats = figures.pop()
            emit(event="saved", step=int(step.numpy()), path=path, ms=save_ms[-1],
                 blocking_ms=stats.blocking_seconds * 1e3, bytes=stats.checkpoint_bytes,
                 shards=stats.num_shards, training_s=stats.training_seconds)
    final = tp.Checkpoint(**run.state(), step=step)
    final_path = final.write(os.path.join(directory, "final"))
    emit(event="done", step=int(step.numpy()), loss=loss, final=final_path)
    return {"save_ms": save_ms, "final": final_path, "checkpoints": manager.checkpoints,
            "resumed_from": resumed_from, "loss": loss}


def _worker(args: argparse.Namespace) -> int:
    def emit(**kw: Any) -> None:
        sys.stdout.write(json.dumps(kw) + "\n")
        sys.stdout.flush()

    train(args.dir, args.steps, args.seed, emit, backend=args.backend)
    return 0


def _spawn(directory: str, steps: int, seed: int, backend: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "trackpoint.cli", "demo", "--worker", "--dir", directory,
           "--steps", str(steps), "--seed", str(seed), "--backend", backend]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def _events(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    assert proc.stdout is not None
    out, _ = proc.communicate()
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _saves_table(saves: list[dict[str, Any]], last: int = 8) -> Table:
    """The figures of the latest saves, as the progress callback reported them."""
    table = Table(title="checkpoints written (live)", title_justify="left")
    for column in ("step", "blocked", "size", "shards", "training since previous"):
        table.add_column(column, justify="right")
    for save in saves[-last:]:
        training = save.get("training_s")
        table.add_row(
            str(save["step"]), f"{save['blocking_ms']:.1f} ms", f"{save['bytes']:,} B",
            str(save["shards"]), "-" if training is None else f"{training * 1e3:.0f} ms",
        )
    return table


def _committed_step(prefix: str | None) -> int | None:
    """The training step stored in the checkpoint ``prefix`` (read from disk)."""
    if prefix is None:
        return None
    import trackpoint as tp

    return int(tp.load_variable(prefix, "step"))


def _dir_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
               if os.path.isfile(os.path.join(directory, f)))


def run(args: argparse.Namespace, console: Console) -> int:
    """Run the crash/resume demo; exit code 0 iff the resumed weights equal the reference."""
    if args.worker:
        return _worker(args)
    import trackpoint as tp

    out = Output(console)  # plain, unwrapped lines when piped
    root = args.dir or tempfile.mkdtemp(prefix="trackpoint-demo-")
    crashed, clean = os.path.join(root, "crashed"), os.path.join(root, "clean")
    rng = random.Random()
    backend = "torch" if args.backend == "torch" or (
        args.backend == "auto" and _torch_available()) else "numpy"
    out.line(f"[bold]trackpoint demo[/] in {root}: {backend_run(backend, 0).name}, "
             f"{args.steps} steps, a checkpoint every {SAVE_EVERY}, keeping {MAX_TO_KEEP}")

    # 1. Train in a child and SIGKILL it at a random moment: after a random number of
    # checkpoints, a random fraction of a second later (mid-step or mid-save).
    proc = _spawn(crashed, args.steps, args.seed, backend)
    assert proc.stdout is not None
    kill_after_saves = rng.randint(1, max(1, args.steps // SAVE_EVERY // 2))
    saved: list[dict[str, Any]] = []
    # A live table on a terminal; in a pipe, one plain line per checkpoint (a Live display
    # there prints only its last frame, and without the line break the next line needs).
    live = Live(_saves_table(saved), console=console, auto_refresh=False)
    with live if console.is_terminal else contextlib.nullcontext():
        for line in proc.stdout:
            event = json.loads(line)
            if event["event"] == "saved":
                saved.append(event)
                if console.is_terminal:
                    live.update(_saves_table(saved), refresh=True)
                else:
                    out.line(f"checkpoint at step {event['step']} written")
                if len(saved) >= kill_after_saves:
                    break
    time.sleep(rng.uniform(0.0, 0.3))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # What happened is on disk: the child kept training (and maybe saving) after the last
    # event read above, until the signal landed.
    latest = tp.latest_checkpoint(crashed)
    disk_step = _committed_step(latest)
    out.line(f"1. training process killed with SIGKILL (running since its checkpoint at "
             f"step {saved[-1]['step']}); the latest committed checkpoint on disk is "
             f"[cyan]{latest}[/], step {disk_step}")

    # 2. Resume in a fresh process.
    resume = _events(_spawn(crashed, args.steps, args.seed, backend))
    start = resume[0]
    out.line(f"2. resumed from {start['resumed_from']} at step {start['step']} and "
             f"trained to step {resume[-1]['step']}")
    if start["step"] != disk_step:
        out.line(f"[bold red]FAILED[/]: the resumed run started at step {start['step']} "
                 f"from {start['resumed_from']}, not at the committed step {disk_step}")
        return 1

    # 3. The reference: one uninterrupted run.
    reference = _events(_spawn(clean, args.steps, args.seed, backend))
    out.line(f"3. reference run without interruption finished at step "
             f"{reference[-1]['step']}")

    # 4. Compare every tensor of the final states bit for bit.
    mismatched = []
    with tp.load_checkpoint(resume[-1]["final"]) as a, tp.load_checkpoint(
            reference[-1]["final"]) as b:
        keys = [k for k in a.get_variable_to_shape_map() if not k.startswith("_")]
        for key in keys:
            if not np.array_equal(a.get_tensor(key), b.get_tensor(key)):
                mismatched.append(key)
    saves = [e for e in resume + reference if e["event"] == "saved"]
    table = Table(title="summary", title_justify="left")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("checkpoints kept", ", ".join(sorted(
        f for f in os.listdir(crashed) if f.endswith(".index"))))
    table.add_row("bytes on disk (crashed run dir)", f"{_dir_bytes(crashed):,}")
    table.add_row("saves timed", str(len(saves)))
    if saves:
        ms = sorted(e["ms"] for e in saves)
        table.add_row("median save time", f"{ms[len(ms) // 2]:.1f} ms")
        blocked = sorted(e["blocking_ms"] for e in saves)
        table.add_row("median time training was blocked (figures)",
                      f"{blocked[len(blocked) // 2]:.1f} ms")
        table.add_row("checkpoint size (figures)", f"{saves[-1]['bytes']:,} B")
    table.add_row("tensors compared", str(len(keys)))
    console.print(table)
    if mismatched:
        out.line(f"[bold red]FAILED[/]: {len(mismatched)} tensors differ: {mismatched}")
        return 1
    out.line("[bold green]OK[/]: the resumed run ended with exactly the weights of the "
             "uninterrupted run")
    return 0
