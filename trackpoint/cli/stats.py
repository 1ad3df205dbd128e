"""``trackpoint stats PATH``: per tensor NaN/Inf counts and min/max/mean/std/L2 norm, per module
parameter counts and bytes.

Tensors are streamed: each is read as a zero-copy view of the mapped data file (a partitioned
one stored slice at a time) and reduced in chunks of :data:`CHUNK_ELEMENTS`, so memory stays
bounded by one chunk in float64, whatever the checkpoint's size. Figures are over the finite
elements; NaN and ±Inf are counted apart. Complex values are reduced by magnitude.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from rich.console import Console

from trackpoint.bundle import BundleReader, TensorSlice
from trackpoint.cli.names import module_of
from trackpoint.cli.output import Column, Output, format_number
from trackpoint.cli.progress import human_bytes
from trackpoint.errors import DataLossError, InvalidArgumentError
from trackpoint.management.paths import resolve_location

__all__ = [
    "CHUNK_ELEMENTS",
    "ModuleTotal",
    "TensorStats",
    "add_parser",
    "array_chunks",
    "check_slices_cover",
    "checkpoint_stats",
    "cmd_stats",
    "module_totals",
    "tensor_pieces",
    "tensor_stats",
]

CHUNK_ELEMENTS = 1 << 20
"""Elements reduced at a time: 8 MiB of float64 per chunk."""


@dataclass(frozen=True, slots=True)
class TensorStats:
    """The figures of one tensor (``None``: no finite element to take them from)."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    bytes: int
    """Stored bytes."""
    count: int
    """Elements."""
    nan: int
    inf: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    """Population standard deviation."""
    norm: float | None
    """L2 norm."""

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.inf == 0

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.key, "dtype": self.dtype, "shape": list(self.shape),
            "bytes": self.bytes, "count": self.count, "nan": self.nan, "inf": self.inf,
            "min": self.min, "max": self.max, "mean": self.mean, "std": self.std,
            "norm": self.norm,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class ModuleTotal:
    """Parameter count and bytes of the values one module (object path) owns."""

    module: str
    tensors: int
    parameters: int
    bytes: int


def array_chunks(array: np.ndarray, limit: int = CHUNK_ELEMENTS) -> Iterator[np.ndarray]:
    """Sub-arrays of ``array`` of at most ``limit`` elements (or one row), views where possible.

    Arrays of equal shape are cut identically, so two can be walked in lockstep.
    """
    if array.ndim == 0:
        yield array.reshape(1)
    elif array.size <= limit:
        yield array
    elif array.ndim == 1:
        for start in range(0, array.shape[0], limit):
            yield array[start : start + limit]
    else:
        row = array[0].size
        if row == 0:
            return
        if row > limit:
            for index in range(array.shape[0]):
                yield from array_chunks(array[index], limit)
            return
        step = max(1, limit // row)
        for start in range(0, array.shape[0], step):
            yield array[start : start + step]


def check_slices_cover(reader: BundleReader, key: str) -> None:
    """Refuse a partitioned ``key`` whose stored slices do not hold exactly the elements of its
    declared shape (index arithmetic only: nothing is read or allocated).

    Commands that stream slices one by one (``stats``, ``verify``) never assemble the tensor,
    so without this an index declaring a huge tensor over one small slice would pass.

    Raises:
        DataLossError: the slices hold more or fewer elements than the shape, or have the
            wrong rank.
    """
    slices = reader.slices(key)
    if not slices:
        return
    full = tuple(reader.shape(key))
    try:
        stored = sum(part.num_elements(full) for part in slices)
    except InvalidArgumentError as exc:
        raise DataLossError(
            f"A stored slice of key '{key}' in {reader.prefix} does not fit its shape "
            f"{list(full)} ({exc}): the index is damaged",
            path=reader.prefix,
            key=key,
        ) from exc
    if stored != math.prod(full):
        raise DataLossError(
            f"The stored slices of key '{key}' in {reader.prefix} hold {stored:,} elements, but "
            f"its index entry declares shape {list(full)} ({math.prod(full):,} elements): the "
            "index is damaged",
            path=reader.prefix,
            key=key,
        )


def tensor_pieces(
    reader: BundleReader, key: str
) -> Iterator[tuple[TensorSlice | None, np.ndarray]]:
    """The stored parts of ``key`` as read-only views of the mapped file: ``(None, whole
    tensor)``, or ``(box, values)`` for each stored slice of a partitioned one (after
    :func:`check_slices_cover`)."""
    slices = reader.slices(key)
    if not slices:
        yield None, reader.read(key, copy=False)
        return
    check_slices_cover(reader, key)
    for stored in slices:
        yield stored, reader.read_slice(key, stored, copy=False)


class _Accumulator:
    """Count, mean and M2 merged chunk by chunk (Chan et al.), plus min, max and sum of squares."""

    def __init__(self) -> None:
        self.count = self.nan = self.inf = self.finite = 0
        self.mean = self.m2 = self.squares = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, chunk: np.ndarray) -> None:
        self.count += chunk.size
        if chunk.dtype.kind == "c":
            self.nan += int(np.count_nonzero(np.isnan(chunk)))
            self.inf += int(np.count_nonzero(np.isinf(chunk)))
            values = np.abs(chunk.astype(np.complex128, copy=False)).ravel()
        else:
            values = np.asarray(chunk, dtype=np.float64).ravel()
            if chunk.dtype.kind == "f" or chunk.dtype.kind == "V":
                nan = int(np.count_nonzero(np.isnan(values)))
                inf = int(np.count_nonzero(np.isinf(values)))
                self.nan, self.inf = self.nan + nan, self.inf + inf
        finite = values[np.isfinite(values)] if self.nan or self.inf else values
        n = finite.size
        if not n:
            return
        mean = float(finite.mean())
        m2 = float(np.dot(finite - mean, finite - mean))
        total = self.finite + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.finite * n / total
        self.finite = total
        self.squares += float(np.dot(finite, finite))
        self.min = min(self.min, float(finite.min()))
        self.max = max(self.max, float(finite.max()))


