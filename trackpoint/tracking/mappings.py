"""Tracked dicts and tuples (see ``containers.py`` for the rules they share with lists).

A dict's values are tracked under their string keys; a tuple's elements under their index and,
for a namedtuple, also under the field name (semantics B11).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, SupportsIndex

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import Trackable
from trackpoint.tracking.containers import (
    NoDependency,
    TrackableDataStructure,
    sticky_attribute_assignment,
    wrap_or_unwrap,
)

__all__ = ["DictWrapper", "TupleWrapper", "wrap_tuple"]


class DictWrapper(TrackableDataStructure, dict):  # type: ignore[type-arg]
    """A dict whose values are tracked under their keys; non-string keys with trackable values
    and changes to the original dict behind the wrapper's back make saving fail."""

    def __init__(self, wrapped_dict: Any = None) -> None:
        if wrapped_dict is None:
            wrapped_dict = {}
        original = wrapped_dict if type(wrapped_dict) in (dict, OrderedDict) else dict(
            wrapped_dict
        )
        object.__setattr__(self, "_self_original", original)
        object.__setattr__(self, "_self_non_string_key", False)
        object.__setattr__(self, "_self_external_modification", False)
        dict.__init__(self, {k: self._track_value(v, k) for k, v in original.items()})
        self._sync()

    def _track_value(self, value: Any, name: Any) -> Any:
        if isinstance(name, str):
            return sticky_attribute_assignment(self, name, value)
        no_dependency = isinstance(value, NoDependency)
        value = wrap_or_unwrap(value)
        if not no_dependency and to_trackable(value) is not None:
            object.__setattr__(self, "_self_non_string_key", True)
        return value

    def _sync(self) -> None:
        """Mirror the wrapper into the original dict."""
        original = self._self_original
        original.clear()
        original.update(dict.items(self))

    def _check_external_modification(self) -> None:
        """The original dict differs from the wrapper (compared by key and value identity)."""
        if self._self_external_modification or self._self_non_string_key:
            return
        original = self._self_original
        if len(original) != dict.__len__(self) or any(
            not dict.__contains__(self, k) or dict.__getitem__(self, k) is not v
            for k, v in original.items()
        ):
            object.__setattr__(self, "_self_external_modification", True)

    def _trackable_children(self) -> dict[str, Trackable]:
        # docstring inherited
        self._check_external_modification()
        if self._self_non_string_key:
            raise InvalidArgumentError(
                f"Unable to save the object {self!r} (a dict wrapper constructed on attribute "
                "assignment). It has a non-string key mapping to a trackable object; use "
                "string keys, or assign the dict through NoDependency."
            )
        if self._self_external_modification:
            raise InvalidArgumentError(
                f"Unable to save the object {self!r} (a dict wrapper constructed on attribute "
                f"assignment). The wrapped dict was modified outside the wrapper (its value is "
                f"{self._self_original!r}), which breaks restoration on object creation. "
                "Mutate the attribute, not the original dict, or assign it through NoDependency."
            )
        return super()._trackable_children()

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(key, str):
            old = dict.get(self, key)
            stored = self._track_value(value, key)
            if to_trackable(stored) is None and old is not None and to_trackable(old) is not None:
                self._untrack(key)
        else:
            stored = self._track_value(value, key)
        dict.__setitem__(self, key, stored)
        self._self_original[key] = stored

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, key)
        if isinstance(key, str):
            self._untrack(key)
        self._self_original.pop(key, None)

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> DictWrapper:  # type: ignore[override,misc]
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

    def copy(self) -> DictWrapper:  # type: ignore[override]
        return DictWrapper(dict(dict.items(self)))

    def __copy__(self) -> DictWrapper:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> DictWrapper:
        copied = DictWrapper.__new__(DictWrapper)
        memo[id(self)] = copied
        DictWrapper.__init__(copied, copy.deepcopy(dict(dict.items(self)), memo))
        return copied

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        return (dict, (dict(dict.items(self)),))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"DictWrapper({dict.__repr__(self)})"


class TupleWrapper(TrackableDataStructure, Sequence):  # type: ignore[type-arg]
    """A tracked tuple or namedtuple: elements by index, namedtuple fields also by name.

    A proxy (tuple subclasses cannot be weakly referenced, and the restore coordinator holds
    objects weakly): it reports the wrapped type as its ``__class__``, so ``isinstance(w, P)``
    holds for a namedtuple ``P``, and forwards attribute access (fields, ``_asdict``, …).
    """

    def __init__(self, original: tuple[Any, ...] = ()) -> None:
        add_dependency = [not isinstance(e, NoDependency) for e in original]
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
        return super()._trackable_children()

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
        return TupleWrapper(self._self_wrapped)

    def __deepcopy__(self, memo: dict[int, Any]) -> TupleWrapper:
        return TupleWrapper(copy.deepcopy(self._self_wrapped, memo))

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
