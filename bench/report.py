"""Results of a run, the targets they are checked against, and their rendering.

Tables are built once as :class:`Table` (plain strings) and rendered twice: with rich for the
terminal and as Markdown for docs/performance.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from bench.measure import median

__all__ = [
    "AsyncResult",
    "CaseResult",
    "RssResult",
    "RunResult",
    "Table",
    "TargetRow",
    "build_tables",
    "evaluate_targets",
    "primary_trackpoint",
    "render_markdown",
    "render_rich",
]

GB = 1e9
TF_KEYS = ("tf", "tf-raw")


@dataclass
class CaseResult:
    """One system on one workload at one location: timings of every repetition."""

    system: str
    label: str
    group: str
    status: str = "ok"  # ok | unavailable | skipped | error | mismatch
    detail: str = ""
    save_s: list[float] = field(default_factory=list)
    restore_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0  # harness time spent on this case, setup and verification included

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.save_s) and bool(self.restore_s)


@dataclass
class AsyncResult:
    """trackpoint's async save against copying the state, interleaved repetitions."""

    block_s: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)
    memcpy_new_s: list[float] = field(default_factory=list)
    memcpy_pre_s: list[float] = field(default_factory=list)
    status: str = "ok"
    detail: str = ""


@dataclass
class RssResult:
    """Peak memory of one save and one restore, each in a fresh process (bytes over state)."""

    label: str = ""
    save_extra: int | None = None
    save_anon_extra: int | None = None
    restore_extra: int | None = None
    restore_anon_extra: int | None = None
    detail: str = ""


@dataclass
class RunResult:
    """Everything one ``bench/run.py`` invocation measured."""

    quick: bool
    reps: int
    workloads: dict[str, dict[str, object]]  # key -> {title, nbytes, tensors, has_bf16, pid}
    locations: dict[str, str]  # name -> directory
    cases: dict[str, dict[str, dict[str, CaseResult]]] = field(default_factory=dict)
    async_: dict[str, dict[str, AsyncResult]] = field(default_factory=dict)
    rss: dict[str, dict[str, RssResult]] = field(default_factory=dict)
    rss_location: str | None = None
    machine: dict[str, str] = field(default_factory=dict)
    footnotes: list[str] = field(default_factory=list)
    cold: bool = False
    duration_s: float = 0.0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        """Inverse of ``dataclasses.asdict``: a run saved with ``--json``, for re-rendering."""
        nested = ("cases", "async_", "rss")
        run = cls(**{k: v for k, v in d.items() if k not in nested})
        run.cases = {w: {loc: {k: CaseResult(**c) for k, c in by_sys.items()}
                         for loc, by_sys in by_loc.items()} for w, by_loc in d["cases"].items()}
        run.async_ = {w: {loc: AsyncResult(**a) for loc, a in by_loc.items()}
                      for w, by_loc in d["async_"].items()}
        run.rss = {w: {k: RssResult(**r) for k, r in by_sys.items()}
                   for w, by_sys in d["rss"].items()}
        return run


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True, slots=True)
class TargetRow:
    """One target checked on one workload/location."""

    id: str
    target: str
    scope: str
    measured: str
    required: str
    verdict: str  # PASS | MISS | N/A


# -- numbers ----------------------------------------------------------------------------------
def _gbps(nbytes: int, seconds: list[float]) -> str:
    m = median(seconds)
    if not m:
        return "—"
    rate = nbytes / GB / m
    return f"{rate:.2f}" if rate >= 0.1 else f"{rate:.2g}"


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def _fmt_ratio(r: float | None) -> str:
    return f"{r:.2f}×" if r is not None else "—"


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _mib(n: int | None, state: int) -> str:
    if n is None:
        return "—"
    return f"{n / 2**20:+.0f} MiB ({100 * n / state:+.0f}%)"


def primary_trackpoint(cases: dict[str, CaseResult]) -> CaseResult | None:
    """The trackpoint row targets are judged on: Checkpoint-level if it ran, else bundle."""
    for key in ("tp", "tp-bundle"):
        c = cases.get(key)
        if c is not None and c.ok:
            return c
    return None


