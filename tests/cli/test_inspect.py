"""`trackpoint ls | info | verify | cat` on checkpoints TensorFlow wrote and on damaged ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from trackpoint.bundle import BundleWriter
from trackpoint.cli.main import main

GOLDEN = Path(__file__).parent.parent / "golden" / "bundle"


@pytest.fixture
def golden_object(tmp_path) -> str:
    for f in (GOLDEN / "object").iterdir():
        shutil.copy(f, tmp_path / f.name)
    return str(tmp_path / "ckpt-1")


def test_ls_tensorflow_checkpoint(golden_object, capsys):
    assert main(["ls", golden_object, "--stats"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "/.ATTRIBUTES/" in line]
    assert "save_counter/.ATTRIBUTES/VARIABLE_VALUE" in lines[0]
    assert "v/.ATTRIBUTES/VARIABLE_VALUE" in lines[1]
    assert "float32" in lines[1] and "[2]" in lines[1]
    assert "ckpt-1.data-00000-of-00001" in out
    assert "1 shard(s)" in out


def test_ls_accepts_index_file_and_directory(golden_object, tmp_path, capsys):
    assert main(["ls", golden_object + ".index"]) == 0
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    assert main(["ls", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("v/.ATTRIBUTES/VARIABLE_VALUE") == 2


def test_ls_sliced(capsys):
    assert main(["ls", str(GOLDEN / "sliced")]) == 0
    assert "(2 slices)" in capsys.readouterr().out


def test_cat(golden_object, capsys):
    assert main(["cat", golden_object, "v/.ATTRIBUTES/VARIABLE_VALUE"]) == 0
    out = capsys.readouterr().out
    assert "dtype=float32 shape=[2]" in out
    assert "array([1., 2.]" in out


def test_cat_missing_key(golden_object, capsys):
    assert main(["cat", golden_object, "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_missing_checkpoint_hints_at_suffix(tmp_path, capsys):
    assert main(["ls", str(tmp_path / "ckpt")]) == 2
    err = capsys.readouterr().err
    assert "ckpt.index" in err and "-1" in err


def test_verify_ok_and_damaged(tmp_path, capsys):
    prefix = str(tmp_path / "ck")
    with BundleWriter(prefix) as w:
        w.add("a", np.arange(1000, dtype=np.float32))
        w.add("b", np.ones((4, 4)))
    assert main(["verify", prefix]) == 0
    assert "every checksum matches" in capsys.readouterr().out
    data = tmp_path / "ck.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[10] ^= 0xFF  # inside tensor "a"
    data.write_bytes(bytes(raw))
    assert main(["verify", prefix]) == 1
    err = capsys.readouterr().err
    assert "1 of 2 tensors are damaged" in err
    assert "Checksum does not match" in err


def test_info(golden_object, capsys):
    assert main(["info", golden_object]) == 0
    assert "445 bytes" in capsys.readouterr().out
