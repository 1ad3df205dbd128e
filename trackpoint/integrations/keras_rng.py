"""The process-wide random state a keras ``fit`` draws from when no seed is given.

An unseeded ``Dropout`` on the torch backend calls ``torch.nn.functional.dropout``, which draws
from torch's default generator; data shuffling draws from numpy's and python's global
generators (or torch's, through a ``DataLoader``). None of that is a keras variable, so a run
resumed from the model's and optimizer's variables alone draws other masks than the
uninterrupted run. :class:`GlobalRandomState` saves those generators beside the model:

* ``python``: ``random.getstate()``, as JSON;
* ``numpy``: numpy's global ``RandomState`` (``np.random.get_state()``), as JSON;
* ``torch/cpu`` and ``torch/cuda:<i>``: torch's default generators, on the torch backend
  (through the adapter registry, as ``torch.Generator`` states).

Seeded keras layers (``Dropout(seed=...)``) and the JAX backend keep their ``SeedGenerator``
state in model variables, which are saved with the model.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import Trackable
from trackpoint.tracking.python_state import PythonState
from trackpoint.tracking.state_json import dumps, loads

__all__ = ["RNG_NAME", "GlobalRandomState"]

RNG_NAME = "rng"
"""Local name of the process's random state under the checkpoint's root."""


class _PythonRandom(PythonState):
    """``random``'s global state: ``(version, 625 ints, gauss_next)``."""

    def __repr__(self) -> str:
        return "<python random state>"

    def serialize(self) -> bytes:
        # docstring inherited
        version, internal, gauss = random.getstate()
        return dumps([version, list(internal), gauss], what="python random state")

    def deserialize(self, data: bytes) -> None:
        # docstring inherited
        self._prepare_deserialize(data)()

    def _prepare_deserialize(self, data: bytes) -> Callable[[], None]:
        # docstring inherited: checked, and tried on a scratch generator, before it is applied
        saved = loads(data, what="python random state")
        try:
            version, internal, gauss = saved
            state = (int(version), tuple(int(x) for x in internal), gauss)
            random.Random().setstate(state)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"python random state: the checkpoint holds {str(saved)[:80]!r}, not a "
                f"random.getstate() value ({exc})"
            ) from exc
        return functools.partial(random.setstate, state)


class _NumpyGlobalRandom(PythonState):
    """numpy's global ``RandomState`` (the one ``np.random.shuffle`` and friends draw from)."""

    def __repr__(self) -> str:
        return "<numpy global random state>"

    def serialize(self) -> bytes:
        # docstring inherited
        name, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
        return dumps([name, np.asarray(key).tolist(), int(pos), int(has_gauss), float(gauss)],
                     what="numpy global random state")

    def deserialize(self, data: bytes) -> None:
        # docstring inherited
        self._prepare_deserialize(data)()

    def _prepare_deserialize(self, data: bytes) -> Callable[[], None]:
        # docstring inherited: checked on a scratch RandomState before it is applied
        saved = loads(data, what="numpy global random state")
        try:
            name, key, pos, has_gauss, gauss = saved
            state = (str(name), np.asarray(key, dtype=np.uint32), int(pos), int(has_gauss),
                     float(gauss))
            np.random.RandomState().set_state(state)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                "numpy global random state: the checkpoint does not hold a "
                f"np.random.get_state() value ({exc})"
            ) from exc
        return functools.partial(np.random.set_state, state)


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
        children: dict[str, Trackable] = {
            "python": _PythonRandom(), "numpy": _NumpyGlobalRandom(),
        }
        torch_generators = _torch_generators()
        if torch_generators:
            children["torch"] = _Group(torch_generators, "torch default generators")
        super().__init__(children, "keras global random state")
