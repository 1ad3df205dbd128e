"""Hugging Face Trainer: the cost of a checkpoint, Trainer's own files against trackpoint.

Run: ``.venv/bin/python bench/transformers.py [--small] [--saves 5] [--dir /dev/shm]``.

The same run three times: a GPT-2 built from a config (6 layers, hidden 512, vocabulary 16384:
about 36M parameters, 0.4 GiB with AdamW's state; ``--small``: 2 layers, hidden 128), trained
by ``Trainer`` with AdamW and a linear schedule, saving every ``--every`` steps, ``--saves``
times:

* ``Trainer``: ``transformers.Trainer`` itself (``model.safetensors``, ``optimizer.pt``,
  ``scheduler.pt``, ``rng_state.pth``, ``trainer_state.json``, ``training_args.bin``);
* ``trackpoint``: ``tp.transformers.TrackpointTrainer`` (one checkpoint per directory);
* ``trackpoint async``: the same with ``CheckpointOptions(enable_async=True)``: the time is
  what training waits for (the copy, and any wait for the previous background write).

Each save is timed around Trainer's ``_save_checkpoint`` with every file fsynced inside the
timed region (``measure.fsync_tree``: Trainer's ``torch.save`` does not sync, trackpoint does;
an async save's background write syncs its files itself), so every row is measured durable.
The table gives the median save, its ratio to Trainer's (above 1: faster than Trainer), the
checkpoint size and the whole run's wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script, bench/ is sys.path[0], where this file would shadow `transformers`.
    _HERE = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
    sys.path.insert(0, str(_HERE.parent))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

import trackpoint as tp  # noqa: E402
from bench import measure  # noqa: E402

MIB = 1 << 20


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, samples: int, length: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(1, vocab, (samples, length), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def _timed(base: type) -> type:
    """``base`` with each ``_save_checkpoint`` timed (fsync of the run directory included)."""

    class Timed(base):  # type: ignore[valid-type, misc]
        save_times: list[float]

        def _save_checkpoint(self, model, trial):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            super()._save_checkpoint(model, trial)
            if getattr(self, "_pending_save", None) is None:  # an async write syncs itself
                measure.fsync_tree(self.args.output_dir)
            self.save_times.append(time.perf_counter() - start)

    return Timed


def _model(small: bool) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    if small:
        config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=4096, n_positions=64)
    else:
        config = GPT2Config(n_layer=6, n_embd=512, n_head=8, vocab_size=16384, n_positions=64)
    return GPT2LMHeadModel(config)


def _run(name: str, small: bool, directory: str, saves: int, every: int) -> dict:
    output = os.path.join(directory, name.replace(" ", "-"))
    shutil.rmtree(output, ignore_errors=True)
    model = _model(small)
    args = TrainingArguments(
        output_dir=output, max_steps=saves * every, save_strategy="steps", save_steps=every,
        per_device_train_batch_size=4, report_to=[], use_cpu=True, disable_tqdm=True,
        logging_strategy="no", learning_rate=1e-4, seed=0,
    )
    data = _Tokens(4 * saves * every, 32, model.config.vocab_size)
    if name == "Trainer":
        trainer = _timed(Trainer)(model=model, args=args, train_dataset=data)
    else:
        options = tp.CheckpointOptions(enable_async=name.endswith("async"))
        trainer = _timed(tp.transformers.TrackpointTrainer)(
            model=model, args=args, train_dataset=data, trackpoint_options=options)
    trainer.save_times = []
    start = time.perf_counter()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), \
            contextlib.redirect_stderr(quiet):  # Trainer's printed metrics, progress bars
        trainer.train()
    wall = time.perf_counter() - start
    last = os.path.join(output, f"checkpoint-{saves * every}")
    size = sum(f.stat().st_size for f in Path(last).iterdir() if f.is_file())
    shutil.rmtree(output, ignore_errors=True)
    return {"name": name, "times": trainer.save_times, "size": size, "wall": wall}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a 2-layer, hidden-128 GPT-2")
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--every", type=int, default=2, help="training steps between saves")
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    console = Console(width=150)
    directory = tempfile.mkdtemp(prefix="tp-bench-hf-", dir=args.dir)
    params = sum(p.numel() for p in _model(args.small).parameters())
    console.print(f"GPT-2 with {params / 1e6:.1f}M parameters, {args.saves} saves every "
                  f"{args.every} steps, into {directory}")
    results = []
    try:
        for name in ("Trainer", "trackpoint", "trackpoint async"):
            results.append(_run(name, args.small, directory, args.saves, args.every))
            console.print(f"  {name}: saves " + " ".join(f"{t:.3f}" for t in results[-1]["times"]))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    base = statistics.median(results[0]["times"])
    title = f"Trainer checkpoints: {args.saves} saves per system, medians ({args.dir})"
    table = Table(title=title)
    for column in ("system", "save s (median)", "vs Trainer", "checkpoint MiB", "run wall s"):
        table.add_column(column, justify="left" if column == "system" else "right")
    for r in results:
        median = statistics.median(r["times"])
        table.add_row(r["name"], f"{median:.3f}", f"{base / median:.2f}x",
                      f"{r['size'] / MIB:.1f}", f"{r['wall']:.1f}")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
