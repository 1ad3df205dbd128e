"""Subprocess worker for test_transformers.py: a Trainer run, killed, resumed.

``python hf_trainer_worker.py MODE DIR MODELS`` with MODELS ``gpt2``, ``llama`` or both
(``gpt2,llama``: one process runs each in ``DIR/<model>``, paying for the imports once):

* ``full``: train STEPS steps, saving every SAVE_EVERY through trackpoint; record DIR/full.npz.
* ``crash``: the same run, SIGKILLed while the checkpoint of step KILL_AT is being written.
* ``resume``: a model built from another seed, ``train(resume_from_checkpoint=True)`` in a new
  process; record DIR/resume.npz (the losses of the steps after the checkpoint).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hf_worker_common as common  # noqa: E402
from transformers import TrainingArguments  # noqa: E402

import trackpoint as tp  # noqa: E402


def main(mode: str, directory: str, kind: str) -> None:
    os.makedirs(directory, exist_ok=True)
    common.deterministic()
    args = TrainingArguments(
        output_dir=os.path.join(directory, "out"), max_steps=common.STEPS,
        per_device_train_batch_size=common.BATCH, save_strategy="steps",
        save_steps=common.SAVE_EVERY, save_total_limit=2, logging_steps=1, report_to=[],
        use_cpu=True, seed=0, learning_rate=1e-3, warmup_steps=2, weight_decay=0.01,
        disable_tqdm=True, dataloader_num_workers=0,
    )
    options = None
    if mode == "crash":
        options = tp.CheckpointOptions(progress=common.killer(f"checkpoint-{common.KILL_AT}"))
    model = common.build_model(kind, seed=12345 if mode == "resume" else 0)
    trainer = tp.transformers.TrackpointTrainer(
        model=model, args=args, train_dataset=common.TokenData(), trackpoint_options=options)
    trainer.train(resume_from_checkpoint=True if mode == "resume" else None)
    losses = {entry["step"]: entry["loss"] for entry in trainer.state.log_history
              if "loss" in entry}
    after = [losses[s] for s in sorted(losses) if s > common.KILL_AT - common.SAVE_EVERY]
    common.record(os.path.join(directory, f"{mode}.npz"), trainer.model,
                  trainer.optimizer.optimizer, trainer.lr_scheduler, after)


if __name__ == "__main__":
    # MODEL may be a comma-separated list: one process runs each model's run in DIR/<model>.
    for model_kind in sys.argv[3].split(","):
        main(sys.argv[1], os.path.join(sys.argv[2], model_kind), model_kind)
