"""The ``many`` workload's table and targets (issue 28): cost per value, across sizes.

Its sizes run as workloads ``many-<layers>`` of one run; this module puts them side by side:
microseconds per value for every path at every size, each path's cost per value over the
numpy path's, and how the time grows from the smallest size to the largest (linear: 4× the
values in at most 4.6× the time).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.measure import median
from bench.report import CaseResult, RunResult, Table, TargetRow

__all__ = ["many_tables", "many_targets"]

NUMPY, TORCH, JAX = "tp-many-numpy", "tp-many-torch", "tp-many-jax"
PATHS = (NUMPY, TORCH, JAX)
PEERS = (
    ("torch-many", 5.0, "torch.load + load_state_dict"),
    ("dcp-many", 10.0, "torch.distributed.checkpoint"),
)
WITHIN_NUMPY = 1.5  # torch and JAX per-value cost ≤ 1.5× the numpy path's
LINEAR_SLACK = 1.15  # 4× the values in ≤ 4.6× the time
OPS = (("save_s", "save"), ("restore_s", "restore"))


@dataclass(frozen=True, slots=True)
class _Size:
    workload: str
    values: int


def _sizes(run: RunResult) -> list[_Size]:
    found = [
        _Size(w, int(info["tensors"]))  # type: ignore[call-overload]
        for w, info in run.workloads.items()
        if info.get("kind") == "many"
    ]
    return sorted(found, key=lambda s: s.values)


def _locations(run: RunResult, sizes: list[_Size]) -> list[str]:
    locs: list[str] = []
    for s in sizes:
        locs += [loc for loc in run.cases.get(s.workload, {}) if loc not in locs]
    return locs


def _case(run: RunResult, size: _Size, loc: str, key: str) -> CaseResult | None:
    c = run.cases.get(size.workload, {}).get(loc, {}).get(key)
    return c if c is not None and c.ok else None


def _med(run: RunResult, size: _Size, loc: str, key: str, attr: str) -> float | None:
    """Median seconds of ``attr`` (save_s or restore_s) of a case that ran cleanly."""
    c = _case(run, size, loc, key)
    return median(getattr(c, attr)) if c else None


def _per_value(run: RunResult, size: _Size, loc: str, key: str, attr: str) -> float | None:
    """Median microseconds per value."""
    m = _med(run, size, loc, key, attr)
    return m / size.values * 1e6 if m else None


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def _x(r: float | None) -> str:
    return f"{r:.2f}×" if r is not None else "—"


def _us(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _growth(run: RunResult, sizes: list[_Size], loc: str, key: str, attr: str) -> float | None:
    """Time at the largest size over time at the smallest."""
    if len(sizes) < 2:
        return None
    return _ratio(_med(run, sizes[-1], loc, key, attr), _med(run, sizes[0], loc, key, attr))


def many_tables(run: RunResult) -> list[Table]:
    """One table per location: every path's µs per value at every size, and the ratios."""
    sizes = _sizes(run)
    if not sizes:
        return []
    factor = sizes[-1].values / sizes[0].values
    tables = []
    for loc in _locations(run, sizes):
        keys: dict[str, CaseResult] = {}
        for s in sizes:
            for key, c in run.cases.get(s.workload, {}).get(loc, {}).items():
                keys.setdefault(key, c)
        headers = ["path"]
        for s in sizes:
            headers += [f"save µs ({s.values:,})", f"restore µs ({s.values:,})"]
        headers += ["save ÷ numpy", "restore ÷ numpy"]
        if len(sizes) > 1:
            headers += [f"save, {factor:g}× values", f"restore, {factor:g}× values"]
        headers += ["runs", "note"]
        rows = []
        for key, first in keys.items():
            row = [first.label]
            notes = []
            for s in sizes:
                case = run.cases.get(s.workload, {}).get(loc, {}).get(key)
                if case is not None and case.status != "ok":
                    notes.append(f"{s.values:,}: {case.status.upper()}: {case.detail}")
                elif case is not None and case.detail:
                    notes.append(case.detail)
                row += [_us(_per_value(run, s, loc, key, a)) for a, _ in OPS]
            for attr, _ in OPS:
                row.append(
                    " / ".join(
                        _x(
                            _ratio(
                                _per_value(run, s, loc, key, attr),
                                _per_value(run, s, loc, NUMPY, attr),
                            )
                        )
                        for s in sizes
                    )
                )
            if len(sizes) > 1:
                row += [_x(_growth(run, sizes, loc, key, attr)) for attr, _ in OPS]
            runs = [_case(run, s, loc, key) for s in sizes]
            row.append("/".join(str(len(c.save_s)) if c else "0" for c in runs))
            if key in {p for p, _, _ in PEERS}:
                speedups = [
                    " / ".join(
                        _x(_ratio(_med(run, s, loc, key, attr), _med(run, s, loc, TORCH, attr)))
                        for s in sizes
                    )
                    for attr, _ in OPS
                ]
                notes.insert(
                    0, f"time ÷ trackpoint torch: save {speedups[0]}, restore {speedups[1]}"
                )
            row.append("; ".join(dict.fromkeys(notes)))
            rows.append(tuple(row))
        sizes_text = " / ".join(f"{s.values:,}" for s in sizes)
        tables.append(
            Table(
                f"many: Linear(32, 32) layers + AdamW state: µs per value at {sizes_text} values "
                f"(÷ columns in that order; 'N× values': time at {sizes[-1].values:,} ÷ time at "
                f"{sizes[0].values:,}) — {loc}",
                tuple(headers),
                tuple(rows),
            )
        )
    return tables


