"""Subprocess worker for test_accelerate.py: a plain Accelerate loop, killed, resumed.

``python hf_accelerate_worker.py MODE DIR MODELS`` with MODELS ``gpt2``, ``llama`` or both
(``gpt2,llama``: one process runs each in ``DIR/<model>``, paying for the imports once):

* ``full``: train STEPS steps with AdamW and a warmup schedule, saving every SAVE_EVERY with
  ``tp.accelerate.save_state`` (automatic naming, ``total_limit=2``); record DIR/full.npz.
* ``crash``: the same run, SIGKILLed while the checkpoint of step KILL_AT is being written.
* ``resume``: a model built from another seed, ``tp.accelerate.load_state(accelerator)`` (the
  newest complete checkpoint) in a new process, then on to STEPS; record DIR/resume.npz.

A registered custom object (``Progress``) carries the step and the losses, so the loop's own
position comes back through ``register_for_checkpointing``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hf_worker_common as common  # noqa: E402
import torch  # noqa: E402
from accelerate import Accelerator, DataLoaderConfiguration  # noqa: E402
from accelerate.utils import ProjectConfiguration, set_seed  # noqa: E402
from transformers import get_linear_schedule_with_warmup  # noqa: E402

import trackpoint as tp  # noqa: E402

PER_EPOCH = common.SAMPLES // common.BATCH


class Progress:
    """The loop's position: registered for checkpointing like any custom object."""

    def __init__(self) -> None:
        self.step = 0
        self.losses: list[float] = []

    def state_dict(self) -> dict:
        return {"step": self.step, "losses": list(self.losses)}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]
        self.losses = list(state["losses"])


def main(mode: str, directory: str, kind: str) -> None:
    os.makedirs(directory, exist_ok=True)
    common.deterministic()
    accelerator = Accelerator(
        cpu=True,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        project_config=ProjectConfiguration(project_dir=directory,
                                            automatic_checkpoint_naming=True, total_limit=2),
    )
    set_seed(0)
    model = common.build_model(kind, seed=12345 if mode == "resume" else 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, common.STEPS)
    # The loader's own generator: drawing its base seed leaves the global RNG (dropout) alone.
    loader = torch.utils.data.DataLoader(common.TokenData(), batch_size=common.BATCH,
                                         shuffle=True, generator=torch.Generator().manual_seed(1))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    options = None
    if mode == "crash":
        index = common.KILL_AT // common.SAVE_EVERY - 1  # checkpoint_<i> counts saves from 0
        options = tp.CheckpointOptions(progress=common.killer(f"checkpoint_{index}"))
    if mode == "resume":
        tp.accelerate.load_state(accelerator)
    first = progress.step
    model.train()
    while progress.step < common.STEPS:
        loader.set_epoch(progress.step // PER_EPOCH)
        skip = progress.step % PER_EPOCH
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        for batch in batches:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.step += 1
            progress.losses.append(float(loss.item()))
            if progress.step % common.SAVE_EVERY == 0:
                tp.accelerate.save_state(accelerator, options=options)
            if progress.step == common.STEPS:
                break
    del first
    after = progress.losses[common.KILL_AT - common.SAVE_EVERY:]
    common.record(os.path.join(directory, f"{mode}.npz"), accelerator.unwrap_model(model),
                  optimizer.optimizer, scheduler.scheduler, after)


if __name__ == "__main__":
    # MODEL may be a comma-separated list: one process runs each model's run in DIR/<model>.
    for model_kind in sys.argv[3].split(","):
        main(sys.argv[1], os.path.join(sys.argv[2], model_kind), model_kind)
