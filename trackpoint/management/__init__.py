"""Finding and inspecting checkpoints: the path resolver, the state file, ``CheckpointManager``,
and ``load_checkpoint``/``list_variables``/``object_metadata``."""

from __future__ import annotations

from trackpoint.management.continuous import ContinuousCheckpointingPolicy
from trackpoint.management.inspection import (
    list_variables,
    load_checkpoint,
    load_variable,
    object_metadata,
)
from trackpoint.management.manager import CheckpointManager
from trackpoint.management.paths import resolve_prefix
from trackpoint.management.reader import CheckpointReader
from trackpoint.management.state_file import get_checkpoint_state, latest_checkpoint

__all__ = [
    "CheckpointManager",
    "CheckpointReader",
    "ContinuousCheckpointingPolicy",
    "get_checkpoint_state",
    "latest_checkpoint",
    "list_variables",
    "load_checkpoint",
    "load_variable",
    "object_metadata",
    "resolve_prefix",
]
