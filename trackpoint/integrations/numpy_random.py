"""numpy random generators as checkpoint state (``np.random.Generator``, ``RandomState``).

A generator's ``bit_generator.state`` is a dict of ints (PCG64's 128-bit state and increment
included: JSON integers have no size limit), strings and, for MT19937, a uint32 key array; it
is stored as one JSON ``PythonState`` value and restored into the same generator object, so a
resumed run draws the same numbers as an uninterrupted one. ``import trackpoint`` activates this
module the first time a numpy random object is checkpointed (``tracking/adapters.py``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.adapters import register_adapter
from trackpoint.tracking.python_state import PythonState
from trackpoint.tracking.state_json import dumps, loads

__all__ = ["NumpyRandomState"]


class NumpyRandomState(PythonState):
    """Adapter: a ``np.random.Generator``, ``BitGenerator`` or legacy ``RandomState``.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> ckpt = tp.Checkpoint(rng=rng)        # saved as rng/.ATTRIBUTES/py_state
    """

    def __init__(self, generator: Any) -> None:
        self._generator = generator

    def _bit_generator(self) -> Any:
        generator = self._generator
        if isinstance(generator, np.random.Generator):
            return generator.bit_generator
        return generator

    def _what(self) -> str:
        return f"numpy {type(self._generator).__name__} state"

    def __repr__(self) -> str:
        return f"<{self._what()}>"

    def serialize(self) -> bytes:
        # docstring inherited
        target = self._bit_generator()
        if isinstance(target, np.random.RandomState):
            state = target.get_state(legacy=False)
        else:
            state = target.state
        return dumps(state, what=self._what())

    def deserialize(self, data: bytes) -> None:
        # docstring inherited
        self._prepare_deserialize(data)()

    def _prepare_deserialize(self, data: bytes) -> Callable[[], None]:
        # docstring inherited
        state = loads(data, what=self._what())
        target = self._bit_generator()
        try:
            # Checked on a scratch generator of the same type, so a state that does not fit
            # fails before anything of the restore changes (saving/restore.py).
            scratch = copy.deepcopy(target)
            _set_state(scratch, state)
        except (TypeError, ValueError, KeyError) as exc:
            raise InvalidArgumentError(
                f"cannot restore {self._what()} from the checkpoint: {exc} (was it saved from "
                "another bit generator type? Create the generator with the saved type)"
            ) from exc
        return functools.partial(_set_state, target, state)


def _set_state(target: Any, state: Any) -> None:
    if isinstance(target, np.random.RandomState):
        target.set_state(state)
    else:
        target.state = state


register_adapter(np.random.Generator, NumpyRandomState)
register_adapter(np.random.BitGenerator, NumpyRandomState)
register_adapter(np.random.RandomState, NumpyRandomState)
