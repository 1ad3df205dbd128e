"""Tracked lists: ``ListWrapper`` (the rules all tracked containers share are in ``containers.py``).

A list's elements are tracked under their index, ``"0"``, ``"1"``, …; trackable elements may be
appended or rebound, never moved or removed (semantics B12). Importing this module registers
the wrapper with ``containers.register_wrapper``, so ``wrap_or_unwrap`` turns a plain ``list``
into one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any, SupportsIndex

from trackpoint.errors import FailedPreconditionError, InvalidArgumentError
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import Trackable
from trackpoint.tracking.containers import (
    NoDependency,
    TrackableDataStructure,
    holds_trackable,
    is_tracked_value,
    register_wrapper,
)
from trackpoint.tracking.plain_values import is_plain, merge_plain, short_repr, updates_by_index
from trackpoint.tracking.views import made_from, same_items, source_of

__all__ = ["ListWrapper"]

_ABSENT = object()


class ListWrapper(TrackableDataStructure, list[Any]):
    """A list whose elements are tracked as ``"0"``, ``"1"``, …; trackable elements may be
    appended or rebound (``items[i] = x``), not moved or removed (B12).

    The wrapper mirrors every change into the original list it was built from, so aliases of
    that list keep seeing the same elements, and adopts changes made to that list directly.
    """

    # Set with object.__setattr__ in __init__; declared for type checkers.
    _self_original: list[Any]
    _self_non_append_mutation: bool
    _self_external_modification: bool
    _self_untracked: dict[int, Any]  # id -> element assigned through NoDependency

    def __init__(self, wrapped_list: Iterable[Any] = ()) -> None:
        original = wrapped_list if type(wrapped_list) is list else list(wrapped_list)
        object.__setattr__(self, "_self_original", original)
        object.__setattr__(self, "_self_non_append_mutation", False)
        object.__setattr__(self, "_self_external_modification", False)
        object.__setattr__(self, "_self_untracked", {})
        list.__init__(self, [self._track_value(v, str(i)) for i, v in enumerate(original)])
        self._self_original[:] = map(source_of, list.__iter__(self))  # tracked by their index

    # -- bookkeeping -------------------------------------------------------------------------

    def _track_value(self, value: Any, name: str) -> Any:
        # NoDependency elements are remembered by identity: elements move between indices.
        if isinstance(value, NoDependency):
            self._self_untracked[id(value.value)] = value.value
            return value.value
        return super()._track_value(value, name)

    def _sync(self) -> None:
        """Mirror the wrapper into the original list; name each tracked element by its index."""
        self._self_original[:] = map(source_of, list.__iter__(self))
        if self._self_non_append_mutation or self._self_external_modification:
            return  # unsaveable: renaming could hand a waiting restore the wrong object
        items = list(list.__iter__(self))
        for ref in self._checkpoint_dependencies:
            index = int(ref.name)
            if (
                index >= len(items) or self._is_exempt(index, items[index])
                or to_trackable(items[index]) is not ref.ref
            ):
                self._untrack(ref.name)
        for index, item in enumerate(items):
            if is_tracked_value(item) and not self._is_exempt(index, item):
                child = to_trackable(item)
                if child is not None:
                    self._track_trackable(child, str(index), overwrite=True)
        untracked = self._self_untracked
        if untracked:
            alive = {id(item) for item in items}
            for key in [key for key in untracked if key not in alive]:
                del untracked[key]

    def _adopt_external_changes(self) -> None:
        """Take in what was done to the original list behind the wrapper's back.

        Rebinding elements (``original[0] = new_array``) and appending are adopted, as if done
        through the wrapper; appends through the wrapper are mirrored one element at a time, so
        a difference made earlier stays visible here. Removing elements while the list holds
        trackables loses their identity (B12): the next save fails instead.

        Raises:
            FailedPreconditionError: an adopted element is an object a restore is waiting for
                (it would be restored now, not when it was assigned).
        """
        if self._self_external_modification or self._self_non_append_mutation:
            return
        original = self._self_original
        current = list(list.__iter__(self))
        sources = current if same_items(original, current) else list(map(source_of, current))
        if sources is current or same_items(original, sources):
            return
        if len(original) < len(current) and any(holds_trackable(v) for v in current):
            object.__setattr__(self, "_self_external_modification", True)
            return
        changed = [
            index for index, value in enumerate(original)
            if index >= len(current) or sources[index] is not value
        ]
        for index in changed:
            if is_tracked_value(original[index]) and self._deferred_dependencies.get(str(index)):
                raise FailedPreconditionError(
                    f"Element {index} of the list {list(original)!r} was assigned on the list "
                    "itself (not through the tracked list) while a checkpoint restore was "
                    "waiting for it, so the restore could not run when it was assigned. Assign "
                    "it through the tracked list (e.g. ckpt.items[i] = value) to restore it "
                    "now, or through NoDependency to leave it out."
                )
        stored = [c if s is v else v for c, s, v in zip(current, sources, original)]
        stored += original[len(stored):]  # unchanged elements keep their wrappers
        for index in changed:
            stored[index] = self._track_value(original[index], str(index))
        list.__setitem__(self, slice(None), stored)
        self._sync()

    def _has_mutation_or_trackable(self) -> bool:
        return self._self_non_append_mutation or any(
            holds_trackable(v) for v in list.__iter__(self)
        )

    def _flag_if_tracked(self) -> None:
        if self._has_mutation_or_trackable():
            object.__setattr__(self, "_self_non_append_mutation", True)

    def _trackable_children(self) -> dict[str, Trackable]:
        # docstring inherited
        self._adopt_external_changes()
        if self._self_non_append_mutation:
            raise InvalidArgumentError(
                f"Unable to save the object {self!r} (a list wrapper constructed to track "
                "trackable objects). A list element was replaced by a slice assignment, "
                "deleted (__delitem__, pop, remove, clear) or moved (sort, reverse, insert). To "
                "support restoration on object creation, tracking is for append-only lists "
                "(rebinding one element, items[i] = value, is fine). If you don't need this "
                "list checkpointed, assign it through NoDependency."
            )
        if self._self_external_modification:
            raise InvalidArgumentError(
                f"Unable to save the object {self!r} (a list wrapper constructed to track "
                "trackable objects). The wrapped list was modified outside the wrapper (its "
                f"value is {self._self_original!r}, the wrapper holds "
                f"{list(list.__iter__(self))!r}): elements were removed, which "
                "breaks restoration on object creation. Mutate the attribute, not the "
                "original list, or assign it through NoDependency."
            )
        return self._visible_children(super()._trackable_children())

    # -- plain values (see the module docstring) ---------------------------------------------

    def _entries(self) -> list[tuple[Any, Any]]:
        # docstring inherited
        return list(enumerate(list.__iter__(self)))

    def _values(self) -> Iterable[Any]:
        # docstring inherited
        return list.__iter__(self)

    def _is_exempt(self, key: Any, value: Any) -> bool:
        # docstring inherited
        return self._self_untracked.get(id(value), _ABSENT) is value

    def _plain_form(self, plain: list[tuple[Any, Any]]) -> Any:
        # docstring inherited
        if len(plain) == list.__len__(self):
            return [value for _, value in plain]
        return {str(index): value for index, value in plain}

    def _prepare_plain_restore(self, saved: Any) -> Callable[[], None]:
        # docstring inherited
        items = self._entries()
        if isinstance(saved, list):
            held = [i for i, v in items if self._is_exempt(i, v) or not is_plain(v)]
            if held:
                raise InvalidArgumentError(
                    f"the checkpoint holds the list as plain values {short_repr(saved)}, but the "
                    f"program's list holds trackable or NoDependency elements at {held}; "
                    "restore into a list of plain values"
                )

            def replace() -> None:
                merge_plain(self, saved)

            return replace
        updates = updates_by_index(saved, items, self._is_exempt, what="list")

        def apply() -> None:
            for index, value in updates.items():
                self[index] = merge_plain(list.__getitem__(self, index), value)

        return apply

    # -- append-only mutations ---------------------------------------------------------------

    def append(self, value: Any) -> None:
        stored = self._track_value(value, str(len(self)))
        list.append(self, stored)
        self._self_original.append(source_of(stored))  # O(1): no full re-sync

    def extend(self, values: Iterable[Any]) -> None:
        for value in list(values):
            self.append(value)

    # Accepts any iterable (as list's does), while list.__add__ takes lists only: mypy
    # reports the pair as incompatible, which is list's own behaviour.
    def __iadd__(self, values: Iterable[Any]) -> ListWrapper:  # type: ignore[misc]
        self.extend(values)
        return self

    def __imul__(self, factor: SupportsIndex) -> ListWrapper:
        self._adopt_external_changes()
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
        self._adopt_external_changes()
        if isinstance(key, slice):
            before = list(list.__iter__(self))
            list.__setitem__(self, key, value)
            now = list(list.__iter__(self))
            for i in range(max(len(before), len(now))):
                old = before[i] if i < len(before) else None
                new = now[i] if i < len(now) else None
                if holds_trackable(old) and new is not old:
                    object.__setattr__(self, "_self_non_append_mutation", True)
                if i < len(now) and new is not old:
                    list.__setitem__(self, i, self._track_value(new, str(i)))
        else:
            # Rebinding one element keeps the others' names: allowed, as in TensorFlow's
            # ListWrapper (the training-loop pattern items[i] = new_array).
            index = key.__index__()
            if index < 0:
                index += len(self)
            list.__getitem__(self, index)  # IndexError as for a list, before tracking value
            list.__setitem__(self, index, self._track_value(value, str(index)))
        self._sync()

    def __delitem__(self, key: Any) -> None:
        self._adopt_external_changes()
        self._flag_if_tracked()
        list.__delitem__(self, key)
        self._sync()

    def insert(self, index: SupportsIndex, value: Any) -> None:
        self._adopt_external_changes()
        if self._has_mutation_or_trackable() or holds_trackable(value):
            object.__setattr__(self, "_self_non_append_mutation", True)
        list.insert(self, index, self._track_value(value, str(int(index))))
        self._sync()

    def pop(self, index: SupportsIndex = -1) -> Any:
        self._adopt_external_changes()
        self._flag_if_tracked()
        value = list.pop(self, index)
        self._sync()
        return value

    def remove(self, value: Any) -> None:
        self._adopt_external_changes()
        self._flag_if_tracked()
        list.remove(self, value)
        self._sync()

    def clear(self) -> None:
        self._adopt_external_changes()
        self._flag_if_tracked()
        list.clear(self)
        self._sync()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._adopt_external_changes()
        self._flag_if_tracked()
        list.sort(self, *args, **kwargs)
        self._sync()

    def reverse(self) -> None:
        self._adopt_external_changes()
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

    def copy(self) -> ListWrapper:
        items = list(list.__iter__(self))
        return self._copy_flags_to(ListWrapper(self._keep_exempt(items, items)))

    def __copy__(self) -> ListWrapper:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> ListWrapper:
        copied = ListWrapper.__new__(ListWrapper)
        memo[id(self)] = copied
        items = list(list.__iter__(self))
        copies = copy.deepcopy(items, memo)
        ListWrapper.__init__(copied, self._keep_exempt(items, copies))
        return self._copy_flags_to(copied)

    def _keep_exempt(self, items: list[Any], copies: list[Any]) -> list[Any]:
        """``copies`` of ``items``, NoDependency elements wrapped again so copies keep them out."""
        return [
            NoDependency(copied) if self._is_exempt(i, item) else copied
            for i, (item, copied) in enumerate(zip(items, copies))
        ]

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        return (list, (list(list.__iter__(self)),))

    __hash__ = None

    def __repr__(self) -> str:
        return f"ListWrapper({list.__repr__(self)})"


def _wrap_list(value: list[Any]) -> ListWrapper:
    return made_from(ListWrapper(value), value)  # never written into the user's containers


register_wrapper(list, _wrap_list)
