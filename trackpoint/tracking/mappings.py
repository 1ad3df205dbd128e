"""Tracked dicts and tuples (see ``containers.py`` for the rules they share with lists).

A dict's values are tracked under their string keys; a tuple's elements under their index and,
for a namedtuple, also under the field name (semantics B11). Plain entries are saved as one
JSON value per container, as ``containers.py`` describes. Importing this module registers both
wrappers with ``containers.register_wrapper``.
"""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import is_
from typing import Any, SupportsIndex

from numpy import ndarray

from trackpoint._gc import collector_paused
from trackpoint.errors import FailedPreconditionError, InvalidArgumentError
from trackpoint.tracking.adapters import to_trackable, to_trackables
from trackpoint.tracking.base import Trackable
from trackpoint.tracking.containers import (
    NoDependency,
    TrackableDataStructure,
    holds_trackable,
    is_tracked_value,
    register_wrapper,
    sticky_attribute_assignment,
    wrap_or_unwrap,
)
from trackpoint.tracking.plain_values import (
    is_plain,
    is_plain_key,
    merge_plain,
    updates_by_index,
)
from trackpoint.tracking.views import made_from, source_of

__all__ = ["DictWrapper", "TupleWrapper", "wrap_tuple"]

logger = logging.getLogger(__name__)

_STR_TYPE = frozenset({str})