# -- tables -----------------------------------------------------------------------------------
def build_tables(run: RunResult) -> list[Table]:
    tables = []
    for w, info in run.workloads.items():
        if info.get("kind", "tensors") != "tensors":
            continue  # bench/many_report.py tabulates the many workload's sizes side by side
        nbytes = int(info["nbytes"])  # type: ignore[call-overload]
        for loc, cases in run.cases.get(w, {}).items():
            tp = primary_trackpoint(cases)
            rows = []
            for c in cases.values():
                if c.status in ("unavailable", "skipped"):
                    rows.append((c.label, "", "", "", "", "", c.detail))
                    continue
                save_r = _ratio(median(c.save_s), median(tp.save_s)) if tp else None
                rest_r = _ratio(median(c.restore_s), median(tp.restore_s)) if tp else None
                mark = "(this row)" if c is tp else ""
                note = (mark or c.detail) if c.status == "ok" else f"{c.status.upper()}: {c.detail}"
                rows.append((
                    c.label,
                    _gbps(nbytes, c.save_s),
                    _gbps(nbytes, c.restore_s),
                    _fmt_ratio(save_r) if c is not tp else "1.00×",
                    _fmt_ratio(rest_r) if c is not tp else "1.00×",
                    f"{len(c.save_s)}",
                    note,
                ))
            title = f"{w}: {info['title']} ({_size(nbytes)}) — {loc}"
            headers = (
                "system", "save GB/s", "restore GB/s", "tp ÷ peer save", "tp ÷ peer restore",
                "runs", "note",
            )
            tables.append(Table(title, headers, tuple(rows)))
        rss = run.rss.get(w)
        if rss:
            rows = []
            for key, r in rss.items():
                rows.append((
                    r.label or key,
                    _mib(r.save_extra, nbytes),
                    _mib(r.save_anon_extra, nbytes),
                    _mib(r.restore_extra, nbytes),
                    _mib(r.restore_anon_extra, nbytes),
                    r.detail,
                ))
            tables.append(Table(
                f"{w}: peak RSS over the state, fresh process per case "
                f"({run.rss_location})",
                ("system", "save VmHWM", "save anon (sampled)", "restore VmHWM",
                 "restore anon (sampled)", "note"),
                tuple(rows),
            ))
    rows = []
    for w, by_loc in run.async_.items():
        for loc, a in by_loc.items():
            sync = primary_trackpoint(run.cases[w][loc])
            blk, sync_s = median(a.block_s), median(sync.save_s) if sync else None
            if a.status != "ok":
                rows.append((w, loc, "", "", "", "", "", f"{a.status.upper()}: {a.detail}"))
                continue
            rows.append((
                w, loc,
                _fmt_ratio(_ratio(blk, median(a.memcpy_new_s))),
                _fmt_ratio(_ratio(blk, median(a.memcpy_pre_s))),
                f"{100 * blk / sync_s:.1f}%" if blk and sync_s else "—",
                _fmt_ratio(_ratio(median(a.total_s), sync_s)),
                str(len(a.block_s)),
                "",
            ))
    if rows:
        tables.append(Table(
            "trackpoint async save: time until write() returns",
            ("workload", "where", "÷ memcpy (new buffers)", "÷ memcpy (preallocated)",
             "÷ sync save", "async total ÷ sync save", "runs", "note"),
            tuple(rows),
        ))
    return tables


# -- targets ----------------------------------------------------------------------------------
SMALL_WORKLOADS = ("small", "small-dict")
"""Workloads judged on per-value cost rather than bandwidth."""


def _best(cases: dict[str, CaseResult], keys: tuple[str, ...], attr: str) -> CaseResult | None:
    """The fastest ok row among ``keys`` by median of ``attr`` (save_s or restore_s)."""
    found = [cases[k] for k in keys if k in cases and cases[k].ok]
    return min(found, key=lambda c: median(getattr(c, attr)) or 0.0, default=None)


