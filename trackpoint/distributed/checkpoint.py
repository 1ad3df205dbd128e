"""``DistributedCheckpoint``: ``tp.Checkpoint`` for every rank of a torch.distributed group
(or every process of a ``jax.distributed`` job).

Each rank wraps its own objects (its shards of the model, its optimizer) exactly as it would in
one process; ``save``/``write`` and ``restore``/``read`` are then collective calls: every rank
makes them, in the same order, with the same prefix. The result is one ordinary TensorFlow V2
checkpoint: one index, one data file per shard, sharded tensors stored once as slices of the
full tensor. See docs/distributed.md.

A ``DistributedCheckpoint`` is a :class:`~trackpoint.checkpoint.Checkpoint` of the wrapped
checkpoint's object graph whose saver is a :class:`~trackpoint.distributed.saver.DistributedSaver`
(:meth:`DistributedCheckpoint._make_saver`): the write itself (the paused collector, the timing,
the async writer and the order of sync and async saves, ``sync``) is ``Checkpoint``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from typing import Any

from trackpoint._types import PathLike, fspath
from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.checkpoint.load_status import LoadStatus
from trackpoint.distributed.collective import Collective, LocalCollective
from trackpoint.distributed.jax_collective import JaxCollective, jax_distributed_initialized
from trackpoint.distributed.read_plan import IndexView, PrefetchedStorage, read_requests
from trackpoint.distributed.saver import DistributedSaver, error_message, raise_collected
from trackpoint.errors import CheckpointError, InvalidArgumentError
from trackpoint.graph.serialize import serialize_graph
from trackpoint.graph.walk import ObjectGraphView, list_objects
from trackpoint.management.paths import resolve_prefix
from trackpoint.saving import CheckpointOptions, get_registered_saver_name
from trackpoint.saving.restore import RestoreAgreement, restore_agreement
from trackpoint.storage import LocalStorage, Storage, locate

__all__ = ["DistributedCheckpoint"]

logger = logging.getLogger(__name__)


_BACKENDS = ("torch", "jax")


def _torch_initialized() -> bool:
    # Nobody initialized torch.distributed without importing it: no import of torch here.
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _torch_optimizers() -> Any:
    """``trackpoint.distributed.optimizers`` if torch values can be tracked here, else None
    (torch is not installed: there is no torch optimizer, tensor or adapter to look after)."""
    if "trackpoint.integrations.torch_tensors" not in sys.modules:
        return None  # never imported: no torch value was ever given an adapter
    from trackpoint.distributed import optimizers

    return optimizers


def _collective_for(group: Any, timeout: float, backend: str | None = None) -> Collective:
    """The collective of ``group``/``backend``: torch.distributed when it is initialized, else
    jax.distributed when it runs several processes, else this process alone."""
    if isinstance(group, Collective):
        return group
    if backend is not None and backend not in _BACKENDS:
        raise InvalidArgumentError(
            f"backend must be 'torch', 'jax' or None (automatic), got {backend!r}"
        )
    if backend == "jax" or (
        backend is None and group is None and jax_distributed_initialized()
        and not _torch_initialized()
    ):
        if group is not None:
            raise InvalidArgumentError(
                "backend='jax' takes no group: every process of the jax.distributed job "
                "takes part"
            )
        return JaxCollective(timeout=timeout)
    if backend == "torch" or _torch_initialized():
        from trackpoint.distributed.torch_collective import TorchCollective  # needs torch

        return TorchCollective(group, timeout=timeout)  # raises if not initialized
    if group is not None:
        raise InvalidArgumentError(
            "a process group was given but torch.distributed is not initialized"
        )
    return LocalCollective()


def _process_group_values() -> contextlib.AbstractContextManager[None]:
    """The context in which this process's values for a checkpoint of every process are
    gathered: JAX arrays spanning processes then give this process's shards."""
    if "jax" not in sys.modules:  # no jax array can exist: do not import the integration
        return contextlib.nullcontext()
    from trackpoint.integrations.jax_arrays import process_group_save

    return process_group_save()


def _check_adapters(objects: Any) -> None:
    """Refuse sharded tensors that got a plain adapter (marked, or imported, too late)."""
    if _torch_optimizers() is None:
        return  # no tensor adapter exists
    from trackpoint.distributed.torch_sharded import ShardedTensorVariable, layout_of
    from trackpoint.integrations.torch_tensors import TensorVariable

    for obj in objects:
        if isinstance(obj, TensorVariable) and not isinstance(obj, ShardedTensorVariable):
            if layout_of(obj.tensor) is not None:
                raise InvalidArgumentError(
                    f"{obj.name} is sharded, but it was checkpointed as a whole tensor before "
                    "trackpoint.distributed knew (import trackpoint.distributed and call "
                    "mark_sharded before the tensor is first given to a checkpoint)"
                )


