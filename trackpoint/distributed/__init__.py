"""Multi-process save and restore on torch.distributed or jax.distributed, with resharding.

Every rank of a process group writes its own values into one TensorFlow V2 checkpoint; sharded
values (DTensors, :func:`mark_sharded` tensors, :class:`Slice` / :class:`FlatSlice`) are stored
as slices of the full tensor, and a restore on any number of ranks, with any slicing, reads just
the regions each rank needs. ``import trackpoint.distributed as tpd``; see docs/distributed.md.
"""

from __future__ import annotations

from trackpoint.distributed.checkpoint import DistributedCheckpoint
from trackpoint.distributed.collective import (
    Collective,
    CollectiveError,
    LocalCollective,
    ThreadGroup,
    TorchCollective,
)
from trackpoint.distributed.jax_collective import JaxCollective
from trackpoint.distributed.layout import Box, ShardLayout
from trackpoint.distributed.optimizers import init_sharded_optimizer_state
from trackpoint.distributed.saver import DistributedSaver
from trackpoint.distributed.sharded import (
    FlatSlice,
    ShardedTensorVariable,
    Slice,
    layout_of,
    mark_sharded,
)

__all__ = [
    "Box",
    "Collective",
    "CollectiveError",
    "DistributedCheckpoint",
    "DistributedSaver",
    "FlatSlice",
    "JaxCollective",
    "LocalCollective",
    "ShardLayout",
    "ShardedTensorVariable",
    "Slice",
    "ThreadGroup",
    "TorchCollective",
    "init_sharded_optimizer_state",
    "layout_of",
    "mark_sharded",
]
