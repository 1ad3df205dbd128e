"""Boxes of partitioned tensors, from the stored slices that meet them (§8.4).

A partitioned tensor's full-tensor entry lists its stored slices (§8.1); a box of it (the whole
tensor, or the region one process needs) is filled from each stored slice that intersects the
box, and only those are read. TensorFlow's ``TensorSliceReader`` does the same; the stored
slices of one tensor may in principle overlap, so full coverage is checked exactly when the
element counts do not settle it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from trackpoint.errors import DataLossError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from trackpoint.bundle.slice_spec import TensorSlice

__all__ = ["assemble", "exact_slice"]


def assemble(
    key: str,
    full_shape: tuple[int, ...],
    stored: Sequence[TensorSlice],
    target: TensorSlice,
    out: np.ndarray | Callable[[], np.ndarray],
    locate_slice: Callable[[TensorSlice], Any],
    read_slice: Callable[[Any], np.ndarray],
    *,
    index_path: str,
    prefix: str,
) -> np.ndarray:
    """Fill ``out``, the box ``target`` of tensor ``key``, from its stored slices; return it.

    Nothing is allocated before the stored slices are known to cover ``target`` and each one
    that meets it was located (its entry consistent with the full tensor's, its bytes within
    its data file): ``out`` may be a function that allocates the box, called only then, so a
    tiny index declaring a huge tensor is refused instead of allocated. Slices are then read
    one at a time (checksums verified), as before.

    Args:
        key: the checkpoint key, for errors.
        full_shape: the tensor's shape.
        stored: its stored slices, in index order.
        target: the box ``out`` holds.
        out: the array to fill, of ``target``'s shape, or a function returning it.
        locate_slice: checks one stored slice's entry and extent without reading its bytes
            (called only for those that meet ``target``); returns what ``read_slice`` takes.
        read_slice: reads a located slice.
        index_path: the ``.index`` file, for errors.
        prefix: the checkpoint, for errors.

    Raises:
        DataLossError: a stored slice has the wrong rank, or the stored slices do not cover
            ``target``; and what ``locate_slice`` and ``read_slice`` raise.
    """
    covered = 0
    meeting: list[tuple[TensorSlice, TensorSlice]] = []
    for part in stored:
        if part.rank != len(full_shape):
            raise DataLossError(
                f"Slice '{part}' of key '{key}' has the wrong rank for shape "
                f"{list(full_shape)} in {index_path}",
                path=index_path,
                key=key,
            )
        common = part.intersect(target)
        if common is None:
            continue
        meeting.append((part, common))
        covered += common.num_elements(full_shape)
    needed = target.num_elements(full_shape)
    if covered < needed:  # arithmetic on the index alone: nothing read or allocated yet
        _raise_uncovered(key, prefix, target, full_shape)
    located = [locate_slice(part) for part, _ in meeting]
    if covered != needed and not _covers([c for _, c in meeting], target, full_shape):
        _raise_uncovered(key, prefix, target, full_shape)
    array = out() if callable(out) else out
    for (part, common), where in zip(meeting, located):
        data = read_slice(where)
        array[common.relative_to(target, full_shape)] = data[common.relative_to(part, full_shape)]
    return array


def _raise_uncovered(
    key: str, prefix: str, target: TensorSlice, full_shape: tuple[int, ...]
) -> NoReturn:
    raise DataLossError(
        f"The stored slices of key '{key}' in {prefix} do not cover the requested region "
        f"'{target}' of shape {list(full_shape)}",
        path=prefix,
        key=key,
    )


def exact_slice(
    stored: Sequence[TensorSlice], target: TensorSlice, full_shape: tuple[int, ...]
) -> TensorSlice | None:
    """The stored slice that is exactly the (non-empty) box ``target``, if there is one.

    Such a box can be returned as a view of its stored bytes, without assembling.
    """
    needed = target.num_elements(full_shape)
    if not needed:
        return None
    for part in stored:
        common = part.intersect(target) if part.rank == len(full_shape) else None
        if (
            common is not None
            and common.num_elements(full_shape) == needed
            and part.num_elements(full_shape) == needed
        ):
            return part
    return None


def _covers(parts: list[TensorSlice], target: TensorSlice, full_shape: tuple[int, ...]) -> bool:
    """Exact coverage test, needed only when stored slices overlap (once they were located,
    so the mask is no larger than their bytes in the data files)."""
    hit = np.zeros(target.shape_in(full_shape), dtype=bool)
    for part in parts:
        hit[part.relative_to(target, full_shape)] = True
    return bool(hit.all())