def evaluate_targets(run: RunResult) -> list[TargetRow]:
    out: list[TargetRow] = []

    def check(tid: str, target: str, scope: str, value: float | None, limit: float,
              higher_is_better: bool, fmt: str, note: str = "") -> None:
        req = f"{'≥' if higher_is_better else '≤'} {fmt.format(limit)}"
        if value is None:
            out.append(TargetRow(tid, target, scope, note or "not measured", req, "N/A"))
            return
        ok = value >= limit if higher_is_better else value <= limit
        measured = fmt.format(value) + (f" {note}" if note else "")
        out.append(TargetRow(tid, target, scope, measured, req, "PASS" if ok else "MISS"))

    large = [w for w, info in run.workloads.items()
             if w not in SMALL_WORKLOADS and info.get("kind", "tensors") == "tensors"]
    for w in large:
        for loc, cases in run.cases.get(w, {}).items():
            tp = primary_trackpoint(cases)
            via = "" if tp is None or tp.system == "tp" else " (bundle API)"
            scope = f"{w}, {loc}{via}"
            tps, tpr = (median(tp.save_s), median(tp.restore_s)) if tp else (None, None)
            if loc == "shm":
                tf = _best(cases, TF_KEYS, "save_s")
                check(f"save-vs-tf/{w}/{loc}", "sync save ≥ 1.5× TensorFlow", scope,
                      _ratio(median(tf.save_s), tps) if tf else None, 1.5, True, "{:.2f}×",
                      f"(vs {tf.label})" if tf else "")
                st = cases.get("safetensors")
                check(f"save-vs-safetensors/{w}/{loc}", "sync save ≥ 1.0× safetensors", scope,
                      _ratio(median(st.save_s), tps) if st and st.ok else None, 1.0, True,
                      "{:.2f}×")
                check(f"restore-vs-safetensors/{w}/{loc}", "restore ≥ 1.0× safetensors", scope,
                      _ratio(median(st.restore_s), tpr) if st and st.ok else None, 1.0, True,
                      "{:.2f}×")
            if loc == "disk":
                raw = cases.get("raw")
                check(f"save-vs-raw/{w}/{loc}", "sync save within 10% of raw copy", scope,
                      _ratio(median(raw.save_s), tps) if raw and raw.ok else None, 0.9, True,
                      "{:.2f}×")
            tf = _best(cases, TF_KEYS, "restore_s")
            check(f"restore-vs-tf/{w}/{loc}", "restore ≥ 2× TensorFlow", scope,
                  _ratio(median(tf.restore_s), tpr) if tf else None, 2.0, True, "{:.2f}×",
                  f"(vs {tf.label})" if tf else "")
            a = run.async_.get(w, {}).get(loc)
            blk = median(a.block_s) if a and a.status == "ok" else None
            check(f"async-vs-memcpy/{w}/{loc}", "async blocking ≤ 1.05× memcpy", f"{w}, {loc}",
                  _ratio(blk, median(a.memcpy_new_s)) if a else None, 1.05, False, "{:.2f}×",
                  "" if a and a.status == "ok" else (a.detail if a else "not measured"))
            check(f"async-vs-sync/{w}/{loc}", "async blocking ≤ 10% of sync save",
                  f"{w}, {loc}", _ratio(blk, tps), 0.10, False, "{:.1%}",
                  "" if a and a.status == "ok" else (a.detail if a else "not measured"))
    for loc, cases in run.cases.get("small", {}).items():
        tp = primary_trackpoint(cases)
        st = cases.get("safetensors")
        scope = f"small, {loc}" + ("" if tp is None or tp.system == "tp" else " (bundle API)")
        for attr, what in (("save_s", "save"), ("restore_s", "restore")):
            r = None
            if tp and st and st.ok:
                r = _ratio(median(getattr(st, attr)), median(getattr(tp, attr)))
            check(f"small-{what}-vs-safetensors/{loc}",
                  f"100k small tensors: {what} within 2× safetensors", scope, r, 0.5, True,
                  "{:.2f}×")
    # Issue 19: the object layer costs no more than the bytes (a flat dict with "/" keys).
    for loc, cases in run.cases.get("small-dict", {}).items():
        st = cases.get("safetensors")
        for key, limit, how in (("tp-dict", 1.0, "one Checkpoint, repeated"),
                                ("tp-dict-fresh", 0.67, "a fresh Checkpoint")):
            tp = cases.get(key)
            for attr, what in (("save_s", "save"), ("restore_s", "restore")):
                r = None
                if tp and tp.ok and st and st.ok:
                    r = _ratio(median(getattr(st, attr)), median(getattr(tp, attr)))
                check(f"small-dict-{what}-{key}/{loc}",
                      f"100k values, {how}: {what} ≥ {limit:.2f}× safetensors",
                      f"small-dict, {loc}", r, limit, True, "{:.2f}×")
    for w, rss in run.rss.items():
        if w in SMALL_WORKLOADS:
            continue
        nbytes = int(run.workloads[w]["nbytes"])  # type: ignore[call-overload]
        key = "tp" if "tp" in rss and rss["tp"].save_extra is not None else "tp-bundle"
        r = rss.get(key)
        value = r.save_extra / nbytes if r and r.save_extra is not None else None
        via = "" if key == "tp" else " (bundle API)"
        check(f"rss-save/{w}", "peak RSS during sync save ≤ state + 10%",
              f"{w}, {run.rss_location}{via}", value, 0.10, False, "+{:.1%}")
    return out


