"""`Variable`: a mutable numpy value that saves itself and is restored in place.

A restore copies the saved value into the variable's own ndarray (``np.copyto``), so the array
object, and every reference to it an optimizer or user code holds, stays valid (semantics B3).
A saved value whose shape or dtype differs is rejected before anything is written (B8).
Plain numpy arrays become variables through the adapter registry (``tracking/adapters.py``):
the variable then *shares* the user's array, so restoring it writes into that array.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.adapters import register_adapter
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable

__all__ = ["Variable", "check_restorable"]

_DEFAULT_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"


def _as_value_array(value: Any, dtype: Any = None) -> np.ndarray:
    array = np.array(value, dtype=dtype, copy=True)
    if array.dtype == object:
        raise InvalidArgumentError(
            f"cannot make a variable of numpy dtype object from {type(value).__name__}; "
            "use a numeric, bool or fixed-width bytes dtype"
        )
    return array


def _fit_bytes(saved: np.ndarray, dtype: np.dtype[Any], what: str) -> np.ndarray:
    """Checkpoint strings (an object array of bytes) as ``dtype`` (fixed-width ``|S<n>``)."""
    longest = max((len(item) for item in saved.flat), default=0)
    if longest > dtype.itemsize:
        raise InvalidArgumentError(
            f"cannot restore {what}: the checkpoint holds a string of {longest} bytes but its "
            f"numpy dtype {dtype} holds at most {dtype.itemsize}; use a wider bytes dtype or "
            "dtype=object"
        )
    return saved.astype(dtype)


def check_restorable(target: np.ndarray, saved: Any, *, what: str) -> np.ndarray:
    """Validate that ``saved`` can be copied into ``target`` in place; return it as an array.

    Raises:
        InvalidArgumentError: shapes or dtypes differ ("incompatible tensor with shape", as
            TF words it), or ``target`` is read-only. Nothing is written in any case.
    """
    saved_array = np.asarray(saved)
    if saved_array.shape != target.shape:
        raise InvalidArgumentError(
            f"Received incompatible tensor with shape {saved_array.shape} when attempting to "
            f"restore {what} with shape {target.shape}; the checkpoint does not match the "
            "program (build the object with the saved shape)"
        )
    if target.dtype.kind == "S" and saved_array.dtype == object:
        saved_array = _fit_bytes(saved_array, target.dtype, what)
    if saved_array.dtype != target.dtype:
        raise InvalidArgumentError(
            f"Received tensor of dtype {saved_array.dtype} when attempting to restore {what} "
            f"with dtype {target.dtype}; trackpoint does not cast on restore (create the "
            f"holder with dtype {saved_array.dtype}, or cast after restoring)"
        )
    if not target.flags.writeable:
        raise InvalidArgumentError(
            f"cannot restore {what} in place: its numpy array is read-only; make it writable "
            "(array.setflags(write=True) on an array that owns its memory) or track a copy"
        )
    return saved_array


class Variable(Trackable):
    """A mutable, numpy-backed value saved under ``VARIABLE_VALUE``.

    Args:
        initial_value: anything ``np.array`` accepts, or a zero-argument callable returning it.
            The variable owns a copy.
        dtype: numpy dtype (default: inferred from ``initial_value``).
        name: the variable's name, recorded as ``full_name`` in the object graph.

    Restoring and :meth:`assign` write into the same ndarray (:attr:`array`); :meth:`numpy`
    returns a copy, as in TensorFlow.

    Example:
        >>> v = Variable([1.0, 2.0])
        >>> v.assign([3.0, 4.0]).numpy()
        array([3., 4.])
    """

    def __init__(
        self,
        initial_value: Any | Callable[[], Any],
        dtype: Any = None,
        name: str | None = None,
    ) -> None:
        if callable(initial_value):
            initial_value = initial_value()
        self._value = _as_value_array(initial_value, dtype)
        self._name = name or "Variable"

    @classmethod
    def wrap(cls, array: np.ndarray, name: str | None = None) -> Variable:
        """A variable that shares ``array``'s memory: restores and assigns write into it."""
        if not isinstance(array, np.ndarray):
            raise InvalidArgumentError(
                f"Variable.wrap() needs a numpy ndarray, got {type(array).__name__}"
            )
        if array.dtype == object:
            raise InvalidArgumentError(
                "cannot checkpoint a numpy array of dtype object (it would need pickle); "
                "use a numeric, bool or fixed-width bytes dtype"
            )
        variable = cls.__new__(cls)
        variable._value = array
        variable._name = name or "Variable"
        return variable

    # -- value access ------------------------------------------------------------------------

    @property
    def array(self) -> np.ndarray:
        """The live ndarray (no copy): restores and :meth:`assign` write into it."""
        return self._value

    def numpy(self) -> np.ndarray:
        """A copy of the current value."""
        return self._value.copy()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy:
            return np.array(self._value, dtype=dtype, copy=True)
        return self._value if dtype is None else self._value.astype(dtype)

    def assign(self, value: Any) -> Variable:
        """Write ``value`` into the variable's array in place; returns ``self``.

        Raises:
            InvalidArgumentError: the shape differs or the array is read-only.
        """
        new = np.asarray(value, dtype=self._value.dtype)
        if new.shape != self._value.shape:
            raise InvalidArgumentError(
                f"cannot assign a value of shape {new.shape} to variable {self._name!r} of "
                f"shape {self._value.shape}"
            )
        if not self._value.flags.writeable:
            raise InvalidArgumentError(f"variable {self._name!r} wraps a read-only array")
        np.copyto(self._value, new)
        return self

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._value.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._value.dtype

    @property
    def device(self) -> str:
        """Where the value lives; numpy values are host (CPU) memory."""
        return _DEFAULT_DEVICE

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return (
            f"<trackpoint.Variable {self._name!r} shape={self.shape} dtype={self.dtype} "
            f"value={np.array2string(self._value, threshold=6)}>"
        )

    # -- checkpointing -----------------------------------------------------------------------

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # docstring inherited
        return {VARIABLE_VALUE_KEY: self._value}

    def _restore_from_tensors(self, restored_tensors: Mapping[str, Any]) -> None:
        # docstring inherited
        saved, value = restored_tensors[VARIABLE_VALUE_KEY], self._value
        if not (
            type(saved) is np.ndarray  # the usual case, checked without building messages
            and saved.shape == value.shape
            and saved.dtype == value.dtype
            and value.flags.writeable
        ):
            saved = check_restorable(value, saved, what=f"variable {self._name!r}")
        np.copyto(value, saved, casting="no")


register_adapter(np.ndarray, Variable.wrap)
