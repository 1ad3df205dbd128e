"""`trackpoint tree` (object graph with sizes) and `trackpoint report` (one offline HTML page)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.cli.main import main
from trackpoint.cli.report import squarify
from trackpoint.tracking import AutoTrackable, Variable


@pytest.fixture
def ckpt(tmp_path: Path) -> str:
    model = AutoTrackable()
    model.encoder = AutoTrackable()
    model.encoder.embed = Variable(np.ones((100, 8), np.float32))  # 3,200 bytes
    model.encoder.norm = Variable(np.array([1.0, np.nan, np.inf], np.float32))
    model.head = AutoTrackable()
    model.head.w = model.encoder.embed  # tied
    model.head.b = Variable(np.zeros(10, np.float64))  # 80 bytes
    return Checkpoint(model=model).write(tmp_path / "ckpt")


def test_tree_lines_sizes_and_tied_reference(ckpt: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tree", ckpt]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("(root)")
    assert "  model  (3.2 KiB)" in lines
    assert "    encoder  (3.1 KiB)" in lines
    assert "      embed  float32 [100, 8]  3.1 KiB" in lines
    assert "      w -> same object as model.encoder.embed" in lines
    assert "      b  float64 [10]  80 B" in lines
    assert main(["tree", ckpt, "--depth", "1"]) == 0
    assert not any("embed" in line for line in capsys.readouterr().out.splitlines())


def test_tree_json(ckpt: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tree", ckpt, "--json"]) == 0
    root = json.loads(capsys.readouterr().out)
    model = next(c for c in root["children"] if c["name"] == "model")
    head = next(c for c in model["children"] if c["name"] == "head")
    assert head["bytes"] == 80  # the tied weight is counted once, where it is stored
    assert model["bytes"] == 3200 + 12 + 80


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.links: list[str] = []
        self.bad_rows = 0
        self.cells: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "xlink:href", "action") and value:
                self.links.append(value)
            if tag == "tr" and name == "class" and value == "bad":
                self.bad_rows += 1

    def handle_data(self, data: str) -> None:
        self.cells.append(data)


def test_report_is_one_offline_html_file(
    ckpt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.html"
    assert main(["report", ckpt, "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    text = out.read_text(encoding="utf-8")
    page = _Page()
    page.feed(text)
    assert page.tags[0] == "html" and "svg" in page.tags and "rect" in page.tags
    assert "table" in page.tags and "script" not in page.tags
    assert not page.links  # nothing fetched: no src/href at all
    assert "http://" not in text and "https://" not in text
    assert page.bad_rows == 1  # encoder.norm holds a NaN and an Inf
    assert "model/encoder/norm/.ATTRIBUTES/VARIABLE_VALUE" in page.cells
    assert any("NaN or Inf" in cell for cell in page.cells)
    assert main(["report", ckpt]) == 2  # -o is required


def test_squarify_tiles_the_rectangle() -> None:
    sizes = [500.0, 300.0, 120.0, 50.0, 20.0, 9.0, 1.0]
    rects = squarify(sizes, (10.0, 20.0, 400.0, 300.0))
    total = 400.0 * 300.0
    for size, (x, y, w, h) in zip(sizes, rects):
        assert w * h == pytest.approx(total * size / sum(sizes))
        assert 10 - 1e-9 <= x and x + w <= 410 + 1e-9 and 20 - 1e-9 <= y and y + h <= 320 + 1e-9
    for i, a in enumerate(rects):  # no two boxes overlap
        for b in rects[i + 1 :]:
            overlap_w = min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0])
            overlap_h = min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1])
            assert overlap_w <= 1e-9 or overlap_h <= 1e-9
    aspect = [max(w / h, h / w) for _, _, w, h in rects[:3]]
    assert max(aspect) < 3  # the big boxes are near squares
