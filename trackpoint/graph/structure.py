"""Whether the object graph still has the shape it had: the exact check behind reusing work.

A training loop saves and restores the same objects again and again. Walking 100,000 values,
naming them and encoding the object graph costs several times the bytes' own cost (issue 19),
and none of it changes while the structure does not. A :class:`StructureSnapshot` records the
structure one walk saw — every node, and each node's children by local name and identity — and
:meth:`StructureSnapshot.unchanged` answers, exactly, whether a walk now would see the same:

- every recorded node is still alive (held weakly: a snapshot never keeps an object, or the
  array an adapter wraps, alive after the program dropped it);
- every node with children lists the same names, in the same order, bound to the same objects
  (asked of the object itself, ``_trackable_children()``, so tracked containers adopt changes
  made to the original dict or list, and adapters such as torch modules list their children
  anew);
- every leaf is still a leaf.

That is the whole input of the walk's structure: what the walk derives from it (node ids,
paths, checkpoint keys, the encoded graph) is a function of it. A value changed in place does
not change the structure; values are always read again at the call. Objects that cannot be
referenced weakly are not snapshotted (:meth:`StructureSnapshot.capture` returns None) and
the caller walks every time.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from itertools import compress, repeat
from operator import is_, not_
from typing import TYPE_CHECKING

from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import Trackable, TrackableReference

if TYPE_CHECKING:
    from trackpoint.graph.walk import ObjectGraphView

__all__ = ["StructureSnapshot"]

_PLAIN_CHILDREN = Trackable._trackable_children


def _is_plain_leaf(obj: Trackable) -> bool:
    """A leaf whose children come from its own dependency list, which is empty."""
    return (
        type(obj)._trackable_children is _PLAIN_CHILDREN
        and not getattr(obj, "_self_dependencies", None)
    )


class StructureSnapshot:
    """The nodes of one walk and the children of each, checkable later in one cheap pass.

    Build with :meth:`capture`; ask :meth:`unchanged` before reusing anything derived from
    the walk. Not thread-safe (as the walk itself).
    """

    __slots__ = ("_attached", "_leaves", "_parents", "_plain_leaves", "_refs", "_view")

    def __init__(
        self,
        view: ObjectGraphView,
        refs: list[weakref.ref[Trackable]],
        parents: list[tuple[int, list[str], list[int]]],
        leaves: list[int],
        plain_leaves: list[int],
        attached: list[tuple[str, int]],
    ) -> None:
        self._view = view
        self._refs = refs
        self._parents = parents  # (node, child names, child nodes), root first
        self._leaves = leaves  # nodes whose children are computed but were empty
        self._plain_leaves = plain_leaves  # leaves with the base class's empty dependency list
        self._attached = attached  # the root's attached dependencies: (name, node)

    @classmethod
    def capture(
        cls,
        view: ObjectGraphView,
        objects: Sequence[Trackable],
        children: Sequence[Sequence[TrackableReference]],
    ) -> StructureSnapshot | None:
        """The snapshot of a walk of ``view`` that found ``objects`` (node order) and
        ``children[i]`` under ``objects[i]`` (the root's attached dependencies included).

        Returns None when an object cannot be referenced weakly.
        """
        try:
            refs = [weakref.ref(obj) for obj in objects]
        except TypeError:
            return None
        attached_objects = [_held(ref.ref) for ref in view.attached_dependencies]
        if any(obj is None for obj in attached_objects):
            return None  # a dead attached dependency: rare, not worth reusing around
        node_of = {id(obj): index for index, obj in enumerate(objects)}
        parents: list[tuple[int, list[str], list[int]]] = []
        leaves: list[int] = []
        plain_leaves: list[int] = []
        attached: list[tuple[str, int]] = []
        for index, refs_of in enumerate(children):
            if index == 0:  # list_children puts the attached dependencies last
                own = len(refs_of) - len(attached_objects)
                attached = [(ref.name, node_of[id(ref.ref)]) for ref in refs_of[own:]]
                refs_of = refs_of[:own]
            if refs_of or index == 0:
                names = [ref.name for ref in refs_of]
                parents.append((index, names, [node_of[id(ref.ref)] for ref in refs_of]))
            elif _is_plain_leaf(objects[index]):
                plain_leaves.append(index)
            else:
                leaves.append(index)
        return cls(view, refs, parents, leaves, plain_leaves, attached)

    def objects(self) -> list[Trackable] | None:
        """The recorded nodes in node order; None if one of them no longer exists."""
        objects = list(map(weakref.ref.__call__, self._refs))  # in C: 100,000s of nodes
        if any(map(is_, objects, repeat(None))):
            return None
        return objects  # type: ignore[return-value]

    def unchanged(self) -> list[Trackable] | None:
        """The nodes in node order if a walk now would find exactly the recorded structure;
        None if anything differs (then walk again)."""
        objects = self.objects()
        if objects is None or objects[0] is not _root(self._view):
            return None
        if not self._same_attached(objects):
            return None
        for index, names, child_nodes in self._parents:
            if not _same_children(objects[index], names, child_nodes, objects):
                return None
        for index in self._leaves:
            if objects[index]._trackable_children():
                return None
        plain = list(map(objects.__getitem__, self._plain_leaves))
        kinds: set[type[Trackable]] = set(map(type, plain))
        if any(cls._trackable_children is not _PLAIN_CHILDREN for cls in kinds):
            return None  # one computes its children now
        if any(map(getattr, plain, repeat("_self_dependencies"), repeat(None))):
            return None  # one gained a dependency
        return objects

    def _same_attached(self, objects: list[Trackable]) -> bool:
        current = self._view.attached_dependencies
        if len(current) != len(self._attached):
            return False
        for ref, (name, node) in zip(current, self._attached):
            if ref.name != name or _held(ref.ref) is not objects[node]:
                return False
        return True


def _held(held: Trackable | weakref.ref[Trackable]) -> Trackable | None:
    """An attached dependency's object (it may be held through a weakref)."""
    return held() if isinstance(held, weakref.ref) else held


def _root(view: ObjectGraphView) -> Trackable | None:
    try:
        return view.root
    except Exception:  # noqa: BLE001 - a dead weak root: nothing to reuse
        return None


def _same_children(
    obj: Trackable, names: list[str], child_nodes: list[int], objects: list[Trackable]
) -> bool:
    children = obj._trackable_children()
    if len(children) != len(names) or list(children) != names:
        return False
    values = list(children.values())
    expected = list(map(objects.__getitem__, child_nodes))
    same = list(map(is_, values, expected))  # in C; a container's children may be raw values
    if all(same):
        return True
    return all(
        to_trackable(values[i]) is expected[i] for i in compress(range(len(same)), map(not_, same))
    )