class DistributedCheckpoint(Checkpoint):
    """Saves and restores the objects of every rank as one checkpoint.

    Every rank constructs it (creating it is collective when a process group is used) and then
    calls ``save``/``restore`` together. Values held by several ranks are written once; sharded
    values (DTensors, :func:`~trackpoint.distributed.mark_sharded` tensors,
    :class:`~trackpoint.distributed.Slice`) are written by their owners as slices of the full
    tensor. Restoring reads, on each rank, just the regions its objects need, whatever layout
    and number of ranks wrote the checkpoint.

    It is a ``tp.Checkpoint`` of the wrapped checkpoint's objects (the same object graph, the
    same ``save_counter``) that writes through every rank: ``write``, ``save`` and ``sync``
    work as ``tp.Checkpoint``'s, collectively. Its public attributes are the wrapped
    checkpoint's (``ckpt.params = new_params`` rebinds what the next save writes). A value
    several ranks hold whole is written once, so it must be equal on all of them: a save whose
    replicas differ fails on every rank naming them (keep per-process state as each rank's
    :class:`~trackpoint.distributed.Slice` of a tensor sharded by rank). Each rank's write
    callbacks run on that rank once the checkpoint is committed: the coordinator's first, the
    other ranks' after it has finished them (guard side effects wanted once, such as an upload, with
    :attr:`is_coordinator`). With ``options.enable_async`` each rank snapshots its values and
    returns; the ranks' background threads then save together (:meth:`sync` waits). A save's
    figures are recorded in ``trackpoint.metrics`` (the checkpoint's size and shards by the
    coordinator, durations by every rank; docs/distributed.md).

    Args:
        checkpoint: the ``tp.Checkpoint`` of this rank's objects; or give them as keyword
            arguments, as to ``tp.Checkpoint``.
        group: the ranks taking part: a ``torch.distributed`` process group (default: the world
            group; a gloo side group is created for checkpoint traffic), a
            :class:`~trackpoint.distributed.Collective`, or None (see ``backend``).
        timeout: seconds a rank waits for the others at each step before failing the save.
        coordinator: the rank that merges and commits, and whose object graph is recorded.
        coalesce_reads: prefetch each rank's byte ranges in few merged requests before a
            restore; default: on object stores, not on local disks (mmap is better there).
        backend: ``"torch"`` (torch.distributed), ``"jax"`` (the key-value store of
            ``jax.distributed``: :class:`~trackpoint.distributed.jax_collective.JaxCollective`;
            ranks are JAX process indices) or None: torch.distributed when it is initialized,
            else jax.distributed when it runs several processes, else one process.
        **children: objects to save, when ``checkpoint`` is not given.

    Raises:
        InvalidArgumentError: both ``checkpoint`` and keyword arguments, or a bad ``group``.

    Example::

        dist.init_process_group("gloo")             # torchrun sets rank and world size
        model = build_sharded_model()               # DTensor or mark_sharded parameters
        ckpt = tpd.DistributedCheckpoint(model=model, optimizer=opt)
        ckpt.restore(tp.latest_checkpoint("/ckpts"))  # None on the first run: nothing to do
        path = ckpt.save("/ckpts/ckpt")             # same path returned on every rank
    """

    # Set with object.__setattr__ (AutoTrackable would track them); declared for type checkers.
    _checkpoint: Checkpoint
    _collective: Collective
    _coordinator: int
    _coalesce_reads: bool | None

    def __init__(
        self,
        checkpoint: Checkpoint | None = None,
        *,
        group: Any = None,
        timeout: float = 1800.0,
        coordinator: int = 0,
        coalesce_reads: bool | None = None,
        backend: str | None = None,
        **children: Any,
    ) -> None:
        super().__init__()
        if checkpoint is None:
            checkpoint = Checkpoint(**children)
        elif children:
            raise InvalidArgumentError(
                "pass either a tp.Checkpoint or the objects as keyword arguments, not both"
            )
        elif not isinstance(checkpoint, Checkpoint) or isinstance(
            checkpoint, DistributedCheckpoint
        ):
            raise InvalidArgumentError(
                f"checkpoint must be a tp.Checkpoint, got {type(checkpoint).__name__}; pass "
                "objects as keyword arguments instead (model=..., optimizer=...)"
            )
        collective = _collective_for(group, timeout, backend)
        if not 0 <= coordinator < collective.world_size:
            raise InvalidArgumentError(
                f"coordinator must be a rank below {collective.world_size}, got {coordinator}"
            )
        # object.__setattr__: AutoTrackable would make the wrapped checkpoint a tracked child.
        # The graph saved is the wrapped checkpoint's, as if it saved itself.
        object.__setattr__(self, "_self_view", checkpoint.object_graph_view)
        object.__setattr__(self, "_checkpoint", checkpoint)
        object.__setattr__(self, "_collective", collective)
        object.__setattr__(self, "_coordinator", coordinator)
        object.__setattr__(self, "_coalesce_reads", coalesce_reads)

    # -- the wrapped checkpoint's attributes ----------------------------------------------------
    # ``ckpt.params = new_params`` must change what the next save writes, as on a tp.Checkpoint
    # (JAX updates make new trees, so every step rebinds): the graph saved is the wrapped
    # checkpoint's, so its children are read, set and deleted there. Private names and the
    # class's own (``rank``, ``save``, ...) stay this object's.
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self._checkpoint, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or hasattr(type(self), name):
            super().__setattr__(name, value)
        else:
            setattr(self._checkpoint, name, value)

    def __delattr__(self, name: str) -> None:
        if name.startswith("_") or name in self.__dict__:
            super().__delattr__(name)
        else:
            delattr(self._checkpoint, name)

    # -- properties --------------------------------------------------------------------------
    @property
    def checkpoint(self) -> Checkpoint:
        """This rank's ``tp.Checkpoint``."""
        return self._checkpoint

    @property
    def collective(self) -> Collective:
        return self._collective

    @property
    def rank(self) -> int:
        return self._collective.rank

    @property
    def is_coordinator(self) -> bool:
        """True on the rank that commits, writes the state file and deletes old checkpoints.

        ``tp.CheckpointManager`` reads it: on the other ranks it follows the state file the
        coordinator wrote instead of writing it or deleting anything.
        """
        return self._collective.rank == self._coordinator

    @property
    def world_size(self) -> int:
        return self._collective.world_size

    def _maybe_create_save_counter(self) -> None:
        # The wrapped checkpoint's counter: a node of the graph saved (same number on every
        # rank, since every rank saves and restores the same checkpoints).
        if self._self_save_counter is None:
            object.__setattr__(self, "_self_save_counter", self._checkpoint.save_counter)

    # -- saving ------------------------------------------------------------------------------
    @property
    def _records_state_file(self) -> bool:
        # docstring inherited: the coordinator records each save for every rank, so
        # tp.latest_checkpoint(dir) names it on every rank once save() has returned
        return self.is_coordinator

    @property
    def _guards_directory(self) -> bool:
        # docstring inherited: a rank refusing alone would leave the others waiting in the
        # save's exchanges; a CheckpointManager on top holds the directory's lock instead
        return False

    def _make_saver(self) -> DistributedSaver:
        """This rank's part of the save: its values, or the error gathering them raised.

        An error is not raised here: the save reports it to every rank, so all fail together.
        """
        view = self.object_graph_view
        try:
            optimizers = _torch_optimizers()
            if optimizers is not None:
                optimizers.propagate_optimizer_layouts(
                    list_objects(view, skip_slot_variables=True)
                )
            with _process_group_values():
                graph = serialize_graph(view, registered_saver_for=get_registered_saver_name)
            _check_adapters(graph.objects)
            keys = None
            if self.rank == self._coordinator:
                keys = [a.checkpoint_key for n in graph.object_graph_proto.nodes
                        for a in n.attributes]
            return DistributedSaver(
                graph.tensors, graph.registered_savers, collective=self._collective,
                coordinator=self._coordinator, graph_keys=keys,
            )
        except Exception as exc:  # reported to every rank by the save itself
            return DistributedSaver(
                {}, collective=self._collective, coordinator=self._coordinator, error=exc
            )

    def close(self) -> None:
        """Wait for a pending async save and stop the background thread.

        Call before ``torch.distributed.destroy_process_group()``: the thread's exchanges need
        the group.
        """
        writer = self._self_async
        if writer is not None:
            object.__setattr__(self, "_self_async", None)
            writer.close()

    # -- restoring ---------------------------------------------------------------------------
    def read(self, path: PathLike, options: CheckpointOptions | None = None) -> LoadStatus:
        """Restore every rank's objects from ``path`` (a prefix or a directory); collective.

        Each rank reads only what its objects need: whole replicated values, and the regions of
        sharded values its layouts name, assembled from whatever slices the checkpoint holds.
        Optimizers of sharded parameters that have no state yet get it created first (see
        :mod:`trackpoint.distributed.optimizers`). Waits for a pending async save.

        Returns:
            This rank's load status (``assert_consumed()`` ... ``expect_partial()``).

        Raises:
            NotFoundError: no checkpoint at ``path`` (raised on every rank).
            InvalidArgumentError: the ranks asked for different checkpoints, or a value does
                not fit its object; if any rank fails, every rank raises.
        """
        return self._read_together(path, CheckpointOptions.resolve(options), restore=False)

    def restore(
        self, path: PathLike | None, options: CheckpointOptions | None = None
    ) -> LoadStatus:
        """:meth:`read`, then create ``save_counter`` (``restore(None)`` restores nothing)."""
        if path is None:
            return self._checkpoint.restore(None)
        return self._read_together(path, CheckpointOptions.resolve(options), restore=True)

    def _read_together(
        self, path: PathLike, options: CheckpointOptions, *, restore: bool
    ) -> LoadStatus:
        # Not Checkpoint._read (another signature): every rank reads, then all agree.
        self.sync()
        requested = fspath(path)
        storage = locate(requested, storage=options.storage).storage  # picked once, here
        prefix = self._agree_on_prefix(requested, storage)
        status: LoadStatus | None = None
        error: BaseException | None = None
        prefetched: PrefetchedStorage | None = None
        agreement = RestoreAgreement(self._collective.all_gather)
        try:
            view = self._checkpoint.object_graph_view
            objects = list_objects(view, skip_slot_variables=True)
            # The index is parsed here only when needed: the restore parses it anyway, and
            # with many ranks it lists many slices.
            index: IndexView | None = None
            optimizers = _torch_optimizers()
            if optimizers is not None:
                if optimizers.needs_sharded_optimizer_state(objects):
                    index = IndexView.load(prefix, storage)
                if index is not None and index.has_slot_variables():
                    optimizers.init_sharded_optimizer_state(objects)
                else:
                    optimizers.propagate_optimizer_layouts(objects)
            if self._should_coalesce(storage):
                index = index or IndexView.load(prefix, storage)
                prefetched = self._prefetch(view, index, storage, options)
            read_options = dataclasses.replace(options, storage=prefetched or storage)
            # Every rank verifies its own values, then all vote: a rank applies its values
            # only if every rank verified theirs (trackpoint/saving/restore.py).
            with restore_agreement(agreement):
                if restore:
                    status = self._checkpoint.restore(prefix, read_options)
                else:
                    status = self._checkpoint.read(prefix, read_options)
        except Exception as exc:  # every rank learns of it below
            error = exc
            if not agreement.voted:  # failed before its vote: the others wait for it
                agreement.vote(exc)
        finally:
            if prefetched is not None:
                prefetched.release()
        errors = self._collective.all_gather(error_message(error, self.rank))
        failed = [e for e in errors if e]
        if failed:
            raise_collected(failed, error, f"Restoring checkpoint {prefix}", prefix)
        assert status is not None
        # Incremental saves compare this rank's values with the checkpoint just restored.
        self._self_history.restored(prefix, storage)
        return status

    def _agree_on_prefix(self, path: str, storage: Storage) -> str:
        """The checkpoint ``path`` names, resolved once by the coordinator for every rank."""
        resolved: str | None = None
        problem: dict[str, Any] | None = None
        if self.rank == self._coordinator:
            try:
                resolved = resolve_prefix(path, storage=storage)  # the one path resolver
            except CheckpointError as exc:
                problem = error_message(exc, self.rank)
        messages = self._collective.all_gather(
            {"path": path, "resolved": resolved, "error": problem}
        )
        paths = sorted({m["path"] for m in messages})
        if len(paths) > 1:
            listed = ", ".join(f"rank {r}: {m['path']}" for r, m in enumerate(messages))
            raise InvalidArgumentError(
                f"the ranks are restoring different checkpoints ({listed}); pass the same path "
                "on every rank",
                path=path,
            )
        answer = messages[self._coordinator]
        if answer["error"]:
            raise_collected([answer["error"]], None, "Finding the checkpoint", path)
        return str(answer["resolved"])

    def _should_coalesce(self, storage: Storage) -> bool:
        if self._coalesce_reads is not None:
            return self._coalesce_reads
        return not isinstance(storage, LocalStorage)

    def _prefetch(
        self, view: ObjectGraphView, index: IndexView, storage: Storage,
        options: CheckpointOptions,
    ) -> PrefetchedStorage | None:
        """Fetch this rank's byte ranges in merged requests; None if it cannot be planned."""
        try:
            graph = serialize_graph(view, registered_saver_for=get_registered_saver_name)
        except Exception as exc:
            logger.debug("not prefetching: the live objects cannot be listed (%s)", exc)
            return None
        from trackpoint.graph.keys import OBJECT_GRAPH_KEY

        requests = [*read_requests(graph.tensors), (OBJECT_GRAPH_KEY, None)]
        ranges = [r for key, region in requests for r in index.ranges(key, region)]
        prefetched = PrefetchedStorage(storage, index)
        prefetched.fetch(ranges, workers=options.num_io_threads or 8)
        return prefetched

    def __repr__(self) -> str:
        return (
            f"DistributedCheckpoint(rank {self.rank} of {self.world_size}, "
            f"coordinator {self._coordinator})"
        )