class DictWrapper(TrackableDataStructure, dict[Any, Any]):
    """A dict whose values are tracked under their keys; non-string keys with trackable values
    make saving fail. Changes made to the original dict behind the wrapper's back (the
    training-loop pattern ``state["w"] = new_array``) are adopted at the next save or restore.
    """

    # Set with object.__setattr__ in __init__; declared for type checkers.
    _self_original: dict[Any, Any]
    _self_untracked_keys: set[Any]  # keys assigned through NoDependency

    def __init__(self, wrapped_dict: Any = None) -> None:
        if wrapped_dict is None:
            wrapped_dict = {}
        original = wrapped_dict if type(wrapped_dict) in (dict, OrderedDict) else dict(
            wrapped_dict
        )
        object.__setattr__(self, "_self_original", original)
        object.__setattr__(self, "_self_untracked_keys", set())
        if self._track_all_at_once(original):
            dict.__init__(self, original)  # every value is stored as given
            return
        dict.__init__(self, {k: self._track_value(v, k) for k, v in original.items()})
        self._sync()

    def _track_all_at_once(self, original: dict[Any, Any]) -> bool:
        """Track every value of ``original`` in one pass if all are kept as they are (string
        keys; numpy arrays and Trackables, which are neither wrapped nor NoDependency); False,
        tracking nothing, for any other dict (then each value goes through _track_value).

        The usual large dict, ``{name: array}`` of a model, is tracked here without a call
        chain per value; the result is what tracking one value after the other gives.
        """
        if not original or not set(map(type, original)) <= _STR_TYPE:
            return False
        kinds = set(map(type, original.values()))
        if not all(kind is ndarray or issubclass(kind, Trackable) for kind in kinds):
            return False
        # The adapters and references made here live on: pausing the collector spares the
        # collections their allocation would trigger (see trackpoint._gc).
        with collector_paused():
            children = to_trackables(list(original.values()))
            if any(child is None for child in children):
                return False  # not reached for these kinds; the general path says why
            return self._track_first_children(list(original), children)  # type: ignore[arg-type]

    def _track_value(self, value: Any, name: Any) -> Any:
        if isinstance(value, NoDependency):
            self._self_untracked_keys.add(name)
            return value.value
        self._self_untracked_keys.discard(name)
        if isinstance(name, str):
            return sticky_attribute_assignment(self, name, value)
        return wrap_or_unwrap(value)  # a trackable here makes saving fail (_trackable_children)

    def _sync(self) -> None:
        """Mirror the wrapper into the original dict (nested wrappers as what they wrap)."""
        original = self._self_original
        original.clear()
        original.update(zip(dict.keys(self), map(source_of, dict.values(self))))

    def _adopt_external_changes(self) -> None:
        """Take in keys set, rebound or deleted on the original dict (compared by identity), as
        if done through the wrapper.

        Raises:
            FailedPreconditionError: an adopted value is an object a restore is waiting for
                (it would be restored now, not when it was assigned).
        """
        original = self._self_original
        if (
            len(original) == dict.__len__(self)
            and all(map(is_, original.values(), dict.values(self)))
            and all(map(is_, original, dict.keys(self)))
        ):
            return  # the usual case, checked in C: the same keys and values, in order
        changed = [
            key for key, value in original.items()
            if not dict.__contains__(self, key)
            or source_of(dict.__getitem__(self, key)) is not value
        ]
        if not changed and len(original) == dict.__len__(self):
            return
        for key in changed:
            if (
                isinstance(key, str) and self._deferred_dependencies.get(key)
                and is_tracked_value(original[key])
            ):
                raise FailedPreconditionError(
                    f"The key {key!r} was set on the dict itself (not through the tracked dict) "
                    "while a checkpoint restore was waiting for it, so the restore could not "
                    "run when it was assigned. Assign it through the tracked dict (e.g. "
                    f"ckpt.state[{key!r}] = value) to restore it now, or through NoDependency "
                    "to leave it out."
                )
        for key in [key for key in dict.keys(self) if key not in original]:
            dict.__delitem__(self, key)
            self._forget(key)
        for key in changed:
            self[key] = original[key]  # tracks it and mirrors the stored (wrapped) value back

    def _forget(self, key: Any) -> None:
        self._self_untracked_keys.discard(key)
        if isinstance(key, str):
            self._untrack(key)

    def _trackable_children(self) -> dict[str, Trackable]:
        # docstring inherited
        self._adopt_external_changes()
        if not set(map(type, dict.keys(self))) <= _STR_TYPE and any(
            not isinstance(key, str) and not self._is_exempt(key, value)
            and holds_trackable(value)
            for key, value in dict.items(self)
        ):
            raise InvalidArgumentError(
                f"Unable to save the object {self!r} (a dict wrapper constructed on attribute "
                "assignment). It has a non-string key mapping to a trackable object; use "
                "string keys, or assign the dict through NoDependency."
            )
        return self._visible_children(super()._trackable_children())

    # -- plain values (see containers.py) ----------------------------------------------------

    def _entries(self) -> list[tuple[Any, Any]]:
        # docstring inherited
        return list(dict.items(self))

    def _values(self) -> Iterable[Any]:
        # docstring inherited
        return dict.values(self)

    def _is_exempt(self, key: Any, value: Any) -> bool:
        # docstring inherited
        return key in self._self_untracked_keys

    def _is_plain_key(self, key: Any) -> bool:
        # docstring inherited
        return is_plain_key(key)

    def _plain_form(self, plain: list[tuple[Any, Any]]) -> Any:
        # docstring inherited
        return dict(plain)

    def _prepare_plain_restore(self, saved: Any) -> Callable[[], None]:
        # docstring inherited
        if not isinstance(saved, dict):
            raise InvalidArgumentError(
                f"the checkpoint holds a {type(saved).__name__} as the plain values of a dict; "
                "was it written for another kind of container?"
            )
        held = [
            key for key in saved
            if dict.__contains__(self, key)
            and (self._is_exempt(key, dict.__getitem__(self, key))
                 or not is_plain(dict.__getitem__(self, key)))
        ]
        if held:
            raise InvalidArgumentError(
                f"the checkpoint has plain values for the keys {held!r} of a dict, but the "
                "program holds trackable (or NoDependency) objects there; a checkpointed plain "
                "value cannot replace them"
            )
        kept = [key for key, _ in self._plain_entries() if key not in saved]

        def apply() -> None:
            for key, value in saved.items():
                self[key] = merge_plain(dict.get(self, key), value)
            if kept:
                logger.warning(
                    "The checkpoint has no value for the keys %r of a tracked dict; they keep "
                    "their current values", kept,
                )

        return apply

    # -- mutations ---------------------------------------------------------------------------

    def __setitem__(self, key: Any, value: Any) -> None:
        stored = self._track_value(value, key)
        if isinstance(key, str) and (
            key in self._self_untracked_keys or to_trackable(stored) is None
        ):
            self._untrack(key)  # the value it replaces may have been tracked
        dict.__setitem__(self, key, stored)
        self._self_original[key] = source_of(stored)

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, key)
        self._forget(key)
        self._self_original.pop(key, None)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    # Accepts any mapping or pairs (as dict's does), while dict.__or__ takes dicts only: mypy
    # reports the pair as incompatible, which is dict's own behaviour.
    def __ior__(self, other: Any) -> DictWrapper:  # type: ignore[misc]
        self.update(other)
        return self

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def pop(self, key: Any, *default: Any) -> Any:
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        value = self[key]
        del self[key]
        return value

    def popitem(self) -> tuple[Any, Any]:
        if not self:
            raise KeyError("popitem(): dictionary is empty")
        key = next(reversed(list(dict.keys(self))))
        return key, self.pop(key)

    def clear(self) -> None:
        for key in list(dict.keys(self)):
            del self[key]

    def copy(self) -> DictWrapper:
        return DictWrapper(self._keep_exempt(dict(dict.items(self))))

    def _keep_exempt(self, copies: dict[Any, Any]) -> dict[Any, Any]:
        """``copies`` of the entries, NoDependency ones wrapped again so copies keep them out."""
        return {
            key: NoDependency(value) if key in self._self_untracked_keys else value
            for key, value in copies.items()
        }

    def __copy__(self) -> DictWrapper:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> DictWrapper:
        copied = DictWrapper.__new__(DictWrapper)
        memo[id(self)] = copied
        DictWrapper.__init__(
            copied, self._keep_exempt(copy.deepcopy(dict(dict.items(self)), memo))
        )
        return copied

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        return (dict, (dict(dict.items(self)),))

    __hash__ = None

    def __repr__(self) -> str:
        return f"DictWrapper({dict.__repr__(self)})"


