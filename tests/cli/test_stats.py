"""`trackpoint info` and `ls --stats`: size, shard count and bytes per data file."""

from __future__ import annotations

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
    assert main(["info", sharded]) == 0
    out = capsys.readouterr().out
    assert "missing" in out and "1 missing" in out
