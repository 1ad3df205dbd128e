"""Matching one object's values to the attributes of its checkpoint node.

The restore walk (``checkpoint/restore.py``) plans runs of leaves whose class declares
``_whole_value_names`` from the checkpoint's attributes (``restore_bulk.plan_leaves``); every
other object comes here, and so does such a leaf on a node that does not fit its declaration:
an object of a registered saver, one with several values, renamed values (aliases, semantics
G3), optional values, values whose layout matters (slices, devices), and objects without values
whose node has attributes (reported as unused, C1).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.keys import ADVISORY_ATTRIBUTES, escape_local_name
from trackpoint.saving.devices import DeviceValue
from trackpoint.saving.restore import RestoreItem
from trackpoint.tracking.base import Trackable, has_values

if TYPE_CHECKING:
    from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
    from trackpoint.checkpoint.restore_plan import RestorePlan

__all__ = ["MatchingContext", "plan_values"]


class MatchingContext(Protocol):
    """What matching asks of the load it is part of (the ``RestoreCoordinator``)."""

    restore_uid: int
    prefix: str
    unused_attributes: dict[int, list[str]]
    """Node id -> checkpoint attributes its object did not take (reported by the status)."""

    def node_name(self, node_id: int) -> str:
        """Readable path of a checkpoint node."""
        ...


def plan_values(
    coordinator: MatchingContext,
    plan: RestorePlan,
    node_id: int,
    node: TrackableObjectGraph.TrackableObject,
    trackable: Trackable,
) -> bool:
    """Plan the values of ``trackable`` from node ``node_id``; True if the plan gives it
    values (False: a newer restore did, or the checkpoint has none it accepts).

    Raises:
        InvalidArgumentError: the checkpoint has some of the object's values but not all (and
            the missing ones are not optional).
    """
    if coordinator.restore_uid <= trackable._update_uid:
        return False  # a more recently requested restore already gave it values
    if node.HasField("registered_saver") and node.registered_saver.name:
        saver = node.registered_saver
        if plan.plan(trackable):
            plan.registered.setdefault(saver.name, {})[saver.object_name] = trackable
        return True
    live = trackable._serialize_to_tensors() if has_values(trackable) else {}
    attributes = node.attributes
    label = functools.partial(coordinator.node_name, node_id)
    if len(live) == 1 and len(attributes) == 1:
        # One value, stored under its own escaped name (a variable of a class without the
        # declaration, or one on a node the walk's one-pass planning declined).
        ((own_name, value),) = live.items()
        attribute = attributes[0]
        # ("VARIABLE_VALUE" and most names escape to themselves: skip building the copy)
        plain = "." not in own_name and "/" not in own_name
        if attribute.name == (own_name if plain else escape_local_name(own_name)):
            if plan.plan(trackable):
                layouts = {own_name: value} if _has_layout(value) else None
                plan.add_item(
                    RestoreItem(trackable, {own_name: attribute.checkpoint_key}, label, layouts)
                )
            return True
    if not live:
        if attributes:
            coordinator.unused_attributes.setdefault(node_id, []).extend(a.name for a in attributes)
        plan.plan(trackable)
        return True
    by_escaped = {escape_local_name(name): name for name in live}
    for name, aliases in trackable._tensor_name_aliases().items():
        if name in live:
            for alias in aliases:
                by_escaped.setdefault(escape_local_name(alias), name)
    keys: dict[str, str] = {}
    present = {attribute.name for attribute in attributes}
    for attribute in attributes:
        matched = by_escaped.get(attribute.name)
        if (
            matched is not None
            and attribute.name != escape_local_name(matched)
            and (escape_local_name(matched) in present)
        ):
            matched = None  # an old alias next to the current name: the current one wins
        if matched is None:
            if attribute.name not in ADVISORY_ATTRIBUTES:
                coordinator.unused_attributes.setdefault(node_id, []).append(attribute.name)
            continue
        keys[matched] = attribute.checkpoint_key
    if not keys:
        return False  # nothing of this object is in the checkpoint: it stays unmatched
    missing = sorted(set(live) - set(keys) - trackable._optional_tensor_names())
    if missing:
        raise InvalidArgumentError(
            f"Could not restore object {label()} ({type(trackable).__name__}): not "
            f"all of its values are in the checkpoint {coordinator.prefix}. Expected "
            f"{sorted(live)}, the checkpoint has {sorted(a.name for a in attributes)}. "
            "Nothing was restored.",
            path=coordinator.prefix,
        )
    if plan.plan(trackable):
        layouts = {name: live[name] for name in keys if _has_layout(live[name])}
        plan.add_item(RestoreItem(trackable, keys, label, layouts or None))
    return True


def _has_layout(value: Any) -> bool:
    """Whether a live value's layout matters to reading it (slices, devices)."""
    return type(value) is not np.ndarray and isinstance(value, (Mapping, DeviceValue))
