"""`PythonState`: Python-side state saved as one bytes value (semantics B13).

Subclasses say how to turn their state into bytes and back; the value is stored as a scalar
DT_STRING under ``<path>/.ATTRIBUTES/py_state``, as TensorFlow's
``tf.train.experimental.PythonState`` does, so either library can read the other's files.
Restoring calls :meth:`PythonState.deserialize` immediately, like any other value.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.base import Trackable

__all__ = ["PYTHON_STATE", "PythonState", "bytes_of", "string_scalar"]

PYTHON_STATE = "py_state"
"""Attribute name of a PythonState's value (TensorFlow's ``python_state.PYTHON_STATE``)."""


def string_scalar(data: bytes) -> np.ndarray:
    """``data`` as a 0-d numpy object array: how trackpoint represents a DT_STRING scalar."""
    value = np.empty((), dtype=object)
    value[()] = bytes(data)
    return value


def bytes_of(value: Any) -> bytes:
    """The bytes of a restored DT_STRING scalar (0-d array, ``np.bytes_`` or bytes)."""
    if isinstance(value, np.ndarray):
        if value.shape != ():
            raise InvalidArgumentError(
                f"expected a scalar string value, got an array of shape {value.shape}"
            )
        value = value[()]
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview, np.bytes_)):
        return bytes(value)
    raise InvalidArgumentError(f"expected a bytes value, got {type(value).__name__}")


class PythonState(Trackable, metaclass=abc.ABCMeta):
    """Mixin for Python state stored in a checkpoint as bytes.

    Example:
        >>> import json
        >>> class Counter(PythonState):
        ...     def __init__(self):
        ...         self.count = 0
        ...     def serialize(self):
        ...         return json.dumps({"count": self.count}).encode()
        ...     def deserialize(self, data):
        ...         self.count = json.loads(data)["count"]
    """

    @abc.abstractmethod
    def serialize(self) -> bytes:
        """This object's state as bytes (called once per save)."""

    @abc.abstractmethod
    def deserialize(self, data: bytes) -> None:
        """Replace this object's state with the state ``data`` encodes."""

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # docstring inherited; a callable so async saves take it at snapshot time only once
        return {PYTHON_STATE: lambda: string_scalar(self.serialize())}

    def _prepare_deserialize(self, data: bytes) -> Callable[[], None]:
        """Check ``data`` and return the step that applies it (all-or-nothing restores).

        The restore engine calls this for every object before changing any. The default
        checks nothing and its step calls :meth:`deserialize`; state that can be rejected
        (malformed bytes, a layout that does not fit) should parse and check here and only
        assign in the returned function, so a failed restore changes nothing.
        """
        return functools.partial(self.deserialize, data)

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited
        return self._prepare_deserialize(bytes_of(restored_tensors[PYTHON_STATE]))
