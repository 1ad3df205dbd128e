"""CheckpointOptions: every knob of a save or restore, in one frozen object."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trackpoint.errors import InvalidArgumentError
from trackpoint.storage.base import Storage

__all__ = ["CheckpointOptions", "WriteCallback"]

WriteCallback = Callable[..., Any]
"""Called after a checkpoint is committed, with no argument or with the checkpoint's prefix."""


def _count_required_positional(fn: Callable[..., Any]) -> tuple[int, int | None]:
    """(minimum, maximum) positional arguments ``fn`` accepts; maximum None means unbounded."""
    sig = inspect.signature(fn)
    required = 0
    maximum: int | None = 0
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            assert maximum is not None
            maximum += 1
            if p.default is p.empty:
                required += 1
        elif p.kind is p.VAR_POSITIONAL:
            maximum = None
        elif p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            required += 1_000  # a required keyword can never be satisfied
    return required, maximum


def _callback_arity(fn: WriteCallback) -> int:
    """0 or 1: how many arguments trackpoint passes to a write callback."""
    required, maximum = _count_required_positional(fn)
    if required > 1:
        raise InvalidArgumentError(
            f"write callback {fn!r} requires {required} arguments; a write callback takes "
            "no argument or one (the checkpoint prefix)"
        )
    if required == 1 or maximum is None or maximum >= 1:
        return 1 if required == 1 else 0
    return 0


