"""Lightning and Fabric through ``tp.lightning.TrackpointCheckpointIO``.

A fit resumed from ``ckpt_path="last"`` ends bit for bit where an uninterrupted fit does;
``ModelCheckpoint``'s top-k removal, ``save_last`` (copy and link) and ``AsyncCheckpointIO``
work on the checkpoint directories; the dict Lightning saved comes back equal, types included.
"""

from __future__ import annotations

import math
import os
import pathlib
from collections import OrderedDict

import numpy as np
import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO  # noqa: E402

import trackpoint as tp  # noqa: E402
from trackpoint.errors import InvalidArgumentError  # noqa: E402

TrackpointCheckpointIO = tp.lightning.TrackpointCheckpointIO


class Regressor(L.LightningModule):
    """Linear → BatchNorm → Linear with Adam and StepLR: every kind of state Lightning saves."""

    def __init__(self, hidden: int = 8, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, hidden), torch.nn.BatchNorm1d(hidden), torch.nn.Linear(hidden, 1)
        )
        self.register_buffer("scale", torch.ones(hidden, dtype=torch.bfloat16))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = ((self.net(x) * self.scale.float().mean() - y) ** 2).mean()
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)}


def _data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=generator)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(32, 1, generator=generator)
    # No shuffling: Lightning does not checkpoint the global RNG, so a resumed run could not
    # draw the same order.
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def _model(seed: int) -> Regressor:
    torch.manual_seed(seed)
    return Regressor()


def _trainer(epochs: int, *callbacks, plugin=None, **kwargs):
    return L.Trainer(
        max_epochs=epochs, callbacks=list(callbacks), plugins=[plugin or TrackpointCheckpointIO()],
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu", devices=1, **kwargs,
    )


