"""`convert` writes a tied weight under every name and refuses extensions it does not know."""

from __future__ import annotations

import numpy as np
import pytest

from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.cli.main import main
from trackpoint.convert.convert import convert
from trackpoint.convert.formats import check_format, detect_format
from trackpoint.convert.safetensors_format import read_safetensors
from trackpoint.errors import InvalidArgumentError, NotFoundError
from trackpoint.management.reader import CheckpointReader
from trackpoint.tracking import AutoTrackable, Variable


def _tied_numpy_checkpoint(tmp_path) -> str:  # noqa: ANN001
    """Two paths to one variable: ``model.head.w`` and ``model.embed.w``."""
    model = AutoTrackable()
    model.head = AutoTrackable()
    model.embed = AutoTrackable()
    shared = Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    model.head.w = shared
    model.embed.w = shared
    model.embed.b = Variable(np.ones(3, np.float32))
    return Checkpoint(model=model).write(tmp_path / "ckpt")


def test_safetensors_gets_every_name_of_a_tied_value(tmp_path):
    src = _tied_numpy_checkpoint(tmp_path)
    with CheckpointReader(src) as reader:
        assert sum("/w/" in key for key in reader.keys()) == 1  # stored once
    result = convert(src, tmp_path / "m.safetensors", root="model")
    with read_safetensors(str(tmp_path / "m.safetensors")) as file:
        assert sorted(file.tensors) == ["embed.b", "embed.w", "head.w"]
        np.testing.assert_array_equal(file.tensors["embed.w"], file.tensors["head.w"])
    assert {target for _, target in result.names} == {"embed.b", "embed.w", "head.w"}
    convert(src, tmp_path / "one.safetensors", root="model", aliases=False)
    with read_safetensors(str(tmp_path / "one.safetensors")) as file:
        assert sorted(file.tensors) == ["embed.b", "head.w"]


def test_alias_inside_root_when_the_stored_key_is_outside(tmp_path):
    src = _tied_numpy_checkpoint(tmp_path)
    convert(src, tmp_path / "embed.safetensors", root="model/embed")
    with read_safetensors(str(tmp_path / "embed.safetensors")) as file:
        assert sorted(file.tensors) == ["b", "w"]


def test_checkpoint_destination_keeps_one_copy(tmp_path):
    src = _tied_numpy_checkpoint(tmp_path)
    dst = str(tmp_path / "copy")
    convert(src, dst, root="model")
    with CheckpointReader(dst) as reader:
        values = [k for k in reader.keys() if k.endswith("/w/.ATTRIBUTES/VARIABLE_VALUE")]
    assert len(values) == 1


def test_tied_torch_model_to_safetensors_loads_strictly(tmp_path):
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")

    def make() -> torch.nn.Module:
        model = torch.nn.Module()
        model.transformer = torch.nn.Module()
        model.transformer.wte = torch.nn.Embedding(7, 4)
        model.lm_head = torch.nn.Linear(4, 7, bias=False)
        model.lm_head.weight = model.transformer.wte.weight
        return model

    model = make()
    src = Checkpoint(model=model).write(tmp_path / "ckpt")
    assert main(["convert", src, str(tmp_path / "model.safetensors"), "--root", "model"]) == 0
    state = safetensors_torch.load_file(str(tmp_path / "model.safetensors"))
    fresh = make()
    fresh.load_state_dict(state, strict=True)
    assert torch.equal(fresh.transformer.wte.weight, model.transformer.wte.weight)
    # A torch file keeps the tie: one storage under two names.
    convert(src, tmp_path / "model.pt", root="model")
    loaded = torch.load(tmp_path / "model.pt", weights_only=True)
    assert loaded["lm_head.weight"].data_ptr() == loaded["transformer.wte.weight"].data_ptr()


def test_unknown_extensions_are_refused_with_the_known_list(tmp_path, capsys):
    src = _tied_numpy_checkpoint(tmp_path)
    with pytest.raises(InvalidArgumentError, match=r"\.onnx.*\.safetensors.*\.pt"):
        convert(src, tmp_path / "x.onnx")
    assert not list(tmp_path.glob("x.onnx*"))
    assert main(["convert", src, str(tmp_path / "x.onnx")]) == 2
    err = capsys.readouterr().err
    assert ".onnx" in err and ".safetensors" in err and "--to checkpoint" in err
    # Said explicitly, any name is a checkpoint prefix.
    convert(src, tmp_path / "x.onnx", destination_format="checkpoint")
    assert (tmp_path / "x.onnx.index").exists()
    # ...and such an existing checkpoint is accepted as a source.
    convert(tmp_path / "x.onnx", tmp_path / "back.safetensors")
    (tmp_path / "weights.h5").write_bytes(b"\x89HDF")
    with pytest.raises(InvalidArgumentError, match=r"\.h5"):
        convert(tmp_path / "weights.h5", tmp_path / "w.safetensors")
    with pytest.raises(NotFoundError, match=r"\.gguf"):
        convert(tmp_path / "missing.gguf", tmp_path / "w.safetensors")


def test_names_that_are_not_extensions():
    assert detect_format("run/ckpt-3") == "checkpoint"
    assert detect_format("run/model.ckpt") == "checkpoint"
    assert detect_format("run/model.ckpt-1000") == "checkpoint"
    assert detect_format("run/v1.2/ckpt") == "checkpoint"
    assert detect_format("run/ckpt-3.index") == "checkpoint"
    assert detect_format("m.SAFETENSORS") == "safetensors"
    assert check_format(None, "run/ckpt-3.data-00000-of-00001", source=False) == "checkpoint"
    with pytest.raises(InvalidArgumentError, match="unknown format"):
        check_format("onnx", "x", source=False)
