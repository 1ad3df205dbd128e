"""Tracked containers: lists (here), dicts and tuples (``mappings.py``) that are trackable.

Assigning a plain ``list``, ``dict`` or tuple to an ``AutoTrackable`` attribute (or passing one
to ``Checkpoint``) replaces it with a wrapper that tracks its elements: list elements under
``"0"``, ``"1"``, …, dict values under their (string) keys, namedtuple fields under both the
field name and the index (tf-checkpoint-format.md §9.3, semantics B11). Wrappers subclass the
builtin, so ``isinstance(x, list)``, ``json.dumps`` and numpy see an ordinary container.

Names must stay attached to the same objects for deferred restoration to be right, so
mutations that move or drop a tracked element (``del``, ``sort``, replacing an element,
``*= -1``), and changes made to the original list or dict behind the wrapper's back, make the
next save fail with "Unable to save" instead of writing a checkpoint that restores into the
wrong objects (semantics B12). Containers without tracked elements can be mutated freely.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, SupportsIndex

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.adapters import claims_structure, is_adaptable, to_trackable
from trackpoint.tracking.base import Trackable

__all__ = [
    "ListWrapper",
    "NoDependency",
    "TrackableDataStructure",
    "is_tracked_value",
    "same_items",
    "sticky_attribute_assignment",
    "wrap_or_unwrap",
]


class NoDependency:
    """Assign ``value`` to a tracked attribute without making it a dependency.

    ``obj.cache = NoDependency([...])`` stores the plain list, untracked and unwrapped.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def is_tracked_value(value: Any) -> bool:
    return isinstance(value, Trackable) or is_adaptable(value)


def _should_wrap_tuple(value: tuple[Any, ...]) -> bool:
    for element in value:
        if isinstance(element, NoDependency) or is_tracked_value(element):
            return True
        if type(element) in (dict, OrderedDict, list):
            return True
        if isinstance(element, tuple) and _should_wrap_tuple(element):
            return True
    return False


def wrap_or_unwrap(value: Any) -> Any:
    """Wrap a plain list/dict/tuple in its tracked container; unwrap a ``NoDependency``."""
    if isinstance(value, NoDependency):
        return value.value
    if isinstance(value, Trackable):
        return value
    if isinstance(value, (list, dict, tuple)) and claims_structure(value):
        return value  # e.g. a JAX pytree: tracked through its adapter, never modified
    if type(value) is list:
        return ListWrapper(value)
    if type(value) in (dict, OrderedDict) or (
        isinstance(value, tuple) and _should_wrap_tuple(value)
    ):
        # mappings.py builds on this module, so it is imported on first use.
        from trackpoint.tracking.mappings import DictWrapper, wrap_tuple

        return DictWrapper(value) if isinstance(value, dict) else wrap_tuple(value)
    return value


def sticky_attribute_assignment(trackable: Trackable, name: str, value: Any) -> Any:
    """Track ``value`` as ``trackable``'s child ``name`` if it is (or wraps to) a trackable.

    Returns the value to store: the wrapped container, the unwrapped ``NoDependency`` value,
    or ``value`` itself (an adapted object such as an ndarray stays itself; its adapter is the
    tracked child).
    """
    if isinstance(value, NoDependency):
        return value.value
    value = wrap_or_unwrap(value)
    child = to_trackable(value)
    if child is not None:
        trackable._track_trackable(child, name=name, overwrite=True)
    return value


def same_items(a: Iterable[Any], b: Iterable[Any]) -> bool:
    """Element-wise identity: arrays compare element-wise under ``==``, so compare by ``is``."""
    a_list, b_list = list(a), list(b)
    return len(a_list) == len(b_list) and all(x is y for x, y in zip(a_list, b_list))


class TrackableDataStructure(Trackable):
    """Base of the tracked containers; assertions ignore those without tracked elements."""

    def _track_value(self, value: Any, name: str) -> Any:
        return sticky_attribute_assignment(self, name, value)


