"""Test doubles for checkpoint scenarios: a plain-numpy Adam with slots, a numpy state holder."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from typing import Any

import numpy as np

from trackpoint.management import CheckpointReader
from trackpoint.tracking import AutoTrackable, PythonState, SlotOwner, Trackable, Variable


class NumpyAdam(SlotOwner, AutoTrackable):
    """Adam laid out like tf.compat.v1.train.AdamOptimizer: slots m, v; beta1/2_power."""

    def __init__(self, learning_rate: float = 0.1, beta1: float = 0.9, beta2: float = 0.999):
        self.learning_rate = learning_rate
        self.beta1 = beta1
        self.beta2 = beta2

    def _ensure_non_slot(self) -> None:
        if "beta1_power" not in self.__dict__:
            self.beta1_power = self._add_variable("beta1_power", self.beta1, dtype=np.float32)
            self.beta2_power = self._add_variable("beta2_power", self.beta2, dtype=np.float32)

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> None:
        self._ensure_non_slot()
        b1p = float(self.beta1_power.numpy())
        b2p = float(self.beta2_power.numpy())
        lr = self.learning_rate * np.sqrt(1 - b2p) / (1 - b1p)
        for grad, var in grads_and_vars:
            array = var.array if isinstance(var, Variable) else var
            m = self.add_slot(var, "m")
            v = self.add_slot(var, "v")
            m.assign(self.beta1 * m.array + (1 - self.beta1) * grad)
            v.assign(self.beta2 * v.array + (1 - self.beta2) * grad * grad)
            array -= (lr * m.array / (np.sqrt(v.array) + 1e-7)).astype(array.dtype)
        self.beta1_power.assign(b1p * self.beta1)
        self.beta2_power.assign(b2p * self.beta2)


class _NumpyWrapper(PythonState):
    """One numpy array stored as .npy bytes (no pickle)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def serialize(self) -> bytes:
        buffer = io.BytesIO()
        np.save(buffer, self.array, allow_pickle=False)
        return buffer.getvalue()

    def deserialize(self, data: bytes) -> None:
        self.array = np.load(io.BytesIO(data), allow_pickle=False)


class NumpyState(Trackable):
    """Attributes holding numpy arrays, saved as Python state; restoring into an empty holder
    recreates the attributes (TF's python_state_test NumpyState)."""

    def _lookup_dependency(self, name, cached_dependencies=None):  # noqa: ANN001, ANN202
        value = super()._lookup_dependency(name)
        if value is None:
            value = _NumpyWrapper(np.array([]))
            self._track_trackable(value, name)
        return value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        wrapper = self._lookup_dependency(name)
        return wrapper.array

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        self._lookup_dependency(name).array = np.asarray(value)


class JsonState(PythonState):
    """A dict of JSON values."""

    def __init__(self, **values: Any) -> None:
        self.values = dict(values)

    def serialize(self) -> bytes:
        return json.dumps(self.values, sort_keys=True).encode()

    def deserialize(self, data: bytes) -> None:
        self.values = json.loads(data)


def keys_of(prefix: str) -> list[str]:
    """Every checkpoint key of ``prefix``, sorted."""
    with CheckpointReader(prefix) as reader:
        return reader.keys()


def value_of(prefix: str, key: str) -> np.ndarray:
    with CheckpointReader(prefix) as reader:
        return reader.get_tensor(key)
