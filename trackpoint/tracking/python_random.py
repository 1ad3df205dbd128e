"""Python's ``random`` generators as checkpoint state (a ``random.Random``, by default the
module's global one, behind ``random.random()`` and friends).

Framework integrations that save "every RNG of the process" (Keras, Hugging Face) use it for
Python's share; it knows no framework, so it lives here for all of them.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.python_state import PythonState
from trackpoint.tracking.state_json import dumps, loads

__all__ = ["PythonRandomState"]


class PythonRandomState(PythonState):
    """A ``random.Random`` (by default the module's global one) as JSON.

    ``getstate()`` is ``(version, 625 ints, gauss_next)``; JSON keeps the tuples and the
    integers exactly (``state_json``), so the restored generator draws the same numbers.
    """

    def __init__(self, generator: random.Random | None = None) -> None:
        # random's module-level functions are bound methods of this hidden instance.
        self._generator: random.Random = generator or random._inst

    def __repr__(self) -> str:
        return "<python random state>"

    def serialize(self) -> bytes:
        # docstring inherited
        return dumps(self._generator.getstate(), what="python random state")

    def deserialize(self, data: bytes) -> None:
        # docstring inherited
        self._prepare_deserialize(data)()

    def _prepare_deserialize(self, data: bytes) -> Callable[[], None]:
        # docstring inherited
        state = loads(data, what="python random state")
        try:  # checked on a scratch generator: a failed restore changes nothing
            random.Random().setstate(state)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"cannot restore python's random state from the checkpoint: {exc}; was "
                "rng/python written by another program?"
            ) from exc
        return functools.partial(self._generator.setstate, state)
