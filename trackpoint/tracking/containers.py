"""Tracked containers: lists (here), dicts and tuples (``mappings.py``) that are trackable.

Assigning a plain ``list``, ``dict`` or tuple to an ``AutoTrackable`` attribute (or passing one
to ``Checkpoint``) replaces it with a wrapper that tracks its elements: list elements under
``"0"``, ``"1"``, …, dict values under their (string) keys, namedtuple fields under both the
field name and the index (tf-checkpoint-format.md §9.3, semantics B11). Wrappers subclass the
builtin, so ``isinstance(x, list)``, ``json.dumps`` and numpy see an ordinary container.

Names must stay attached to the same objects for deferred restoration to be right, so
mutations that move or drop a tracked element of a list (``del``, ``sort``, slice replacement,
``*= -1``) make the next save fail with "Unable to save" instead of writing a checkpoint that
restores into the wrong objects (semantics B12). Rebinding an entry (``d["w"] = new_array``,
``items[0] = new_array``) is the training-loop pattern and is fine, also when done on the
original dict or list the wrapper was made from: the wrapper adopts such outside changes at the
next save or restore, so a save writes the values reachable at the moment of the call. (Only an
outside change that drops tracked list elements, or that adds an object a restore is waiting
for, fails: the first loses identity, the second would be restored too late.) Containers
without tracked elements can be mutated freely.

Plain values (issue 13: nothing is dropped without a word): entries that are not trackable are
saved too if they are plain (numbers, strings, None, numpy scalars and lists, tuples and dicts
of them), as one JSON value on the container's own node, ``<container path>/.ATTRIBUTES/py_state``,
and restored in place; ``plain_values.py`` describes the storage form and the restore rules.
Any other value (an open file, a function, a set, a custom object) fails the save with an
:class:`~trackpoint.errors.InvalidArgumentError` naming it (``(root).extra['handle']``) and the
fixes: a ``tp.PythonState``, a ``tp.Variable``/array, removing it, or ``NoDependency``.
Entries assigned through :class:`NoDependency` are neither saved nor checked.
"""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, SupportsIndex

import numpy as np
from numpy import ndarray

from trackpoint.errors import FailedPreconditionError, InvalidArgumentError
from trackpoint.tracking.adapters import claims_structure, is_adaptable, to_trackable
from trackpoint.tracking.base import Trackable
from trackpoint.tracking.plain_values import (
    decode_plain,
    encode_plain,
    entry_label,
    find_unplain,
    is_plain,
    merge_plain,
    short_repr,
    type_name,
    updates_by_index,
)
from trackpoint.tracking.python_state import PYTHON_STATE, bytes_of, string_scalar
from trackpoint.tracking.save_check import SaveChecked
from trackpoint.tracking.views import Viewing, made_from, same_items, source_of

