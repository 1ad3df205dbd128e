"""Replaying a save's walk while the object graph keeps its structure (a training loop).

A view saved again and again (``Checkpoint.save`` in a loop) lends each save what the walk of
the previous one derived from the structure: node ids, checkpoint keys, the encoded graph.
:class:`SaveReplay` holds them with a :class:`~trackpoint.graph.structure.StructureFingerprint` and
hands them out only while a walk now would find exactly the same:

- the structure fingerprint says every node, and each node's children, are as recorded (slot
  variables included, as leaves);
- every optimizer (``SlotOwner``) still keeps the same slot variables, each the same object, for
  the same variables under the same slot names, in the same order (an optimizer step that added
  state, an entry replaced by ``load_state_dict``), and every variable it keeps state for is
  still a node;
- every object still names the same values (a class's batch ``_serialize_many`` is asked for them
  anew, as the walk asks).

The values themselves and the containers' save checks are always taken anew, at the call.
:class:`ValueGroup` is what walk and replay share: the nodes of one class and their values' keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import is_, itemgetter
from typing import Any

from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.keys import OBJECT_GRAPH_KEY
from trackpoint.graph.serialized import SerializedGraph, TensorsByTrackable
from trackpoint.graph.structure import StructureFingerprint
from trackpoint.graph.walk import GraphWalk, ObjectGraphView, slots_of
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import Trackable, batch_hook
from trackpoint.tracking.python_state import string_scalar
from trackpoint.tracking.slots import SlotOwner

__all__ = ["SaveReplay", "ValueGroup", "serialize_many"]

Pair = tuple[Trackable, dict[str, Any]]
"""One object and its values by checkpoint key."""


def serialize_many(cls: type[Trackable], objects: list[Trackable]) -> list[Any]:
    """The values of ``objects`` (all of class ``cls``), through the class's batch hook.

    Raises:
        InvalidArgumentError: the hook returned another number of results than objects.
    """
    results = batch_hook(cls, "_serialize_many")(objects)
    if len(results) != len(objects):
        raise InvalidArgumentError(
            f"{cls.__name__}._serialize_many returned {len(results)} results for "
            f"{len(objects)} objects; it returns one {{name: value}} dict per object, in order"
        )
    return results if type(results) is list else list(results)


@dataclass(frozen=True, slots=True)
class ValueGroup:
    """The nodes of one class whose values a save writes, and their checkpoint keys.

    With ``names`` (every node saves exactly these values, in this order: the usual case),
    ``keys[j][i]`` is the key of value ``names[j]`` of node ``nodes[i]``; without, ``keys[i]``
    is node ``i``'s keys and ``node_names[i]`` its value names.
    """

    cls: type[Trackable]
    nodes: list[int]
    names: tuple[str, ...] | None
    keys: list[list[str]]
    node_names: list[tuple[str, ...]]

    def pairs(self, objects: list[Trackable], values: list[Any]) -> list[Pair] | None:
        """``(object, {key: value})`` of each node from what ``_serialize_many`` returned;
        None when a node no longer names the recorded values."""
        names = self.names
        if names is None:
            out: list[Pair] = []
            for obj, live, names_now, keys in zip(objects, values, self.node_names, self.keys):
                if tuple(live) != names_now:
                    return None
                out.append((obj, dict(zip(keys, live.values()))))
            return out
        if set(map(len, values)) - {len(names)}:
            return None
        if not names:  # the class saved nothing this time
            return [(obj, {}) for obj in objects]
        try:
            found = list(map(itemgetter(*names), values))
        except KeyError:
            return None
        if len(names) == 1:  # one value each (a variable): a dict display is the cheapest
            return [(obj, {key: value}) for obj, key, value in zip(objects, self.keys[0], found)]
        return list(zip(objects, map(dict, map(zip, zip(*self.keys), found))))


def place(target: list[Any], nodes: list[int], found: Sequence[Any]) -> None:
    """``target[nodes[i]] = found[i]`` (a slice when the nodes are one ascending run)."""
    if nodes and nodes[-1] - nodes[0] + 1 == len(nodes):
        target[nodes[0] : nodes[-1] + 1] = found
        return
    for index, item in zip(nodes, found):
        target[index] = item


class SaveReplay:
    """What one save of a view lends the next, valid while the structure is exactly the same.

    Build with :meth:`capture` after a walk; :meth:`serialize` gives the next save's graph or
    None (walk again).
    """

    __slots__ = ("_checks", "_count", "_graph", "_groups", "_in_order", "_listed", "_node_ids",
                 "_owners", "_fingerprint")  # fmt: skip

    def __init__(
        self,
        fingerprint: StructureFingerprint,
        graph: bytes,
        groups: list[ValueGroup],
        checks: list[tuple[int, str]],
        owners: list[tuple[int, list[tuple[int, str, int]]]],
        node_ids: dict[int, int],
        listed: int,
    ) -> None:
        self._fingerprint = fingerprint
        self._graph = graph
        self._groups = groups
        self._checks = checks  # (node, readable path) of containers with save checks
        self._owners = owners  # (optimizer node, its slot refs (variable, slot name, slot node))
        self._node_ids = node_ids  # id(object) -> node, of the recorded (living) objects
        self._listed = listed  # nodes before the slot variables
        self._count = len(node_ids)
        bounds = [(group.nodes[0], group.nodes[-1]) for group in groups if group.nodes]
        self._in_order = all(
            last < first for (_, last), (first, _) in zip(bounds, bounds[1:])
        ) and all(group.nodes == sorted(group.nodes) for group in groups)

    @classmethod
    def capture(
        cls,
        view: ObjectGraphView,
        walk: GraphWalk,
        graph: bytes,
        groups: list[ValueGroup],
        checks: list[tuple[int, str]],
    ) -> SaveReplay | None:
        """The replay of ``walk`` (which gave ``graph``, ``groups`` and ``checks``); None
        when an object cannot be referenced weakly."""
        objects, listed = walk.objects, len(walk.children)
        # Slot variables are leaves of the structure too: one that gains a child is refused.
        children: Sequence[Any] = [*walk.children, *repeat([], len(objects) - listed)]
        fingerprint = StructureFingerprint.capture(view, objects, children)
        if fingerprint is None:
            return None
        node_ids = walk.node_ids
        owners = [
            (index, walk.slot_refs.get(id(obj), []))
            for index, obj in enumerate(objects[:listed])
            if isinstance(obj, SlotOwner)
        ]
        return cls(fingerprint, graph, groups, checks, owners, node_ids, listed)

    def serialize(self) -> SerializedGraph | None:
        """The graph of a save now, or None if anything it depends on changed."""
        objects = self._fingerprint.unchanged()
        if objects is None or not self._same_slots(objects):
            return None
        for index, where in self._checks:
            objects[index]._check_saveable(where)  # type: ignore[attr-defined]
        found_by_group: list[list[Pair]] = []
        for group in self._groups:
            nodes = group.nodes
            if nodes and nodes[-1] - nodes[0] + 1 == len(nodes):  # one run: a slice
                members = objects[nodes[0] : nodes[-1] + 1]
            else:
                members = list(map(objects.__getitem__, nodes))
            if set(map(type, members)) != {group.cls}:
                return None  # an object's class was reassigned
            found = group.pairs(members, serialize_many(group.cls, members))
            if found is None:
                return None
            found_by_group.append(found)
        if self._in_order:  # each group's nodes come after the previous group's: concatenate
            pairs: list[Any] = list(chain.from_iterable(found_by_group))
        else:
            pairs = [None] * self._count
            for group, found in zip(self._groups, found_by_group):
                place(pairs, group.nodes, found)
            pairs = list(filter(None, pairs))
        tensors = TensorsByTrackable(pairs)
        tensors.add(None, {OBJECT_GRAPH_KEY: string_scalar(self._graph)})
        return SerializedGraph(self._graph, tensors, {}, tuple(objects))

    def _same_slots(self, objects: list[Trackable]) -> bool:
        """Whether each optimizer keeps exactly the recorded slot variables, and every
        variable it keeps state for is still a node (else the walk raises)."""
        node_ids, non_slot = self._node_ids, objects[: self._listed]
        for owner_node, recorded in self._owners:
            owner = objects[owner_node]
            for _, variable in owner._slot_variables():  # type: ignore[attr-defined]
                trackable = to_trackable(variable)
                if trackable is None or node_ids.get(id(trackable)) is None:
                    return False
            found = list(slots_of(owner, non_slot))  # type: ignore[arg-type]
            if len(found) != len(recorded):
                return False
            if [(v, name) for v, name, _ in found] != [(v, name) for v, name, _ in recorded]:
                return False
            now = [slot for _, _, slot in found]
            then = [objects[slot_node] for _, _, slot_node in recorded]
            if not all(map(is_, now, then)):
                return False
        return True