def _assert_same_state(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(a[name], b[name]), name


def test_fit_resumed_from_last_matches_uninterrupted_fit_bit_for_bit(tmp_path):
    full = _model(0)
    _trainer(4, ModelCheckpoint(dirpath=tmp_path / "full", save_last=True)).fit(full, _data())

    first = _model(0)
    _trainer(2, ModelCheckpoint(dirpath=tmp_path / "run", save_last=True)).fit(first, _data())
    last = tmp_path / "run" / "last.ckpt"
    assert last.is_dir() and (last / "checkpoint").is_file()

    resumed = _model(1)  # other initial weights: only the checkpoint can make them equal
    trainer = _trainer(4, ModelCheckpoint(dirpath=tmp_path / "run", save_last=True))
    trainer.fit(resumed, _data(), ckpt_path="last")
    assert trainer.ckpt_path == str(last)
    assert trainer.global_step == 16
    _assert_same_state(full.state_dict(), resumed.state_dict())
    full_opt = full.trainer.optimizers[0].state_dict()["state"]
    resumed_opt = trainer.optimizers[0].state_dict()["state"]
    for index, state in full_opt.items():
        for key, value in state.items():
            assert torch.equal(value, resumed_opt[index][key]), (index, key)

    # The files are TensorFlow checkpoints under readable keys.
    reader = tp.load_checkpoint(last)
    weight = reader.get_tensor("state_dict/net/0/weight/.ATTRIBUTES/VARIABLE_VALUE")
    np.testing.assert_array_equal(weight, resumed.net[0].weight.detach().numpy())
    assert reader.get_tensor("state_dict/scale/.ATTRIBUTES/VARIABLE_VALUE").dtype.name == (
        "bfloat16"
    )
    assert reader.has_tensor("optimizer_states/0/state/0/exp_avg/.ATTRIBUTES/VARIABLE_VALUE")


def test_saved_dict_loads_back_equal_with_its_types(tmp_path):
    state_dict = OrderedDict(
        [("net.0.weight", torch.randn(3, 2)), ("net.0.bias", torch.zeros(3))]
    )
    state_dict._metadata = OrderedDict([("", {"version": 1}), ("net.0", {"version": 2})])
    tied = torch.randn(4, 4)
    checkpoint = {
        "epoch": 3,
        "lr": 0.5,
        "state_dict": state_dict,
        "optimizer_states": [{"state": {0: {"step": torch.tensor(7.0)}},
                              "param_groups": [{"betas": (0.9, 0.999), "params": [0]}]}],
        "tied": {"encoder.weight": tied, "decoder.weight": tied.detach()},
        "bf16": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "parameter": torch.nn.Parameter(torch.ones(2)),
        "size": torch.Size([2, 3]),
        "dtype": torch.float16,
        "device": torch.device("cpu"),
        "path": pathlib.PurePosixPath("/data/train"),
        "array": np.arange(5, dtype=np.int32),
        "odd": {1: "int key", "1": "str key", (2, 3): None, "__tuple__": [1.0, math.inf]},
        "nan": math.nan,
        "text": "ünïcode",
    }
    io = TrackpointCheckpointIO()
    io.save_checkpoint(checkpoint, tmp_path / "x.ckpt")
    loaded = io.load_checkpoint(tmp_path / "x.ckpt")

    assert list(loaded) == list(checkpoint)
    assert type(loaded["state_dict"]) is OrderedDict
    assert loaded["state_dict"]._metadata == state_dict._metadata
    for name, value in state_dict.items():
        assert torch.equal(loaded["state_dict"][name], value)
    opt = loaded["optimizer_states"][0]
    assert list(opt["state"]) == [0] and torch.equal(opt["state"][0]["step"], torch.tensor(7.0))
    assert opt["param_groups"][0]["betas"] == (0.9, 0.999)
    assert loaded["tied"]["encoder.weight"] is loaded["tied"]["decoder.weight"]
    assert torch.equal(loaded["tied"]["encoder.weight"], tied)
    assert loaded["bf16"].dtype == torch.bfloat16
    assert torch.equal(loaded["bf16"], checkpoint["bf16"])
    assert isinstance(loaded["parameter"], torch.nn.Parameter)
    assert loaded["parameter"].requires_grad
    assert type(loaded["size"]) is torch.Size and loaded["size"] == (2, 3)
    assert loaded["dtype"] is torch.float16 and loaded["device"] == torch.device("cpu")
    assert loaded["path"] == pathlib.PurePosixPath("/data/train")
    assert loaded["array"].dtype == np.int32 and list(loaded["array"]) == list(range(5))
    assert loaded["odd"] == checkpoint["odd"]
    assert type(loaded["epoch"]) is int and type(loaded["lr"]) is float
    assert math.isnan(loaded["nan"]) and loaded["text"] == "ünïcode"

    # A tied tensor is stored once; keys follow the dict, dotted names nest.
    keys = {key for key, _ in tp.list_variables(tmp_path / "x.ckpt")}
    assert "tied/encoder/weight/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "tied/decoder/weight/.ATTRIBUTES/VARIABLE_VALUE" not in keys
    assert "state_dict/net/0/weight/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "optimizer_states/0/state/0/step/.ATTRIBUTES/VARIABLE_VALUE" in keys


def test_save_over_a_path_replaces_it_and_keeps_one_checkpoint(tmp_path):
    io = TrackpointCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"w": torch.zeros(2)}, path)
    io.save_checkpoint({"w": torch.ones(2)}, path)
    assert sorted(os.listdir(path)) == [
        "checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index"
    ]
    assert torch.equal(io.load_checkpoint(path)["w"], torch.ones(2))


def test_save_over_a_link_or_a_file_replaces_it_not_what_it_names(tmp_path):
    io = TrackpointCheckpointIO()
    io.save_checkpoint({"w": torch.zeros(2)}, tmp_path / "epoch=0.ckpt")
    os.symlink("epoch=0.ckpt", tmp_path / "last.ckpt")
    io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "last.ckpt")
    assert not (tmp_path / "last.ckpt").is_symlink()
    assert torch.equal(io.load_checkpoint(tmp_path / "last.ckpt")["w"], torch.ones(2))
    assert torch.equal(io.load_checkpoint(tmp_path / "epoch=0.ckpt")["w"], torch.zeros(2))
    torch.save({"w": torch.zeros(1)}, tmp_path / "old.ckpt")
    io.save_checkpoint({"w": torch.ones(1)}, tmp_path / "old.ckpt")
    assert torch.equal(io.load_checkpoint(tmp_path / "old.ckpt")["w"], torch.ones(1))


