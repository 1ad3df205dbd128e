"""`Variable`: a mutable numpy value that saves itself and is restored in place.

A restore copies the saved value into the variable's own ndarray (``np.copyto``), so the array
object, and every reference to it an optimizer or user code holds, stays valid (semantics B3).
A saved value whose shape or dtype differs is rejected before anything is written (B8).
Plain numpy arrays become variables through the adapter registry (``tracking/adapters.py``):
the variable then *shares* the user's array, so restoring it writes into that array.
String values (``tf.string``) are covered in ``tracking/string_values.py``: a variable built
from strings holds an object array of ``bytes``; restores never cut a string.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.adapters import register_adapter
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable, register_variable_type
from trackpoint.tracking.string_values import (
    check_string_elements,
    fit_strings,
    is_string_array,
    to_bytes_array,
)
from trackpoint.tracking.value_columns import ValueColumns

__all__ = ["Variable", "check_restorable"]

_DEFAULT_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"


def _as_value_array(value: Any, dtype: Any = None) -> np.ndarray:
    """The variable's own array; strings become an object array of ``bytes`` unless ``dtype``
    asks for a fixed width (``S``/``U``) or ``StringDType``."""
    requested = None if dtype is None else np.dtype(dtype)
    array = np.array(value, dtype=requested, copy=True)
    if requested is None and array.dtype.kind in "SU" and not isinstance(value, np.ndarray):
        # numpy's inferred S/U width would drop trailing NUL bytes: keep the elements as given.
        array = np.array(value, dtype=object)
    if is_string_array(array) and (requested is None or requested.kind == "O"):
        return to_bytes_array(array, what="a variable")
    return array


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
    if is_string_array(target) and is_string_array(saved_array):
        saved_array = fit_strings(saved_array, target, what=what)
    if saved_array.dtype != target.dtype and (
        saved_array.dtype.newbyteorder("=") == target.dtype.newbyteorder("=")
    ):
        # The same values in the other byte order: checkpoints store little-endian, so a
        # big-endian holder gets them swapped (a copy; such holders are rare).
        saved_array = saved_array.astype(target.dtype)
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
        self._given_name = name

    @classmethod
    def wrap(cls, array: np.ndarray, name: str | None = None) -> Variable:
        """A variable that shares ``array``'s memory: restores and assigns write into it."""
        if not isinstance(array, np.ndarray):
            raise InvalidArgumentError(
                f"Variable.wrap() needs a numpy ndarray, got {type(array).__name__}"
            )
        if array.dtype == object:  # strings only: anything else would need pickle
            check_string_elements(array, what="a numpy array")
        variable = cls.__new__(cls)
        variable._value = array
        variable._name = name or "Variable"
        variable._given_name = name
        return variable

    @classmethod
    def wrap_all(cls, arrays: list[np.ndarray]) -> list[Variable]:
        """:meth:`wrap` of each of ``arrays`` (exactly numpy arrays), registered as their
        adapters (``_self_adapted_value``): the adapter registry's batch factory.

        The attributes go straight into each new instance's ``__dict__`` (what
        ``object.__setattr__`` does for a plain attribute, and ``Variable`` defines no
        descriptor for them), in one order so the instances share their key table: half the
        time of a call per attribute for a dict of 100,000 arrays.
        """
        if "O" in set(map(_KIND_OF, arrays)):  # strings only: as wrap() checks them
            return [_adapted(cls.wrap(array), array) for array in arrays]
        variables: list[Variable] = list(map(object.__new__, itertools.repeat(cls, len(arrays))))
        for variable, array in zip(variables, arrays):
            attributes = variable.__dict__
            attributes["_value"] = array
            attributes["_name"] = "Variable"
            attributes["_given_name"] = None
            attributes["_self_adapted_value"] = array
        return variables

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
            InvalidArgumentError: the shape differs or the array is read-only; for strings, a
                value the variable's dtype cannot keep exactly (see ``string_values``).
        """
        if is_string_array(self._value):
            given = np.array(value, dtype=object)
            new = fit_strings(to_bytes_array(given, what="a value"), self._value,
                              what=f"a value into variable {self._name!r}")  # fmt: skip
        else:
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

    @property
    def given_name(self) -> str | None:
        """The ``name`` given at construction; None for the default name.

        Name-based (TF1) restores match variables by it, so unnamed variables and tracked
        arrays never pick up a TF1 checkpoint's default-named ``Variable`` by accident.
        """
        given: str | None = getattr(self, "_given_name", None)
        return given

    def __repr__(self) -> str:
        return (
            f"<trackpoint.Variable {self._name!r} shape={self.shape} dtype={self.dtype} "
            f"value={np.array2string(self._value, threshold=6)}>"
        )

    # -- checkpointing -----------------------------------------------------------------------

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # docstring inherited
        value = self._value
        if value.dtype.kind == "T":  # StringDType: save str elements (savers copy object arrays)
            return {VARIABLE_VALUE_KEY: value.astype(object)}
        return {VARIABLE_VALUE_KEY: value}

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited
        saved, value = restored_tensors[VARIABLE_VALUE_KEY], self._value
        if not (
            type(saved) is np.ndarray  # the usual case, checked without building messages
            and saved.shape == value.shape
            and saved.dtype == value.dtype
            and not value.dtype.hasobject  # strings are fitted to the holder's element type
            and value.flags.writeable
        ):
            saved = check_restorable(value, saved, what=f"variable {self._name!r}")
        return functools.partial(np.copyto, value, saved, casting="no")

    # -- many at once (the batch-first protocol of tracking/base.py) ----------------------------

    # Every variable saves one whole array (a string variable an object array: still one).
    _whole_value_names: ClassVar[tuple[str, ...] | None] = (VARIABLE_VALUE_KEY,)

    @classmethod
    def _prepare_restores(
        cls,
        trackables: Sequence[Trackable],
        restored: Sequence[Mapping[str, Any]],
        on_error: Callable[[int, InvalidArgumentError], BaseException],
    ) -> Callable[[], None]:
        """:meth:`_prepare_restore` of many variables, checked a list at a time.

        The usual case, an array of the variable's shape and dtype, is checked for the whole
        list without a call or a step object per variable (a model of 100,000 variables); any
        other value goes through ``_prepare_restore``. The step copies every value in, in order.
        """
        if isinstance(restored, ValueColumns):  # a batch the engine planned: a list already
            saved_list: list[Any] = restored.column(VARIABLE_VALUE_KEY)
        else:
            saved_list = list(map(_SAVED, restored))
        targets: list[np.ndarray] = list(map(_VALUE, trackables))
        others: dict[int, Callable[[], None]] = {}  # index -> _prepare_restore's step
        if not _all_usual(targets, saved_list):
            others = _unusual_steps(trackables, targets, saved_list, on_error)

        def apply() -> None:
            # Same shape and dtype: `target[...] = saved` is np.copyto(target, saved,
            # casting="no"), at a fraction of the call's cost.
            if not others:
                for target, saved in zip(targets, saved_list):
                    target[...] = saved
                return
            for index, (target, saved) in enumerate(zip(targets, saved_list)):
                step = others.get(index)
                if step is None:
                    target[...] = saved
                else:
                    step()

        return apply


def _all_usual(targets: list[np.ndarray], saved: list[Any]) -> bool:
    """Whether every pair is ``_prepare_restore``'s usual case, tested a list at a time:
    exactly an ndarray of the holder's shape and dtype, for a writeable non-object holder."""
    if len(targets) != len(saved) or set(map(type, saved)) - {np.ndarray}:
        return False
    dtypes = list(map(_DTYPE, targets))
    if any(dtype.hasobject for dtype in set(dtypes)) or dtypes != list(map(_DTYPE, saved)):
        return False
    return (list(map(_SHAPE, targets)) == list(map(_SHAPE, saved))
            and all(map(_WRITEABLE, targets)))


