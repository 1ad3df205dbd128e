"""``SaveSnapshot``: the evaluated values of one save, and private copies for async saves.

One type serves every kind of save; what sets one apart is declared on it, never found out
with ``isinstance``: :attr:`SaveSnapshot.plan` (an incremental save's plan),
:attr:`SaveSnapshot.shards` (cut on the caller's thread) and :attr:`SaveSnapshot.stager` (the
values stream through a staging buffer, :mod:`trackpoint.saving.staging`). The async writer
hands its thread any :class:`Snapshot`: a ``SaveSnapshot``, or a lazy snapshot
(:class:`~trackpoint.saving.lazy_snapshot.LazyCopy`) whose copies are still running, and asks
it only what the protocol declares: what to wait for before writing (:meth:`Snapshot.complete`)
and what to release when the write fails (:meth:`Snapshot.abandon`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from trackpoint.errors import FailedPreconditionError, InvalidArgumentError
from trackpoint.saving.sharding import ShardableTensor

if TYPE_CHECKING:
    from trackpoint.metrics.registry import WriteTiming
    from trackpoint.saving.sharding import Shard

__all__ = ["SaveSnapshot", "Snapshot", "StagingSource", "as_array"]


def as_array(value: Any, key: str) -> np.ndarray:
    """``value`` as a numpy array; ``bytes``/``str`` scalars keep every byte (object dtype)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (bytes, str)):
        return np.array(value, dtype=object)
    try:
        return np.asarray(value)
    except Exception as exc:  # numpy raises many types for odd objects
        raise InvalidArgumentError(
            f"value of checkpoint key {key!r} is a {type(value).__name__}, which is not an "
            "array; pass a numpy array, a zero-argument callable returning one, or None",
            key=key,
        ) from exc


class StagingSource(Protocol):
    """What a snapshot streamed through a staging buffer asks of its stager
    (:class:`~trackpoint.saving.staging.Stager`)."""

    def caller_timing(self) -> WriteTiming:
        """The save's timing with its blocking part set; waits until the last value is staged."""
        ...

    def abort(self, error: BaseException) -> None:
        """The write failed: wake the caller's thread if it waits for staging space."""
        ...


class Snapshot(Protocol):
    """What the async writer asks of a snapshot it hands to its thread.

    :class:`SaveSnapshot` and the lazy snapshot
    (:class:`~trackpoint.saving.lazy_snapshot.LazyCopy`) implement it.
    """

    def complete(self) -> SaveSnapshot:
        """Wait for what must be done before writing; the snapshot to write.

        Raises:
            CheckpointError: the snapshot cannot be completed (a lazy copy found its value
                changed); the checkpoint must not be written.
        """
        ...

    def abandon(self, error: BaseException | None = None) -> None:
        """The write failed (``error``) or never began: release what still feeds the snapshot
        (stop waiting copies, wake a caller waiting for staging space, drop live values)."""
        ...


@dataclass(frozen=True, slots=True)
class SaveSnapshot:
    """The values of one save, evaluated: task -> its ``ShardableTensor`` s, in order.

    Made by :meth:`MultiDeviceSaver.snapshot`; written by :meth:`MultiDeviceSaver.save_snapshot`.
    The arrays are the owners' own until :meth:`copy` makes private host copies, which a
    background write needs while the owners keep changing their values.

    The keyword-only fields declare how the snapshot is to be written; each is None for an
    ordinary save.

    Attributes:
        shards: the shards to write, cut on the caller's thread (a staged save); None: the
            saver cuts them from ``tensors_by_task`` by the sharding policy.
        stager: the values arrive through a staging buffer while they are written (each shard
            value a :class:`~trackpoint.saving.staging.StagedValue`); the caller's thread was
            blocked until the stager copied the last one.
        plan: an incremental save's plan
            (:class:`~trackpoint.saving.incremental.IncrementalPlan`, set only there): the
            values left to write, the files linked, the tokens recorded after the commit.
    """

    tensors_by_task: Mapping[str, Sequence[ShardableTensor]]
    shards: tuple[tuple[str, Shard], ...] | None = dataclasses.field(default=None, kw_only=True)
    stager: StagingSource | None = dataclasses.field(default=None, kw_only=True, compare=False)
    plan: object | None = dataclasses.field(default=None, kw_only=True, compare=False)

    @property
    def nbytes(self) -> int:
        """Host bytes the arrays occupy (object arrays: pointers only)."""
        return sum(st.tensor.nbytes for sts in self.tensors_by_task.values() for st in sts)

    def complete(self) -> SaveSnapshot:
        """This snapshot: its values are there (a staged value is waited for as it is written)."""
        return self

    def abandon(self, error: BaseException | None = None) -> None:
        """Wake the caller's thread if it waits for staging space (a staged save)."""
        if self.stager is not None:
            self.stager.abort(error or FailedPreconditionError("the write was abandoned"))

    def copy(
        self, buffers: MutableMapping[tuple[str, str], np.ndarray] | None = None
    ) -> SaveSnapshot:
        """A snapshot of private C-ordered copies of the arrays, with this one's :attr:`plan`.

        Shards cut earlier hold the owners' arrays: a copy has none (nor a stager).

        Args:
            buffers: arrays of an earlier copy that may be overwritten, by (checkpoint key,
                slice spec); a buffer of the same shape and dtype is reused instead of
                allocating. Updated in place to hold exactly this copy's arrays.
        """
        old = dict(buffers or {})
        if buffers is not None:
            buffers.clear()
        copied: dict[str, list[ShardableTensor]] = {}
        for task, tensors in self.tensors_by_task.items():
            out = copied.setdefault(task, [])
            for st in tensors:
                ident = (st.checkpoint_key, st.slice_spec)
                buffer = old.get(ident)
                if (
                    buffer is not None
                    and buffer.shape == st.tensor.shape
                    and buffer.dtype == st.tensor.dtype
                ):
                    np.copyto(buffer, st.tensor)
                else:
                    buffer = np.array(st.tensor, copy=True, order="C")
                if buffers is not None:
                    buffers[ident] = buffer
                out.append(st._replace(tensor=buffer))
        return SaveSnapshot(copied, plan=self.plan)
