"""`trackpoint diff A B`: added, removed and changed keys, their figures, per-module totals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trackpoint.bundle import BundleReader, BundleWriter
from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.cli.diff import diff_checkpoints
from trackpoint.cli.main import main

VV = "/.ATTRIBUTES/VARIABLE_VALUE"


def _write(path: Path, state: dict[str, dict[str, np.ndarray]]) -> str:
    return Checkpoint(**state).write(path)


@pytest.fixture
def pair(tmp_path: Path) -> tuple[str, str]:
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    changed = w.copy()
    changed[1, 2] += 0.25
    changed[2, 3] = -changed[2, 3]  # a sign flip: the largest relative difference, 2
    a = _write(tmp_path / "a", {"enc": {"w": w, "b": np.zeros(4, np.float32)},
                                "dec": {"w": np.ones(2), "gone": np.arange(3)},
                                "step": {"n": np.array(5)}})  # fmt: skip
    b = _write(tmp_path / "b", {"enc": {"w": changed, "b": np.zeros(4, np.float32)},
                                "dec": {"w": np.ones(2, np.float32), "new": np.arange(2)},
                                "step": {"n": np.array(6)}})  # fmt: skip
    return a, b


def test_diff_json(pair: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = pair
    assert main(["diff", a, b, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["added"] == ["dec/new" + VV]
    assert report["removed"] == ["dec/gone" + VV]
    changed = {c["key"]: c for c in report["changed"]}
    w = changed["enc/w" + VV]
    assert w["reason"] == "values" and w["mismatched"] == 2 and w["elements"] == 12
    assert w["max_abs"] == pytest.approx(2 * 1.0, rel=1e-6)  # 1 -> -1
    assert w["max_rel"] == pytest.approx(2.0)
    assert changed["dec/w" + VV]["reason"] == "dtype"
    assert changed["dec/w" + VV]["dtype"] == "float64"
    assert changed["dec/w" + VV]["b_dtype"] == "float32"
    n = changed["step/n" + VV]
    assert n["max_abs"] == 1 and n["max_rel"] == pytest.approx(1 / 6)
    assert "enc/b" + VV not in changed
    modules = {m["module"]: m for m in report["modules"]}
    assert modules["enc"] == {
        "module": "enc",
        "added": 0,
        "removed": 0,
        "changed": 1,
        "unchanged": 1,
    }
    assert modules["dec"]["added"] == 1 and modules["dec"]["removed"] == 1


def test_diff_lines_and_exit_code(
    pair: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = pair
    assert main(["diff", a, b]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "+ dec/new" + VV in out and "- dec/gone" + VV in out
    line = next(x for x in out if x.startswith("~ enc/w"))
    assert "differ=2/12" in line and "max_abs=2" in line
    assert main(["diff", a, b, "--exit-code"]) == 1
    assert main(["diff", a, a, "--exit-code"]) == 0
    assert "identical" in capsys.readouterr().out
    assert main(["diff", a, str(Path(a).parent / "nope")]) == 2


def test_chunks_nan_and_shape_changes(tmp_path: Path) -> None:
    big = np.random.default_rng(0).standard_normal((37, 53)).astype(np.float32)
    other = big.copy()
    other[5, 7] = np.nan
    other[30, 1] += 3.0
    big[11, 11] = other[11, 11] = np.nan  # NaN on both sides is no change
    with BundleWriter(str(tmp_path / "a")) as w:
        w.add("x", big)
        w.add("s", np.zeros((2, 3)))
    with BundleWriter(str(tmp_path / "b")) as w:
        w.add("x", other)
        w.add("s", np.zeros((3, 2)))
    with BundleReader(str(tmp_path / "a")) as ra, BundleReader(str(tmp_path / "b")) as rb:
        result = diff_checkpoints(ra, rb, chunk_elements=16)  # many chunks, rows split
    x = next(d for d in result.changed if d.key == "x")
    assert x.mismatched == 2  # the new NaN and the +3
    assert x.max_abs == pytest.approx(3.0)
    s = next(d for d in result.changed if d.key == "s")
    assert s.reason == "shape" and s.described == ("float64", "[2, 3] -> [3, 2]")


def test_diff_of_partitioned_tensors(tmp_path: Path) -> None:
    golden = Path(__file__).parent.parent / "golden" / "bundle" / "sliced"
    with BundleReader(str(golden)) as a, BundleReader(str(golden)) as b:
        result = diff_checkpoints(a, b, chunk_elements=7)
    assert result.identical and "t" in result.unchanged