def tensor_stats(
    reader: BundleReader, key: str, *, chunk_elements: int = CHUNK_ELEMENTS
) -> TensorStats | None:
    """The figures of tensor ``key``, streamed in chunks; None for strings.

    Raises:
        DataLossError: the tensor's bytes are damaged (its checksum is verified on read).
    """
    dtype = reader.dtype(key)
    if dtype == np.dtype(object):
        return None
    acc = _Accumulator()
    for _, piece in tensor_pieces(reader, key):
        for chunk in array_chunks(piece, chunk_elements):
            acc.add(chunk)
    some = acc.finite > 0
    return TensorStats(
        key=key,
        dtype=str(dtype),
        shape=tuple(reader.shape(key)),
        bytes=reader.stored_bytes(key),
        count=acc.count,
        nan=acc.nan,
        inf=acc.inf,
        min=acc.min if some else None,
        max=acc.max if some else None,
        mean=acc.mean if some else None,
        std=math.sqrt(acc.m2 / acc.finite) if some else None,
        norm=math.sqrt(acc.squares) if some else None,
    )


def checkpoint_stats(
    reader: BundleReader,
    *,
    progress: Callable[[int, int], None] | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> tuple[list[TensorStats], list[str]]:
    """Figures of every numeric tensor in key order, and the keys of the others (strings)."""
    keys = reader.keys()
    sizes = [reader.stored_bytes(key) for key in keys]
    total, done = sum(sizes), 0
    figures, skipped = [], []
    for key, size in zip(keys, sizes):
        stats = tensor_stats(reader, key, chunk_elements=chunk_elements)
        if stats is None:
            skipped.append(key)
        else:
            figures.append(stats)
        done += size
        if progress is not None:
            progress(done, total)
    return figures, skipped


def module_totals(figures: list[TensorStats], depth: int | None = None) -> list[ModuleTotal]:
    """Per-module sums, in order of first appearance (key order groups modules together)."""
    totals: dict[str, list[int]] = {}
    for stats in figures:
        entry = totals.setdefault(module_of(stats.key, depth), [0, 0, 0])
        entry[0] += 1
        entry[1] += stats.count
        entry[2] += stats.bytes
    return [ModuleTotal(m, *values) for m, values in totals.items()]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``stats`` to ``trackpoint``'s subcommands."""
    p = subparsers.add_parser(
        "stats",
        help="per tensor NaN/Inf counts, min/max/mean/std/norm; per module parameters, bytes",
        description="Stream every tensor (bounded memory) and report its figures over the "
        "finite elements, NaN and Inf counted apart; then parameter counts and bytes per "
        "module. For sizes of files and shards see `trackpoint info`.",
    )
    p.add_argument("path", help="checkpoint prefix, one of its files, or a directory")
    p.add_argument(
        "--depth",
        type=int,
        default=None,
        metavar="N",
        help="group modules by the first N names of their path (default: full path)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list: key, dtype, shape, bytes, count, nan, inf, min, max, "
        "mean, std, norm",
    )
    p.set_defaults(func=cmd_stats)


def cmd_stats(args: argparse.Namespace, console: Console) -> int:
    """Run ``trackpoint stats``."""
    out = Output(console, json=args.json)
    location = resolve_location(args.path)
    prefix = location.prefix
    with BundleReader(prefix, storage=location.storage) as reader, out.progress("reading") as bar:
        figures, skipped = checkpoint_stats(reader, progress=bar.update)
    if out.json_mode:
        out.json([stats.to_json() for stats in figures])
        return 0
    columns = [
        Column("key", fold=True), Column("dtype"), Column("shape"),
        *(Column(h, "right") for h in ("nan", "inf", "min", "max", "mean", "std", "norm")),
    ]  # fmt: skip
    rows = [
        [s.key, s.dtype, "[" + ", ".join(map(str, s.shape)) + "]", str(s.nan), str(s.inf),
         *(format_number(v) for v in (s.min, s.max, s.mean, s.std, s.norm))]
        for s in figures
    ]  # fmt: skip
    styles = [None if s.finite else "bold red" for s in figures]
    out.table(columns, rows, title=f"tensors of {prefix}", styles=styles)
    totals = module_totals(figures, args.depth)
    out.table(
        [Column("module", fold=True), Column("tensors", "right"),
         Column("parameters", "right"), Column("bytes", "right")],
        [[t.module, str(t.tensors), f"{t.parameters:,}", f"{t.bytes:,}"] for t in totals],
        title="modules",
    )  # fmt: skip
    bad = [s for s in figures if not s.finite]
    parameters = sum(s.count for s in figures)
    note = f", {len(skipped)} non-numeric skipped" if skipped else ""
    out.line(
        f"{len(figures)} tensors, {parameters:,} parameters, "
        f"{human_bytes(sum(s.bytes for s in figures))}{note}"
    )
    if bad:
        out.line(
            f"[bold red]{len(bad)} tensor(s) hold NaN or Inf[/]: "
            f"{sum(s.nan for s in bad):,} NaN, {sum(s.inf for s in bad):,} Inf"
        )
    return 0
