"""Saving: ``MultiDeviceSaver``, sharding policies, registered savers, options, atomic commit,
the asynchronous writer."""

from __future__ import annotations

from trackpoint.saving import sharding
from trackpoint.saving.async_writer import AsyncWriter
from trackpoint.saving.devices import LOCAL_TASK, DeviceValue, task_of
from trackpoint.saving.incremental import SaveHistory
from trackpoint.saving.options import CheckpointOptions, WriteCallback
from trackpoint.saving.progress import ProgressEvent
from trackpoint.saving.registration import (
    RegisteredSaver,
    get_registered_saver,
    get_registered_saver_name,
    objects_to_restore,
    register_checkpoint_saver,
    registered_savers,
    unregister_checkpoint_saver,
)
from trackpoint.saving.saver import MultiDeviceSaver
from trackpoint.saving.sharding import (
    MaxShardSizePolicy,
    Shard,
    ShardableTensor,
    ShardByTaskPolicy,
    ShardingPolicy,
)
from trackpoint.saving.snapshot import SaveSnapshot

__all__ = [
    "LOCAL_TASK",
    "AsyncWriter",
    "CheckpointOptions",
    "DeviceValue",
    "MaxShardSizePolicy",
    "MultiDeviceSaver",
    "ProgressEvent",
    "RegisteredSaver",
    "SaveHistory",
    "SaveSnapshot",
    "Shard",
    "ShardByTaskPolicy",
    "ShardableTensor",
    "ShardingPolicy",
    "WriteCallback",
    "get_registered_saver",
    "get_registered_saver_name",
    "objects_to_restore",
    "register_checkpoint_saver",
    "registered_savers",
    "sharding",
    "task_of",
    "unregister_checkpoint_saver",
]
