"""The checkpoint layer: ``Checkpoint``, the one restore engine, and load statuses."""

from __future__ import annotations

from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.checkpoint.load_status import (
    CheckpointLoadStatus,
    InitializationOnlyStatus,
    LoadStatus,
    NameBasedSaverStatus,
)

__all__ = [
    "Checkpoint",
    "CheckpointLoadStatus",
    "InitializationOnlyStatus",
    "LoadStatus",
    "NameBasedSaverStatus",
]
