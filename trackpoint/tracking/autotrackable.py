"""`AutoTrackable`: attribute assignment declares dependencies.

``obj.layer = Dense()`` tracks the layer under the local name ``"layer"``; plain lists, dicts
and tuples become tracked containers; numpy arrays (and any type with a registered adapter)
are tracked through their adapter while the attribute keeps the original object;
``NoDependency(value)`` opts out (tensorflow/python/trackable/autotrackable.py).
"""

from __future__ import annotations

from typing import Any

from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import Trackable
from trackpoint.tracking.containers import NoDependency, wrap_or_unwrap

__all__ = ["AutoTrackable"]

_MISSING = object()


class AutoTrackable(Trackable):
    """A Trackable whose attribute assignments declare its dependencies.

    Reassigning an attribute replaces the dependency; assigning a value that is not
    trackable (e.g. ``None``), or deleting the attribute, drops it.

    Example:
        >>> import numpy as np
        >>> model = AutoTrackable()
        >>> model.w = np.zeros(3)          # tracked as "w"; model.w is still the ndarray
        >>> model.layers = [np.ones(2)]    # a ListWrapper; its element is tracked as "0"
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_self_"):
            object.__setattr__(self, name, value)
            return
        current = self.__dict__.get(name, _MISSING)
        if current is value:
            return  # self.x = self.x
        if isinstance(value, NoDependency):
            stored, child = value.value, None
        else:
            stored = wrap_or_unwrap(value)
            child = to_trackable(stored)
        if child is None and current is not _MISSING:
            self._drop_attribute_dependency(name, current)
        object.__setattr__(self, name, stored)
        if child is not None:
            # After the assignment: a pending restore runs here, and if it fails (e.g. a
            # shape mismatch) the attribute and the dependency still agree.
            self._track_trackable(child, name, overwrite=True)

    def __delattr__(self, name: str) -> None:
        current = self.__dict__.get(name, _MISSING)
        if current is not _MISSING:
            self._drop_attribute_dependency(name, current)
        object.__delattr__(self, name)

    def _drop_attribute_dependency(self, name: str, current: Any) -> None:
        """Untrack ``name`` if it was tracked from the attribute's previous value."""
        child = to_trackable(current)
        if child is not None and self._lookup_dependency(name) is child:
            self._untrack(name)
