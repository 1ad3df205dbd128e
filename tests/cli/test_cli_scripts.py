"""The CLI for scripts: --json, unwrapped lines in pipes, readable paths for `cat`, exit codes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.cli.main import EXIT_DAMAGE, EXIT_OK, EXIT_USAGE, _parser, main
from trackpoint.tracking import AutoTrackable, Variable

TRACKPOINT = Path(sys.executable).parent / "trackpoint"
LONG = "a_rather_long_module_name_that_goes_on_and_on"


@pytest.fixture
def ckpt(tmp_path: Path) -> str:
    model = AutoTrackable()
    model.dense = AutoTrackable()
    model.dense.kernel = Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    model.dense.bias = Variable(np.zeros(3, np.float32))
    deep = AutoTrackable()
    setattr(model, LONG, deep)
    deep.weights_of_a_layer_with_a_long_name = Variable(np.ones(4, np.float64))
    model.other = AutoTrackable()
    model.other.tied = model.dense.kernel  # a second path to one variable
    return Checkpoint(model=model).write(tmp_path / "ckpt")


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> object:
    assert main(argv) == EXIT_OK
    return json.loads(capsys.readouterr().out)


def test_ls_json(ckpt: str, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json(["ls", ckpt, "--json"], capsys)
    assert isinstance(rows, list)
    by_key = {row["key"]: row for row in rows}
    kernel = by_key["model/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE"]
    assert kernel["dtype"] == "float32" and kernel["shape"] == [2, 3] and kernel["bytes"] == 24
    assert by_key["_CHECKPOINTABLE_OBJECT_GRAPH"]["dtype"] == "string"
    assert main(["ls", ckpt, "--json", "--stats"]) == EXIT_USAGE
    assert "info --json" in capsys.readouterr().err


def test_info_objects_verify_json(ckpt: str, capsys: pytest.CaptureFixture[str]) -> None:
    info = _json(["info", ckpt, "--json"], capsys)
    assert isinstance(info, dict)
    data = Path(ckpt + ".data-00000-of-00001").stat().st_size
    assert info["data"] == [{"file": "ckpt.data-00000-of-00001", "bytes": data}]
    assert info["total_bytes"] == data + Path(ckpt + ".index").stat().st_size
    assert info["missing"] == [] and info["num_shards"] == 1
    nodes = _json(["objects", ckpt, "--json"], capsys)
    assert isinstance(nodes, list)
    paths = {node["path"] for node in nodes}
    assert "(root).model.dense.kernel" in paths
    assert main(["objects", ckpt]) == EXIT_OK
    rows = capsys.readouterr().out.splitlines()
    assert any(row.split()[1:] == ["(root).model.dense.kernel", "VARIABLE_VALUE"] for row in rows)
    verified = _json(["verify", ckpt, "--json"], capsys)
    assert verified == {
        "prefix": ckpt,
        "ok": True,
        "tensors": 4,
        "bytes": verified["bytes"],
        "damaged": [],
    }


def test_cat_accepts_readable_object_paths(ckpt: str, capsys: pytest.CaptureFixture[str]) -> None:
    key = "model/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE"
    for spelling in (
        key,
        "model/dense/kernel",
        "model.dense.kernel",
        "(root).model.dense.kernel",
        "model.other.tied",
    ):
        assert main(["cat", ckpt, spelling]) == EXIT_OK, spelling
        out = capsys.readouterr().out
        assert out.startswith(f"{key}: dtype=float32 shape=[2, 3]"), spelling
    assert main(["cat", ckpt, "model.dense.kernal"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "model.dense.kernel" in err  # the close match is suggested


def test_pipe_output_is_never_wrapped(ckpt: str) -> None:
    """`trackpoint ls PATH | grep …` sees every key whole on one line (issue 17)."""
    key = f"model/{LONG}/weights_of_a_layer_with_a_long_name/.ATTRIBUTES/VARIABLE_VALUE"
    assert len(key) > 80
    for command in ("ls", "stats"):
        shell = f"'{TRACKPOINT}' {command} '{ckpt}' | cat"
        run = subprocess.run(
            shell,
            shell=True,
            capture_output=True,
            text=True,
            timeout=120,
            env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"},
            check=False,
        )
        assert run.returncode == 0, run.stderr
        lines = [line for line in run.stdout.splitlines() if "layer_with" in line]
        assert len(lines) == 1 and key in lines[0], run.stdout
        assert "│" not in run.stdout and "\x1b[" not in run.stdout  # no boxes, no colour
    assert "float64" in lines[0]


def test_terminal_output_uses_rich(ckpt: str) -> None:
    out = io.StringIO()
    args = _parser().parse_args(["ls", ckpt])
    assert args.func(args, Console(file=out, force_terminal=True, width=60)) == 0
    assert "┃" in out.getvalue()  # a rich table, folded to the terminal's width


def test_exit_codes(ckpt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", ckpt]) == EXIT_OK
    assert main(["ls"]) == EXIT_USAGE  # argparse usage error, returned instead of raised
    assert main(["nosuchcommand"]) == EXIT_USAGE
    assert main(["--help"]) == EXIT_OK
    assert main(["ls", str(tmp_path / "missing")]) == EXIT_USAGE
    assert main(["cat", ckpt, "nope"]) == EXIT_USAGE
    capsys.readouterr()
    # Damage: a flipped byte in the data file...
    data = Path(ckpt + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert main(["verify", ckpt]) == EXIT_DAMAGE
    assert main(["stats", ckpt]) == EXIT_DAMAGE  # reading damaged bytes is damage too
    capsys.readouterr()


def test_verify_reports_a_truncated_index(ckpt: str, capsys: pytest.CaptureFixture[str]) -> None:
    index = Path(ckpt + ".index")
    index.write_bytes(index.read_bytes()[:-20])
    assert main(["verify", ckpt]) == EXIT_DAMAGE
    err = capsys.readouterr().err
    assert "ckpt.index" in err and "FAILED" in err and "index is damaged" in err
    assert main(["verify", ckpt, "--json"]) == EXIT_DAMAGE
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["damaged"][0]["key"].endswith("ckpt.index")


def test_verify_reports_a_missing_data_file(ckpt: str, capsys: pytest.CaptureFixture[str]) -> None:
    Path(ckpt + ".data-00000-of-00001").unlink()
    assert main(["verify", ckpt, "--json"]) == EXIT_DAMAGE
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and len(report["damaged"]) == report["tensors"] == 4