# -- rendering --------------------------------------------------------------------------------
def render_rich(console: object, run: RunResult, tables: list[Table],
                targets: list[TargetRow]) -> None:
    from rich.table import Table as RichTable

    for t in tables:
        rt = RichTable(title=t.title, title_justify="left")
        for i, h in enumerate(t.headers):
            rt.add_column(h, justify="left" if i == 0 or h in _TEXT_COLUMNS else "right")
        for row in t.rows:
            rt.add_row(*row)
        console.print(rt)  # type: ignore[attr-defined]
    rt = RichTable(title="Targets (trackpoint ÷ peer; throughput ratios unless noted)",
                   title_justify="left")
    for h in ("target", "scope", "measured", "required", "verdict"):
        rt.add_column(h)
    style = {"PASS": "[green]PASS[/]", "MISS": "[red]MISS[/]", "N/A": "[yellow]N/A[/]"}
    for r in targets:
        rt.add_row(r.target, r.scope, r.measured, r.required, style[r.verdict])
    console.print(rt)  # type: ignore[attr-defined]
    for i, note in enumerate(run.footnotes, 1):
        console.print(f"[{i}] {note}", highlight=False)  # type: ignore[attr-defined]


_TEXT_COLUMNS = ("where", "note")


def _md_table(headers: tuple[str, ...], rows: tuple[tuple[str, ...], ...] | list) -> str:
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


_WHY = re.compile(r"<!-- why:(?P<id>\S+) -->\n(?P<body>.*?)<!-- /why -->", re.S)
# Sections another bench writes (bench/training_loop.py's lazy snapshots), carried over whole.
_KEPT = re.compile(r"<!-- kept:(?P<id>\S+) -->\n.*?<!-- /kept -->\n", re.S)
_PLACEHOLDER = (
    "**Needs analysis.** Why: _not analysed yet. The lead fills this in from profile findings "
    "(py-spy / perf on the case above); nothing here is a measured explanation._\n"
)


