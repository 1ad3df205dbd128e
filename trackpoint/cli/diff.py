"""``trackpoint diff A B``: which keys were added, removed or changed, by how much, and where.

Keys are compared by checkpoint key. A tensor present in both is *changed* when its dtype,
shape or any element differs; numeric ones are streamed in lockstep chunks (bounded memory, as
``trackpoint stats``) and get the largest absolute difference and the largest relative one,
``|a - b| / max(|a|, |b|)`` (between 0 and 2, symmetric), over elements finite on both sides;
NaN against NaN counts as equal. Per-module totals say where the changes are.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from rich.console import Console

from trackpoint.bundle import BundleReader
from trackpoint.cli.names import module_of
from trackpoint.cli.output import Column, Output, format_number
from trackpoint.cli.stats import array_chunks, tensor_pieces
from trackpoint.management.paths import resolve_location

__all__ = ["CheckpointDiff", "TensorDiff", "add_parser", "cmd_diff", "diff_checkpoints"]


@dataclass(frozen=True, slots=True)
class TensorDiff:
    """How one key present in both checkpoints differs."""

    key: str
    reason: str
    """``"dtype"``, ``"shape"`` or ``"values"``."""
    dtype: str
    """A's dtype (``"string"`` for strings)."""
    shape: tuple[int, ...]
    """A's shape."""
    b_dtype: str
    b_shape: tuple[int, ...]
    elements: int | None = None
    """Elements compared (``None`` when dtype or shape changed)."""
    mismatched: int | None = None
    """Elements that differ."""
    max_abs: float | None = None
    """Largest ``|a - b|`` over elements finite on both sides (``None``: no such element
    differs, e.g. only NaN/Inf changed)."""
    max_rel: float | None = None

    @property
    def described(self) -> tuple[str, str]:
        """(dtype, shape) for people: ``float32 -> float16`` where they changed."""
        dtype = self.dtype if self.dtype == self.b_dtype else f"{self.dtype} -> {self.b_dtype}"
        shape = _shape(self.shape)
        if self.shape != self.b_shape:
            shape = f"{shape} -> {_shape(self.b_shape)}"
        return dtype, shape

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.key, "reason": self.reason, "dtype": self.dtype,
            "shape": list(self.shape), "b_dtype": self.b_dtype, "b_shape": list(self.b_shape),
            "elements": self.elements, "mismatched": self.mismatched,
            "max_abs": self.max_abs, "max_rel": self.max_rel,
        }  # fmt: skip


@dataclass(slots=True)
class CheckpointDiff:
    """The result of :func:`diff_checkpoints`."""

    a: str
    b: str
    added: list[str] = field(default_factory=list)
    """Keys only in B."""
    removed: list[str] = field(default_factory=list)
    """Keys only in A."""
    changed: list[TensorDiff] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def modules(self, depth: int | None = None) -> list[dict[str, str | int]]:
        """Per module: how many keys were added, removed, changed and left unchanged."""
        totals: dict[str, dict[str, int]] = {}
        groups = (
            ("added", self.added),
            ("removed", self.removed),
            ("changed", [d.key for d in self.changed]),
            ("unchanged", self.unchanged),
        )
        for what, keys in groups:
            for key in keys:
                entry = totals.setdefault(
                    module_of(key, depth),
                    {"added": 0, "removed": 0, "changed": 0, "unchanged": 0},
                )
                entry[what] += 1
        return [{"module": m, **counts} for m, counts in sorted(totals.items())]


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _dtype_name(dtype: np.dtype) -> str:
    return "string" if dtype == np.dtype(object) else str(dtype)


def _compare(a: np.ndarray, b: np.ndarray, acc: list[float]) -> None:
    """Fold one pair of equal-shape chunks into ``acc`` = [mismatched, finite mismatched,
    max_abs, max_rel]."""
    if a.dtype.kind in "iub":
        differ = a != b
        fa = np.asarray(a[differ], dtype=np.float64)
        fb = np.asarray(b[differ], dtype=np.float64)
    else:
        kind = np.complex128 if a.dtype.kind == "c" else np.float64
        xa, xb = np.asarray(a, dtype=kind), np.asarray(b, dtype=kind)
        differ = (xa != xb) & ~(np.isnan(xa) & np.isnan(xb))
        fa, fb = xa[differ], xb[differ]
    count = int(np.count_nonzero(differ))
    if not count:
        return
    acc[0] += count
    both = np.isfinite(fa) & np.isfinite(fb)
    fa, fb = fa[both], fb[both]
    if fa.size:
        delta = np.abs(fa - fb)
        scale = np.maximum(np.abs(fa), np.abs(fb))
        acc[1] += fa.size
        acc[2] = max(acc[2], float(delta.max()))
        acc[3] = max(acc[3], float((delta / scale).max()))  # scale > 0 where they differ


def _diff_tensor(a: BundleReader, b: BundleReader, key: str, chunk: int) -> TensorDiff | None:
    dtype_a, dtype_b = a.dtype(key), b.dtype(key)
    shape_a, shape_b = tuple(a.shape(key)), tuple(b.shape(key))
    names = (_dtype_name(dtype_a), shape_a, _dtype_name(dtype_b), shape_b)
    if dtype_a != dtype_b:
        return TensorDiff(key, "dtype", *names)
    if shape_a != shape_b:
        return TensorDiff(key, "shape", *names)
    if dtype_a == np.dtype(object):  # strings: small, compared whole
        same = np.array_equal(a.read(key, copy=False), b.read(key, copy=False))
        return None if same else TensorDiff(key, "values", *names)
    acc: list[float] = [0, 0, 0.0, 0.0]
    for box, piece_a in tensor_pieces(a, key):
        piece_b = b.read(key, copy=False) if box is None else b.read_slice(key, box, copy=False)
        for chunk_a, chunk_b in zip(array_chunks(piece_a, chunk), array_chunks(piece_b, chunk)):
            _compare(chunk_a, chunk_b, acc)
    if not acc[0]:
        return None
    return TensorDiff(
        key, "values", *names,
        elements=int(np.prod(shape_a, dtype=np.int64)), mismatched=int(acc[0]),
        max_abs=acc[2] if acc[1] else None, max_rel=acc[3] if acc[1] else None,
    )  # fmt: skip


