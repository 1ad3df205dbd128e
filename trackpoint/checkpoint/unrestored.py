"""The warning about checkpoint values a restore never used (semantics C4).

It is logged from a ``weakref.finalize`` hook when the restore's coordinator is freed, unless
``expect_partial()`` was called; the state it needs is kept apart from the coordinator so the
hook does not keep the coordinator alive.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from trackpoint.checkpoint.saved_graph import SavedGraph

__all__ = ["WarningState", "warn_unrestored"]

logger = logging.getLogger("trackpoint.checkpoint")


@dataclass(slots=True)
class WarningState:
    """What the C4 warning needs, kept apart from the coordinator so the finalizer can hold it."""

    graph: SavedGraph
    matched_proto_ids: set[int]
    unused_attributes: dict[int, list[str]]
    ignored_node_ids: frozenset[int]
    expect_partial: bool = False
    prefix: str = ""
    extra: list[str] = field(default_factory=list)


def warn_unrestored(state: WarningState) -> None:
    """Log one warning naming every checkpoint value this restore never used."""
    if state.expect_partial:
        return
    unmatched = [
        node_id for node_id in state.graph.unmatched(state.matched_proto_ids, with_saver=False)
        if node_id not in state.ignored_node_ids
    ]
    if not unmatched and not state.unused_attributes:
        return
    names = state.graph.node_names()
    lines = [
        f"Value in checkpoint could not be found in the restored object: {names[node_id]}"
        for node_id in unmatched
    ]
    lines += [
        "An attribute in the restored object could not be found in the checkpoint. "
        f"Object: {names[node_id]}, attribute: {attributes}"
        for node_id, attributes in state.unused_attributes.items()
    ]
    if lines:
        logger.warning(
            "A checkpoint restore from %s is being dropped with unrestored values. To silence "
            "this warning, call `status.expect_partial()` on the status that `read()`/`restore()` "
            "returned.\n  %s",
            state.prefix,
            "\n  ".join(lines),
        )
