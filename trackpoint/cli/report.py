"""``trackpoint report PATH -o report.html``: one self-contained HTML page about a checkpoint.

The page needs no network and no script: inline CSS, a treemap of stored bytes by object path
drawn as inline SVG (hover a box for its path and size), the per-module totals and the
per-tensor figures of ``trackpoint stats`` with NaN and Inf highlighted. The treemap is laid out
with the squarified algorithm (Bruls, Huizing, van Wijk 2000) over the tree of
``trackpoint tree``, nested a few levels deep.
"""

from __future__ import annotations

import argparse
import html
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape

from trackpoint.cli.output import Output, format_number
from trackpoint.cli.progress import human_bytes
from trackpoint.cli.stats import TensorStats, checkpoint_stats, module_totals
from trackpoint.cli.tree import ObjectNode, build_object_tree
from trackpoint.management.paths import resolve_location
from trackpoint.management.reader import CheckpointReader
from trackpoint.storage import locate

__all__ = ["add_parser", "cmd_report", "render_report", "squarify", "treemap_svg"]

WIDTH, HEIGHT = 1000, 560
_HEADER = 16  # px of a group's label strip
_MAX_DEPTH = 4
_HUES = (210, 30, 120, 280, 0, 170, 60, 320, 250, 90)

Rect = tuple[float, float, float, float]  # x, y, width, height


def _worst(row: Sequence[float], side: float) -> float:
    total = sum(row)
    return max(max(side * side * r / (total * total), total * total / (side * side * r))
               for r in row)  # fmt: skip


def squarify(sizes: Sequence[float], rect: Rect) -> list[Rect]:
    """Rectangles tiling ``rect`` with areas proportional to ``sizes`` (positive, any order),
    as close to squares as the squarified algorithm gets them; one per size, in order."""
    x, y, w, h = rect
    total = float(sum(sizes))
    if not sizes or total <= 0 or w <= 0 or h <= 0:
        return [(x, y, 0.0, 0.0) for _ in sizes]
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    areas = [sizes[i] * w * h / total for i in order]
    out: dict[int, Rect] = {}
    start = 0
    while start < len(areas):
        side = min(w, h)
        end = start + 1
        while end < len(areas) and _worst(areas[start : end + 1], side) <= _worst(
            areas[start:end], side
        ):
            end += 1
        row = areas[start:end]
        thickness = sum(row) / side
        offset = 0.0
        for index, area in zip(order[start:end], row):
            length = area / thickness
            if w >= h:  # lay the row out as a column on the left
                out[index] = (x, y + offset, thickness, length)
            else:  # as a row on top
                out[index] = (x + offset, y, length, thickness)
            offset += length
        if w >= h:
            x, w = x + thickness, w - thickness
        else:
            y, h = y + thickness, h - thickness
        start = end
    return [out[i] for i in range(len(sizes))]


def _boxes(node: ObjectNode) -> list[tuple[str, str, int, ObjectNode | None]]:
    """(label, readable path, bytes, node to nest into or None) of what fills ``node``'s box."""
    own = sum(v.bytes for v in node.values)
    items: list[tuple[str, str, int, ObjectNode | None]] = [
        (child.name, child.path, child.bytes, child) for child in node.children if child.bytes > 0
    ]
    if own > 0:
        name = node.values[0].name if len(node.values) == 1 else "values"
        items.append((name, node.path or "(root)", own, None))
    return items


def _svg_rect(rect: Rect, path: str, size: int, hue: int, depth: int, label: str) -> str:
    x, y, w, h = rect
    light = min(88, 52 + 9 * depth)
    parts = [
        f"<g><title>{html.escape(path)}: {human_bytes(size)} ({size:,} bytes)</title>",
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
        f'fill="hsl({hue},55%,{light}%)" stroke="#fff" stroke-width="1"/>',
    ]
    room = int((w - 6) / 6.5)
    if room >= 3 and h >= 13:
        text = label if len(label) <= room else label[: room - 1] + "…"
        parts.append(f'<text x="{x + 3:.1f}" y="{y + 11:.1f}">{html.escape(text)}</text>')
    parts.append("</g>")
    return "".join(parts)