def render_markdown(run: RunResult, tables: list[Table], targets: list[TargetRow],
                    previous: str = "") -> str:
    """docs/performance.md; "why" sections already filled in ``previous`` are carried over."""
    kept = {m["id"]: m["body"] for m in _WHY.finditer(previous)}
    m = run.machine
    out = [
        "# Performance",
        "",
        f"Generated by `bench/run.py --write-doc` on {m.get('date', '?')} at commit "
        f"{m.get('trackpoint commit', '?')}. One run ({run.duration_s / 60:.0f} min), "
        f"{run.reps} repetition(s) per case, medians. "
        "The machine is a shared virtual machine: quote the **ratios**, not the absolute "
        "throughputs, which move from run to run.",
        "",
    ]
    if run.quick:
        out += ["> **Quick mode:** tiny sizes, one repetition. These numbers mean nothing; "
                "run `make bench` for real ones.", ""]
    out += [
        "## How to reproduce",
        "",
        "```sh",
        "make bench                                   # = .venv/bin/python bench/run.py",
        ".venv/bin/python bench/run.py --write-doc    # also rewrites this file",
        ".venv/bin/python bench/run.py --big          # adds the 4 GiB workload",
        ".venv/bin/python bench/run.py --workloads 1gib --where shm --systems tp,tf,safetensors",
        ".venv/bin/python bench/run.py --quick        # tiny sizes, under a minute",
        ".venv/bin/python bench/run.py --workloads many --many-layers 4000,16000  # issue 28",
        ".venv/bin/python bench/run.py --json run.json    # keep the raw measurements",
        ".venv/bin/python bench/run.py --from-json run.json --write-doc  # re-render, no measuring",
        ".venv/bin/python bench/profile_small.py      # 100k small values: time per step",
        "```",
        "",
        "`--help` lists every flag (repetitions, per-case time budget, cold page cache, "
        "peak-RSS children, JSON output).",
        "",
        "## Machine",
        "",
        _md_table(("what", "value"), [(k, v) for k, v in m.items()]),
        "",
        "## Method",
        "",
        "- Each workload runs in a fresh process of its own; in it, all systems run "
        "interleaved on the same tensors (same seed), in an order rotated every repetition; "
        "each cell is the median over repetitions. A case "
        "stops repeating once it has used its time budget (column *runs*).",
        "- **save**: from the system's own in-memory objects (tf.Variables, torch tensors, "
        "numpy arrays; building them is not timed) to files made durable: every file the "
        "system wrote and its directory are fsynced inside the timed region.",
        "- **restore**: until the values are materialised in memory (in place into an "
        "existing, zeroed model for trackpoint, tf.train.Checkpoint and the raw copy; newly "
        "allocated for the others). Every restore is then compared bit for bit against the "
        "source with `numpy.array_equal`, outside the timed region.",
        "- **async**: trackpoint `CheckpointOptions(enable_async=True)`: time until `write()` "
        "returns, against copying the state into new buffers (`ndarray.copy()`) and into "
        "preallocated ones (`np.copyto`).",
        "- **peak RSS**: each save and each restore in a fresh process (`bench/run.py --child`); "
        "VmHWM after the operation minus the RSS before it, with the state itself subtracted "
        "(for a save the state is already resident; a restore must add it). The sampled "
        "anonymous-memory column leaves out mapped file pages.",
        "- Throughput is state bytes ÷ median seconds, in GB/s (10⁹ bytes). Ratios are "
        "trackpoint ÷ peer throughput: above 1 means trackpoint is faster.",
        "- **many** (issue 28): the same Linear(32, 32) layers + AdamW state as a numpy "
        "nested dict, a torch module + optimizer and a JAX pytree, at two sizes (each its own "
        "workload and process). Its table gives microseconds per value (median seconds ÷ "
        "values), each path's cost per value ÷ the numpy path's, and the time at the largest "
        "size ÷ the time at the smallest (linear: 4× the values in ≤ 4.6× the time).",
        "",
        "## Bounded async snapshots (`max_staging_bytes`)",
        "",
        "An async save normally copies the whole state into host buffers (one memory copy, "
        "then the call returns). With `CheckpointOptions(max_staging_bytes=N)` and a larger "
        "state, the values are copied through one reusable buffer of N bytes while the writer "
        "thread writes them (values above N/4 in N/4 pieces, `BundleWriter.add_chunks`); the "
        "call returns once the last value is copied. Trade-off: extra host memory stays at "
        "about N (a 400 MiB state with N = 32 MiB adds ~33 MiB of peak RSS, against ~400 MiB "
        "for a full copy; `tests/saving/test_staging.py` measures it in a child process), "
        "but the call blocks for about the whole write minus the last buffer's worth, i.e. "
        "close to a synchronous save rather than to one memcpy. The files are byte-identical "
        "to a synchronous save, and updates made after the call never reach them. "
        "Synchronous saves never copy the state: they write from the arrays' own memory "
        "(non-contiguous or big-endian arrays are converted 8 MiB at a time).",
        "",
    ]
    out += [m.group(0) for m in _KEPT.finditer(previous)]
    out += ["## Results", ""]
    for t in tables:
        out += [f"### {t.title}", "", _md_table(t.headers, t.rows), ""]
    out += ["## Targets", "", _md_table(
        ("target", "scope", "measured", "required", "verdict"),
        [(r.target, r.scope, r.measured, r.required, r.verdict) for r in targets],
    ), ""]
    missed = [r for r in targets if r.verdict == "MISS"]
    if missed:
        out += ["## Missed targets, and why", ""]
        for r in missed:
            body = kept.get(r.id, _PLACEHOLDER)
            out += [
                f"### MISS: {r.target} ({r.scope})",
                "",
                f"Measured {r.measured}, required {r.required}.",
                "",
                f"<!-- why:{r.id} -->",
                body.rstrip("\n"),
                "<!-- /why -->",
                "",
            ]
    # Explanations of targets met in this run are kept (below the notes) for a later run in
    # which they miss again.
    spare = {k: v for k, v in kept.items() if k not in {r.id for r in missed}}
    if run.footnotes:
        out += ["## Notes", ""]
        out += [f"{i}. {n}" for i, n in enumerate(run.footnotes, 1)]
        out.append("")
    if spare:
        out += ["## Explanations kept from earlier runs", "",
                "For targets met in this run; shown again under *Missed targets* if they miss.", ""]
        for tid, body in sorted(spare.items()):
            out += [f"### {tid}", "", f"<!-- why:{tid} -->", body.rstrip("\n"), "<!-- /why -->", ""]
    return "\n".join(out)
