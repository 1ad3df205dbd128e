"""``SaveSnapshot``: the evaluated values of one save, and private copies for async saves."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trackpoint.errors import InvalidArgumentError
from trackpoint.saving.sharding import ShardableTensor

__all__ = ["SaveSnapshot", "as_array"]


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


@dataclass(frozen=True, slots=True)
class SaveSnapshot:
    """The values of one save, evaluated: task -> its ``ShardableTensor`` s, in order.

    Made by :meth:`MultiDeviceSaver.snapshot`; written by :meth:`MultiDeviceSaver.save_snapshot`.
    The arrays are the owners' own until :meth:`copy` makes private host copies, which a
    background write needs while the owners keep changing their values.
    """

    tensors_by_task: Mapping[str, Sequence[ShardableTensor]]

    @property
    def nbytes(self) -> int:
        """Host bytes the arrays occupy (object arrays: pointers only)."""
        return sum(st.tensor.nbytes for sts in self.tensors_by_task.values() for st in sts)

    def copy(
        self, buffers: MutableMapping[tuple[str, str], np.ndarray] | None = None
    ) -> SaveSnapshot:
        """A snapshot of private C-ordered copies of the arrays.

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
        return SaveSnapshot(copied)