def many_targets(run: RunResult) -> list[TargetRow]:
    """Issue 28's targets on the many workload, each judged on its worst size."""
    sizes = _sizes(run)
    out: list[TargetRow] = []
    if not sizes:
        return out
    factor = sizes[-1].values / sizes[0].values
    at = " / ".join(f"{s.values:,}" for s in sizes)

    def row(
        tid: str,
        target: str,
        scope: str,
        per_size: list[float | None],
        limit: float,
        higher_is_better: bool,
        note: str = "",
    ) -> None:
        req = f"{'≥' if higher_is_better else '≤'} {limit:.2f}×"
        if not per_size or any(v is None for v in per_size):
            out.append(TargetRow(tid, target, scope, "not measured", req, "N/A"))
            return
        values = [v for v in per_size if v is not None]
        worst = min(values) if higher_is_better else max(values)
        ok = worst >= limit if higher_is_better else worst <= limit
        measured = f"{worst:.2f}×" + (
            f" ({' / '.join(_x(v) for v in values)} {note})"
            if len(values) > 1
            else f" {note}".rstrip()
        )
        out.append(TargetRow(tid, target, scope, measured, req, "PASS" if ok else "MISS"))

    for loc in _locations(run, sizes):
        scope = f"many, {loc}"
        for key, name in ((TORCH, "torch module + AdamW"), (JAX, "JAX pytree")):
            for attr, what in OPS:
                row(
                    f"many-{key}-{what}-vs-numpy/{loc}",
                    f"{name}: {what} µs/value ≤ {WITHIN_NUMPY}× the numpy path's",
                    scope,
                    [
                        _ratio(
                            _per_value(run, s, loc, key, attr), _per_value(run, s, loc, NUMPY, attr)
                        )
                        for s in sizes
                    ],
                    WITHIN_NUMPY,
                    False,
                    f"at {at} values",
                )
        if len(sizes) > 1:
            for key in PATHS:
                label = next(
                    (c.label for s in sizes if (c := run.cases[s.workload].get(loc, {}).get(key))),
                    key,
                )
                for attr, what in OPS:
                    row(
                        f"many-{key}-{what}-linear/{loc}",
                        f"{label}: {what} time for {factor:g}× the values "
                        f"≤ {LINEAR_SLACK * factor:.2f}×",
                        scope,
                        [_growth(run, sizes, loc, key, attr)],
                        LINEAR_SLACK * factor,
                        False,
                        f"({sizes[0].values:,} → {sizes[-1].values:,} values)",
                    )
        for peer, limit, name in PEERS:
            row(
                f"many-restore-vs-{peer}/{loc}",
                f"torch case: restore ≥ {limit:g}× {name}",
                scope,
                [
                    _ratio(
                        _med(run, s, loc, peer, "restore_s"), _med(run, s, loc, TORCH, "restore_s")
                    )
                    for s in sizes
                ],
                limit,
                True,
                f"at {at} values",
            )
    return out
