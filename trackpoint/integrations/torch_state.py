"""Torch state that is not a tensor of a module: LR schedulers, grad scalers, RNG generators.

* Objects with a ``state_dict()`` of plain numbers (LR schedulers, ``ReduceLROnPlateau``,
  ``torch.amp.GradScaler``) are saved as one JSON ``PythonState`` value and restored with
  their own ``load_state_dict()``.
* A ``torch.Generator`` (``torch.default_generator``, a CUDA device's default generator, a
  DataLoader's generator) is saved as its state: a uint8 vector under ``VARIABLE_VALUE``.
* :class:`TorchRNG` tracks the process's default generators: the CPU one and, when CUDA is
  available, one per device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from trackpoint.errors import InvalidArgumentError
from trackpoint.integrations.torch_tensors import TENSOR_JSON_HOOKS, tensor_to_json
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable
from trackpoint.tracking.python_state import PythonState
from trackpoint.tracking.state_json import dumps, loads

__all__ = ["GeneratorVariable", "StateDictAdapter", "TorchRNG"]


class StateDictAdapter(PythonState):
    """Adapter: an object with ``state_dict()``/``load_state_dict()`` of plain values, as JSON.

    Tensors inside the state are stored too (tagged, in JSON); functions and other objects
    are refused with the key that holds them, since loading a checkpoint never unpickles.
    """

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def _what(self) -> str:
        return f"{type(self._obj).__name__} state_dict"

    def __repr__(self) -> str:
        return f"<torch {type(self._obj).__name__} state>"

    def serialize(self) -> bytes:
        # docstring inherited
        return dumps(self._obj.state_dict(), what=self._what(), default=tensor_to_json)

    def deserialize(self, data: bytes) -> None:
        # docstring inherited
        self._prepare_deserialize(data)()

    def _prepare_deserialize(self, data: bytes) -> Callable[[], None]:
        # docstring inherited
        state = loads(data, what=self._what(), hooks=TENSOR_JSON_HOOKS)
        if not isinstance(state, dict):
            raise InvalidArgumentError(
                f"{self._what()}: the checkpoint holds a {type(state).__name__}, not a dict"
            )
        return functools.partial(self._obj.load_state_dict, state)


class GeneratorVariable(Trackable):
    """Adapter: a ``torch.Generator``'s state as a uint8 variable; restore calls ``set_state``.

    The state is read when the checkpoint is written (an async save snapshots it at call
    time), so random numbers drawn during a background write do not leak into the file.
    """

    def __init__(self, generator: torch.Generator) -> None:
        self._generator = generator

    @property
    def generator(self) -> torch.Generator:
        return self._generator

    def __repr__(self) -> str:
        return f"<torch Generator on {self._generator.device}>"

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # docstring inherited
        return {VARIABLE_VALUE_KEY: self._generator.get_state().numpy()}

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited
        saved = np.asarray(restored_tensors[VARIABLE_VALUE_KEY])
        current = self._generator.get_state()
        if saved.dtype != np.uint8 or saved.shape != tuple(current.shape):
            raise InvalidArgumentError(
                f"Received incompatible tensor with shape {saved.shape} and dtype {saved.dtype} "
                f"when attempting to restore the state of a torch Generator on "
                f"{self._generator.device}, which has shape {tuple(current.shape)} and dtype "
                "uint8; was the checkpoint written for another kind of generator?"
            )
        state = torch.from_numpy(np.array(saved, copy=True))

        def apply() -> None:
            self._generator.set_state(state)

        return apply


class TorchRNG(Trackable):
    """The process's default random generators: ``cpu`` and, with CUDA, ``cuda:<i>``.

    Checkpoint it to make a resumed run draw the same random numbers (dropout, shuffling,
    initialization) as an uninterrupted one.

    Example:
        >>> ckpt = tp.Checkpoint(model=model, optimizer=opt, rng=TorchRNG())
    """

    def __init__(self) -> None:
        generators: dict[str, torch.Generator] = {"cpu": torch.default_generator}
        if torch.cuda.is_available():
            torch.cuda.init()
            for index, generator in enumerate(torch.cuda.default_generators):
                generators[f"cuda:{index}"] = generator
        self._children: dict[str, Trackable] = {}
        for name, generator in generators.items():
            child = to_trackable(generator)
            assert child is not None
            self._children[name] = child

    def __repr__(self) -> str:
        return f"<torch RNG {sorted(self._children)}>"

    def _trackable_children(self) -> dict[str, Trackable]:
        # docstring inherited
        return dict(self._children)

    def _lookup_dependency(
        self, name: str, cached_dependencies: Mapping[str, Trackable] | None = None
    ) -> Trackable | None:
        # docstring inherited
        return (cached_dependencies or self._children).get(name)
