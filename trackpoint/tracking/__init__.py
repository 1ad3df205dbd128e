"""The object model: trackables, tracked containers, variables, Python state, slots, adapters.

See DESIGN.md: this layer knows objects and their names, never files.
"""

from __future__ import annotations

from trackpoint.tracking.adapters import (
    AdapterFactory,
    claims_structure,
    is_adaptable,
    register_adapter,
    register_lazy_integration,
    register_structure_adapter,
    to_trackable,
)
from trackpoint.tracking.autotrackable import AutoTrackable
from trackpoint.tracking.base import (
    VARIABLE_VALUE_KEY,
    DeferredRestoration,
    NotTrackable,
    Trackable,
    TrackableReference,
    has_values,
)
from trackpoint.tracking.containers import NoDependency, TrackableDataStructure, wrap_or_unwrap
from trackpoint.tracking.lists import ListWrapper
from trackpoint.tracking.mappings import DictWrapper, TupleWrapper
from trackpoint.tracking.parallel import ParallelVariable
from trackpoint.tracking.python_state import PYTHON_STATE, PythonState
from trackpoint.tracking.save_check import SaveChecked
from trackpoint.tracking.slots import PendingSlot, SlotOwner
from trackpoint.tracking.variable import Variable

__all__ = [
    "PYTHON_STATE",
    "VARIABLE_VALUE_KEY",
    "AdapterFactory",
    "AutoTrackable",
    "DeferredRestoration",
    "DictWrapper",
    "ListWrapper",
    "NoDependency",
    "NotTrackable",
    "ParallelVariable",
    "PendingSlot",
    "PythonState",
    "SaveChecked",
    "SlotOwner",
    "Trackable",
    "TrackableDataStructure",
    "TrackableReference",
    "TupleWrapper",
    "Variable",
    "claims_structure",
    "has_values",
    "is_adaptable",
    "register_adapter",
    "register_lazy_integration",
    "register_structure_adapter",
    "to_trackable",
    "wrap_or_unwrap",
]
