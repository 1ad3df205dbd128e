"""Tracked containers: what lists (``lists.py``), dicts and tuples (``mappings.py``) share.

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

The wrappers track their elements through :func:`wrap_or_unwrap`, which makes wrappers: each
wrapper's module registers its class here (:func:`register_wrapper`) instead of this module
importing it, so the modules stay one above the other (no import circle). ``trackpoint.tracking``
imports them all, so every wrapper is registered once any tracking module is imported.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from numpy import ndarray

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.adapters import claims_structure, is_adaptable, to_trackable
from trackpoint.tracking.base import Trackable
from trackpoint.tracking.plain_values import (
    decode_plain,
    encode_plain,
    entry_label,
    find_unplain,
    is_plain,
    type_name,
)
from trackpoint.tracking.python_state import PYTHON_STATE, bytes_of, string_scalar
from trackpoint.tracking.save_check import SaveChecked
from trackpoint.tracking.views import Viewing

__all__ = [
    "NoDependency",
    "TrackableDataStructure",
    "holds_trackable",
    "is_tracked_value",
    "register_wrapper",
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


# Explicit registry (STYLE.md §1): the tracked wrapper of each plain container kind, ``list``
# (lists.py), ``dict`` (also for OrderedDict) and ``tuple`` (also for namedtuples), from the plain
# value to its wrapper. See the module docstring for why it is registered, not imported.
_wrappers: dict[type, Callable[[Any], Any]] = {}
_KINDS = (list, dict, tuple)


def register_wrapper(kind: type, wrap: Callable[[Any], Any]) -> None:
    """Make ``wrap`` (a plain container -> its tracked wrapper) what :func:`wrap_or_unwrap` does
    with a plain ``kind``, one of ``list``, ``dict`` and ``tuple``.

    Raises:
        InvalidArgumentError: ``kind`` is none of the three.
    """
    if kind not in _KINDS:
        raise InvalidArgumentError(
            f"register_wrapper() takes list, dict or tuple, got {kind!r}; other types become "
            "trackable through trackpoint.tracking.register_adapter"
        )
    _wrappers[kind] = wrap


def wrap_or_unwrap(value: Any) -> Any:
    """Wrap a plain list/dict/tuple in its tracked container; unwrap a ``NoDependency``."""
    if isinstance(value, NoDependency):
        return value.value
    if isinstance(value, Trackable):
        return value
    if isinstance(value, (list, dict, tuple)) and claims_structure(value):
        return value  # e.g. a JAX pytree: tracked through its adapter, never modified
    if type(value) is list:
        return _wrappers[list](value)
    if type(value) in (dict, OrderedDict):
        return _wrappers[dict](value)
    if isinstance(value, tuple) and _should_wrap_tuple(value):
        return _wrappers[tuple](value)
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
