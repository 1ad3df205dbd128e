"""The save oracle through the framework plug-ins: Lightning's ``CheckpointIO`` and Keras's
callback, while training goes on (so an async save's values change right after the call).

Lightning: a callback copies the dict Lightning hands the plug-in (``on_save_checkpoint`` runs
as the dict is built, before the plug-in writes it); each ``.ckpt`` must hold that copy: its
``state_dict`` tensors at their documented keys, bit for bit, and the whole dict loaded back
equal, types included. Keras (a subprocess: the backend is chosen at import): a callback listed
before ``tp.keras.TrackpointCheckpoint`` copies every model and optimizer variable at each
epoch's end; ``ckpt-N`` must hold exactly those values under ``model/<path>`` and
``optimizer/<path>``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from oracle import OracleMismatch, escape, host_copy, same_plain, variable_key

import trackpoint as tp

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _same_dict(want: Any, got: Any, where: str) -> None:
    """Deep equality with types; tensors bit for bit with their dtype."""
    import torch

    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor) or want.dtype != got.dtype:
            raise OracleMismatch(
                f"{where}: saved {type(got).__name__} "
                f"{getattr(got, 'dtype', '')}, at the call {want.dtype}"
            )
        a, b = host_copy(want), host_copy(got)
        if a.shape != b.shape or a.tobytes() != b.tobytes():
            raise OracleMismatch(
                f"{where}: tensor differs: saved {b.reshape(-1)[:4]}, at the "
                f"call {a.reshape(-1)[:4]}"
            )
        return
    if type(want) is not type(got):
        raise OracleMismatch(
            f"{where}: saved a {type(got).__name__}, at the call a {type(want).__name__}"
        )
    if isinstance(want, dict):
        if list(want) != list(got):
            raise OracleMismatch(f"{where}: keys {list(got)} saved, {list(want)} at the call")
        for key in want:
            _same_dict(want[key], got[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        if len(want) != len(got):
            raise OracleMismatch(f"{where}: {len(got)} items saved, {len(want)} at the call")
        for i, (a, b) in enumerate(zip(want, got)):
            _same_dict(a, b, f"{where}[{i}]")
    elif isinstance(want, float):
        if not same_plain(want, got):
            raise OracleMismatch(f"{where}: saved {got!r}, at the call {want!r}")
    elif want != got:
        raise OracleMismatch(f"{where}: saved {got!r}, at the call {want!r}")


def _clone(value: Any) -> Any:
    import copy

    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        cloned = type(value)((k, _clone(v)) for k, v in value.items())
        if hasattr(value, "_metadata"):
            cloned._metadata = copy.deepcopy(value._metadata)  # type: ignore[attr-defined]
        return cloned
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_clone(v) for v in value)
    return copy.deepcopy(value)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_lightning_checkpoints_hold_the_dict_lightning_handed_over(
    tmp_path, asynchronous, tf
) -> None:
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning")  # noqa: N806
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.save_hyperparameters({"lr": 0.05, "tag": "oracle", "widths": (4, 3)})
            self.net = torch.nn.Sequential(
                torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1)
            )
            self.register_buffer("lowp", torch.randn(5).to(torch.bfloat16))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            with torch.no_grad():
                self.lowp.add_(1)  # a buffer edited in place at every step
            return ((self.net(x) - y) ** 2).mean()

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(24, 4, generator=generator)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8
    )
    plugin: Any = tp.lightning.TrackpointCheckpointIO()
    copies: dict[str, dict[str, Any]] = {}
    if asynchronous:
        plugin = AsyncCheckpointIO(plugin)
    inner = plugin.checkpoint_io if asynchronous else plugin
    original_save = inner.save_checkpoint

    def copying_save(checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        copies[os.path.basename(os.fspath(path))] = _clone(checkpoint)
        original_save(checkpoint, path, storage_options)

    if not asynchronous:  # what the plug-in is handed is what it must write
        inner.save_checkpoint = copying_save
    torch.manual_seed(0)
    trainer = L.Trainer(
        max_epochs=3,
        callbacks=[ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)],
        plugins=[plugin],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    if asynchronous:  # the values at the call: Lightning hands its clone to the thread
        original_async = plugin.save_checkpoint

        def copying_async_save(
            checkpoint: dict[str, Any], path: Any, storage_options: Any = None
        ) -> None:
            copies[os.path.basename(os.fspath(path))] = _clone(checkpoint)
            original_async(checkpoint, path, storage_options)

        plugin.save_checkpoint = copying_async_save
    trainer.fit(Net(), data)
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith(".ckpt"))
    assert names == sorted(copies) and len(names) == 3, (names, sorted(copies))
    for number, name in enumerate(names):
        want = copies[name]
        path = tmp_path / name
        reader = tp.load_checkpoint(path)
        for key, tensor in want["state_dict"].items():
            ckpt_key = variable_key("/".join(["state_dict", *map(escape, key.split("."))]))
            got = reader.get_tensor(ckpt_key)
            a = host_copy(tensor)
            if a.dtype != got.dtype or a.tobytes() != np.asarray(got).tobytes():
                raise OracleMismatch(f"{path}: {ckpt_key}: saved {got}, at the call {a}")
            if number == 0:  # TensorFlow reads the same bytes
                tf_got = tf.train.load_checkpoint(os.fspath(path)).get_tensor(ckpt_key)
                assert np.asarray(tf_got).tobytes() == a.tobytes(), ckpt_key
        _same_dict(want, tp.lightning.TrackpointCheckpointIO().load_checkpoint(path), name)
    assert isinstance(copies[names[0]]["state_dict"], OrderedDict)


@pytest.fixture(scope="module")
def keras_runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The Keras worker's two fits (sync and async saves), run once for the module."""
    pytest.importorskip("keras")
    pytest.importorskip("torch")
    tmp_path = tmp_path_factory.mktemp("keras-oracle")
    env = {
        **os.environ,
        "KERAS_BACKEND": "torch",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]),
    }
    done = subprocess.run(
        [sys.executable, str(HERE / "oracle.py"), "keras", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    runs: list[dict[str, Any]] = json.loads((tmp_path / "captures.json").read_text())
    assert len(runs) == 2
    return runs


@pytest.mark.slow  # keras_runs fits twice: ~27 s
def test_keras_checkpoints_hold_the_variables_at_each_epochs_end(keras_runs) -> None:
    for run in keras_runs:  # a synchronous and an asynchronous run
        assert len(run["epochs"]) == 3
        for number, names in enumerate(run["epochs"], start=1):
            prefix = os.path.join(run["directory"], f"ckpt-{number}")
            values = np.load(os.path.join(run["directory"], f"capture-{number}.npz"))
            reader = tp.load_checkpoint(prefix)
            present = {
                k
                for k in reader.get_variable_to_shape_map()
                if k.startswith(("model/", "optimizer/"))
            }
            wanted = set()
            for index, (owner, owner_name, path) in enumerate(names):
                parts = path.split("/")  # relative to the owner's name, when under it
                parts = parts[1:] if parts[0] == owner_name and len(parts) > 1 else parts
                key = variable_key("/".join([owner, *map(escape, parts)]))
                wanted.add(key)
                want, got = values[f"v{index}"], np.asarray(reader.get_tensor(key))
                if (
                    want.dtype != got.dtype
                    or want.shape != got.shape
                    or want.tobytes() != got.tobytes()
                ):
                    raise OracleMismatch(
                        f"{prefix} ({run['mode']}): {key}: saved "
                        f"{got.reshape(-1)[:4]}, at the epoch's end "
                        f"{want.reshape(-1)[:4]}"
                    )
            assert present == wanted, (sorted(present - wanted), sorted(wanted - present))


@pytest.mark.slow  # keras_runs
def test_known_27_16_keras_torch_backend_saves_torch_rng_at_the_call(keras_runs) -> None:
    """#16 (the lead's, integrations/keras*): on the torch backend unseeded Dropout draws from
    torch's global generator, so its state at the call is reachable state the checkpoint must
    hold (under ``rng/torch/cpu``, next to ``rng/numpy`` and ``rng/python``)."""
    for run in keras_runs:
        for number in range(1, len(run["epochs"]) + 1):
            prefix = os.path.join(run["directory"], f"ckpt-{number}")
            want = np.load(os.path.join(run["directory"], f"capture-{number}.npz"))["torch_rng"]
            reader = tp.load_checkpoint(prefix)
            key = variable_key("rng/torch/cpu")
            if not reader.has_tensor(key):
                raise OracleMismatch(
                    f"{prefix} ({run['mode']}): torch's generator state, "
                    "which Dropout draws from, is not saved"
                )
            got = np.asarray(reader.get_tensor(key))
            assert got.tobytes() == want.tobytes(), f"{prefix}: torch RNG differs from the call"