@dataclass(frozen=True)
class CheckpointOptions:
    """Options for ``write``/``save``/``read``/``restore``.

    Args:
        enable_async: return from ``save``/``write`` after a snapshot of the values; write in a
            background thread. ``sync()`` waits and raises a background error.
        sharding_policy: callable mapping one task's ``ShardableTensor``s to shards
            (``tp.sharding.ShardByTaskPolicy()`` by default).
        write_callbacks: callables of zero or one argument (the prefix) run in order after
            the commit (on the writer thread for async saves).
        skip_slot_variables: on restore, leave optimizer slot state untouched.
        num_io_threads: threads that write shards concurrently (default: up to 4).
        fsync: flush files and directories to stable storage before the commit. Turn off only
            for scratch checkpoints: a machine crash can then lose a "committed" checkpoint.
            Off, ``Checkpoint.save`` does not flush the state file either (it names the
            checkpoint; a ``CheckpointManager`` flushes its own state file regardless).
        max_staging_bytes: bound on the extra host memory an async save may hold for its
            snapshot (default: none, a full copy of the state). A larger state is copied
            through a reusable staging buffer of this size while the writer thread writes it,
            so the call returns only once the last value is copied: it blocks for about the
            time of the write minus the last buffer's worth, instead of for one memory copy.
            Values are still snapshotted at the call and the files are the same. String
            values are copied outside the bound (their payloads are immutable objects).
        progress: callable receiving ``trackpoint.saving.ProgressEvent``s during long work.
        storage: the byte backend to read and write through (e.g. an ``FsspecStorage`` over a
            configured filesystem); by default chosen from the prefix (``storage.locate``),
            once per ``save``/``write``/``read``.
        name_map: for restoring a name-based (TF1 ``Saver``) checkpoint: the TF1 key of a
            value, given its object-based checkpoint key (``model/w/.ATTRIBUTES/VARIABLE_VALUE``),
            as a mapping or a function returning None for "no TF1 key"; consulted before
            ``tp.Variable`` names and torch ``state_dict`` paths.
        incremental: ``Checkpoint.save``/``write`` and ``CheckpointManager.save`` do not write
            again the values unchanged since the previous checkpoint this ``Checkpoint``
            wrote (or restored): the new checkpoint's data files holding only such values
            are hard links to the previous checkpoint's (a server-side copy on object
            stores). Every checkpoint stays complete on its own; deleting any other never
            breaks it. Values are compared by a content hash (XXH3-128), JAX arrays too
            unless ``trust_immutable_arrays`` (docs/incremental.md). A data file is linked
            only after its bytes are read and checked (content digest or crc32c); a damaged
            one is not, its values are written. ``DistributedCheckpoint``: each rank reuses
            the files it wrote. A bare ``MultiDeviceSaver`` needs ``use_history`` first.
        trust_immutable_arrays: incremental saves compare ``jax.Array`` s (values offering
            ``_value_versions()``) by identity instead of hashing their bytes: the same array
            object is taken for the same value. Set it only if nothing writes those arrays
            in place: a CPU ``jax.Array`` can be changed through DLPack
            (``torch.from_dlpack``), and such a change would then not be saved.
            ``DistributedCheckpoint`` always hashes.
        lazy_snapshot: with ``enable_async``, copy at the call only what may change before
            the next optimizer step (buffers, RNG states, plain values, anything no tracked
            optimizer owns) and copy parameters and optimizer state on the writer thread;
            each tracked optimizer's next ``step()`` first waits for (or takes over) the copy
            of the tensors it changes. The checkpoint holds exactly the values at the call; a
            value changed some other way before its copy fails the save (docs/performance.md,
            "Lazy snapshots"). Cannot be combined with ``max_staging_bytes``.
    """

    enable_async: bool = False
    sharding_policy: Callable[..., Any] | None = None
    write_callbacks: Sequence[WriteCallback] = field(default_factory=tuple)
    skip_slot_variables: bool = False
    num_io_threads: int | None = None
    fsync: bool = True
    max_staging_bytes: int | None = None
    progress: Callable[[Any], None] | None = None
    storage: Storage | None = None
    name_map: Mapping[str, str] | Callable[[str], str | None] | None = None
    incremental: bool = False
    trust_immutable_arrays: bool = False
    lazy_snapshot: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.enable_async, bool):
            raise InvalidArgumentError(
                f"enable_async must be a bool, got {type(self.enable_async).__name__}"
            )
        if not isinstance(self.incremental, bool):
            raise InvalidArgumentError(
                f"incremental must be a bool, got {type(self.incremental).__name__}"
            )
        if not isinstance(self.trust_immutable_arrays, bool):
            raise InvalidArgumentError(
                "trust_immutable_arrays must be a bool, got "
                f"{type(self.trust_immutable_arrays).__name__}"
            )
        if not isinstance(self.lazy_snapshot, bool):
            raise InvalidArgumentError(
                f"lazy_snapshot must be a bool, got {type(self.lazy_snapshot).__name__}"
            )
        if self.lazy_snapshot and not self.enable_async:
            raise InvalidArgumentError(
                "lazy_snapshot=True needs enable_async=True: a lazy snapshot finishes its "
                "copies in the background, and a synchronous save has no background"
            )
        if self.lazy_snapshot and self.max_staging_bytes is not None:
            raise InvalidArgumentError(
                "lazy_snapshot=True cannot be combined with max_staging_bytes: a lazy snapshot "
                "holds a full copy of the deferred values until they are written; drop one of "
                "the two options"
            )
        if self.sharding_policy is not None and not callable(self.sharding_policy):
            raise InvalidArgumentError(
                "sharding_policy must be a callable such as tp.sharding.MaxShardSizePolicy(…), "
                f"got {type(self.sharding_policy).__name__}"
            )
        callbacks = self.write_callbacks
        if callable(callbacks):
            callbacks = (callbacks,)
        callbacks = tuple(callbacks)
        for cb in callbacks:
            if not callable(cb):
                raise InvalidArgumentError(f"write callback {cb!r} is not callable")
            _callback_arity(cb)
        object.__setattr__(self, "write_callbacks", callbacks)
        if self.num_io_threads is not None and (
            not isinstance(self.num_io_threads, int) or self.num_io_threads < 1
        ):
            raise InvalidArgumentError(
                f"num_io_threads must be a positive int, got {self.num_io_threads!r}"
            )
        if self.max_staging_bytes is not None and (
            not isinstance(self.max_staging_bytes, int) or self.max_staging_bytes < 1
        ):
            raise InvalidArgumentError(
                f"max_staging_bytes must be a positive int, got {self.max_staging_bytes!r}"
            )
        if self.progress is not None and not callable(self.progress):
            raise InvalidArgumentError("progress must be callable")
        if self.name_map is not None and not (
            callable(self.name_map) or isinstance(self.name_map, Mapping)
        ):
            raise InvalidArgumentError(
                "name_map must be a mapping or a function from object-based checkpoint keys to "
                f"TF1 keys, got {type(self.name_map).__name__}"
            )
        if self.storage is not None and not isinstance(self.storage, Storage):
            raise InvalidArgumentError(
                "storage must be a trackpoint.storage.Storage (LocalStorage, FsspecStorage, "
                f"...), got {type(self.storage).__name__}"
            )

    @staticmethod
    def resolve(options: CheckpointOptions | None) -> CheckpointOptions:
        """``options``, or the defaults for ``None``; anything else is refused.

        Raises:
            InvalidArgumentError: ``options`` is not a ``CheckpointOptions``.
        """
        if options is None:
            return CheckpointOptions()
        if not isinstance(options, CheckpointOptions):
            raise InvalidArgumentError(
                f"options must be a tp.CheckpointOptions, got {type(options).__name__}"
            )
        return options

    def run_write_callbacks(self, prefix: str) -> None:
        """Call every write callback in order, passing ``prefix`` to those that take one."""
        for cb in self.write_callbacks:
            if _callback_arity(cb) == 1:
                cb(prefix)
            else:
                cb()
