"""JAX integration: pytrees of jax arrays in TensorFlow checkpoints (``tp.jax``).

Importing this module registers two adapters (``import trackpoint`` does not import jax; the
adapter registry imports this module when it meets a jax array, or a container, once the
program has imported jax):

* ``jax.Array`` → :class:`ArrayLeaf`: saved shard by shard as slices of the full tensor;
* a pytree container holding jax arrays → :class:`PyTreeNode`: dict keys, sequence indices
  and namedtuple/dataclass field names become local names; the container is never modified.

So ``tp.Checkpoint(params=params, opt_state=opt_state)`` saves an optax training state as is::

    ckpt = tp.Checkpoint(params=params, opt_state=opt_state, step=step)
    ckpt.write("/ckpts/run")   # params/dense/w/.ATTRIBUTES/VARIABLE_VALUE, opt_state/0/mu/...

JAX arrays are immutable, so restoring returns new ones: :func:`restore` is the one way to
read JAX state back, from any checkpoint (written by ``tp.Checkpoint``, :func:`write` or
TensorFlow); ``Checkpoint.read``/``restore`` refuse jax leaves with a message pointing here::

    state = tp.jax.restore("/ckpts/run", {"params": params, "opt_state": opt_state, "step": step})

With a ``CheckpointManager``, :func:`restore_or_initialize` resumes: it restores the latest
checkpoint into new arrays (rebinding them on the Checkpoint) and numbering continues after it::

    state, path = tp.jax.restore_or_initialize(manager)   # path None: nothing to resume

Targets may be abstract (``jax.eval_shape``/``nnx.eval_shape`` output, PRNG keys included);
``tp.jax.restore("/ckpts/run")`` without a target returns the saved tree as nested dicts and
lists. A key's implementation and an array's ``weak_type`` are recorded next to the value.

Multi-process JAX (``jax.distributed``): global arrays are saved by
``trackpoint.distributed.DistributedCheckpoint`` (each process writes the shards it addresses)
and restored by :func:`restore` on every process (each reads the shards it addresses); see
docs/jax.md.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from trackpoint._gc import collector_paused
from trackpoint._types import PathLike, fspath
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.serialize import serialize_graph
from trackpoint.graph.walk import ObjectGraphView
from trackpoint.integrations.jax_arrays import ArrayLeaf, ScalarLeaf, is_key_array
from trackpoint.integrations.jax_pytrees import PyTreeNode, is_jax_pytree, tree_trackable
from trackpoint.integrations.jax_restore import restore
from trackpoint.integrations.jax_resume import restore_or_initialize
from trackpoint.saving import CheckpointOptions, MultiDeviceSaver, get_registered_saver_name
from trackpoint.tracking.adapters import register_adapter, register_structure_adapter

__all__ = [
    "ArrayLeaf",
    "PyTreeNode",
    "ScalarLeaf",
    "restore",
    "restore_or_initialize",
    "snapshot_to_host",
    "write",
]


def write(prefix: PathLike, tree: Any, *, options: CheckpointOptions | None = None) -> str:
    """Write ``tree`` as a checkpoint at exactly ``prefix`` (no counter, no state file).

    The keys are those ``tp.Checkpoint(**tree).write(prefix)`` writes for a dict ``tree``
    (``params/w/.ATTRIBUTES/VARIABLE_VALUE``); any pytree works (a single array is the root's
    value). Atomic like ``Checkpoint.write``; blocks until committed, with every leaf's
    device-to-host copy started before the first one is waited for. Sharded arrays are written
    as slices, one per distinct shard. Read back with :func:`restore` (or TensorFlow).

    Args:
        prefix: the checkpoint prefix (local path or URL).
        tree: a pytree of jax/numpy arrays and Python/numpy scalars.
        options: saving options (sharding policy, I/O threads, fsync, write callbacks).
            For a background save use ``tp.Checkpoint(**tree).write(prefix,
            tp.CheckpointOptions(enable_async=True))`` and ``sync()``.

    Returns:
        ``prefix`` as a str.

    Raises:
        InvalidArgumentError: a leaf cannot be saved (type or dtype; names its key path), or
            ``options.enable_async`` is set.
        CheckpointError: writing failed; nothing was committed.

    Example:
        >>> tp.jax.write("/tmp/ckpt", {"params": params, "step": 3})
        >>> tp.jax.restore("/tmp/ckpt", {"params": params, "step": 0})["step"]
        3
    """
    options = CheckpointOptions.resolve(options)
    if options.enable_async:
        raise InvalidArgumentError(
            "tp.jax.write() blocks until the checkpoint is committed; for a background save "
            "use ckpt = tp.Checkpoint(**tree); ckpt.write(prefix, "
            "tp.CheckpointOptions(enable_async=True)); ckpt.sync()"
        )
    with collector_paused():  # see trackpoint._gc: many leaves allocate many containers
        root = tree_trackable(tree)
        view = ObjectGraphView(root)
        graph = serialize_graph(view, registered_saver_for=get_registered_saver_name)
        saver = MultiDeviceSaver(graph.tensors, graph.registered_savers)
        return saver.save(fspath(prefix), options)


def snapshot_to_host(tree: Any) -> Any:
    """A copy of ``tree`` with every jax array replaced by a host numpy array.

    Starts ``copy_to_host_async()`` on every jax leaf before waiting for any, so the call
    blocks for one overlapped transfer rather than one per leaf. Sharded arrays are gathered
    whole; typed PRNG keys become their ``key_data``. Other leaves are returned as they are.
    The numpy arrays may be read-only views of host buffers (CPU): copy before writing to them.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    arrays = [
        jax.random.key_data(leaf) if isinstance(leaf, jax.Array) and is_key_array(leaf) else leaf
        for leaf in leaves
    ]
    for leaf in arrays:
        if isinstance(leaf, jax.Array):
            leaf.copy_to_host_async()
    host = [np.asarray(leaf) if isinstance(leaf, jax.Array) else leaf for leaf in arrays]
    return jax.tree_util.tree_unflatten(treedef, host)


register_adapter(jax.Array, ArrayLeaf)
register_structure_adapter(is_jax_pytree, PyTreeNode)
