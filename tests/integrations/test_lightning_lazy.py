"""``TrackpointCheckpointIO`` with async and lazy snapshots (issue 29).

Each checkpoint of a fit holds exactly the state at its save call (copies taken in
``on_save_checkpoint``), the parameters and optimizer state are left to the background (the
bytes copied at the call are fewer than the state's), the optimizer's next step finishes the
copies when the writer thread has not, and a change outside the optimizer fails the fit.
"""

from __future__ import annotations

import os
import threading

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402

import trackpoint as tp  # noqa: E402
from trackpoint.errors import FailedPreconditionError  # noqa: E402
from trackpoint.integrations.torch_lazy import step_gate  # noqa: E402
from trackpoint.saving.lazy_snapshot import LazyCopy  # noqa: E402

TrackpointCheckpointIO = tp.lightning.TrackpointCheckpointIO


class Regressor(L.LightningModule):
    """Linear → BatchNorm → Linear with Adam: parameters, optimizer state and buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return ((self.net(x) - y) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


def _data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=generator)
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8
    )


class Recorder(Callback):
    """Copies of the tensors of every dict Lightning saves, by global step, at the call."""

    def __init__(self) -> None:
        self.at_call: dict[int, dict[str, torch.Tensor]] = {}
        self.saves_at: list[int] = []

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        copies = {f"state_dict/{k}": v.clone() for k, v in checkpoint["state_dict"].items()}
        for index, state in checkpoint["optimizer_states"][0]["state"].items():
            for name, value in state.items():
                copies[f"opt/{index}/{name}"] = value.clone()
        self.at_call[trainer.global_step] = copies
        self.saves_at.append(trainer.global_step)


def _flat(loaded: dict) -> dict[str, torch.Tensor]:
    flat = {f"state_dict/{k}": v for k, v in loaded["state_dict"].items()}
    for index, state in loaded["optimizer_states"][0]["state"].items():
        for name, value in state.items():
            flat[f"opt/{index}/{name}"] = value
    return flat


class HoldWriter(Callback):
    """The writer thread finishes a lazy snapshot's copies only after the next optimizer step.

    So that step's pre-hook must have made them. Released for good at the end of training
    (the last save has no next step; ``teardown`` then waits for the writes).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._cond = threading.Condition()
        self._step = 0
        self._ended = False
        real = LazyCopy.complete

        def held(copy: LazyCopy):  # noqa: ANN202
            with self._cond:
                start = self._step
                assert self._cond.wait_for(lambda: self._step > start or self._ended, 60)
            return real(copy)

        monkeypatch.setattr(LazyCopy, "complete", held)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        with self._cond:
            self._step = trainer.global_step
            self._cond.notify_all()

    def on_train_end(self, trainer, pl_module) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()


def _fit(tmp_path, *callbacks, options: tp.CheckpointOptions) -> tuple[Regressor, L.Trainer]:
    torch.manual_seed(0)
    model = Regressor()
    trainer = L.Trainer(
        max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu", devices=1, plugins=[TrackpointCheckpointIO(options)],
        callbacks=[
            ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1,
                            save_last=True),
            *callbacks,
        ],
    )
    trainer.fit(model, _data())
    return model, trainer


def test_j1_lightning_lazy_checkpoints_hold_the_values_at_each_call(tmp_path, monkeypatch):
    staged: list[int] = []

    def progress(event) -> None:  # noqa: ANN001
        if event.phase == "stage":
            staged.append(event.bytes_done)

    recorder = Recorder()
    options = tp.CheckpointOptions(enable_async=True, lazy_snapshot=True, progress=progress)
    model, trainer = _fit(tmp_path, recorder, HoldWriter(monkeypatch), options=options)

    # The writer was held: the optimizer's next step made the copies before changing values.
    assert step_gate(trainer.optimizers[0]).calls > 0
    names = sorted(n for n in os.listdir(tmp_path) if n != "last.ckpt")
    assert names == [f"epoch={(s - 1) // 4}-step={s}.ckpt" for s in (2, 4, 6, 8)]
    for name in names:
        step = int(name.rpartition("=")[2].removesuffix(".ckpt"))
        loaded = _flat(tp.lightning.read_checkpoint_dict(str(tmp_path / name)))
        expected = recorder.at_call[step]
        assert sorted(loaded) == sorted(expected)
        for key, value in expected.items():
            assert torch.equal(loaded[key], value), (name, key)
    last = _flat(tp.lightning.read_checkpoint_dict(str(tmp_path / "last.ckpt")))
    for key, value in recorder.at_call[8].items():
        assert torch.equal(last[key], value), key

    # Parameters and Adam's moments were left to the background: far fewer bytes at the call.
    owned = sum(p.numel() * 4 * 3 for p in model.parameters())
    assert staged and max(staged[1:]) < owned / 3


def test_lightning_lazy_change_outside_the_optimizer_fails_the_fit(tmp_path, monkeypatch):
    class Scale(Callback):
        """After each save, scales a weight in place under no_grad (an EMA-like change)."""

        def __init__(self) -> None:
            self.saved = False

        def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
            self.saved = True

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if self.saved:
                with torch.no_grad():
                    pl_module.net[0].weight.mul_(0.5)
                self.saved = False

    options = tp.CheckpointOptions(enable_async=True, lazy_snapshot=True)
    with pytest.raises(FailedPreconditionError, match=r"net/0/weight.*changed after save"):
        _fit(tmp_path, Scale(), HoldWriter(monkeypatch), options=options)


def test_lightning_async_without_lazy_copies_at_the_call(tmp_path):
    recorder = Recorder()
    _fit(tmp_path, recorder, options=tp.CheckpointOptions(enable_async=True))
    loaded = _flat(tp.lightning.read_checkpoint_dict(str(tmp_path / "epoch=0-step=2.ckpt")))
    for key, value in recorder.at_call[2].items():
        assert torch.equal(loaded[key], value), key
