"""``MultiDeviceSaver``: writes values from many devices into one checkpoint, and reads them back.

TensorFlow's ``functional_saver.MultiDeviceSaver`` without TensorFlow (tf-checkpoint-format.md
§11–§12): values are grouped by task, each task's values are cut into shards by the sharding
policy, every shard is written as a one-data-file bundle by a pool of threads, and the bundles
are merged into ``prefix`` under an atomic commit (:mod:`trackpoint.saving.commit`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain, compress, repeat
from operator import attrgetter, eq, is_not, itemgetter
from typing import Any, NamedTuple, NoReturn, Protocol

import numpy as np

from trackpoint._types import PathLike, fspath
from trackpoint.bundle.reader import BundleReader
from trackpoint.bundle.slice_spec import parse_slice_spec
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.keys import local_name
from trackpoint.metrics import registry as metrics
from trackpoint.saving.commit import AtomicCommit
from trackpoint.saving.devices import LOCAL_TASK, DeviceValue, task_of
from trackpoint.saving.incremental import (
    SaveHistory,
    plan_of,
    prepare_incremental,
    record_incremental,
)
from trackpoint.saving.options import CheckpointOptions
from trackpoint.saving.progress import (
    ProgressEvent,
    WrittenFiles,
    committed_sizes,
    write_stats,
)
from trackpoint.saving.registration import get_registered_saver
from trackpoint.saving.restore import RestoreItem, restore_items
from trackpoint.saving.shard_validation import policy_description, validate_shards
from trackpoint.saving.shard_writer import payload_bytes, write_shards
from trackpoint.saving.sharding import (
    MaxShardSizePolicy,
    Shard,
    ShardableTensor,
    ShardByTaskPolicy,
)
from trackpoint.saving.snapshot import SaveSnapshot, as_array
from trackpoint.storage import Storage, locate
from trackpoint.tracking.base import Trackable

__all__ = ["MultiDeviceSaver", "ProgressEvent", "SerializedTensors"]

logger = logging.getLogger(__name__)

_DEFAULT_MAX_IO_THREADS = 4
_DTYPE = attrgetter("dtype")
_SHAPE = attrgetter("shape")
_FIRST = itemgetter(0)
_SECOND = itemgetter(1)


class SerializedTensors(Protocol):
    """What :class:`MultiDeviceSaver` takes: ``(trackable, {checkpoint_key: value})`` pairs.

    A plain dict keyed by trackable qualifies, and so does the graph walk's
    :class:`~trackpoint.graph.serialize.TensorsByTrackable` (keyed by identity, since trackables may
    be unhashable).
    """

    def items(self) -> Iterable[tuple[Any, Mapping[str, Any]]]:
        """The pairs, in data order."""
        ...


class _Values(NamedTuple):
    """One task's values as the saver keeps them (before evaluation): parallel lists, one item
    per value, so that the usual save (100,000 whole local arrays) is found, checked and
    snapshotted a list at a time, in C (issue 19)."""

    keys: list[str]
    specs: list[str]
    """Slice specs, ``""`` for a whole value."""
    values: list[Any]
    """An array, a zero-argument callable returning one, or None (graph only, never written)."""
    devices: list[str | None]
    trackables: list[Any]


class MultiDeviceSaver:
    """Saves values from several devices into one checkpoint and restores them.

    Args:
        serialized_tensors: ``{trackable: {checkpoint_key: {slice_spec: value}}}`` (a value
            directly under the key means slice spec ``""``). A value is a numpy array, a
            zero-argument callable returning one (evaluated exactly once per save), ``None``
            (recorded in the object graph only, never written), or a ``DeviceValue`` giving one
            of those together with its device. The trackable's ``_prepare_restore`` (or
            ``_restore_from_tensors``) receives the values on restore; a ``None`` trackable is
            never restored.
        registered_savers: ``{saver_name: {object_path: trackable}}`` for objects handled by a
            registered saver (:func:`trackpoint.saving.register_checkpoint_saver`).

    :meth:`use_history` (``Checkpoint`` calls it) lets saves with
    ``CheckpointOptions(incremental=True)`` reuse unchanged data files (docs/incremental.md).

    Raises:
        InvalidArgumentError: two values share a checkpoint key and slice spec, or a slice spec
            or device is malformed.

    Example::

        saver = MultiDeviceSaver({holder: {"w/.ATTRIBUTES/VARIABLE_VALUE": {"": weights}}})
        saver.save("/tmp/ckpt")
        saver.restore("/tmp/ckpt")   # calls holder._restore_from_tensors({"VARIABLE_VALUE": …})
    """

    def __init__(
        self,
        serialized_tensors: SerializedTensors,
        registered_savers: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self._registered_savers = {
            name: dict(objects) for name, objects in (registered_savers or {}).items()
        }
        self._history: SaveHistory | None = None
        self._values_by_task = _by_task(_flatten(serialized_tensors))

    @property
    def history(self) -> SaveHistory | None:
        """The previous checkpoint incremental saves compare with (see :meth:`use_history`)."""
        return self._history

    def use_history(self, history: SaveHistory) -> bool:
        """Let saves with ``options.incremental`` reuse files of ``history``'s checkpoint.

        Returns whether they will (True here; the distributed saver overrides it to plan in
        its own save).
        """
        self._history = history
        return True

    @property
    def tasks(self) -> list[str]:
        """The tasks of the values, in first-seen order (``""`` is this process)."""
        return list(self._values_by_task)

    # -- save ------------------------------------------------------------------------------
    def snapshot(self) -> SaveSnapshot:
        """Evaluate every value once: callables are called, ``None`` values dropped.

        The arrays are not copied; see :meth:`SaveSnapshot.copy`.
        """
        tensors_by_task: dict[str, list[ShardableTensor]] = {}
        for task, (keys, specs, values, devices, trackables) in self._values_by_task.items():
            arrays = values
            odd = list(compress(range(len(values)), map(is_not, map(type, values),
                                                          repeat(np.ndarray))))  # fmt: skip
            if odd:  # callables called now, None dropped, other values as arrays
                arrays = list(values)
                for index in odd:
                    value = values[index]
                    value = value() if callable(value) else value
                    arrays[index] = None if value is None else as_array(value, keys[index])
            present = list(map(is_not, arrays, repeat(None))) if odd else None
            if present is not None and not all(present):  # keep the values that are not None
                kept = list(compress(range(len(arrays)), present))
                arrays, keys, specs, devices, trackables = (
                    list(map(column.__getitem__, kept))
                    for column in (arrays, keys, specs, devices, trackables)
                )
            # ShardableTensor(tensor, dtype, device, name, shape, spec, key, trackable) made in
            # C by tuple.__new__ (a NamedTuple's own __new__ is Python), the dtype and shape
            # read now (an array may have been reshaped in place).
            fields = zip(
                arrays, map(_DTYPE, arrays), devices, keys, map(_SHAPE, arrays), specs, keys,
                trackables,
            )  # fmt: skip
            tensors_by_task[task] = list(map(tuple.__new__, repeat(ShardableTensor), fields))
        return SaveSnapshot(tensors_by_task)

    def save(
        self,
        prefix: PathLike,
        options: CheckpointOptions | None = None,
        *,
        storage: Storage | None = None,
        timing: metrics.WriteTiming | None = None,
    ) -> str:
        """Write every value to the checkpoint ``prefix``, atomically.

        The values are evaluated (callables called once), registered savers write their files,
        then the values are sharded per task by ``options.sharding_policy``, written
        concurrently (``options.num_io_threads``, default ``min(4, shards)``) and merged into
        ``prefix.index`` + ``prefix.data-*``. The checkpoint
        appears at once, when its index is renamed into place; on failure nothing of this save
        remains and an earlier checkpoint at another prefix is untouched. Write callbacks run
        last. Blocks until done.

        Args:
            prefix: the checkpoint prefix (local path or URL).
            options: settings; ``CheckpointOptions()`` when None.
            storage: the byte backend; by default chosen from ``prefix``.
            timing: from ``trackpoint.metrics.begin_write()`` when the caller's wait began
                earlier (``Checkpoint.write`` serializes the object graph first); by default
                the write is timed from this call. The figures are recorded once, at the
                commit (``trackpoint.metrics.record_write``), and passed to ``options.progress``.

        Returns:
            ``prefix`` as a str.

        Raises:
            InvalidArgumentError: a value cannot be stored, or the sharding policy altered the
                values (names the key).
            CheckpointError: writing failed (the save is rolled back).
        """
        timing = timing or metrics.begin_write()
        return self.save_snapshot(
            self.snapshot(), prefix, options, storage=storage, timing=timing
        )

    def save_snapshot(
        self,
        snapshot: SaveSnapshot,
        prefix: PathLike,
        options: CheckpointOptions | None = None,
        *,
        storage: Storage | None = None,
        timing: metrics.WriteTiming | None = None,
    ) -> str:
        """Like :meth:`save` for values evaluated earlier by :meth:`snapshot` (async saves).

        A ``timing`` whose ``blocking_seconds`` is set (by an async writer) makes this the
        background part of an async write: its duration is recorded as such.
        """
        started = time.perf_counter()
        timing = timing or metrics.begin_write()
        options = options or CheckpointOptions()
        prefix_str = fspath(prefix)
        # Checkpoint.save/write pass the backend they picked; a direct caller gets one here.
        given = storage or options.storage
        storage = locate(prefix_str, storage=given, fsync=options.fsync).storage
        # Incremental saves (docs/incremental.md): only what changed is left to write.
        snapshot = prepare_incremental(self.history, snapshot, prefix_str, options, storage)
        commit = AtomicCommit(storage, prefix_str)
        try:
            commit.prepare()
            # Registered savers run before the default shards are written (TF's API contract).
            commit.add_foreign_prefixes(self._run_registered_save_fns(prefix_str))
            written = self._write(snapshot, commit, options)
        except BaseException:
            commit.abort()
            raise
        record_incremental(snapshot, prefix_str, storage)  # the next one compares with this
        options.run_write_callbacks(prefix_str)
        if snapshot.stager is not None:
            # A bounded async save: the caller was blocked until the stager copied the last value.
            timing = snapshot.stager.caller_timing()
        stats = write_stats(prefix_str, written, timing, started)
        metrics.record_write(stats)
        count, nbytes = written.num_shards, written.payload_bytes
        self._progress(options, prefix_str, "commit", count, count, nbytes, nbytes, stats=stats)
        return prefix_str

    def _run_registered_save_fns(self, prefix: str) -> list[str]:
        written: list[str] = []
        for name, objects in self._registered_savers.items():
            saver = get_registered_saver(name)
            result = saver.save_fn(dict(objects), f"{prefix}-{name}")
            if result is None:
                continue
            if isinstance(result, (str, os.PathLike)):
                result = [result]
            try:
                written.extend(fspath(p) for p in result)
            except TypeError as exc:
                raise InvalidArgumentError(
                    f"registered saver {name!r} returned {result!r}; a save_fn returns None or "
                    "the prefix(es) of bundles it wrote, to be merged into the checkpoint"
                ) from exc
        return written

    def _shard(
        self, snapshot: SaveSnapshot, options: CheckpointOptions
    ) -> list[tuple[str, Shard]]:
        if snapshot.shards is not None:
            return list(snapshot.shards)  # cut on the caller's thread by a bounded async save
        policy: Callable[[Sequence[ShardableTensor]], Iterable[Shard]] = (
            options.sharding_policy or ShardByTaskPolicy()
        )
        plan = plan_of(snapshot)
        if plan is not None:
            return plan.shards(snapshot, policy)
        shards_by_task = {
            task: list(policy(tensors)) for task, tensors in snapshot.tensors_by_task.items()
        }
        if not isinstance(policy, (ShardByTaskPolicy, MaxShardSizePolicy)):
            every = [st for tensors in snapshot.tensors_by_task.values() for st in tensors]
            validate_shards(shards_by_task, every, policy_description(policy))
        flat = [(task, shard) for task, shards in shards_by_task.items() for shard in shards]
        return [(task, shard) for task, shard in flat if shard]

    def _write(
        self,
        snapshot: SaveSnapshot,
        commit: AtomicCommit,
        options: CheckpointOptions,
    ) -> WrittenFiles:
        policy_started = time.perf_counter()
        shards = self._shard(snapshot, options)
        sharding_seconds = time.perf_counter() - policy_started
        plan = plan_of(snapshot)
        linked = plan.linked if plan is not None else ()  # reused files of an incremental save
        if not shards and not linked:
            # Nothing to write: still produce a valid (empty) checkpoint, one empty data file.
            shards = [(LOCAL_TASK, {})]
        num_shards = len(shards)
        total = num_shards + (1 if linked else 0)  # all reused files form one bundle
        prefixes = [commit.shard_prefix(i, total) for i in range(total)]
        workers = options.num_io_threads or min(_DEFAULT_MAX_IO_THREADS, num_shards)
        jobs = [(path, shard, commit.storage) for path, (_, shard) in zip(prefixes, shards)]
        sizes = [0] * num_shards  # each shard's payload, filled in as it is written
        # Progress reports need every size before the first shard completes.
        expected = [payload_bytes(shard) for _, shard in shards] if options.progress else None
        done_bytes = 0
        for count, index in enumerate(write_shards(jobs, workers, sizes), start=1):
            if expected is not None:
                done_bytes += sizes[index]
                self._progress(
                    options, commit.prefix, "write", count, num_shards, done_bytes,
                    sum(expected), shard_id=index, shard_bytes=sizes[index],
                )  # fmt: skip
        if plan is not None and linked:
            plan.link(prefixes[-1], commit.storage)
        commit.commit([*commit.foreign_prefixes, *prefixes])
        logger.info("Saved checkpoint %s (%d shards, %d bytes)", commit.prefix, num_shards,
                    sum(sizes))
        policy = policy_description(options.sharding_policy or ShardByTaskPolicy())
        file_bytes, index_bytes = committed_sizes(commit)
        return WrittenFiles(
            num_shards, sum(sizes), file_bytes, index_bytes + sum(file_bytes), policy,
            sharding_seconds,
        )  # fmt: skip

    @staticmethod
    def _progress(
        options: CheckpointOptions,
        prefix: str,
        phase: str,
        shards_done: int,
        num_shards: int,
        bytes_done: int,
        bytes_total: int,
        **extra: Any,
    ) -> None:
        if options.progress is not None:
            event = ProgressEvent(
                prefix, phase, shards_done, num_shards, bytes_done, bytes_total, **extra
            )
            options.progress(event)

    # -- restore ---------------------------------------------------------------------------
    def restore(
        self,
        prefix: PathLike,
        options: CheckpointOptions | None = None,
        *,
        storage: Storage | None = None,
        index: BundleReader | None = None,
    ) -> None:
        """Read every value's key from ``prefix`` and hand them to their trackables.

        ``index``, a reader of ``prefix`` opened earlier (it may be closed), saves reading and
        parsing the index again: the values are read through ``index.reopen()``.

        All or nothing, through the one value phase (trackpoint/saving/restore.py): every value
        is read and verified, then each trackable's ``_prepare_restore(tensors)`` checks its
        values, with ``tensors`` mapping each local name (the part of the key after
        ``/.ATTRIBUTES/``) to an array, or, for a value registered under a non-empty slice
        spec, to ``{slice_spec: array}`` holding that sub-box; registered savers'
        ``restore_fn`` s run next, and only then are the trackables changed. Arrays may be
        read-only zero-copy views of the file, valid until the restore returns.

        Raises:
            NotFoundError: the checkpoint or a key is missing.
            DataLossError: the files are damaged.
            InvalidArgumentError: a requested slice does not fit the stored tensor, or a
                registered saver's strict predicate rejects an object.
        """
        prefix_str = fspath(prefix)
        given = storage or (options.storage if options is not None else None)
        storage = locate(prefix_str, storage=given).storage
        # One item per trackable: {local name: key}, and the slice specs each value is read as.
        groups: dict[int, tuple[Trackable, dict[str, str], dict[str, dict[str, None]]]] = {}
        for task_values in self._values_by_task.values():
            for key, spec, trackable in zip(
                task_values.keys, task_values.specs, task_values.trackables
            ):
                if trackable is None:
                    continue
                _, keys, layouts = groups.setdefault(id(trackable), (trackable, {}, {}))
                name = local_name(key)
                keys[name] = key
                layouts.setdefault(name, {})[spec] = None
        items = [
            RestoreItem(trackable, keys, repr(trackable), layouts)
            for trackable, keys, layouts in groups.values()
        ]
        opened = index.reopen() if index is not None else BundleReader(prefix_str, storage=storage)
        with opened as reader:
            restore_items(
                items, reader, prefix=prefix_str,
                registered=self._registered_savers,
                progress=options.progress if options is not None else None,
            )


_ABSENT = object()


def _flatten(serialized_tensors: SerializedTensors) -> _Values:
    """Every value of ``serialized_tensors`` with its key, slice spec, device and trackable,
    in data order, keys checked: non-empty strs, each (key, slice spec) produced once.

    The usual values, whole local ndarrays in plain dicts, are listed in C; a mapping of
    slices or a ``DeviceValue`` is expanded where it stands.
    """
    pairs = list(_items(serialized_tensors))
    dicts = list(map(_SECOND, pairs))
    if set(map(type, dicts)) - {dict}:
        dicts = [dict(_items(d)) if type(d) is not dict else d for d in dicts]
    keys: list[Any] = list(chain.from_iterable(dicts))
    values: list[Any] = list(chain.from_iterable(map(dict.values, dicts)))
    trackables = list(chain.from_iterable(map(repeat, map(_FIRST, pairs), map(len, dicts))))
    count = len(keys)
    specs: list[str] = [""] * count
    devices: list[str | None] = [None] * count
    odd = list(compress(range(count), map(is_not, map(type, values), repeat(np.ndarray))))
    if odd:
        keys, specs, values, devices, trackables = _expand(
            keys, values, trackables, odd, specs, devices
        )
    if set(map(type, keys)) - {str} or "" in keys:
        bad = next(i for i, key in enumerate(keys) if type(key) is not str or not key)
        raise InvalidArgumentError(
            f"checkpoint keys must be non-empty str, got {keys[bad]!r} from {trackables[bad]!r}"
        )
    if len(set(zip(keys, specs)) if odd else set(keys)) != len(keys):
        _raise_duplicate(keys, specs, trackables)
    return _Values(keys, specs, values, devices, trackables)


def _expand(
    keys: list[Any],
    values: list[Any],
    trackables: list[Any],
    odd: list[int],
    specs: list[str],
    devices: list[str | None],
) -> tuple[list[Any], list[str], list[Any], list[str | None], list[Any]]:
    """The lists with each value at ``odd`` expanded: a mapping into its slices (specs
    checked), a ``DeviceValue`` into its value and device; the runs between as they are."""
    out: tuple[list[Any], list[str], list[Any], list[str | None], list[Any]] = ([], [], [], [], [])
    new_keys, new_specs, new_values, new_devices, new_trackables = out
    start = 0
    for index in [*odd, len(keys)]:
        new_keys += keys[start:index]
        new_specs += specs[start:index]
        new_values += values[start:index]
        new_devices += devices[start:index]
        new_trackables += trackables[start:index]
        start = index + 1
        if index == len(keys):
            break
        key, raw, trackable = keys[index], values[index], trackables[index]
        if not isinstance(key, str) or not key:
            raise InvalidArgumentError(
                f"checkpoint keys must be non-empty str, got {key!r} from {trackable!r}"
            )
        slices = raw.items() if isinstance(raw, Mapping) else (("", raw),)
        for raw_spec, raw_value in slices:
            # The usual "": no checks.
            spec = "" if type(raw_spec) is str and not raw_spec else _check_spec(raw_spec, key)
            value, device = raw_value, None
            if isinstance(raw_value, DeviceValue):
                value, device = raw_value.value, raw_value.device
            new_keys.append(key)
            new_specs.append(spec)
            new_values.append(value)
            new_devices.append(device)
            new_trackables.append(trackable)
    return out


def _raise_duplicate(keys: list[str], specs: list[str], trackables: list[Any]) -> NoReturn:
    """Name the first (key, slice spec) produced twice, and both producers."""
    owners: dict[tuple[str, str], Any] = {}
    for key, spec, trackable in zip(keys, specs, trackables):
        owner = owners.get((key, spec), _ABSENT)
        if owner is not _ABSENT:
            raise InvalidArgumentError(
                f"checkpoint key {key!r} with slice spec {spec!r} is produced twice, "
                f"by {owner!r} and by {trackable!r}; one would "
                "overwrite the other in the checkpoint. Give the objects distinct "
                "names.",
                key=key,
            )
        owners[key, spec] = trackable
    raise AssertionError("_raise_duplicate called without a duplicate")


def _by_task(values: _Values) -> dict[str, _Values]:
    """``values`` split by the task of each one's device, tasks in first-seen order; none
    for no values."""
    if not values.keys:
        return {}
    placed = list(compress(range(len(values.keys)), map(is_not, values.devices, repeat(None))))
    tasks = {task_of(values.devices[index]) for index in placed}
    if tasks <= {LOCAL_TASK}:
        return {LOCAL_TASK: values}  # every value on this process: the usual save
    task_list = list(map(task_of, values.devices))
    by_task: dict[str, _Values] = {}
    for task in dict.fromkeys(task_list):
        chosen = list(compress(range(len(task_list)), map(eq, task_list, repeat(task))))
        by_task[task] = _Values(*(list(map(column.__getitem__, chosen)) for column in values))
    return by_task


def _items(mapping: Any) -> Iterable[tuple[Any, Any]]:
    if type(mapping) is dict:
        return mapping.items()
    if isinstance(mapping, Mapping) or hasattr(mapping, "items"):
        return list(mapping.items())
    raise InvalidArgumentError(
        f"expected a mapping, got {type(mapping).__name__}: serialized_tensors is "
        "{trackable: {checkpoint_key: {slice_spec: value}}}"
    )


def _check_spec(spec: object, key: str) -> str:
    if not isinstance(spec, str):
        raise InvalidArgumentError(
            f"slice spec of checkpoint key {key!r} must be a str, got {type(spec).__name__}",
            key=key,
        )
    spec = spec.strip()
    if spec:
        try:
            parse_slice_spec(spec)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(
                f"slice spec {spec!r} of checkpoint key {key!r} is malformed ({exc}); expected "
                "'<full shape> <offset>,<length>:...' such as '4 6 0,4:0,2'",
                key=key,
            ) from exc
    return spec
