"""Whether the object graph still has the shape it had: the exact check behind reusing work.

A training loop saves and restores the same objects again and again. Walking 100,000 values,
naming them and encoding the object graph costs several times the bytes' own cost (issue 19),
and none of it changes while the structure does not. A :class:`StructureFingerprint` records the
structure one walk saw — every node, and each node's children by local name and identity — and
:meth:`StructureFingerprint.unchanged` answers, exactly, whether a walk now would see the same:

- every recorded node is still alive (held weakly: a fingerprint never keeps an object, or the
  array an adapter wraps, alive after the program dropped it);
- every node with children lists the same names, in the same order, bound to the same objects
  (asked of the object itself, ``_trackable_children()``, so tracked containers adopt changes
  made to the original dict or list, and adapters such as torch modules list their children
  anew);
- every leaf is still a leaf.

That is the whole input of the walk's structure: what the walk derives from it (node ids,
paths, checkpoint keys, the encoded graph) is a function of it. A value changed in place does
not change the structure; values are always read again at the call. Objects that cannot be
referenced weakly are not fingerprinted (:meth:`StructureFingerprint.capture` returns None) and
the caller walks every time.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from itertools import compress, repeat
from operator import and_, is_, itemgetter, not_
from typing import TYPE_CHECKING

from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import Trackable

if TYPE_CHECKING:
    from trackpoint.graph.walk import ObjectGraphView

__all__ = ["StructureFingerprint"]

_PLAIN_CHILDREN = Trackable._trackable_children
Children = Sequence[tuple[str, Trackable]] | Mapping[str, Trackable]
"""One node's children as a walk lists them: references, or local name -> child."""
_NAME = itemgetter(0)  # of a TrackableReference
_CHILD = itemgetter(1)


class StructureFingerprint:
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
        # Weakly: the view keeps the fingerprint (a save's reuse), which must not keep the view.
        self._view = weakref.ref(view)
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
        children: Sequence[Children],
    ) -> StructureFingerprint | None:
        """The fingerprint of a walk of ``view`` that found ``objects`` (node order) and
        ``children[i]`` under ``objects[i]`` (the root's attached dependencies included, last):
        references, or a mapping of local names to children (a restore's walk record).

        Returns None when an object cannot be referenced weakly.
        """
        try:
            refs = list(map(weakref.ref, objects))  # in C, as the rest: 100,000s of nodes
        except TypeError:
            return None
        attached_objects = [_held(ref.ref) for ref in view.attached_dependencies]
        if any(obj is None for obj in attached_objects):
            return None  # a dead attached dependency: rare, not worth reusing around
        count = len(objects)
        node_of = dict(zip(map(id, objects), range(count)))

        def edges(refs_of: Children) -> tuple[list[str], list[int]]:
            if isinstance(refs_of, Mapping):
                nodes = map(node_of.__getitem__, map(id, refs_of.values()))
                return list(refs_of), list(nodes)
            nodes = map(node_of.__getitem__, map(id, map(_CHILD, refs_of)))
            return list(map(_NAME, refs_of)), list(nodes)

        # The root is always a parent; list_children puts its attached dependencies last.
        root: Children = children[0] if count else ()
        root_refs = list(root.items()) if isinstance(root, Mapping) else root
        own = len(root_refs) - len(attached_objects)
        attached = list(zip(*edges(root_refs[own:])))
        parents = [(0, *edges(root_refs[:own]))] if count else []
        has_children = list(map(bool, children))
        parents += [(i, *edges(children[i])) for i in compress(range(1, count), has_children[1:])]
        leaf_nodes = list(compress(range(1, count), map(not_, has_children[1:])))
        leaf_objects = list(map(objects.__getitem__, leaf_nodes))
        # A plain leaf: its children come from its own dependency list, which is empty.
        kinds: list[type[Trackable]] = list(map(type, leaf_objects))
        plain_kind = {kind: kind._trackable_children is _PLAIN_CHILDREN for kind in set(kinds)}
        dependencies = map(getattr, leaf_objects, repeat("_self_dependencies"), repeat(None))
        plain = list(map(and_, map(plain_kind.__getitem__, kinds), map(not_, dependencies)))
        plain_leaves = list(compress(leaf_nodes, plain))
        leaves = list(compress(leaf_nodes, map(not_, plain)))
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
        view = self._view()
        if view is None or objects is None or objects[0] is not _root(view):
            return None
        if not self._same_attached(view, objects):
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

    def _same_attached(self, view: ObjectGraphView, objects: list[Trackable]) -> bool:
        current = view.attached_dependencies
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