class TupleWrapper(TrackableDataStructure, Sequence[Any]):
    """A tracked tuple or namedtuple: elements by index, namedtuple fields also by name.

    A proxy (tuple subclasses cannot be weakly referenced, and the restore coordinator holds
    objects weakly): it reports the wrapped type as its ``__class__``, so ``isinstance(w, P)``
    holds for a namedtuple ``P``, and forwards attribute access (fields, ``_asdict``, …).
    """

    # Set with object.__setattr__ in __init__; declared for type checkers.
    _self_wrapped: tuple[Any, ...]
    _self_constructable: bool
    _self_untracked_indices: frozenset[int]  # elements given through NoDependency

    def __init__(self, original: tuple[Any, ...] = ()) -> None:
        add_dependency = [not isinstance(e, NoDependency) for e in original]
        object.__setattr__(
            self, "_self_untracked_indices",
            frozenset(i for i, depend in enumerate(add_dependency) if not depend),
        )
        elements = [wrap_or_unwrap(e) for e in original]
        fields = getattr(type(original), "_fields", None)
        constructable = True
        try:
            wrapped = _rebuild(type(original), elements)
        except TypeError:  # a namedtuple whose __new__ does not take its fields
            wrapped, constructable = original, False
        object.__setattr__(self, "_self_wrapped", wrapped)
        object.__setattr__(self, "_self_constructable", constructable)
        if not constructable:
            return
        if fields is not None:
            for field, depend, element in zip(fields, add_dependency, elements):
                if depend:
                    self._track_value(element, field)
        for index, (depend, element) in enumerate(zip(add_dependency, elements)):
            if depend:
                self._track_value(element, str(index))

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: D105
        return type(self._self_wrapped)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_self_"):
            raise AttributeError(name)
        return getattr(self._self_wrapped, name)

    def _trackable_children(self) -> dict[str, Trackable]:
        # docstring inherited
        if not self._self_constructable:
            raise InvalidArgumentError(
                f"Unable to save because the namedtuple {self._self_wrapped!r} is not "
                "constructable from its _fields (its __new__ is overridden); wrap it in a "
                "custom trackable object instead"
            )
        return self._visible_children(super()._trackable_children())

    # -- plain values (see containers.py): a tuple is rebuilt, its trackables stay ------------

    def _entries(self) -> list[tuple[Any, Any]]:
        # docstring inherited
        return list(enumerate(self._self_wrapped))

    def _is_exempt(self, key: Any, value: Any) -> bool:
        # docstring inherited
        return key in self._self_untracked_indices

    def _plain_form(self, plain: list[tuple[Any, Any]]) -> Any:
        # docstring inherited
        if len(plain) == len(self._self_wrapped):
            return [value for _, value in plain]
        return {str(index): value for index, value in plain}

    def _prepare_plain_restore(self, saved: Any) -> Callable[[], None]:
        # docstring inherited
        items = self._entries()
        if isinstance(saved, list):
            if len(saved) != len(items) or any(
                self._is_exempt(i, v) or not is_plain(v) for i, v in items
            ):
                raise InvalidArgumentError(
                    f"the checkpoint holds a tuple of {len(saved)} plain values, but the "
                    f"program's tuple {self._self_wrapped!r} has {len(items)} elements or "
                    "holds trackable objects; build it with the saved layout"
                )
            updates = dict(enumerate(saved))
        else:
            updates = updates_by_index(saved, items, self._is_exempt, what="tuple")

        def apply() -> None:
            elements = list(self._self_wrapped)
            for index, value in updates.items():
                elements[index] = merge_plain(elements[index], value)
            object.__setattr__(
                self, "_self_wrapped", _rebuild(type(self._self_wrapped), elements)
            )

        return apply

    def __getitem__(self, index: Any) -> Any:
        return self._self_wrapped[index]

    def __len__(self) -> int:
        return len(self._self_wrapped)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._self_wrapped)

    def __eq__(self, other: object) -> bool:
        return bool(self._self_wrapped == _unwrap_tuple(other))

    def __ne__(self, other: object) -> bool:
        return bool(self._self_wrapped != _unwrap_tuple(other))

    def __lt__(self, other: Any) -> bool:
        return bool(self._self_wrapped < _unwrap_tuple(other))

    def __hash__(self) -> int:
        return hash(self._self_wrapped)

    def __add__(self, other: Any) -> Any:
        return self._self_wrapped + _unwrap_tuple(other)

    def __radd__(self, other: Any) -> Any:
        return _unwrap_tuple(other) + self._self_wrapped

    def __mul__(self, n: SupportsIndex) -> Any:
        return self._self_wrapped * n

    __rmul__ = __mul__

    def __repr__(self) -> str:
        return repr(self._self_wrapped)

    def __copy__(self) -> TupleWrapper:
        return TupleWrapper(self._keep_exempt(list(self._self_wrapped)))

    def __deepcopy__(self, memo: dict[int, Any]) -> TupleWrapper:
        return TupleWrapper(self._keep_exempt(copy.deepcopy(list(self._self_wrapped), memo)))

    def _keep_exempt(self, copies: list[Any]) -> tuple[Any, ...]:
        """``copies`` of the elements as the wrapped type, NoDependency ones wrapped again."""
        untracked = self._self_untracked_indices
        return _rebuild(
            type(self._self_wrapped),
            [NoDependency(v) if i in untracked else v for i, v in enumerate(copies)],
        )

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        return (_rebuild, (type(self._self_wrapped), list(self._self_wrapped)))


def _unwrap_tuple(value: Any) -> Any:
    return value._self_wrapped if isinstance(value, TupleWrapper) else value


def _rebuild(original_type: type, items: list[Any]) -> tuple[Any, ...]:
    if hasattr(original_type, "_fields"):
        return original_type(*items)  # type: ignore[no-any-return]
    return original_type(items)  # type: ignore[no-any-return]


def wrap_tuple(value: tuple[Any, ...]) -> TupleWrapper:
    """A tracked copy of ``value`` (the same wrapper if it already is one)."""
    if isinstance(value, TupleWrapper):
        return value
    return TupleWrapper(value)


def _wrap_dict(value: dict[Any, Any]) -> DictWrapper:
    return made_from(DictWrapper(value), value)  # never written into the user's containers


register_wrapper(dict, _wrap_dict)
register_wrapper(tuple, wrap_tuple)
