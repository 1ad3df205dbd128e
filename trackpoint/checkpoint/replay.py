"""Reading one checkpoint graph again and again: replay the walk while nothing changed.

A training loop (or an evaluation job polling for new checkpoints) reads checkpoints of one
program into one ``Checkpoint``. The restore walk — binding 100,000 nodes to 100,000 objects by
local name — gives the same result every time unless the checkpoint's object graph or the
program's structure changed, so each ``Checkpoint`` keeps a :class:`RestoreReplay`:

- the object graph of its last read (:class:`~trackpoint.checkpoint.saved_graph.SavedGraph`),
  kept when the next checkpoint's graph has the same bytes;
- after a read whose walk met exactly the program's object graph (every live child bound to the
  checkpoint node of its name, in order; no slot variables, registered savers or objects the
  checkpoint shares differently), a
  :class:`~trackpoint.graph.structure.StructureFingerprint` of that structure and a
  :class:`WalkReplay` of the walk's result.

The next read replays that walk instead of walking when, and only when, the graph is the
same (equal bytes) and the fingerprint says the structure is unchanged (every object alive, same
children by name and identity, leaves still leaves). Everything the walk derives from those two
is then the same: which node is bound to which object, the checkpoint key of every plain
leaf planned from the checkpoint's attributes (its class declares ``_whole_value_names``), the
nodes left for deferred restoration. What may differ between two reads of one structure is
asked again: values are read and verified anew, and every other object is planned again (a
container's plain values may have changed). A different graph, a changed structure or a failed
read drops the recorded walk; the next read walks.

The fingerprint also serves the load status: ``assert_*`` methods that would walk the program
again ask the fingerprint instead, and walk only if the structure changed since the read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from trackpoint.checkpoint.restore import CheckpointPosition, RestoreCoordinator
from trackpoint.checkpoint.restore_plan import PlannedBatch, RestorePlan, WalkRecord
from trackpoint.checkpoint.saved_graph import SavedGraph
from trackpoint.graph.keys import SAVE_COUNTER
from trackpoint.graph.structure import StructureFingerprint

if TYPE_CHECKING:
    from trackpoint.bundle.reader import BundleReader
    from trackpoint.graph.walk import ObjectGraphView
    from trackpoint.saving.options import CheckpointOptions
    from trackpoint.tracking.base import Trackable

__all__ = ["RestoreReplay", "WalkReplay"]


class WalkReplay:
    """The result of one top-level walk, by position in the fingerprint's node order.

    ``node_ids[i]`` is the checkpoint node bound to the fingerprint's object ``i``.
    """

    __slots__ = ("batches", "deferred", "general", "node_ids")

    def __init__(self, record: WalkRecord, plan: RestorePlan) -> None:
        self.node_ids = [node_id for node_id, _ in record.queue]
        self.general = record.general  # object index of each object planned anew
        # (class, general objects before it, object index of each, the walk's batch): each
        # object of a batch restored from the same keys as the walk planned
        self.batches = [
            (cls, *record.batches[cls], batch) for cls, batch in plan.batches.items()
        ]
        self.deferred = record.deferred  # (parent's object index, local name, node id)

    def replay(
        self, coordinator: RestoreCoordinator, objects: list[Trackable], plan: RestorePlan
    ) -> None:
        """Fill ``plan`` and bind ``coordinator``'s nodes as the walk did, for ``objects``."""
        node_ids = self.node_ids
        coordinator.object_by_proto_id.bind_many(node_ids, objects)
        coordinator.matched_proto_ids.update(node_ids)
        plan.bound.extend(node_ids)  # first: a failure below forgets every binding
        nodes = coordinator.proto.nodes
        batches = iter(self.batches)
        waiting = next(batches, None)
        for done, index in enumerate([*self.general, None]):
            while waiting is not None and (index is None or waiting[1] <= done):
                cls, _, indexes, walked = waiting
                batch = plan.batches[cls] = PlannedBatch(walked.names, len(plan.items))
                batch.objects = list(map(objects.__getitem__, indexes))
                batch.keys, batch.nodes = walked.keys, walked.nodes  # read only from here on
                waiting = next(batches, None)
            if index is not None:
                node_id = node_ids[index]
                if not coordinator.plan_node(plan, node_id, nodes[node_id], objects[index]):
                    plan.unassigned.append(node_id)
        for parent, name, node_id in self.deferred:
            plan.deferred.append((objects[parent], name, CheckpointPosition(coordinator, node_id)))