class ListWrapper(TrackableDataStructure, list):  # type: ignore[type-arg]
    """A list whose elements are tracked as ``"0"``, ``"1"``, …; append-only for trackables.

    The wrapper mirrors every change into the original list it was built from, so aliases of
    that list keep seeing the same elements.
    """

    def __init__(self, wrapped_list: Iterable[Any] = ()) -> None:
        original = wrapped_list if type(wrapped_list) is list else list(wrapped_list)
        object.__setattr__(self, "_self_original", original)
        object.__setattr__(self, "_self_non_append_mutation", False)
        object.__setattr__(self, "_self_external_modification", False)
        list.__init__(self, [self._track_value(v, str(i)) for i, v in enumerate(original)])
        self._sync()

    # -- bookkeeping -------------------------------------------------------------------------

    def _sync(self) -> None:
        """Mirror the wrapper into the original list."""
        self._self_original[:] = list.__iter__(self)

    def _check_external_modification(self) -> None:
        """The original list differs from the wrapper: someone changed it behind our back.

        Appends are mirrored one element at a time, so a difference made earlier stays visible.
        """
        if self._self_external_modification or self._self_non_append_mutation:
            return
        if not same_items(self._self_original, list.__iter__(self)):
            object.__setattr__(self, "_self_external_modification", True)

    def _has_mutation_or_trackable(self) -> bool:
        return self._self_non_append_mutation or any(
            is_tracked_value(v) for v in list.__iter__(self)
        )

    def _flag_if_tracked(self) -> None:
        if self._has_mutation_or_trackable():
            object.__setattr__(self, "_self_non_append_mutation", True)

    def _trackable_children(self) -> dict[str, Trackable]:
        # docstring inherited
        self._check_external_modification()
        if self._self_non_append_mutation:
            raise InvalidArgumentError(
                f"Unable to save the object {self!r} (a list wrapper constructed to track "
                "trackable objects). A list element was replaced (__setitem__), deleted "
                "(__delitem__, pop, remove, clear) or moved (sort, reverse, insert). To support "
                "restoration on object creation, tracking is for append-only lists. If you "
                "don't need this list checkpointed, assign it through NoDependency."
            )
        if self._self_external_modification:
            raise InvalidArgumentError(
                f"Unable to save the object {self!r} (a list wrapper constructed to track "
                "trackable objects). The wrapped list was modified outside the wrapper (its "
                f"value is {self._self_original!r}, the wrapper holds "
                f"{list(list.__iter__(self))!r}), which "
                "breaks restoration on object creation. Mutate the attribute, not the "
                "original list, or assign it through NoDependency."
            )
        return super()._trackable_children()

    # -- append-only mutations ---------------------------------------------------------------

    def append(self, value: Any) -> None:
        stored = self._track_value(value, str(len(self)))
        list.append(self, stored)
        self._self_original.append(stored)  # O(1): no full re-sync on the common path

    def extend(self, values: Iterable[Any]) -> None:
        for value in list(values):
            self.append(value)

    def __iadd__(self, values: Iterable[Any]) -> ListWrapper:  # type: ignore[override,misc]
        self.extend(values)
        return self

    def __imul__(self, factor: SupportsIndex) -> ListWrapper:  # type: ignore[override,misc]
        self._check_external_modification()
        n = int(factor)
        if n <= 0:
            self._flag_if_tracked()
            list.clear(self)
            self._sync()
            return self
        items = list(list.__iter__(self))
        for _ in range(n - 1):
            for item in items:
                self.append(item)  # duplicates are tracked under each new index
        return self

    # -- mutations that can lose identity ----------------------------------------------------

    def __setitem__(self, key: Any, value: Any) -> None:
        self._check_external_modification()
        if isinstance(key, slice):
            before = list(list.__iter__(self))
            list.__setitem__(self, key, value)
            now = list(list.__iter__(self))
            for i in range(max(len(before), len(now))):
                old = before[i] if i < len(before) else None
                new = now[i] if i < len(now) else None
                if is_tracked_value(old) and new is not old:
                    object.__setattr__(self, "_self_non_append_mutation", True)
                if i < len(now) and new is not old:
                    list.__setitem__(self, i, self._track_value(new, str(i)))
        else:
            index = key.__index__()
            if index < 0:
                index += len(self)
            if is_tracked_value(list.__getitem__(self, index)):
                object.__setattr__(self, "_self_non_append_mutation", True)
            list.__setitem__(self, index, self._track_value(value, str(index)))
        self._sync()

    def __delitem__(self, key: Any) -> None:
        self._check_external_modification()
        self._flag_if_tracked()
        list.__delitem__(self, key)
        self._sync()

    def insert(self, index: SupportsIndex, value: Any) -> None:
        self._check_external_modification()
        if self._has_mutation_or_trackable() or is_tracked_value(value):
            object.__setattr__(self, "_self_non_append_mutation", True)
        list.insert(self, index, self._track_value(value, str(int(index))))
        self._sync()

    def pop(self, index: SupportsIndex = -1) -> Any:
        self._check_external_modification()
        self._flag_if_tracked()
        value = list.pop(self, index)
        self._sync()
        return value

    def remove(self, value: Any) -> None:
        self._check_external_modification()
        self._flag_if_tracked()
        list.remove(self, value)
        self._sync()

    def clear(self) -> None:
        self._check_external_modification()
        self._flag_if_tracked()
        list.clear(self)
        self._sync()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._check_external_modification()
        self._flag_if_tracked()
        list.sort(self, *args, **kwargs)
        self._sync()

    def reverse(self) -> None:
        self._check_external_modification()
        self._flag_if_tracked()
        list.reverse(self)
        self._sync()

    # -- copies ------------------------------------------------------------------------------

    def _copy_flags_to(self, other: ListWrapper) -> ListWrapper:
        object.__setattr__(other, "_self_non_append_mutation", self._self_non_append_mutation)
        object.__setattr__(
            other, "_self_external_modification", self._self_external_modification
        )
        return other

    def copy(self) -> ListWrapper:  # type: ignore[override]
        return self._copy_flags_to(ListWrapper(list(list.__iter__(self))))

    def __copy__(self) -> ListWrapper:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> ListWrapper:
        copied = ListWrapper.__new__(ListWrapper)
        memo[id(self)] = copied
        ListWrapper.__init__(copied, copy.deepcopy(list(list.__iter__(self)), memo))
        return self._copy_flags_to(copied)

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        return (list, (list(list.__iter__(self)),))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ListWrapper({list.__repr__(self)})"