def treemap_svg(root: ObjectNode, width: int = WIDTH, height: int = HEIGHT) -> str:
    """An inline ``<svg>`` treemap of ``root``'s bytes, nested up to a few levels deep."""
    shapes: list[str] = []
    stack: list[tuple[ObjectNode, Rect, int, int | None]] = [(root, (0, 0, width, height), 0, None)]
    while stack:
        node, (x, y, w, h), depth, hue = stack.pop()
        items = _boxes(node)
        rects = squarify([float(size) for _, _, size, _ in items], (x, y, w, h))
        for index, ((label, path, size, child), rect) in enumerate(zip(items, rects)):
            # Each subtree of the first level with more than one box gets its own hue.
            color = hue if hue is not None or len(items) == 1 else _HUES[index % len(_HUES)]
            shapes.append(
                _svg_rect(rect, path, size, _HUES[0] if color is None else color, depth, label)
            )
            cx, cy, cw, ch = rect
            if (
                child is not None
                and child.children
                and depth + 1 < _MAX_DEPTH
                and (cw > 24 and ch > _HEADER + 12)
            ):
                inner = (cx + 2, cy + _HEADER, cw - 4, ch - _HEADER - 2)
                stack.append((child, inner, depth + 1, color))
    return (
        f'<svg class="treemap" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="stored bytes by object path">'
        + "".join(shapes) + "</svg>"
    )  # fmt: skip


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:12px} td,th{padding:2px 8px;border-bottom:1px solid #eee}
th{text-align:left;background:#f5f5f5;position:sticky;top:0} td.n{text-align:right}
td.k{font-family:ui-monospace,monospace;word-break:break-all}
tr.bad td{background:#fde2e2} td.hot{color:#b00020;font-weight:bold}
.warn{background:#fde2e2;border:1px solid #b00020;padding:8px;margin:12px 0}
.treemap text{font:11px sans-serif;fill:#111;pointer-events:none}
"""


def _row(cells: Sequence[tuple[str, str]], cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return (
        f"<tr{attr}>"
        + "".join(f'<td class="{c}">{html.escape(text)}</td>' for c, text in cells)
        + "</tr>"
    )


def _stats_rows(figures: Sequence[TensorStats]) -> str:
    rows = []
    for s in figures:
        shape = "[" + ", ".join(map(str, s.shape)) + "]"
        rows.append(_row(
            [("k", s.key), ("", s.dtype), ("", shape), ("n", f"{s.bytes:,}"),
             ("n hot" if s.nan else "n", str(s.nan)), ("n hot" if s.inf else "n", str(s.inf)),
             *(("n", format_number(v)) for v in (s.min, s.max, s.mean, s.std, s.norm))],
            "" if s.finite else "bad",
        ))  # fmt: skip
    return "".join(rows)


def render_report(
    prefix: str, root: ObjectNode, figures: Sequence[TensorStats], skipped: Sequence[str]
) -> str:
    """The whole HTML page."""
    bad = [s for s in figures if not s.finite]
    title = html.escape(prefix)
    warn = (
        f'<p class="warn">{len(bad)} tensor(s) hold NaN or Inf '
        f"({sum(s.nan for s in bad):,} NaN, {sum(s.inf for s in bad):,} Inf); "
        "their rows are marked below.</p>"
        if bad
        else ""
    )
    modules = "".join(
        _row([("k", t.module), ("n", str(t.tensors)), ("n", f"{t.parameters:,}"),
              ("n", f"{t.bytes:,}")])
        for t in module_totals(list(figures))
    )  # fmt: skip
    headers = ("key", "dtype", "shape", "bytes", "NaN", "Inf", "min", "max", "mean", "std",
               "L2 norm")  # fmt: skip
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>trackpoint report: {title}</title><style>{_CSS}</style></head><body>"
        f"<h1>Checkpoint {title}</h1>"
        f"<p>{len(figures)} numeric tensors, {sum(s.count for s in figures):,} parameters, "
        f"{human_bytes(root.bytes)} of values in the object graph; {len(skipped)} values "
        f"are strings (Python state, the object graph itself).</p>{warn}"
        f"<h2>Bytes by object path</h2>{treemap_svg(root)}"
        "<h2>Modules</h2><table><thead><tr><th>module</th><th>tensors</th><th>parameters</th>"
        f"<th>bytes</th></tr></thead><tbody>{modules}</tbody></table>"
        '<h2>Tensors</h2><table class="stats"><thead><tr>'
        + "".join(f"<th>{h}</th>" for h in headers)
        + f"</tr></thead><tbody>{_stats_rows(figures)}</tbody></table></body></html>\n"
    )


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``report`` to ``trackpoint``'s subcommands."""
    p = subparsers.add_parser(
        "report", help="write a self-contained HTML report: treemap of bytes, tensor figures"
    )
    p.add_argument("path", help="checkpoint prefix, one of its files, or a directory")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    """Run ``trackpoint report``: the file appears whole (written under a temporary name)."""
    out = Output(console)
    location = resolve_location(args.path)
    prefix = location.prefix
    with CheckpointReader(prefix, storage=location.storage) as reader:
        root = build_object_tree(reader)
        with out.progress("reading") as bar:
            figures, skipped = checkpoint_stats(reader.bundle, progress=bar.update)
    page = render_report(prefix, root, figures, skipped)
    locate(args.output).storage.write_atomic(args.output, page.encode("utf-8"))
    bad = sum(1 for s in figures if not s.finite)
    note = f", [bold red]{bad} with NaN/Inf[/]" if bad else ""
    out.line(
        f"wrote {escape(args.output)}: {len(figures)} tensors, {human_bytes(root.bytes)}{note}"
    )
    return 0
