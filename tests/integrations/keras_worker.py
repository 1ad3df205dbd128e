"""Subprocess worker for test_keras.py (keras picks its backend at import: KERAS_BACKEND).

``python keras_worker.py train DIR FIRST THEN``: fit FIRST+THEN epochs uninterrupted
(``DIR/full.npz``), then, in the same process, a second model for FIRST epochs only, saving
with ``TrackpointCheckpoint`` into ``DIR/run`` (and other callback settings into ``DIR/best``
and ``DIR/batches``); ``DIR/train.json`` records what the directories hold.
``python keras_worker.py resume DIR FIRST THEN [callback|restore]``: in a fresh process, build a
model from another seed (keras names its layers ``dense``, ``dense_1``; the saving run's were
``dense_2``, ``dense_3``) and fit up to FIRST+THEN epochs, resuming ``DIR/run`` with
``TrackpointCheckpoint(resume=True)`` (``DIR/resume.npz``; restoring into a model of another
architecture must fail: ``DIR/resume.json``) or with ``tp.keras.restore`` and
``fit(initial_epoch=...)`` (``DIR/resume-restore.npz``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import keras
import numpy as np

import trackpoint as tp
from trackpoint.errors import InvalidArgumentError

_rng = np.random.RandomState(0)
X = _rng.randn(40, 4).astype("float32")
Y = (X @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32") + 0.1).astype("float32")


def build(seed: int, hidden: int = 8) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(hidden, activation="relu"),
        # Unseeded: the torch backend draws its masks from torch's global generator, the
        # jax backend from the layer's SeedGenerator variable (issue 27 #16).
        keras.layers.Dropout(0.25),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def fit(model: keras.Model, epochs: int, callbacks=(), initial_epoch: int = 0) -> None:
    model.fit(X, Y, epochs=epochs, initial_epoch=initial_epoch, batch_size=8, shuffle=False,
              verbose=0, callbacks=list(callbacks))


def record(model: keras.Model, path: Path) -> None:
    arrays = {f"model{i}": keras.ops.convert_to_numpy(v.value)
              for i, v in enumerate(model.variables)}
    arrays.update({f"optimizer{i}": keras.ops.convert_to_numpy(v.value)
                   for i, v in enumerate(model.optimizer.variables)})
    np.savez(path, **arrays)


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def train(out: Path, first: int, then: int) -> None:
    full = build(0)
    fit(full, first + then, [tp.keras.TrackpointCheckpoint(out / "full", max_to_keep=2)])
    record(full, out / "full.npz")

    model = build(0)  # same initial values; keras names its layers dense_2, dense_3 now
    callbacks = [
        tp.keras.TrackpointCheckpoint(out / "run", max_to_keep=2),
        tp.keras.TrackpointCheckpoint(out / "best", monitor="loss", save_best_only=True,
                                      save_weights_only=True, max_to_keep=None),
        tp.keras.TrackpointCheckpoint(out / "batches", save_freq=2, max_to_keep=None,
                                      options=tp.CheckpointOptions(enable_async=True)),
    ]
    fit(model, first, callbacks)
    keys = [key for key, _ in tp.list_variables(out / "run")]
    best_keys = [key for key, _ in tp.list_variables(out / "best")]
    json.dump({
        "full": listing(out / "full"),
        "run": listing(out / "run"),
        "best": listing(out / "best"),
        "batches": listing(out / "batches"),
        "keys": keys,
        "best_keys": best_keys,
        "kernel": keras.ops.convert_to_numpy(model.layers[0].kernel.value).tolist(),
    }, (out / "train.json").open("w"))


def resume(out: Path, first: int, then: int, how: str = "callback") -> None:
    if how == "restore":  # tp.keras.restore, then fit(initial_epoch=...)
        model = build(1)  # paths sequential/dense/kernel…, saved as sequential_1/dense_2/kernel…
        epoch = tp.keras.restore(model, out / "run")
        fit(model, first + then, initial_epoch=epoch)
        record(model, out / "resume-restore.npz")
        return
    epoch = tp.keras.restore(build(4), out / "run")
    model = build(1)
    # resume=True restores where fit starts its epochs, after fit's own start-up draws
    # from the global generators (the torch backend makes one), as BackupAndRestore does.
    fit(model, first + then,
        [tp.keras.TrackpointCheckpoint(out / "run", max_to_keep=None, resume=True)])
    record(model, out / "resume.npz")

    wrong = build(1, hidden=16)
    try:
        tp.keras.restore(wrong, out / "run")
        error = ""
    except InvalidArgumentError as exc:
        error = str(exc)
    keras.utils.set_random_seed(3)
    deeper = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                               keras.layers.Dense(8), keras.layers.Dense(1)])
    try:
        tp.keras.restore(deeper, out / "run", weights_only=True)
        deeper_error = ""
    except InvalidArgumentError as exc:
        deeper_error = str(exc)
    weights_only = build(2)
    weights_epoch = tp.keras.restore(weights_only, out / "best")
    json.dump({"epoch": epoch, "wrong_error": error, "deeper_error": deeper_error,
               "best_epoch": weights_epoch,
               "best_optimizer_built": weights_only.optimizer.built},
              (out / "resume.json").open("w"))


if __name__ == "__main__":
    mode, directory, first_epochs, then_epochs, *how = sys.argv[1:]
    {"train": train, "resume": resume}[mode](Path(directory), int(first_epochs), int(then_epochs),
                                            *how)
