"""What serializing the object graph for a save yields: :class:`SerializedGraph`.

Its own module so that both producers, the walk (``serialize.py``) and the replay of an earlier
walk (``save_replay.py``), build it without importing each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.tracking.base import Trackable

__all__ = ["SerializedGraph", "TensorsByTrackable"]


class TensorsByTrackable:
    """``{trackable: {checkpoint_key: value}}`` keyed by identity (trackables may be unhashable
    or define ``__eq__``); what ``MultiDeviceSaver`` takes. ``None`` owns the object graph."""

    def __init__(self, pairs: list[tuple[Trackable | None, dict[str, Any]]] | None = None) -> None:
        self._pairs: list[tuple[Trackable | None, dict[str, Any]]] = pairs or []

    def add(self, trackable: Trackable | None, tensors: dict[str, Any]) -> None:
        self._pairs.append((trackable, tensors))

    def items(self) -> list[tuple[Trackable | None, dict[str, Any]]]:
        return list(self._pairs)

    def __iter__(self) -> Iterator[Trackable | None]:
        return (trackable for trackable, _ in self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def keys(self) -> list[str]:
        """Every checkpoint key, in data order."""
        return [key for _, tensors in self._pairs for key in tensors]


@dataclass(frozen=True, slots=True)
class SerializedGraph:
    """Everything one save writes, gathered from the live objects."""

    object_graph_bytes: bytes
    """The serialized ``TrackableObjectGraph`` (what is stored under the object graph key)."""
    tensors: TensorsByTrackable
    """Values by trackable and checkpoint key, the object graph last."""
    registered_savers: dict[str, dict[str, Trackable]]
    """``{saver name: {object path: trackable}}`` for registered savers."""
    objects: tuple[Trackable, ...]
    """Every node's object, by node id."""

    @property
    def object_graph_proto(self) -> TrackableObjectGraph:
        """The graph, ``has_checkpoint_values`` set on every node (parsed on each access)."""
        return TrackableObjectGraph.FromString(self.object_graph_bytes)
