"""Containers that hold a restore's objects weakly.

A restore must not keep the program's objects alive (a dropped model is freed even while a
status or a deferred restoration still exists), so the coordinator keeps them in these.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["IdentityWeakSet", "WeakObjects"]


class IdentityWeakSet:
    """A set of objects by identity, holding them weakly (trackables may be unhashable)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Any]] = {}

    def add(self, obj: Any) -> bool:
        """Add ``obj``; True if it was not in the set."""
        # No removal callback (one closure per object costs more than the set is used): a
        # collected object's entry reads as absent and is replaced if its id is reused.
        ref = self._refs.get(id(obj))
        if ref is None or ref() is not obj:
            self._refs[id(obj)] = weakref.ref(obj)
            return True
        return False

    def discard(self, obj: Any) -> None:
        ref = self._refs.get(id(obj))
        if ref is not None and ref() is obj:
            del self._refs[id(obj)]

    def __bool__(self) -> bool:
        return any(ref() is not None for ref in self._refs.values())

    def __iter__(self) -> Iterator[Any]:
        for ref in list(self._refs.values()):
            obj = ref()
            if obj is not None:
                yield obj


class WeakObjects:
    """``{node id: object}`` holding the objects weakly.

    The part of ``weakref.WeakValueDictionary``'s interface a load uses (``get``, ``[]``,
    ``in``, ``values``, ``len``) at a fraction of its per-call cost: a load looks up every
    node of the graph several times (100,000 nodes for a model of 100,000 variables). Entries
    of collected objects read as absent.
    """

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Any]] = {}

    def get(self, key: int, default: Any = None) -> Any:
        ref = self._refs.get(key)
        obj = ref() if ref is not None else None
        return default if obj is None else obj

    def __getitem__(self, key: int) -> Any:
        obj = self._refs[key]()
        if obj is None:
            raise KeyError(key)
        return obj

    def __setitem__(self, key: int, value: Any) -> None:
        self._refs[key] = weakref.ref(value)

    def forget(self, key: int) -> None:
        """Remove ``key`` (no-op if absent)."""
        self._refs.pop(key, None)

    @property
    def refs(self) -> dict[int, weakref.ref[Any]]:
        """The ``{key: weakref}`` table itself, for loops over every node of a load (a method
        call per lookup would cost as much as the lookup). A dead reference reads as absent."""
        return self._refs

    def bind_many(self, keys: Iterable[int], objects: Iterable[Any]) -> None:
        """``self[key] = obj`` for each pair, at C speed (a reused restore binds every node)."""
        self._refs.update(zip(keys, map(weakref.ref, objects)))

    def dead_keys(self) -> list[int]:
        """Keys whose object was collected (they read as absent)."""
        return [key for key, ref in self._refs.items() if ref() is None]

    def __contains__(self, key: object) -> bool:
        ref = self._refs.get(key)  # type: ignore[call-overload]
        return ref is not None and ref() is not None

    def __len__(self) -> int:
        return sum(1 for ref in self._refs.values() if ref() is not None)

    def values(self) -> list[Any]:
        return [obj for obj in (ref() for ref in self._refs.values()) if obj is not None]
