"""Hugging Face Accelerate through ``tp.accelerate.save_state``/``load_state``.

* A tiny GPT-2 and a tiny Llama train in a plain Accelerate loop (AdamW, warmup schedule,
  seedable sampler, a custom object registered for checkpointing, automatic checkpoint naming
  with ``total_limit``), are SIGKILLed while a checkpoint is written, and resume bit for bit
  in a new process from the newest complete checkpoint.
* In process: what is saved under which key, custom objects, refusals that change nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
accelerate = pytest.importorskip("accelerate")

import hf_worker_common as common  # noqa: E402
from accelerate import Accelerator  # noqa: E402

import trackpoint as tp  # noqa: E402
from trackpoint.errors import InvalidArgumentError, NotFoundError  # noqa: E402

WORKER = str(Path(__file__).with_name("hf_accelerate_worker.py"))
def _run(mode: str, directory: Path, kinds: str) -> subprocess.CompletedProcess:
    return common.run_worker(WORKER, mode, directory, kinds)


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    """Both models: uninterrupted, killed mid-save (one process each), resumed: 4 processes."""
    root = tmp_path_factory.mktemp("accelerate")
    result = _run("full", root / "full", "gpt2,llama")
    assert result.returncode == 0, result.stderr
    after_crash = {}
    for kind in ("gpt2", "llama"):
        result = _run("crash", root / "run", kind)
        assert result.returncode == -signal.SIGKILL, result.stderr
        checkpoints = root / "run" / kind / "checkpoints"
        after_crash[kind] = (sorted(os.listdir(checkpoints)),
                             tp.accelerate.latest_state(str(checkpoints)))
    result = _run("resume", root / "run", "gpt2,llama")
    assert result.returncode == 0, result.stderr
    return root, after_crash


@pytest.mark.slow  # its fixture trains, kills and resumes Accelerate processes: ~62 s here
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_accelerate_killed_mid_save_resumes_bit_for_bit(killed_and_resumed, kind):
    root, after_crash = killed_and_resumed
    checkpoints = root / "run" / kind / "checkpoints"
    listing, latest = after_crash[kind]
    killed = common.KILL_AT // common.SAVE_EVERY - 1  # checkpoint_<i> numbers saves from 0
    assert listing == [f".checkpoint_{killed}.trackpoint-partial", f"checkpoint_{killed - 2}",
                       f"checkpoint_{killed - 1}"]  # total_limit=2
    assert latest == str(checkpoints / f"checkpoint_{killed - 1}")
    common.assert_same_records(root / "full" / kind / "full.npz",
                               root / "run" / kind / "resume.npz")
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_2", "checkpoint_3"]
    assert sorted(os.listdir(root / "full" / kind / "checkpoints")) == ["checkpoint_2",
                                                                        "checkpoint_3"]


class Counter:
    """A custom object: anything with state_dict()/load_state_dict()."""

    def __init__(self) -> None:
        self.count, self.history = 0, [0.5]

    def state_dict(self) -> dict:
        return {"count": self.count, "history": list(self.history),
                "tensor": torch.full((2,), float(self.count))}

    def load_state_dict(self, state: dict) -> None:
        self.count, self.history = state["count"], state["history"]
        assert torch.equal(state["tensor"], torch.full((2,), float(self.count)))


def _prepared(seed: int):
    torch.manual_seed(seed)
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2),
                                torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    return accelerator, model, optimizer, scheduler, counter


def _step(accelerator, model, optimizer, scheduler) -> None:
    loss = model(torch.randn(5, 4)).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def test_save_and_load_state_round_trip_with_custom_objects(tmp_path):
    accelerator, model, optimizer, scheduler, counter = _prepared(0)
    for _ in range(3):
        _step(accelerator, model, optimizer, scheduler)
    counter.count, counter.history = 3, [0.5, 0.25]
    accelerator.step = 7
    saved = tp.accelerate.save_state(accelerator, tmp_path / "state")
    assert saved == str(tmp_path / "state")
    keys = {key for key, _ in tp.list_variables(saved)}
    assert "model/0/weight/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "model/0/weight/.OPTIMIZER_SLOT/optimizer/exp_avg/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert {"scheduler/.ATTRIBUTES/py_state", "custom_0/.ATTRIBUTES/py_state",
            "rng/torch/cpu/.ATTRIBUTES/VARIABLE_VALUE"} <= keys
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    expected_draw = torch.rand(3)

    other, model2, optimizer2, scheduler2, counter2 = _prepared(1)
    assert tp.accelerate.load_state(other, tmp_path / "state") == str(tmp_path / "state")
    for name, value in model2.state_dict().items():
        assert torch.equal(value, expected[name]), name
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG came back too
    assert (counter2.count, counter2.history) == (3, [0.5, 0.25])
    assert other.step == 7
    assert scheduler2.scheduler.last_epoch == 3
    assert optimizer2.optimizer.state_dict()["state"][0]["step"] == 3


def test_load_state_refuses_before_changing_anything(tmp_path):
    accelerator, model, optimizer, scheduler, _ = _prepared(0)
    tp.accelerate.save_state(accelerator, tmp_path / "state")

    other, model2, *_ = _prepared(1)
    other.register_for_checkpointing(Counter())  # one more custom object than was saved
    before = {k: v.clone() for k, v in model2.state_dict().items()}
    with pytest.raises(InvalidArgumentError, match=r"missing from the checkpoint: \['custom_1'\]"):
        tp.accelerate.load_state(other, tmp_path / "state")
    for name, value in model2.state_dict().items():
        assert torch.equal(value, before[name]), name

    (tmp_path / "native").mkdir()
    (tmp_path / "native" / "optimizer.bin").write_bytes(b"pickle")
    with pytest.raises(InvalidArgumentError, match="accelerator.load_state"):
        tp.accelerate.load_state(accelerator, tmp_path / "native")
    with pytest.raises(NotFoundError):
        tp.accelerate.load_state(accelerator, tmp_path / "missing")
    with pytest.raises(InvalidArgumentError, match="needs output_dir"):
        tp.accelerate.save_state(accelerator)
    with pytest.raises(InvalidArgumentError, match="enable_async"):
        tp.accelerate.save_state(accelerator, tmp_path / "x",
                                 options=tp.CheckpointOptions(enable_async=True))


def test_staged_directory_appears_complete_and_replaces_atomically(tmp_path):
    from trackpoint.integrations.accelerate_state import StagedDirectory

    final = tmp_path / "checkpoint_0"
    staged = StagedDirectory(str(final))
    (Path(staged.path) / "a").write_text("new")
    assert not final.exists()  # nothing under the final name until the commit
    assert staged.commit() == str(final)
    assert (final / "a").read_text() == "new" and not Path(staged.path).exists()

    (tmp_path / ".checkpoint_0.trackpoint-partial").mkdir()  # left by a killed save
    (tmp_path / ".checkpoint_0.trackpoint-partial" / "junk").write_text("x")
    again = StagedDirectory(str(final))
    assert os.listdir(again.path) == []  # the leftover was removed, not reused
    (Path(again.path) / "b").write_text("newer")
    again.commit()
    assert sorted(os.listdir(final)) == ["b"]  # replaced whole, never merged
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_0"]
    with pytest.raises(InvalidArgumentError, match="must not be empty or start with"):
        StagedDirectory(str(tmp_path / ".hidden"))