__all__ = [
    "ListWrapper",
    "NoDependency",
    "TrackableDataStructure",
    "holds_trackable",
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


logger = logging.getLogger(__name__)

_ABSENT = object()
_ARRAY_TYPES = frozenset({ndarray})


def is_tracked_value(value: Any) -> bool:
    return type(value) is np.ndarray or isinstance(value, Trackable) or is_adaptable(value)


def holds_trackable(value: Any) -> bool:
    """A tracked value that is not plain: a tracked container without trackables is plain."""
    return is_tracked_value(value) and not is_plain(value)


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
        return made_from(ListWrapper(value), value)  # never written into the user's containers
    if type(value) in (dict, OrderedDict) or (
        isinstance(value, tuple) and _should_wrap_tuple(value)
    ):
        # mappings.py builds on this module, so it is imported on first use.
        from trackpoint.tracking.mappings import DictWrapper, wrap_tuple

        if isinstance(value, dict):
            return made_from(DictWrapper(value), value)
        return wrap_tuple(value)
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


class TrackableDataStructure(SaveChecked, Viewing, Trackable):
    """Base of the tracked containers: trackable entries are children, plain entries one JSON
    value (see the module docstring); assertions ignore containers that have neither."""

    # -- what each container provides -------------------------------------------------------

    def _entries(self) -> list[tuple[Any, Any]]:
        """``(key, value)`` of every entry: dict keys, list and tuple indices."""
        raise NotImplementedError

    def _values(self) -> Iterable[Any]:
        """Every entry's value (containers override it with a view that builds no pairs)."""
        return [value for _, value in self._entries()]

    def _only_arrays(self) -> bool:
        """True if every entry is a numpy array (the usual large container): then there is
        nothing plain to save or check, which is decided here in C, without a Python loop."""
        return set(map(type, self._values())) <= _ARRAY_TYPES

    def _is_exempt(self, key: Any, value: Any) -> bool:
        """True for an entry assigned through ``NoDependency``: neither saved nor checked."""
        return False

    def _is_plain_key(self, key: Any) -> bool:
        """True if the entry's key can be written in JSON (always, for indices)."""
        return True

    def _adopt_external_changes(self) -> None:
        """Take in changes made to the original container behind the wrapper's back."""

    def _plain_form(self, plain: list[tuple[Any, Any]]) -> Any:
        """What is stored for the plain entries ``plain`` (see the module docstring)."""
        raise NotImplementedError

    def _prepare_plain_restore(self, saved: Any) -> Callable[[], None]:
        """Check saved plain entries against this container; return the step that applies them.

        Raises:
            InvalidArgumentError: they do not fit (a trackable or a missing index where the
                checkpoint has a plain value); nothing has changed.
        """
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------------

    def _track_value(self, value: Any, name: str) -> Any:
        return sticky_attribute_assignment(self, name, value)

    def _is_all_plain(self, seen: set[int] | None = None) -> bool:
        """True if every entry is plain: the container is then a plain value of its parent."""
        seen = set() if seen is None else seen
        if id(self) in seen:
            return False  # it holds itself
        # Its parent saves its entries: first take in what was done to the caller's own list
        # or dict behind the wrapper (tags.append("b") on the list given inside a dict).
        self._adopt_external_changes()
        seen.add(id(self))
        try:
            return all(
                not self._is_exempt(key, value) and self._is_plain_key(key)
                and is_plain(value, seen)
                for key, value in self._entries()
            )
        finally:
            seen.discard(id(self))

    def _plain_entries(self) -> list[tuple[Any, Any]]:
        if self._only_arrays():
            return []
        return [
            (key, value) for key, value in self._entries()
            if type(value) is not np.ndarray  # the usual entry: skipped without calls
            and not self._is_exempt(key, value) and self._is_plain_key(key) and is_plain(value)
        ]

    def _visible_children(self, children: dict[str, Trackable]) -> dict[str, Trackable]:
        """``children`` without nested containers that hold no trackable: those are plain
        values, saved in this container's JSON."""
        kinds = set(map(type, children.values()))  # per type, not per child
        if not any(issubclass(kind, TrackableDataStructure) for kind in kinds):
            return children  # no nested containers
        return {
            name: child for name, child in children.items()
            if not (isinstance(child, TrackableDataStructure) and child._is_all_plain())
        }

    def _lookup_dependency(
        self, name: str, cached_dependencies: Mapping[str, Trackable] | None = None
    ) -> Trackable | None:
        # docstring inherited; a nested container without trackables is not among the
        # children, but a checkpoint saved while it held some binds it by name (B1).
        found = super()._lookup_dependency(name, cached_dependencies)
        if found is None and cached_dependencies is not None:
            found = super()._lookup_dependency(name)
        return found

    def _check_saveable(self, where: str) -> None:
        # docstring inherited
        self._adopt_external_changes()
        if self._only_arrays():
            return
        for key, value in self._entries():
            if type(value) is ndarray or self._is_exempt(key, value):
                continue  # an array (the usual entry) is always saveable
            if not self._is_plain_key(key) and not is_tracked_value(value):
                label, bad = f" key {key!r}", key
            elif is_plain(value) or is_tracked_value(value):
                continue
            else:
                label, bad = find_unplain(value, entry_label(key))
            raise InvalidArgumentError(
                f"Cannot save {where}{label} ({type_name(bad)}): it is neither "
                "trackable nor a plain Python value (None, bool, int, float, complex, str, "
                "bytes, numpy scalars, and lists, tuples and dicts of them), so a checkpoint "
                "could not restore it. Keep its state in a tp.PythonState (e.g. "
                "trackpoint.tracking.state_json.JsonState) or a tp.Variable / numpy array, "
                "remove it from the container, or assign it through "
                "trackpoint.tracking.NoDependency(value) to leave it out of checkpoints."
            )

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # docstring inherited; the plain entries as one JSON string, encoded when the save
        # takes its values (a callable: once per save, at snapshot time for async saves).
        self._adopt_external_changes()
        plain = self._plain_entries()
        if not plain:
            return {}
        form = self._plain_form(plain)
        what = f"the plain values of a {type(self).__name__}"
        return {PYTHON_STATE: lambda: string_scalar(encode_plain(form, what=what))}

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        # docstring inherited
        what = f"the plain values of a {type(self).__name__}"
        saved = decode_plain(bytes_of(restored_tensors[PYTHON_STATE]), what=what)
        self._adopt_external_changes()
        return self._prepare_plain_restore(saved)


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