def _unusual_steps(
    variables: Sequence[Trackable],
    targets: list[np.ndarray],
    saved_list: list[Any],
    on_error: Callable[[int, InvalidArgumentError], BaseException],
) -> dict[int, Callable[[], None]]:
    """``_prepare_restore``'s step of each pair that is not the usual case, by index."""
    others: dict[int, Callable[[], None]] = {}
    ndarray = np.ndarray
    for index, (variable, value, saved) in enumerate(zip(variables, targets, saved_list)):
        if (  # _prepare_restore's test for the usual case
            type(saved) is ndarray
            and saved.shape == value.shape
            and saved.dtype == value.dtype
            and not value.dtype.hasobject
            and value.flags.writeable
        ):
            continue
        try:
            others[index] = variable._prepare_restore({VARIABLE_VALUE_KEY: saved})
        except InvalidArgumentError as exc:
            raise on_error(index, exc) from exc
    return others


_KIND_OF = operator.attrgetter("dtype.kind")
_VALUE = operator.attrgetter("_value")
_SAVED = operator.itemgetter(VARIABLE_VALUE_KEY)
_DTYPE = operator.attrgetter("dtype")
_SHAPE = operator.attrgetter("shape")
_WRITEABLE = operator.attrgetter("flags.writeable")


def _adapted(variable: Variable, array: np.ndarray) -> Variable:
    object.__setattr__(variable, "_self_adapted_value", array)
    return variable


register_adapter(np.ndarray, Variable.wrap, many=Variable.wrap_all)
register_variable_type(Variable)  # what Trackable._add_variable creates
