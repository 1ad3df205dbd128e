"""Keras 3 models and optimizers in TensorFlow V2 checkpoints (``tp.keras``), on any backend.

Example::

    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, epochs=5, callbacks=[tp.keras.TrackpointCheckpoint("/ckpts", max_to_keep=3)])

    fresh = build_model()                             # compiled like the first one
    epoch = tp.keras.restore(fresh, "/ckpts")         # weights and optimizer state, in place
    fresh.fit(x, y, epochs=10, initial_epoch=epoch)   # continues where the run stopped

Importing this module registers adapters (``import trackpoint`` does not import keras; the
adapter registry imports this module when it meets a keras object):

* ``keras.Variable`` → :class:`VariableAdapter`: saved as a numpy array (its own dtype,
  bfloat16 included), restored with ``variable.assign``;
* ``keras.Layer`` (models too) and ``keras.optimizers.Optimizer`` → :class:`VariableTree`:
  the object's variables named by their ``variable.path`` relative to the object's name, so
  ``tp.Checkpoint(model=model, optimizer=model.optimizer)`` writes
  ``model/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE`` and ``optimizer/iteration/...``.

Keras numbers the layers of a process (``dense``, ``dense_1``, …), so a model rebuilt in the
same process has other paths than the one saved; :func:`restore` pairs them up to those
numbers, in order, and refuses (naming the variables) when the architectures differ.
On the torch backend keras layers are also ``torch.nn.Module``s: touch ``tp.keras`` before
putting one in a plain ``tp.Checkpoint`` so that this adapter, not the torch one, is used.
"""

from __future__ import annotations

from trackpoint.integrations.keras_callback import TrackpointCheckpoint
from trackpoint.integrations.keras_restore import restore
from trackpoint.integrations.keras_rng import RNG_NAME, GlobalRandomState
from trackpoint.integrations.keras_variables import (
    EPOCH_NAME,
    MODEL_NAME,
    OPTIMIZER_NAME,
    VariableAdapter,
    VariableTree,
    variables_by_path,
)

__all__ = [
    "EPOCH_NAME",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "RNG_NAME",
    "GlobalRandomState",
    "TrackpointCheckpoint",
    "VariableAdapter",
    "VariableTree",
    "restore",
    "variables_by_path",
]