def diff_checkpoints(
    a: BundleReader,
    b: BundleReader,
    *,
    progress: Callable[[int, int], None] | None = None,
    chunk_elements: int = 1 << 20,
) -> CheckpointDiff:
    """Compare every key of ``a`` and ``b`` (checksums verified as values are read)."""
    keys_a, keys_b = set(a.keys()), set(b.keys())
    result = CheckpointDiff(a.prefix, b.prefix)
    result.added = sorted(keys_b - keys_a)
    result.removed = sorted(keys_a - keys_b)
    common = [key for key in a.keys() if key in keys_b]
    sizes = {key: a.stored_bytes(key) + b.stored_bytes(key) for key in common}
    total, done = sum(sizes.values()), 0
    for key in common:
        found = _diff_tensor(a, b, key, chunk_elements)
        if found is None:
            result.unchanged.append(key)
        else:
            result.changed.append(found)
        done += sizes[key]
        if progress is not None:
            progress(done, total)
    return result


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``diff`` to ``trackpoint``'s subcommands."""
    p = subparsers.add_parser(
        "diff",
        help="keys added, removed and changed between two checkpoints, with max differences",
        description="Compare checkpoint A with B key by key. Exit status 0, or with "
        "--exit-code 1 when they differ (as `git diff --exit-code`).",
    )
    p.add_argument("a", help="checkpoint A: prefix, one of its files, or a directory")
    p.add_argument("b", help="checkpoint B")
    p.add_argument(
        "--depth",
        type=int,
        default=None,
        metavar="N",
        help="group modules by the first N names of their path",
    )
    p.add_argument("--exit-code", action="store_true", help="exit with 1 if A and B differ")
    p.add_argument(
        "--json",
        action="store_true",
        help="print JSON: added, removed (keys), changed (key and figures), modules",
    )
    p.set_defaults(func=cmd_diff)


def _render(out: Output, diff: CheckpointDiff, depth: int | None) -> None:
    for sign, keys in (("+", diff.added), ("-", diff.removed)):
        if out.rich and keys:
            out.table(
                [Column("key", fold=True)],
                [[k] for k in keys],
                title="added (only in B)" if sign == "+" else "removed (only in A)",
                styles=["green" if sign == "+" else "red"] * len(keys),
            )
        elif keys:
            for key in keys:
                out.text(f"{sign} {key}")
    if diff.changed:
        rows = [
            [d.key, d.reason, *d.described,
             "-" if d.mismatched is None else f"{d.mismatched:,}/{d.elements:,}",
             format_number(d.max_abs), format_number(d.max_rel)]
            for d in diff.changed
        ]  # fmt: skip
        columns = [
            Column("key", fold=True),
            Column("changed"),
            Column("dtype"),
            Column("shape"),
            Column("elements differ", "right"),
            Column("max abs", "right"),
            Column("max rel", "right"),
        ]
        if out.rich:
            out.table(columns, rows, title="changed", styles=["yellow"] * len(rows))
        else:  # one self-describing line per key, for grep
            for key, reason, dtype, shape, differ, max_abs, max_rel in rows:
                out.text(
                    f"~ {key}  {reason}  {dtype} {shape}  differ={differ}  "
                    f"max_abs={max_abs}  max_rel={max_rel}"
                )
    modules = [m for m in diff.modules(depth) if m["added"] or m["removed"] or m["changed"]]
    if modules:
        out.table(
            [Column("module", fold=True),
             *(Column(h, "right") for h in ("added", "removed", "changed", "unchanged"))],
            [[str(m["module"]), *(str(m[h]) for h in ("added", "removed", "changed",
                                                       "unchanged"))] for m in modules],
            title="modules with changes",
        )  # fmt: skip
    summary = (
        f"{len(diff.added)} added, {len(diff.removed)} removed, {len(diff.changed)} "
        f"changed, {len(diff.unchanged)} unchanged"
    )
    out.line(f"[bold]identical[/]: {summary}" if diff.identical else summary)


def cmd_diff(args: argparse.Namespace, console: Console) -> int:
    """Run ``trackpoint diff``."""
    out = Output(console, json=args.json)
    at_a, at_b = resolve_location(args.a), resolve_location(args.b)
    with BundleReader(at_a.prefix, storage=at_a.storage) as a, \
            BundleReader(at_b.prefix, storage=at_b.storage) as b:
        with out.progress("comparing") as bar:
            diff = diff_checkpoints(a, b, progress=bar.update)
    if out.json_mode:
        out.json({
            "a": diff.a, "b": diff.b, "identical": diff.identical,
            "added": diff.added, "removed": diff.removed,
            "changed": [d.to_json() for d in diff.changed],
            "unchanged": len(diff.unchanged), "modules": diff.modules(args.depth),
        })  # fmt: skip
    else:
        _render(out, diff, args.depth)
    return 1 if args.exit_code and not diff.identical else 0