class _Kept(NamedTuple):
    """What one read lends the next (kept as one value: a concurrent read sees all or none)."""

    graph: SavedGraph
    fingerprint: StructureFingerprint
    walk: WalkReplay


class RestoreReplay:
    """What one ``Checkpoint``'s last read lends the next (see the module docstring)."""

    __slots__ = ("_counter", "_graph", "_kept")

    def __init__(self) -> None:
        self._graph: SavedGraph | None = None
        self._kept: _Kept | None = None
        self._counter: tuple[SavedGraph, int | None] | None = None

    def counter_node(self, graph: SavedGraph) -> int | None:
        """The node of the root's ``save_counter`` child in ``graph``, if it has one.

        Asked at every read of a Checkpoint without a counter: answered once per graph (a
        root may have 100,000 children; the counter, added last, is usually the last).
        """
        kept = self._counter
        if kept is not None and kept[0] is graph:
            return kept[1]
        nodes = graph.proto.nodes
        node_id = next(
            (c.node_id for c in reversed(nodes[0].children) if c.local_name == SAVE_COUNTER),
            None,
        )
        if node_id is not None and not 0 <= node_id < len(nodes):
            node_id = None  # an id out of range is the graph checks' to report
        self._counter = (graph, node_id)
        return node_id

    def load_graph(self, bundle: BundleReader) -> SavedGraph | None:
        """The checkpoint's object graph (the last one's if the bytes are the same)."""
        graph = SavedGraph.load(bundle, self._graph)
        if graph is not None:
            self._graph = graph
        return graph

    def restore(
        self,
        view: ObjectGraphView,
        graph: SavedGraph,
        prefix: str,
        options: CheckpointOptions,
        index: BundleReader,
        *,
        own: Mapping[int, Trackable] | None = None,
    ) -> tuple[RestoreCoordinator, StructureFingerprint | None]:
        """Restore ``view``'s objects from the checkpoint: replay the last walk if nothing
        changed, else walk (and keep what the next read may replay). ``own``: the checkpoint's
        own objects the program does not hold yet (see :meth:`RestoreCoordinator.execute`).

        Returns:
            The coordinator of this load, and a fingerprint of the structure it met (None if the
            walk met anything but exactly the program's object graph).
        """
        coordinator = RestoreCoordinator(graph, prefix, options, index=index)
        kept, self._kept = self._kept, None  # kept again if this read succeeds
        root = view.root
        objects = kept.fingerprint.unchanged() if kept is not None and kept.graph is graph else None
        try:
            if kept is not None and objects is not None and objects[0] is root:
                plan, replay = RestorePlan(), kept.walk.replay
                coordinator.execute(plan, lambda: replay(coordinator, objects, plan), own=own)
            else:
                refs = view.list_children(root)
                children = {ref.name: ref.ref for ref in refs}
                record = WalkRecord([]) if not graph.slot_variables() else None
                walked = CheckpointPosition(coordinator, 0).walk_and_restore(
                    root, children, record, own=own
                )
                kept = _keep(view, graph, record, walked)
        except BaseException:
            coordinator.expect_partial = True  # the error says it all; no "unrestored" warning
            raise
        self._kept = kept
        return coordinator, kept.fingerprint if kept is not None else None


def _keep(
    view: ObjectGraphView, graph: SavedGraph, record: WalkRecord | None, plan: RestorePlan | None
) -> _Kept | None:
    """The fingerprint and replay of a walk, if it met exactly the program's object graph."""
    if record is None or record.failed or plan is None:
        return None
    if plan.registered or plan.pending_slots or plan.slots_taken or plan.seen:
        return None  # their objects or bookkeeping are not part of the structure
    objects = [obj for _, obj in record.queue]
    if len(set(map(id, objects))) != len(objects):
        return None  # one object bound to two nodes: the program's graph has it once
    fingerprint = StructureFingerprint.capture(view, objects, record.children)
    if fingerprint is None:
        return None
    return _Kept(graph, fingerprint, WalkReplay(record, plan))
