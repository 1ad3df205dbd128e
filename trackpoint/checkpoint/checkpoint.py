"""`Checkpoint`: save and restore an object graph as a TensorFlow V2 checkpoint.

``write``/``read`` use an exact prefix; ``save``/``restore`` number checkpoints with the lazily
created ``save_counter`` (``<prefix>-<n>``) and keep the directory's ``checkpoint`` state file
current (semantics §2, D1–D3). Values flow through :mod:`trackpoint.graph` (names, keys, the
object graph) and :class:`~trackpoint.saving.MultiDeviceSaver` (files); restoring is the
coordinator's job (:mod:`trackpoint.checkpoint.restore`), which returns a load status
(:mod:`trackpoint.checkpoint.load_status`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from trackpoint._gc import collector_paused
from trackpoint._types import PathLike, fspath
from trackpoint.bundle.reader import BundleReader
from trackpoint.checkpoint.load_status import (
    CheckpointLoadStatus,
    InitializationOnlyStatus,
    LoadStatus,
)
from trackpoint.checkpoint.name_based import restore_name_based
from trackpoint.checkpoint.replay import RestoreReplay
from trackpoint.checkpoint.saved_graph import SavedGraph
from trackpoint.checkpoint.writer_lock import (
    hold_directory,
    refuse_overwriting_live_writer,
    refuse_replacing,
)
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.keys import SAVE_COUNTER
from trackpoint.graph.serialize import serialize_graph
from trackpoint.graph.walk import ObjectGraphView
from trackpoint.management.paths import resolve_location
from trackpoint.management.reader import CheckpointReader
from trackpoint.management.state_file import (
    checkpoint_directory,
    write_checkpoint_state,
)
from trackpoint.metrics import registry as metrics
from trackpoint.saving import (
    AsyncWriter,
    CheckpointOptions,
    MultiDeviceSaver,
    ProgressEvent,
    SaveHistory,
    get_registered_saver_name,
    registered_savers,
)
from trackpoint.storage import locate
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.autotrackable import AutoTrackable
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable, TrackableReference
from trackpoint.tracking.variable import Variable

__all__ = ["Checkpoint"]

logger = logging.getLogger("trackpoint.checkpoint")



def _as_trackable(value: Any, name: str) -> Trackable:
    """``value`` (or its adapter) as a Trackable; a clear error naming the argument otherwise."""
    trackable = to_trackable(value)
    if trackable is None:
        raise InvalidArgumentError(
            f"Checkpoint was expecting {name} to be a trackable object (a tp.Trackable, a numpy "
            "array or another type with a registered adapter, or a list/dict/tuple of them), "
            f"got {value!r} of type {type(value).__name__}. Wrap plain Python values in "
            "tp.Variable or a tp.PythonState."
        )
    return trackable


def _is_counter_shape(shape: tuple[int, ...]) -> bool:
    """Whether a saved counter's shape holds one number (scalar, or ``[1]`` and the like);
    anything else is not allocated for it (the restore then reports the shape)."""
    return all(dim == 1 for dim in shape)


def _report_restored(progress: Callable[[ProgressEvent], None], event: ProgressEvent) -> None:
    """Give the progress callback the ``"restored"`` event of a restore that is complete.

    Every object has its value by now and nothing can undo that, so what the callback raises
    must not fail the restore (a restore that raises has changed nothing): it is logged.
    """
    try:
        progress(event)
    except Exception:
        logger.exception(
            "The progress callback raised on the 'restored' event of %s; the restore is "
            "complete (every value applied), so the error is logged, not raised",
            event.prefix,
        )


def _restored_event(prefix: str, seconds: float, sizes: dict[str, int]) -> ProgressEvent:
    """The last progress event of a read: its figures, from ``BundleReader.file_sizes()``."""
    shard_bytes = tuple(sizes[path] for path in sizes if not path.endswith(".index"))
    stats = metrics.ReadStats(prefix, seconds, sum(sizes.values()), shard_bytes)
    data = sum(shard_bytes)
    shards = len(shard_bytes)
    return ProgressEvent(prefix, "restored", shards, shards, data, data, stats=stats)


class Checkpoint(AutoTrackable):
    """Groups trackable objects and saves/restores them as one TensorFlow V2 checkpoint.

    Args:
        root: the object whose graph is saved (its children keep their names); may be a
            ``weakref.ref``, in which case the Checkpoint does not keep it alive. Without a
            root, the Checkpoint itself is the root and the keyword arguments its children.
        **children: named objects saved under their keyword: trackables, numpy arrays (or
            other adapted types), and lists/dicts/tuples of them. With a root they are attached
            to the root's node (sorted by name) without becoming the root's own children.

    Raises:
        InvalidArgumentError: an argument is not trackable (names it and its type), or
            ``root.<name>`` already exists and is a different object than ``<name>=``.

    Example:
        >>> import numpy as np, trackpoint as tp
        >>> weights = np.zeros(3)
        >>> ckpt = tp.Checkpoint(weights=weights, step=tp.Variable(0))
        >>> path = ckpt.save("/tmp/trackpoint-doc/ckpt")      # ".../ckpt-1"
        >>> weights[:] = 5.0
        >>> ckpt.restore(path).assert_consumed()              # weights is zeros again, in place
    """

    # Set with object.__setattr__ (AutoTrackable would track them); declared for type checkers.
    _self_view: ObjectGraphView
    _self_save_counter: Variable | None
    # A counter a read() restored (verified with every other value) before save_counter
    # existed: it becomes save_counter when the counter is created.
    _self_pending_counter: Variable | None
    _self_async: AsyncWriter | None
    _self_history: SaveHistory  # the previous checkpoint, for incremental saves
    _self_restore_reuse: RestoreReplay  # what the last read lends the next (replay.py)

    def __init__(self, root: Any = None, **children: Any) -> None:
        object.__setattr__(self, "_self_save_counter", None)
        object.__setattr__(self, "_self_pending_counter", None)
        object.__setattr__(self, "_self_async", None)
        object.__setattr__(self, "_self_history", SaveHistory())
        object.__setattr__(self, "_self_restore_reuse", RestoreReplay())
        attached: list[TrackableReference] | None = None
        trackable_root: Trackable | None = None
        if root is not None:
            strong_root = root() if isinstance(root, weakref.ref) else root
            trackable_root = _as_trackable(strong_root, "root")
            attached = []
            children["root"] = root
            existing_counter = trackable_root._lookup_dependency(SAVE_COUNTER)
            if isinstance(existing_counter, Variable):
                object.__setattr__(self, "_self_save_counter", existing_counter)
        for name, value in sorted(children.items()):
            setattr(self, name, value)
            stored = getattr(self, name)
            if isinstance(stored, weakref.ref):
                stored = stored()
            child = _as_trackable(stored, name)
            if trackable_root is None:
                continue
            assert attached is not None
            existing = trackable_root._lookup_dependency(name)
            if existing is None:
                # The root's self-edge is held weakly so a weakref root can be collected.
                ref: Any = weakref.ref(child) if child is trackable_root else child
                attached.append(TrackableReference(name, ref))
            elif existing is not child:
                raise InvalidArgumentError(
                    f"Cannot create a Checkpoint with keyword argument {name} if root.{name} "
                    "already exists (and is a different object)."
                )
        if trackable_root is None:
            # Held weakly, as TensorFlow does: the view is the Checkpoint's own, so a strong
            # root would make every dropped Checkpoint (and the 100,000s of objects it tracks)
            # garbage only a full collection frees. A load status keeps the root alive.
            view = ObjectGraphView(weakref.ref(self))
        else:
            view_root: Any = (
                weakref.ref(trackable_root) if isinstance(root, weakref.ref) else trackable_root
            )
            view = ObjectGraphView(view_root, attached)
        object.__setattr__(self, "_self_view", view)

    def __deepcopy__(self, memo: dict[int, Any]) -> Checkpoint:
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        for name, value in self.__dict__.items():
            if name == "_self_async":
                object.__setattr__(copied, name, None)  # threads are not copied
            elif name == "_self_history":
                object.__setattr__(copied, name, SaveHistory())  # the copy saved nothing yet
            elif name == "_self_restore_reuse":
                object.__setattr__(copied, name, RestoreReplay())  # nor read anything
            else:
                object.__setattr__(copied, name, copy.deepcopy(value, memo))
        return copied

    @property
    def object_graph_view(self) -> ObjectGraphView:
        """The object graph this Checkpoint saves: its root plus the attached children.

        For savers layered on top of ``Checkpoint`` (``trackpoint.distributed``) that gather the
        same values with :func:`trackpoint.graph.serialize_graph` and write them their own way.
        """
        return self._self_view

    # -- save counter ------------------------------------------------------------------------

    @property
    def save_counter(self) -> Variable:
        """The int64 variable numbering ``save()``s: 0 before the first, then 1, 2, …

        Created on first use (here, or by ``save``/``restore``); restoring a checkpoint sets it
        to the saved number at once.
        """
        self._maybe_create_save_counter()
        counter = self._self_save_counter
        assert counter is not None  # created just above
        return counter

    def _maybe_create_save_counter(self) -> None:
        """Create ``save_counter``: the counter the last read restored, else 0; a restore
        waiting for it (another Checkpoint's, on a shared root) is applied first.

        All or nothing: if that restore fails, no counter exists afterwards (the next call
        tries again), so a failed restore never leaves a Checkpoint that cannot save.
        """
        if self._self_save_counter is not None:
            return
        view: ObjectGraphView = self._self_view
        root = view.root
        counter = self._self_pending_counter
        if counter is None:
            spec = root._preload_spec(SAVE_COUNTER)
            shape = spec[0] if spec is not None and _is_counter_shape(spec[0]) else ()
            counter = Variable(np.zeros(shape, dtype=np.int64), name=SAVE_COUNTER)
        if root is self:
            try:
                self._track_trackable(counter, SAVE_COUNTER)  # restores waiting ones apply
            except BaseException:
                self._untrack(SAVE_COUNTER)
                raise
        else:
            pending = root._deferred_dependencies.pop(SAVE_COUNTER, [])
            ordered = sorted(pending, key=lambda p: p.restore_uid, reverse=True)
            for done, position in enumerate(ordered):
                try:
                    position.restore(counter)
                except BaseException:
                    root._deferred_dependencies.setdefault(SAVE_COUNTER, []).extend(
                        ordered[done:]
                    )
                    raise
            view.attached_dependencies.append(TrackableReference(SAVE_COUNTER, counter))
        object.__setattr__(self, "_self_save_counter", counter)
        object.__setattr__(self, "_self_pending_counter", None)

    def _counter_candidate(self, graph: SavedGraph, index: BundleReader) -> dict[int, Variable]:
        """``{node id: new counter}`` for the checkpoint's ``save_counter`` if this Checkpoint
        has no counter yet, else ``{}``.

        The restore plans the node into the new counter (``RestoreCoordinator.execute``'s
        ``own``) instead of leaving it for deferred restoration: its value is read and verified
        with every other value, before any object changes (issue 27: a damaged counter used to
        fail only after every other object was restored, and then on every later save).
        """
        if self._self_save_counter is not None:
            return {}
        reuse: RestoreReplay = self._self_restore_reuse
        node_id = reuse.counter_node(graph)
        if node_id is None:
            return {}
        shape: tuple[int, ...] = ()
        for attribute in graph.proto.nodes[node_id].attributes:
            key = attribute.checkpoint_key
            if attribute.name == VARIABLE_VALUE_KEY and index.has_tensor(key):
                saved = tuple(index.shape(key))
                shape = saved if _is_counter_shape(saved) else ()
        return {node_id: Variable(np.zeros(shape, dtype=np.int64), name=SAVE_COUNTER)}

    def _took_counter(self, offered: dict[int, Variable]) -> None:
        """Keep the counter a read restored (the checkpoint had one) for its creation."""
        for counter in offered.values():
            if counter._update_uid > 0:
                object.__setattr__(self, "_self_pending_counter", counter)

    # -- writing -----------------------------------------------------------------------------

    def write(self, prefix: PathLike, options: CheckpointOptions | None = None) -> str:
        """Write a checkpoint at exactly ``prefix``; no counter, no state file.

        Atomic: ``prefix`` appears complete or not at all (an earlier checkpoint there is
        replaced only when the new one is complete). Missing parent directories are created.
        With ``options.enable_async`` the values are snapshotted now and written in the
        background (see :meth:`sync`). Write callbacks run after the commit.

        Returns:
            ``prefix`` as a str.

        Raises:
            InvalidArgumentError: a value cannot be saved (names the key), or a tracked list
                or dict was mutated so that it cannot be restored reliably ("Unable to save").
            NotImplementedError: a ``NotTrackable`` object is reachable.
            FailedPreconditionError: ``prefix`` is a committed checkpoint in a directory whose
                writer lock another live process holds (one writer per directory).
            CheckpointError: writing failed; nothing was committed.
        """
        prefix_str, options = fspath(prefix, argument="prefix"), CheckpointOptions.resolve(options)
        # The backend, picked once here: the lock check and the saver below use this one.
        storage = locate(prefix_str, storage=options.storage, fsync=options.fsync).storage
        if self._guards_directory:
            refuse_overwriting_live_writer(prefix_str, storage)
        return self._write(prefix_str, dataclasses.replace(options, storage=storage))

    def _write(self, prefix: str, options: CheckpointOptions) -> str:
        timing = metrics.begin_write()  # the training loop's wait starts here
        with collector_paused():  # see trackpoint._gc: a third of the time for many tensors
            return self._write_unpaused(prefix, options, timing)

    def _make_saver(self) -> MultiDeviceSaver:
        """The saver of this write: the graph's values, gathered now (the step that writes).

        ``trackpoint.distributed.DistributedCheckpoint`` overrides it with a saver whose
        ``save`` is one rank's part of a collective save; the rest of the write is this class's.
        """
        # No registered savers (the usual case): skip asking for each of the graph's objects.
        saver_for = get_registered_saver_name if registered_savers() else None
        graph = serialize_graph(self._self_view, registered_saver_for=saver_for)
        return MultiDeviceSaver(graph.tensors, graph.registered_savers)

    def _write_unpaused(
        self, prefix: str, options: CheckpointOptions, timing: metrics.WriteTiming
    ) -> str:
        saver = self._make_saver()
        if options.incremental:
            saver.use_history(self._self_history)
        async_writer: AsyncWriter | None = self._self_async
        if options.enable_async:
            if async_writer is None:
                async_writer = AsyncWriter()
                object.__setattr__(self, "_self_async", async_writer)
            # Snapshot now, write in the background; a failed earlier write is raised here.
            return async_writer.save(saver, prefix, options, timing=timing)
        if async_writer is not None:
            async_writer.sync()  # keep saves in order: a sync save after async ones waits
        return saver.save(prefix, options, timing=timing)

    def save(self, prefix: PathLike, options: CheckpointOptions | None = None) -> str:
        """Increment ``save_counter`` and write ``<prefix>-<counter>``; update the state file.

        After the checkpoint is committed, ``<dir>/checkpoint`` names it as the latest (after
        the user's write callbacks). Nothing is deleted: use ``tp.CheckpointManager`` to keep
        only recent checkpoints.

        One writer per directory: the first save into a directory takes its writer lock and
        this Checkpoint keeps it while it lives (shared with this process's
        ``CheckpointManager``s; released when the Checkpoint is garbage collected or the
        process exits or dies). A Checkpoint that has neither saved nor been restored never
        replaces a committed checkpoint (docs/design.md).

        Returns:
            The checkpoint's prefix, e.g. ``"/tmp/ckpt-3"``.

        Raises:
            FailedPreconditionError: another process holds the directory's writer lock (the
                message names its host and pid), or ``save_counter`` is 0 and ``<prefix>-1``
                is a committed checkpoint (restore first; ``save_counter`` stays 0).
            Same as :meth:`write`.
        """
        options = CheckpointOptions.resolve(options)
        prefix_str = fspath(prefix, argument="prefix")
        counter = self.save_counter
        number = int(counter.numpy()) + 1
        path = f"{prefix_str}-{number}"
        # The backend, picked once here: the lock, the state file and the saver all use it, with
        # options.fsync (off, the state file is not flushed either: a scratch checkpoint).
        storage = locate(path, storage=options.storage, fsync=options.fsync).storage
        options = dataclasses.replace(options, storage=storage)
        if self._guards_directory:
            hold_directory(self, storage, checkpoint_directory(path))
            refuse_replacing(path, storage, number - 1)
        counter.assign(number)

        def update_state_file() -> None:
            write_checkpoint_state(checkpoint_directory(path), path, [path], storage=storage)

        if self._records_state_file:
            options = dataclasses.replace(
                options, write_callbacks=(*options.write_callbacks, update_state_file)
            )
        return self._write(path, options)

    @property
    def _records_state_file(self) -> bool:
        """Whether ``save`` records its checkpoint in the directory's state file here (one
        process of a multi-process job does)."""
        return True

    @property
    def _guards_directory(self) -> bool:
        """Whether saves take the directory's writer lock and refuse to replace a committed
        checkpoint. A collective save cannot refuse on one process alone (the others would
        wait in its exchanges), so the distributed layer turns this off."""
        return True

    def sync(self) -> None:
        """Wait until every background (async) write of this Checkpoint is complete.

        Raises:
            CheckpointError: a background write failed.
        """
        async_writer: AsyncWriter | None = self._self_async
        if async_writer is not None:
            async_writer.sync()

    # -- reading -----------------------------------------------------------------------------

    def read(self, path: PathLike, options: CheckpointOptions | None = None) -> LoadStatus:
        """Restore from the checkpoint ``path`` without creating ``save_counter``.

        Objects that exist get their values now, copied into their own arrays; values for
        objects that do not exist yet are applied when they are attached. ``path`` may be a
        directory, meaning its latest checkpoint. Waits for this Checkpoint's pending writes.
        A checkpoint without an object graph (TF1 ``Saver``) is matched by name instead
        (``trackpoint.checkpoint.name_based``).

        All or nothing: every value is read and verified before any object changes, the
        checkpoint's ``save_counter`` included (it is restored now into the counter this
        Checkpoint creates later, so its node counts as matched). A read that raises changed
        no object and left this Checkpoint as it was: it saves and restores normally after.

        Returns:
            A load status (``assert_consumed()`` … ``expect_partial()``).

        Raises:
            NotFoundError: no checkpoint at ``path`` (with a hint at the ``-N`` suffix).
            InvalidArgumentError: a saved value does not fit its object (shape, dtype; names
                the checkpoint key) — no object changed.
            DataLossError: the files are damaged (``save_counter``'s value too) — no object
                changed.
        """
        options = CheckpointOptions.resolve(options)
        self.sync()
        with collector_paused():  # see trackpoint._gc: a third of the time for many tensors
            return self._read(fspath(path), options)

    def _read(self, path: str, options: CheckpointOptions) -> LoadStatus:
        started = time.perf_counter()
        location = resolve_location(path, storage=options.storage)
        prefix = location.prefix
        # The backend, picked once here: the restore engine, deferred restores and the
        # incremental baseline read through it (options carries it down).
        options = dataclasses.replace(options, storage=location.storage)
        reuse: RestoreReplay = self._self_restore_reuse
        with CheckpointReader(prefix, storage=location.storage) as reader:
            graph = reuse.load_graph(reader.bundle)
            # Only a progress callback needs the file sizes (a stat per file).
            sizes = reader.bundle.file_sizes() if options.progress is not None else None
        if graph is None or not graph.proto.nodes:
            # No object graph: a TF1 Saver checkpoint, matched to objects by name.
            return self._read_name_based(prefix, options, reader.bundle)
        view: ObjectGraphView = self._self_view
        own = self._counter_candidate(graph, reader.bundle)
        # The parsed index is reused by every read of this load (deferred ones too).
        coordinator, fingerprint = reuse.restore(
            view, graph, prefix, options, reader.bundle, own=own
        )
        self._took_counter(own)
        self._self_history.restored(prefix, options.storage)  # incremental saves compare to it
        seconds = time.perf_counter() - started
        metrics.record_duration(metrics.READ_DURATION, seconds)
        if sizes is not None and options.progress is not None:
            _report_restored(options.progress, _restored_event(prefix, seconds, sizes))
        return CheckpointLoadStatus(coordinator, view, options, fingerprint=fingerprint)

    def _read_name_based(
        self, prefix: str, options: CheckpointOptions, index: BundleReader
    ) -> LoadStatus:
        """Restore a TF1 checkpoint by name, a new counter offered as ``save_counter`` (so a
        value under that name is verified and restored with the others, as in ``_read``)."""
        view: ObjectGraphView = self._self_view
        if self._self_save_counter is not None:
            return restore_name_based(view, prefix, options, index=index)
        counter = Variable(np.zeros((), dtype=np.int64), name=SAVE_COUNTER)
        offered = ObjectGraphView(
            view.root, [*view.attached_dependencies, TrackableReference(SAVE_COUNTER, counter)]
        )
        status = restore_name_based(offered, prefix, options, index=index)
        self._took_counter({0: counter})
        return status

    def restore(
        self, path: PathLike | None, options: CheckpointOptions | None = None
    ) -> LoadStatus:
        """Like :meth:`read`, then create ``save_counter`` (restored if the checkpoint has one).

        ``restore(None)`` restores nothing and returns a status whose assertions fail (what
        ``restore(tp.latest_checkpoint(d))`` gives in a fresh directory). Restoring a
        ``write()`` checkpoint (no ``save_counter`` in it) creates the counter at 0; the
        status's assertions do not count it as unmatched (TF's do; semantics D2).

        The counter's saved value is verified with every other value, before any object
        changes: a damaged counter fails the restore with nothing changed, and no counter is
        created by a restore that raises (the Checkpoint saves and restores normally after).

        Raises:
            Same as :meth:`read`.
        """
        if path is None:
            self._maybe_create_save_counter()
            return InitializationOnlyStatus()
        status = self.read(path, options)
        self._maybe_create_save_counter()
        return status
