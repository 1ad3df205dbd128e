"""`ParallelVariable`: one logical value held as a replica per device (semantics H6).

TensorFlow's parallel device saves each component of such a variable separately: component 0
under the standard ``VARIABLE_VALUE`` name, so that a program holding an ordinary variable reads
it from a parallel checkpoint, and component *i* under ``parallel_component_<i>``
(``tensorflow/python/distribute/parallel_device/saving.py``). trackpoint writes the same keys,
so either side reads the other's checkpoints:

* a plain :class:`~trackpoint.Variable` restored from a parallel checkpoint gets component 0;
  ``assert_existing_objects_matched`` passes, ``assert_consumed`` names the other components;
* a ``ParallelVariable`` restored from a single-device checkpoint copies the one value into every
  component (also when it is created after the restore was requested).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable
from trackpoint.tracking.variable import check_restorable

__all__ = ["ParallelVariable", "component_name"]


def component_name(index: int) -> str:
    """The attribute name component ``index`` is saved under (TensorFlow's naming)."""
    return VARIABLE_VALUE_KEY if index == 0 else f"parallel_component_{index}"


class ParallelVariable(Trackable):
    """Replicas of one value, one per device, saved component by component.

    Args:
        components: the per-device values: numpy arrays (restored in place, like
            ``Variable.wrap``) or anything ``np.array`` accepts (copied). All components must
            share one shape and dtype.
        name: recorded as the variable's name in error messages.

    Raises:
        InvalidArgumentError: ``components`` is not a sequence, is empty, or holds values whose
            shapes or dtypes differ.

    Example:
        >>> replicas = ParallelVariable([np.zeros(3), np.ones(3)])
        >>> [c.tolist() for c in replicas.components]
        [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    """

    def __init__(self, components: Sequence[Any], name: str | None = None) -> None:
        # Any iterable of values works (a list, a tuple, the rows of a stacked array).
        if not isinstance(components, Iterable) or isinstance(components, (str, bytes)):
            raise InvalidArgumentError(
                "ParallelVariable takes a list of per-device values (one per replica), got "
                f"{type(components).__name__}"
            )
        arrays = [c if isinstance(c, np.ndarray) else np.array(c) for c in components]
        if not arrays:
            raise InvalidArgumentError("ParallelVariable needs at least one component")
        first = arrays[0]
        for index, array in enumerate(arrays):
            if array.dtype == object:
                raise InvalidArgumentError(
                    f"ParallelVariable component {index} has numpy dtype object; use a "
                    "numeric, bool or fixed-width bytes dtype"
                )
            if array.shape != first.shape or array.dtype != first.dtype:
                raise InvalidArgumentError(
                    f"ParallelVariable components must share shape and dtype: component 0 is "
                    f"{first.shape} {first.dtype}, component {index} is {array.shape} "
                    f"{array.dtype}"
                )
        self._components = arrays
        self._name = name or "ParallelVariable"

    @property
    def components(self) -> list[np.ndarray]:
        """The live per-device arrays (restores write into them)."""
        return list(self._components)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._components[0].shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._components[0].dtype

    @property
    def name(self) -> str:
        return self._name

    def __len__(self) -> int:
        return len(self._components)

    def __repr__(self) -> str:
        return (
            f"<trackpoint.ParallelVariable {self._name!r} components={len(self)} "
            f"shape={self.shape} dtype={self.dtype}>"
        )

    # -- checkpointing -----------------------------------------------------------------------

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # docstring inherited
        return {component_name(i): array for i, array in enumerate(self._components)}

    def _optional_tensor_names(self) -> frozenset[str]:
        # A single-device checkpoint has only component 0; it then fills every replica.
        return frozenset(component_name(i) for i in range(1, len(self._components)))

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited
        values = []
        for index, target in enumerate(self._components):
            name = component_name(index)
            saved = restored_tensors.get(name, restored_tensors[VARIABLE_VALUE_KEY])
            what = f"component {index} of parallel variable {self._name!r}"
            values.append(check_restorable(target, saved, what=what))

        def apply() -> None:
            for target, saved in zip(self._components, values):
                np.copyto(target, saved, casting="no")

        return apply
