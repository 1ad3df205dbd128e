"""`trackpoint info` and `ls --stats`: size, shard count and bytes per data file; and
`trackpoint stats`: per-tensor NaN/Inf counts and figures, per-module totals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.cli.main import main


@pytest.fixture
def sharded(tmp_path: Path) -> str:
    state = {f"w{i}": np.full(1000 * (i + 1), i, np.float32) for i in range(3)}
    options = tp.CheckpointOptions(sharding_policy=tp.sharding.MaxShardSizePolicy(4000))
    return tp.Checkpoint(model=state).write(tmp_path / "ckpt", options)


def _sizes(prefix: str) -> tuple[dict[str, int], int]:
    directory = Path(prefix).parent
    data = {f.name: f.stat().st_size for f in sorted(directory.glob("ckpt.data-*"))}
    return data, (directory / "ckpt.index").stat().st_size


@pytest.mark.parametrize("argv", [["info"], ["ls", "--stats"]])
def test_stats_show_every_data_file_and_the_total(sharded: str, argv: list[str], capsys) -> None:  # noqa: ANN001
    assert main([*argv, sharded]) == 0
    out = capsys.readouterr().out
    data, index = _sizes(sharded)
    assert len(data) >= 3
    for name, size in data.items():
        assert re.search(rf"{re.escape(name)}\s.*\s{size:,}\s", out), name
    total = sum(data.values()) + index
    assert f"({total:,} bytes), {len(data)} shard(s)" in out
    # The same figures a save reports.
    events: list[tp.saving.ProgressEvent] = []
    tp.Checkpoint(model={}).read(sharded, tp.CheckpointOptions(progress=events.append))
    stats = events[-1].stats
    assert stats is not None and stats.checkpoint_bytes == total


def test_info_reports_missing_data_files(sharded: str, capsys) -> None:  # noqa: ANN001
    Path(sharded + ".data-00001-of-" + f"{len(_sizes(sharded)[0]):05d}").unlink()
    assert main(["info", sharded]) == 1  # README: a missing file is damage, exit status 1
    out = capsys.readouterr().out
    assert "missing" in out and "1 missing" in out


# -- `trackpoint stats PATH`: per-tensor figures, streamed -----------------------------------


def _reference(values: np.ndarray) -> dict[str, float]:
    finite = values[np.isfinite(values)].astype(np.float64)
    return {"min": finite.min(), "max": finite.max(), "mean": finite.mean(),
            "std": finite.std(), "norm": float(np.sqrt(np.dot(finite, finite)))}


def test_stats_json_figures_nan_and_inf(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 33)).astype(np.float32)
    w[3, 4], w[10, 0], w[20, 20] = np.nan, np.inf, -np.inf
    import ml_dtypes

    state = {"w": w, "steps": np.arange(10, dtype=np.int64),
             "half": np.linspace(-2, 2, 9).astype(ml_dtypes.bfloat16),
             "nothing": np.full(3, np.nan, np.float32)}  # fmt: skip
    prefix = tp.Checkpoint(model=state).write(tmp_path / "ckpt")
    assert main(["stats", prefix, "--json"]) == 0
    rows = {row["key"].split("/")[1]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["w"]["nan"] == 1 and rows["w"]["inf"] == 2
    for name, values in (("w", w), ("steps", state["steps"]),
                         ("half", state["half"].astype(np.float64))):  # fmt: skip
        for figure, expected in _reference(values).items():
            got = rows[name][figure]
            assert got == pytest.approx(expected, rel=1e-9, abs=1e-12), (name, figure)
    assert rows["half"]["dtype"] == "bfloat16" and rows["half"]["shape"] == [9]
    assert rows["nothing"]["nan"] == 3
    assert rows["nothing"]["min"] is None and rows["nothing"]["norm"] is None  # valid JSON


def test_stats_in_chunks_equal_the_whole(tmp_path: Path) -> None:
    from trackpoint.bundle import BundleReader
    from trackpoint.cli.stats import tensor_stats

    values = np.random.default_rng(2).standard_normal((41, 7, 5)) * 1e3 + 5e3
    prefix = tp.Checkpoint(model={"x": values}).write(tmp_path / "ckpt")
    key = "model/x/.ATTRIBUTES/VARIABLE_VALUE"
    with BundleReader(prefix) as reader:
        whole = tensor_stats(reader, key)
        assert whole is not None
        for chunk in (1, 3, 34, 36, 1000):  # smaller than a row, rows split, many rows
            part = tensor_stats(reader, key, chunk_elements=chunk)
            assert part is not None and part.count == whole.count == values.size
            for figure in ("min", "max", "mean", "std", "norm"):
                assert getattr(part, figure) == pytest.approx(getattr(whole, figure), rel=1e-12)
    assert whole.std == pytest.approx(values.std(), rel=1e-9)


def test_stats_of_a_partitioned_tensor(capsys) -> None:  # noqa: ANN001
    golden = Path(__file__).parent.parent / "golden" / "bundle" / "sliced"
    assert main(["stats", str(golden), "--json"]) == 0
    rows = {row["key"]: row for row in json.loads(capsys.readouterr().out)}
    t = rows["t"]  # arange(50) in two stored slices
    assert (t["min"], t["max"], t["mean"], t["nan"]) == (0, 49, 24.5, 0)
    assert t["norm"] == pytest.approx(np.linalg.norm(np.arange(50)))


def test_stats_tables_and_module_totals(sharded: str, capsys) -> None:  # noqa: ANN001
    assert main(["stats", sharded, "--depth", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^model\s+3\s+6,000\s+24,000$", out, flags=re.M), out
    assert "3 tensors, 6,000 parameters" in out
