"""Where one rank's part of a tensor lies in the full tensor: boxes, flat ranges, slice specs.

A rank holds either one *box* of the full tensor (a row block of an embedding, a DTensor's local
shard) or a *flat range*: elements ``[start, start + n)`` of the full tensor in row-major order,
as FSDP's flat parameters shard it. A checkpoint stores boxes only (TensorFlow slices,
tf-checkpoint-format.md §7–§8), so a flat range is cut into at most ``2 * rank - 1`` boxes, each
of which is a contiguous run of the flat local buffer. Every box becomes one slice entry of the
full tensor's key; restoring reads exactly those boxes, whatever layout wrote the file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trackpoint.bundle.slice_spec import TensorSlice, format_slice_spec
from trackpoint.errors import InvalidArgumentError

__all__ = ["Box", "ShardLayout", "flat_range_boxes"]


@dataclass(frozen=True, slots=True)
class Box:
    """A box of the full tensor: ``offsets`` and ``shape`` per dimension."""

    offsets: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    def spec(self, full_shape: Sequence[int]) -> str:
        """The ``SaveSliceInfo`` spec of this box, e.g. ``"4 6 0,4:0,2"``."""
        return format_slice_spec(full_shape, TensorSlice.from_bounds(self.offsets, self.shape))


def flat_range_boxes(shape: Sequence[int], start: int, stop: int) -> list[Box]:
    """Boxes covering elements ``[start, stop)`` of a tensor of ``shape`` in row-major order.

    The boxes are returned in flat order and each is a contiguous run of that order, so a flat
    buffer holding the range splits into them by consecutive lengths. At most ``2 * rank - 1``
    boxes: a partial leading row, a block of whole rows, a partial trailing row (recursively).
    """
    shape = tuple(shape)
    if start >= stop:
        return []
    if not shape:
        return [Box((), ())]
    inner = math.prod(shape[1:])
    if inner == 0:
        return []
    rest = shape[1:]

    def in_row(row: int, begin: int, end: int) -> list[Box]:
        return [
            Box((row, *box.offsets), (1, *box.shape)) for box in flat_range_boxes(rest, begin, end)
        ]

    first_row, first_col = divmod(start, inner)
    last_row, last_col = divmod(stop, inner)
    if first_row == last_row:
        return in_row(first_row, first_col, last_col)
    boxes: list[Box] = []
    if first_col:
        boxes += in_row(first_row, first_col, inner)
        first_row += 1
    if last_row > first_row:
        boxes.append(Box((first_row,) + (0,) * len(rest), (last_row - first_row, *rest)))
    if last_col:
        boxes += in_row(last_row, 0, last_col)
    return boxes


def _as_shape(values: Sequence[int], what: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(v) for v in values)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what} must be a sequence of ints, got {values!r}") from None
    if any(v < 0 for v in shape):
        raise InvalidArgumentError(f"{what} must not be negative, got {list(shape)}")
    return shape


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """The part of a tensor of ``full_shape`` that one rank holds.

    Build it with :meth:`box` (the local value has the box's shape) or :meth:`flat_range` (the
    local value is a flat buffer of consecutive elements).
    """

    full_shape: tuple[int, ...]
    """Shape of the whole tensor, the same on every rank."""
    boxes: tuple[Box, ...]
    """The boxes held, in the order the local buffer stores them."""
    flat: bool
    """True when the local value is a flat buffer holding the boxes one after another."""

    @classmethod
    def box(
        cls, full_shape: Sequence[int], offsets: Sequence[int], shape: Sequence[int]
    ) -> ShardLayout:
        """One box at ``offsets`` of ``shape`` inside ``full_shape``.

        Raises:
            InvalidArgumentError: ranks differ or the box does not fit.
        """
        full = _as_shape(full_shape, "full_shape")
        start = _as_shape(offsets, "offsets")
        size = _as_shape(shape, "the local shape")
        if not len(full) == len(start) == len(size):
            raise InvalidArgumentError(
                f"a local value of shape {list(size)} at offsets {list(start)} does not match "
                f"the rank of the full shape {list(full)}; give one offset per dimension"
            )
        for dim, (o, n, f) in enumerate(zip(start, size, full)):
            if o + n > f:
                raise InvalidArgumentError(
                    f"a local value of shape {list(size)} at offsets {list(start)} extends past "
                    f"the full shape {list(full)} in dimension {dim} ({o} + {n} > {f})"
                )
        return cls(full, (Box(start, size),), flat=False)

    @classmethod
    def flat_range(cls, full_shape: Sequence[int], start: int, length: int) -> ShardLayout:
        """Elements ``[start, start + length)`` of ``full_shape`` in row-major order.

        Raises:
            InvalidArgumentError: the range does not fit in the full tensor.
        """
        full = _as_shape(full_shape, "full_shape")
        total = math.prod(full)
        if start < 0 or length < 0 or start + length > total:
            raise InvalidArgumentError(
                f"a flat range of {length} elements at {start} does not fit in a tensor of shape "
                f"{list(full)} ({total} elements)"
            )
        return cls(full, tuple(flat_range_boxes(full, start, start + length)), flat=True)

    @property
    def local_size(self) -> int:
        """Elements of the local value."""
        return sum(box.size for box in self.boxes)

    @property
    def local_shape(self) -> tuple[int, ...]:
        """Shape the local value must have (flat layouts: any shape of ``local_size`` elements)."""
        return (self.local_size,) if self.flat else self.boxes[0].shape

    @property
    def is_whole(self) -> bool:
        """True if the rank holds the whole tensor (saved unsliced, like a replicated value)."""
        return len(self.boxes) == 1 and self.boxes[0].shape == self.full_shape

    @property
    def is_empty_tensor(self) -> bool:
        """True if the full tensor has no elements (saved unsliced: slices cannot be empty)."""
        return math.prod(self.full_shape) == 0

    def pieces(self) -> list[tuple[str, Box, int]]:
        """``(slice spec, box, flat start in the local buffer)`` of every non-empty box."""
        out = []
        position = 0
        for box in self.boxes:
            if box.size:
                out.append((box.spec(self.full_shape), box, position))
            position += box.size
        return out

    def check_local(self, shape: Sequence[int], what: str) -> None:
        """Raise if a local value of ``shape`` cannot hold this layout."""
        shape = tuple(shape)
        if self.flat:
            if math.prod(shape) != self.local_size:
                raise InvalidArgumentError(
                    f"{what} has {math.prod(shape)} elements but its flat range holds "
                    f"{self.local_size}"
                )
        elif shape != self.boxes[0].shape:
            raise InvalidArgumentError(
                f"{what} has shape {list(shape)} but its layout says {list(self.boxes[0].shape)}"
            )

    def numpy_views(self, array: np.ndarray) -> dict[str, np.ndarray]:
        """``{slice spec: the part of the local ``array`` holding that box}``.

        Views when the array allows (a flat layout of a non-contiguous array is copied, which is
        fine for saving; restoring into numpy needs a contiguous array, see
        :meth:`writable_numpy_views`).
        """
        if not self.flat:
            return {spec: array for spec, _, _ in self.pieces()}
        flat = array.reshape(-1)
        return {
            spec: flat[start : start + box.size].reshape(box.shape)
            for spec, box, start in self.pieces()
        }

    def writable_numpy_views(self, array: np.ndarray, what: str) -> dict[str, np.ndarray]:
        """Like :meth:`numpy_views`, guaranteed to write into ``array``.

        Raises:
            InvalidArgumentError: ``array`` is read-only, or a flat layout's array is not
                contiguous (its flat view would be a copy).
        """
        if not array.flags.writeable:
            raise InvalidArgumentError(f"cannot restore into {what}: the array is read-only")
        if self.flat and not array.flags.c_contiguous:
            raise InvalidArgumentError(
                f"cannot restore into {what}: a flat shard must be a C-contiguous array"
            )
        return self.numpy_views(array)
