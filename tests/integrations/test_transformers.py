"""Hugging Face Trainer through ``tp.transformers.TrackpointTrainer``.

* A tiny GPT-2 and a tiny Llama train under Trainer, are SIGKILLed while a checkpoint is being
  written, and ``train(resume_from_checkpoint=True)`` in a new process ends bit for bit where
  the uninterrupted run does (weights, AdamW state, LR, losses, the next random numbers).
* ``save_total_limit`` and ``load_best_model_at_end`` behave as with Trainer's own files,
  with synchronous and async saves.
* ``trackpoint convert`` turns a checkpoint into what ``from_pretrained`` loads (tied weights).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_worker_common as common  # noqa: E402
from transformers import AutoModelForCausalLM, TrainingArguments  # noqa: E402
from transformers.trainer_utils import get_last_checkpoint as hf_get_last_checkpoint  # noqa: E402

import trackpoint as tp  # noqa: E402
from trackpoint.cli.main import main as cli  # noqa: E402
from trackpoint.errors import FailedPreconditionError, InvalidArgumentError  # noqa: E402

WORKER = str(Path(__file__).with_name("hf_trainer_worker.py"))
def _run(mode: str, directory: Path, kinds: str) -> subprocess.CompletedProcess:
    return common.run_worker(WORKER, mode, directory, kinds)


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    """Both models: uninterrupted, killed mid-save (one process each), resumed.

    The uninterrupted runs share a process, as do the resumed ones: four processes in all.
    """
    root = tmp_path_factory.mktemp("trainer")
    result = _run("full", root / "full", "gpt2,llama")
    assert result.returncode == 0, result.stderr
    after_crash = {}
    for kind in ("gpt2", "llama"):
        result = _run("crash", root / "run", kind)
        assert result.returncode == -signal.SIGKILL, result.stderr
        out = root / "run" / kind / "out"
        after_crash[kind] = (sorted(os.listdir(out)), hf_get_last_checkpoint(str(out)),
                             tp.transformers.get_last_checkpoint(out))
    result = _run("resume", root / "run", "gpt2,llama")
    assert result.returncode == 0, result.stderr
    return root, after_crash


@pytest.mark.slow  # its fixture trains, kills and resumes Trainer processes: ~68 s here
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_trainer_killed_mid_save_resumes_bit_for_bit(killed_and_resumed, kind):
    root, after_crash = killed_and_resumed
    out = root / "run" / kind / "out"
    listing, theirs, ours = after_crash[kind]
    # The save of KILL_AT was cut short: only its hidden staging directory exists, so
    # Trainer's own get_last_checkpoint and ours both pick the previous one.
    previous = str(out / f"checkpoint-{common.KILL_AT - common.SAVE_EVERY}")
    assert listing == [f".checkpoint-{common.KILL_AT}.trackpoint-partial", "checkpoint-2",
                       "checkpoint-4"]
    assert theirs == previous and ours == previous
    common.assert_same_records(root / "full" / kind / "full.npz",
                               root / "run" / kind / "resume.npz")
    # save_total_limit=2: the two newest remain, the staging directory is gone.
    assert sorted(os.listdir(out)) == ["checkpoint-6", "checkpoint-8"]


def _args(directory: Path, **overrides) -> TrainingArguments:
    settings = {
        "output_dir": str(directory), "max_steps": 8, "per_device_train_batch_size": 4,
        "save_strategy": "steps", "save_steps": 2, "report_to": [], "use_cpu": True,
        "seed": 0, "learning_rate": 1e-3, "disable_tqdm": True, "logging_steps": 1,
    }
    settings.update(overrides)
    return TrainingArguments(**settings)


def _weights(checkpoint: str) -> dict:
    prefix = tp.latest_checkpoint(checkpoint)
    assert prefix is not None
    return tp.torch.load_state_dict(prefix, root="model")


@pytest.mark.parametrize("enable_async", [False, True], ids=["sync", "async"])
def test_total_limit_keeps_the_best_and_load_best_model_at_end_loads_it(tmp_path, enable_async):
    scores = iter([3.0, 1.0, 2.0, 4.0])  # evaluations at steps 2, 4, 6, 8: step 4 is best
    args = _args(tmp_path, eval_strategy="steps", eval_steps=2, save_total_limit=2,
                 load_best_model_at_end=True, metric_for_best_model="score",
                 greater_is_better=False)
    trainer = tp.transformers.TrackpointTrainer(
        model=common.build_model("gpt2", seed=0), args=args, train_dataset=common.TokenData(),
        eval_dataset=torch.utils.data.Subset(common.TokenData(), range(4)),
        compute_metrics=lambda _: {"score": next(scores)},
        trackpoint_options=tp.CheckpointOptions(enable_async=enable_async),
    )
    trainer.train()
    # The most recent (for resuming) and the best one are kept, as Trainer keeps them
    # (checkpoint-6 went when checkpoint-8 was committed).
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-4", "checkpoint-8"]
    assert trainer.state.best_model_checkpoint == str(tmp_path / "checkpoint-4")
    best, last = _weights(str(tmp_path / "checkpoint-4")), _weights(str(tmp_path / "checkpoint-8"))
    live = trainer.model.state_dict()
    assert any(not torch.equal(best[name], last[name]) for name in best)
    for name, value in best.items():
        assert torch.equal(live[name], value), name
    state = tp.load_checkpoint(str(tmp_path / "checkpoint-8"))
    assert state.has_tensor("rng/python/.ATTRIBUTES/py_state")
    assert (tmp_path / "checkpoint-8" / "trainer_state.json").is_file()
    assert not (tmp_path / "checkpoint-8" / "training_args.bin").exists()  # no pickle


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_checkpoint_converts_to_what_from_pretrained_loads(tmp_path, kind):
    model = common.build_model(kind, seed=0)
    trainer = tp.transformers.TrackpointTrainer(
        model=model, args=_args(tmp_path, max_steps=2), train_dataset=common.TokenData())
    trainer.train()
    checkpoint = tmp_path / "checkpoint-2"
    # The README's one command: safetensors with state_dict names (tied aliases included)
    # next to the config.json the checkpoint directory already holds.
    assert cli(["convert", str(checkpoint), str(checkpoint / "model.safetensors"),
                "--root", "model"]) == 0
    loaded = AutoModelForCausalLM.from_pretrained(str(checkpoint))
    assert type(loaded) is type(model)
    trained, exported = model.state_dict(), loaded.state_dict()
    assert sorted(trained) == sorted(exported)
    for name, value in trained.items():
        assert torch.equal(value, exported[name]), name
    if kind == "gpt2":
        assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()


def test_get_last_checkpoint_takes_only_complete_directories(tmp_path):
    assert tp.transformers.get_last_checkpoint(tmp_path / "missing") is None
    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3" / "trainer_state.json").write_text("{}")  # Trainer's own, done
    (tmp_path / "checkpoint-7").mkdir()  # Trainer's own, killed before trainer_state.json
    (tmp_path / ".checkpoint-9.trackpoint-partial").mkdir()
    assert tp.transformers.get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-3")
    assert not tp.transformers.is_trackpoint_checkpoint(tmp_path / "checkpoint-3")


def test_refuses_push_to_hub_and_bad_options(tmp_path):
    model = common.build_model("llama", seed=0)
    with pytest.raises(FailedPreconditionError, match="push an exported model"):
        tp.transformers.TrackpointTrainer(model=model, args=_args(tmp_path, push_to_hub=True))
    with pytest.raises(InvalidArgumentError, match="tp.CheckpointOptions"):
        tp.transformers.TrackpointTrainer(model=model, args=_args(tmp_path),
                                          trackpoint_options={"enable_async": True})
    trainer = tp.transformers.TrackpointTrainer(model=model, args=_args(tmp_path))
    with pytest.raises(FailedPreconditionError, match="no complete checkpoint"):
        trainer.train(resume_from_checkpoint=True)


@pytest.mark.slow  # two Trainer runs: ~13 s here
def test_directories_trainer_wrote_itself_still_resume(tmp_path):
    data = common.TokenData()
    plain = transformers.Trainer(model=common.build_model("gpt2", seed=0),
                                 args=_args(tmp_path, max_steps=2), train_dataset=data)
    plain.train()  # checkpoint-2/ of torch.save and safetensors files
    saved = {k: v.clone() for k, v in plain.model.state_dict().items()}
    assert not tp.transformers.is_trackpoint_checkpoint(tmp_path / "checkpoint-2")

    trainer = tp.transformers.TrackpointTrainer(
        model=common.build_model("gpt2", seed=1), args=_args(tmp_path, max_steps=2),
        train_dataset=data)
    trainer.train(resume_from_checkpoint=True)  # nothing left to train: only the load
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, saved[name]), name

    trainer = tp.transformers.TrackpointTrainer(
        model=common.build_model("gpt2", seed=1), args=_args(tmp_path, max_steps=4),
        train_dataset=data)
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 4
    assert tp.transformers.is_trackpoint_checkpoint(tmp_path / "checkpoint-4")
