"""The process-wide random state a keras ``fit`` draws from when no seed is given.

An unseeded ``Dropout`` on the torch backend calls ``torch.nn.functional.dropout``, which draws
from torch's default generator; data shuffling draws from numpy's and python's global
generators (or torch's, through a ``DataLoader``). None of that is a keras variable, so a run
resumed from the model's and optimizer's variables alone draws other masks than the
uninterrupted run. :class:`GlobalRandomState` saves those generators beside the model:

* ``python``: ``random.getstate()``, as JSON (:class:`~trackpoint.tracking.python_random.
  PythonRandomState`);
* ``numpy``: numpy's global ``RandomState``, as JSON (the numpy generators' adapter);
* ``torch/cpu`` and ``torch/cuda:<i>``: torch's default generators, on the torch backend
  (through the adapter registry, as ``torch.Generator`` states).

Seeded keras layers (``Dropout(seed=...)``) and the JAX backend keep their ``SeedGenerator``
state in model variables, which are saved with the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras
import numpy as np

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import Trackable
from trackpoint.tracking.python_random import PythonRandomState

__all__ = ["RNG_NAME", "GlobalRandomState"]

RNG_NAME = "rng"
"""Local name of the process's random state under the checkpoint's root."""


def _torch_generators() -> dict[str, Trackable]:
    """torch's default generators on the torch backend (none on the others)."""
    if keras.backend.backend() != "torch":
        return {}
    import torch  # the backend is torch: it is imported already

    generators: dict[str, Any] = {"cpu": torch.default_generator}
    if torch.cuda.is_available():
        for index, generator in enumerate(torch.cuda.default_generators):
            generators[f"cuda:{index}"] = generator
    found: dict[str, Trackable] = {}
    for name, generator in generators.items():
        child = to_trackable(generator)
        if child is None:  # pragma: no cover - the torch adapters register torch.Generator
            raise InvalidArgumentError(f"no adapter for torch's {name} generator")
        found[name] = child
    return found


class _Group(Trackable):
    """A node whose children are fixed at construction."""

    def __init__(self, children: dict[str, Trackable], what: str) -> None:
        self._children = children
        self._what = what

    def __repr__(self) -> str:
        return f"<{self._what}>"

    def _trackable_children(self) -> dict[str, Trackable]:
        # docstring inherited
        return dict(self._children)

    def _lookup_dependency(
        self, name: str, cached_dependencies: Mapping[str, Trackable] | None = None
    ) -> Trackable | None:
        # docstring inherited
        return (cached_dependencies or self._children).get(name)


class GlobalRandomState(_Group):
    """python's, numpy's and (on the torch backend) torch's global generators, as one node.

    Saved by :class:`~trackpoint.integrations.keras_callback.TrackpointCheckpoint` and
    restored by ``tp.keras.restore``, so that a resumed fit draws the same dropout masks and
    shuffles as the uninterrupted one. Generators are read when the checkpoint is written and
    set only after every value of the restore was read and checked.
    """

    def __init__(self) -> None:
        numpy_state = to_trackable(np.random.mtrand._rand)  # numpy_random's adapter
        if numpy_state is None:  # pragma: no cover - registered for RandomState lazily
            raise InvalidArgumentError("no adapter for numpy's global RandomState")
        children: dict[str, Trackable] = {"python": PythonRandomState(), "numpy": numpy_state}
        torch_generators = _torch_generators()
        if torch_generators:
            children["torch"] = _Group(torch_generators, "torch default generators")
        super().__init__(children, "keras global random state")