def test_map_location_moves_tensors(tmp_path):
    io = TrackpointCheckpointIO()
    io.save_checkpoint({"w": torch.ones(2), "n": 1}, tmp_path / "x.ckpt")
    assert io.load_checkpoint(tmp_path / "x.ckpt")["w"].device.type == "cpu"
    assert io.load_checkpoint(tmp_path / "x.ckpt", map_location="meta")["w"].is_meta
    assert io.load_checkpoint(tmp_path / "x.ckpt", map_location={"cpu": "meta"})["w"].is_meta
    seen = []

    def to_double(tensor, saved_device):
        seen.append(saved_device)
        return tensor.double()

    loaded = io.load_checkpoint(tmp_path / "x.ckpt", map_location=to_double)
    assert loaded["w"].dtype == torch.float64 and seen == ["cpu"]


def test_unpicklable_hyperparameter_is_refused_naming_the_key_and_the_fix(tmp_path):
    io = TrackpointCheckpointIO()
    checkpoint = {"state_dict": {"w": torch.ones(1)},
                  "hyper_parameters": {"hidden": 4, "loss_fn": object()}}
    with pytest.raises(InvalidArgumentError, match=r"\['hyper_parameters'\]\['loss_fn'\].*"
                       r"save_hyperparameters\(ignore=\['loss_fn'\]\)"):
        io.save_checkpoint(checkpoint, tmp_path / "x.ckpt")
    assert not (tmp_path / "x.ckpt").exists()


def test_torch_file_is_refused_with_a_way_out(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "old.ckpt")
    with pytest.raises(InvalidArgumentError, match="trackpoint convert"):
        TrackpointCheckpointIO().load_checkpoint(tmp_path / "old.ckpt")
    with pytest.raises(FileNotFoundError):
        TrackpointCheckpointIO().load_checkpoint(tmp_path / "missing.ckpt")


def test_model_checkpoint_top_k_removal_and_last_link(tmp_path):
    callback = ModelCheckpoint(
        dirpath=tmp_path, monitor="train_loss", save_top_k=1, save_last="link",
        every_n_epochs=1,
    )
    model = _model(0)
    _trainer(3, callback).fit(model, _data())
    names = sorted(os.listdir(tmp_path))
    best = os.path.basename(callback.best_model_path)
    assert names == sorted([best, "last.ckpt"])  # the other epochs' directories were removed
    last = tmp_path / "last.ckpt"
    assert last.is_symlink() and (tmp_path / os.readlink(last)).resolve() == (
        tmp_path / "epoch=2-step=12.ckpt"
    ).resolve()
    loaded = TrackpointCheckpointIO().load_checkpoint(last)
    _assert_same_state(model.state_dict(), loaded["state_dict"])
    assert loaded["epoch"] == 2 and loaded["global_step"] == 12

    # Removing the link leaves the checkpoint it names.
    TrackpointCheckpointIO().remove_checkpoint(last)
    assert not last.exists() and (tmp_path / best).is_dir()
    TrackpointCheckpointIO().remove_checkpoint(tmp_path / best)
    assert os.listdir(tmp_path) == []


def test_async_checkpoint_io_writes_every_checkpoint(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, save_last=True)
    model = _model(0)
    _trainer(2, callback, plugin=AsyncCheckpointIO(TrackpointCheckpointIO())).fit(model, _data())
    assert sorted(os.listdir(tmp_path)) == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt",
                                            "last.ckpt"]
    loaded = tp.lightning.read_checkpoint_dict(str(tmp_path / "last.ckpt"))
    _assert_same_state(model.state_dict(), loaded["state_dict"])


