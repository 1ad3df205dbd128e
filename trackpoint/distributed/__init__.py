"""Multi-process save and restore on torch.distributed or jax.distributed, with resharding.

Every rank of a process group writes its own values into one TensorFlow V2 checkpoint; sharded
values (DTensors, :func:`mark_sharded` tensors, :class:`Slice` / :class:`FlatSlice`) are stored
as slices of the full tensor, and a restore on any number of ranks, with any slicing, reads just
the regions each rank needs. ``import trackpoint.distributed as tpd``; see docs/distributed.md.

torch is optional: with it installed, importing this package also registers the adapter of
DTensors and marked tensors; without it (a JAX or numpy program), everything but the torch
names (:class:`TorchCollective`, :class:`ShardedTensorVariable`, :func:`mark_sharded`,
:func:`layout_of`, :func:`init_sharded_optimizer_state`) works, and those raise ImportError.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from trackpoint.distributed.checkpoint import DistributedCheckpoint
from trackpoint.distributed.collective import (
    Collective,
    CollectiveError,
    LocalCollective,
    ThreadGroup,
)
from trackpoint.distributed.jax_collective import JaxCollective
from trackpoint.distributed.layout import Box, ShardLayout
from trackpoint.distributed.saver import DistributedSaver
from trackpoint.distributed.sharded import FlatSlice, Slice

_TORCH_NAMES = {
    "TorchCollective": "trackpoint.distributed.torch_collective",
    "ShardedTensorVariable": "trackpoint.distributed.torch_sharded",
    "layout_of": "trackpoint.distributed.torch_sharded",
    "mark_sharded": "trackpoint.distributed.torch_sharded",
    "init_sharded_optimizer_state": "trackpoint.distributed.optimizers",
}

if importlib.util.find_spec("torch") is not None:
    # Registers the DTensor and marked-tensor adapter now: a tensor first checkpointed before
    # it would get a plain adapter and be saved whole (DistributedCheckpoint refuses that).
    from trackpoint.distributed.optimizers import init_sharded_optimizer_state
    from trackpoint.distributed.torch_collective import TorchCollective
    from trackpoint.distributed.torch_sharded import (
        ShardedTensorVariable,
        layout_of,
        mark_sharded,
    )
else:

    def __getattr__(name: str) -> Any:
        if name in _TORCH_NAMES:
            raise ImportError(
                f"trackpoint.distributed.{name} needs torch, which is not installed "
                "(pip install 'trackpoint[torch]')",
                name=_TORCH_NAMES[name],
            )
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