def test_plain_checkpoint_restores_the_state_dict_into_a_module(tmp_path):
    model = _model(0)
    _trainer(1, ModelCheckpoint(dirpath=tmp_path, save_last=True)).fit(model, _data())
    fresh = _model(1)
    tp.Checkpoint(state_dict=fresh).read(tmp_path / "last.ckpt").expect_partial()
    _assert_same_state(model.state_dict(), fresh.state_dict())


def test_fabric_saves_and_loads_through_the_plugin(tmp_path):
    fabric = L.Fabric(accelerator="cpu", devices=1, plugins=[TrackpointCheckpointIO()])
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    fabric.save(tmp_path / "state.ckpt", {"model": model, "optimizer": optimizer, "step": 1})

    torch.manual_seed(1)
    other = torch.nn.Linear(3, 2)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    other, other_opt = fabric.setup(other, other_opt)
    state = {"model": other, "optimizer": other_opt, "step": 0}
    remainder = fabric.load(tmp_path / "state.ckpt", state)
    assert state["step"] == 1 and remainder == {}
    _assert_same_state(model.state_dict(), other.state_dict())
    momentum = other_opt.optimizer.state[other.weight]["momentum_buffer"]
    assert torch.equal(momentum, optimizer.optimizer.state[model.weight]["momentum_buffer"])


def test_pytorch_lightning_namespace_accepts_the_plugin():
    fabric_io = pytest.importorskip("lightning_fabric.plugins.io")
    assert isinstance(TrackpointCheckpointIO(), fabric_io.CheckpointIO)


def test_tensorflow_reads_a_lightning_checkpoint(tmp_path, tf):
    weight = torch.randn(3, 2)
    TrackpointCheckpointIO().save_checkpoint({"state_dict": {"layer.weight": weight}},
                                             tmp_path / "x.ckpt")
    reader = tf.train.load_checkpoint(str(tmp_path / "x.ckpt"))
    value = reader.get_tensor("state_dict/layer/weight/.ATTRIBUTES/VARIABLE_VALUE")
    np.testing.assert_array_equal(value, weight.numpy())


class LoadableRegressor(tp.lightning.TrackpointLoadingMixin, Regressor):
    """The mixin makes Lightning's own classmethod read trackpoint directories."""


def test_load_from_checkpoint_restores_hyperparameters_and_weights(tmp_path):
    torch.manual_seed(0)
    trained = LoadableRegressor(hidden=6, lr=0.02)
    _trainer(1, ModelCheckpoint(dirpath=tmp_path, save_last=True)).fit(trained, _data())
    last = tmp_path / "last.ckpt"

    # Lightning's own classmethod cannot read the directory: the gap the function fills.
    with pytest.raises(IsADirectoryError):
        Regressor.load_from_checkpoint(last)

    loaded = tp.lightning.load_from_checkpoint(Regressor, last)
    assert type(loaded) is Regressor
    assert loaded.hparams.hidden == 6 and loaded.hparams.lr == 0.02
    _assert_same_state(trained.state_dict(), loaded.state_dict())

    overridden = tp.lightning.load_from_checkpoint(Regressor, str(last), lr=0.5)
    assert overridden.hparams.lr == 0.5 and overridden.hparams.hidden == 6

    mixed = LoadableRegressor.load_from_checkpoint(last)
    assert type(mixed) is LoadableRegressor
    _assert_same_state(trained.state_dict(), mixed.state_dict())


def test_load_from_checkpoint_hands_torch_save_files_to_lightning(tmp_path):
    torch.manual_seed(0)
    trained = Regressor(hidden=5)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1,
                        enable_checkpointing=False)
    trainer.fit(trained, _data())
    trainer.save_checkpoint(tmp_path / "plain.ckpt")  # Lightning's torch.save file
    loaded = tp.lightning.load_from_checkpoint(Regressor, tmp_path / "plain.ckpt")
    assert loaded.hparams.hidden == 5
    _assert_same_state(trained.state_dict(), loaded.state_dict())
    with pytest.raises(InvalidArgumentError, match="LightningModule or LightningDataModule"):
        tp.lightning.load_from_checkpoint(torch.nn.Linear, tmp_path / "plain.ckpt")
