"""Format conversion: checkpoints <-> torch state_dict files <-> safetensors, key maps, the CLI."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.convert.convert import checkpoint_key_to_name, convert, detect_format
from trackpoint.convert.key_map import KeyMap
from trackpoint.convert.safetensors_format import read_safetensors, write_safetensors
from trackpoint.errors import (
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from trackpoint.graph.keys import split_checkpoint_key
from trackpoint.tracking import AutoTrackable, Variable

VV = "/.ATTRIBUTES/VARIABLE_VALUE"


def _numpy_values() -> dict[str, np.ndarray]:
    return {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([1.5, -2.0], dtype=np.float64),
        "half": np.arange(4, dtype=np.float16),
        "bf16": np.arange(3, dtype=np.float32).astype(ml_dtypes.bfloat16),
        "f8": np.array([0.5, 1.0], dtype=ml_dtypes.float8_e4m3fn),
        "steps": np.array(7, dtype=np.int64),
        "mask": np.array([True, False]),
        "empty": np.zeros((0, 2), dtype=np.uint8),
    }


def _numpy_checkpoint(tmp_path) -> tuple[str, dict[str, np.ndarray]]:
    values = _numpy_values()
    model = AutoTrackable()
    model.inner = AutoTrackable()
    for name, value in values.items():
        setattr(model.inner, name, Variable(value))
    return Checkpoint(model=model).save(tmp_path / "src" / "ckpt"), values


def _assert_same(got: np.ndarray, expected: np.ndarray, name: str = "") -> None:
    assert got.dtype == expected.dtype, name
    assert got.shape == expected.shape, name
    assert np.asarray(got).tobytes() == np.asarray(expected).tobytes(), name


def test_detect_format():
    assert detect_format("a/model.safetensors") == "safetensors"
    assert detect_format("a/model.PT") == "torch"
    assert detect_format("a/model.pth") == "torch"
    assert detect_format("a/ckpt-3") == "checkpoint"


def test_key_naming_round_trip():
    assert checkpoint_key_to_name("model/0/weight" + VV) == "model.0.weight"
    assert checkpoint_key_to_name("a.Sb/c..d" + VV) == "a/b.c.d"
    assert checkpoint_key_to_name("m/.ATTRIBUTES/custom") == "m.custom"
    assert checkpoint_key_to_name("w/.OPTIMIZER_SLOT/opt/m" + VV) is None
    assert checkpoint_key_to_name("legacy_name") == "legacy_name"
    assert split_checkpoint_key("/.ATTRIBUTES/v1") == ((), "v1")


def test_checkpoint_to_safetensors_and_back(tmp_path):
    src, values = _numpy_checkpoint(tmp_path)
    dst = str(tmp_path / "model.safetensors")
    result = convert(src, dst, root="model")
    assert {target for _, target in result.names} == {f"inner.{n}" for n in values}
    assert ("save_counter" + VV, "outside root 'model'") in result.skipped
    with read_safetensors(dst) as file:
        for name, expected in values.items():
            _assert_same(file.tensors[f"inner.{name}"], expected, name)

    back = str(tmp_path / "back" / "ckpt")
    convert(dst, back, root="model")
    fresh = AutoTrackable()
    fresh.inner = AutoTrackable()
    holders = {name: Variable(np.zeros_like(v)) for name, v in values.items()}
    for name, holder in holders.items():
        setattr(fresh.inner, name, holder)
    Checkpoint(model=fresh).read(back).assert_consumed()
    for name, expected in values.items():
        _assert_same(holders[name].array, expected, name)


def test_safetensors_files_are_readable_by_the_safetensors_library(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = str(tmp_path / "plain.safetensors")
    values = {k: v for k, v in _numpy_values().items() if k not in ("bf16", "f8")}
    write_safetensors(path, values.items(), metadata={"format": "np"})
    loaded = safetensors_numpy.load_file(path)
    for name, expected in values.items():
        _assert_same(loaded[name], expected, name)
    # ... and we read what the library wrote.
    theirs = str(tmp_path / "theirs.safetensors")
    safetensors_numpy.save_file(values, theirs, metadata={"k": "v"})
    with read_safetensors(theirs) as file:
        assert file.metadata == {"k": "v"}
        for name, expected in values.items():
            _assert_same(file.tensors[name], expected, name)


def test_safetensors_rejects_damaged_files(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(DataLossError, match="header length"):
        read_safetensors(str(path))
    header = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(DataLossError, match="outside the data"):
        read_safetensors(str(path))


def test_unsupported_dtype_for_safetensors_names_the_value(tmp_path):
    with pytest.raises(InvalidArgumentError, match="'c'.*complex128"):
        write_safetensors(str(tmp_path / "x.safetensors"),
                          [("c", np.zeros(2, dtype=np.complex128))])
    assert not list(tmp_path.iterdir())


def test_checkpoint_to_checkpoint_copies_everything(tmp_path):
    src, _ = _numpy_checkpoint(tmp_path)
    dst = str(tmp_path / "copy")
    result = convert(src, dst)
    assert not result.skipped
    from trackpoint.management import CheckpointReader

    with CheckpointReader(src) as a, CheckpointReader(dst) as b:
        assert a.keys() == b.keys()
        for key in a.keys():
            assert np.array_equal(a.get_tensor(key), b.get_tensor(key)), key


def test_destination_is_not_overwritten_without_force(tmp_path):
    src, _ = _numpy_checkpoint(tmp_path)
    dst = str(tmp_path / "m.safetensors")
    convert(src, dst)
    with pytest.raises(FailedPreconditionError, match="already exists"):
        convert(src, dst)
    convert(src, dst, overwrite=True)


def test_missing_source(tmp_path):
    with pytest.raises(NotFoundError):
        convert(str(tmp_path / "nope"), str(tmp_path / "x.safetensors"))
    with pytest.raises(NotFoundError):
        convert(str(tmp_path / "nope.safetensors"), str(tmp_path / "x"))


def test_root_needs_a_checkpoint_side(tmp_path):
    path = str(tmp_path / "a.safetensors")
    write_safetensors(path, [("w", np.zeros(2, np.float32))])
    with pytest.raises(InvalidArgumentError, match="root"):
        convert(path, str(tmp_path / "b.safetensors"), root="model")


def test_key_map_renames_transposes_drops(tmp_path):
    src, values = _numpy_checkpoint(tmp_path)
    key_map = KeyMap.from_dict({
        "rename": {"model/inner/w" + VV: {"to": "fc.weight", "transpose": True}},
        "rules": [{"pattern": r"model/inner/(b|half)/\.ATTRIBUTES/VARIABLE_VALUE",
                   "replacement": r"fc.\1"}],
        "drop": ["save_counter/.*"],
        "unmapped": "drop",
    })
    dst = str(tmp_path / "m.safetensors")
    result = convert(src, dst, key_map=key_map)
    with read_safetensors(dst) as file:
        assert sorted(file.tensors) == ["fc.b", "fc.half", "fc.weight"]
        _assert_same(file.tensors["fc.weight"], np.ascontiguousarray(values["w"].T))
    reasons = dict(result.skipped)
    assert reasons["save_counter" + VV] == "dropped by the key map"
    assert reasons["model/inner/mask" + VV] == "not matched by the key map"


def test_key_map_errors(tmp_path):
    with pytest.raises(InvalidArgumentError, match="regular expression"):
        KeyMap(rules=[{"pattern": "(", "replacement": "x"}])
    with pytest.raises(InvalidArgumentError, match="permutation"):
        KeyMap(rename={"a": {"to": "b", "transpose": [0, 0]}})
    with pytest.raises(InvalidArgumentError, match="unknown key map sections"):
        KeyMap.from_dict({"rules": [], "extra": 1})
    key_map = KeyMap(rename={"a": {"to": "b", "transpose": [1, 0, 2]}}, unmapped="error")
    with pytest.raises(InvalidArgumentError, match="dimensions"):
        key_map.apply("a", np.zeros((2, 2)))
    with pytest.raises(InvalidArgumentError, match="not matched"):
        convert(*_numpy_checkpoint(tmp_path)[:1], str(tmp_path / "x.safetensors"),
                key_map=key_map)
    bad = tmp_path / "map.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidArgumentError, match="not valid JSON"):
        KeyMap.load(bad)


def test_flat_rename_table_and_duplicate_targets(tmp_path):
    src, _ = _numpy_checkpoint(tmp_path)
    key_map = KeyMap.from_dict({"model/inner/w" + VV: "x", "model/inner/b" + VV: "x"})
    with pytest.raises(InvalidArgumentError, match="both be written as 'x'"):
        convert(src, str(tmp_path / "m.safetensors"), key_map=key_map)


# -- torch -----------------------------------------------------------------------------------


class Custom:
    """An arbitrary object: torch.load(weights_only=True) must refuse to unpickle it."""


def test_torch_state_dict_round_trip_through_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2).to(torch.bfloat16))
    state = model.state_dict()
    pt = tmp_path / "model.pt"
    torch.save(state, pt)

    ckpt = str(tmp_path / "ckpt")
    convert(pt, ckpt, root="model")
    fresh = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2).to(torch.bfloat16))
    Checkpoint(model=fresh).read(ckpt).assert_consumed()
    for key, value in state.items():
        assert torch.equal(fresh.state_dict()[key], value), key

    out = tmp_path / "back.pth"
    convert(ckpt, out, root="model")
    loaded = torch.load(out, weights_only=True)
    assert list(loaded) == sorted(state)  # checkpoint keys come back sorted
    for key, value in state.items():
        assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key

    st = tmp_path / "m.safetensors"
    convert(out, st)
    safetensors_torch = pytest.importorskip("safetensors.torch")
    for key, value in safetensors_torch.load_file(st).items():
        assert torch.equal(value, state[key]), key


def test_torch_training_checkpoint_dict_is_flattened(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    path = tmp_path / "train.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3},
               path)
    result = convert(path, tmp_path / "out.safetensors")
    names = {target for _, target in result.names}
    assert {"model.weight", "model.bias", "optimizer.state.0.exp_avg"} <= names
    assert ("epoch", "not a tensor (int)") in result.skipped


def test_torch_files_with_arbitrary_objects_are_refused(tmp_path):
    torch = pytest.importorskip("torch")

    path = tmp_path / "evil.pt"
    torch.save({"obj": Custom()}, path)
    with pytest.raises(DataLossError, match="weights_only"):
        convert(path, tmp_path / "out.safetensors")


def test_tensorflow_checkpoint_into_a_pytorch_module_with_a_key_map(tmp_path, tf):
    torch = pytest.importorskip("torch")

    tf_model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(4),
                                    tf.keras.layers.Dense(2)])
    kernel0, bias0 = (v.numpy() for v in tf_model.layers[0].weights)
    ckpt = tf.train.Checkpoint(net=tf_model).write(str(tmp_path / "tf" / "ckpt"))
    keys = [k for k, _ in tf.train.list_variables(ckpt)]
    kernel_keys = sorted(k for k in keys if "kernel" in k)
    assert len(kernel_keys) == 2

    bias_keys = sorted(k for k in keys if k.endswith("bias" + VV))
    # Keras names layers by position ("layer_with_weights-0", or "_operations/1" in Keras 3):
    # a rule maps each kernel (transposed: TF is [in, out], torch [out, in]) and bias by index.
    rename = {}
    for index, (kernel, bias) in enumerate(zip(kernel_keys, bias_keys)):
        rename[kernel] = {"to": f"{index}.weight", "transpose": True}
        rename[bias] = f"{index}.bias"
    map_file = tmp_path / "map.json"
    map_file.write_text(json.dumps({"rename": rename, "unmapped": "drop"}))
    out = tmp_path / "torch.pt"
    convert(ckpt, out, key_map=KeyMap.load(map_file))
    state = torch.load(out, weights_only=True)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    module.load_state_dict(state)
    np.testing.assert_array_equal(module[0].weight.detach().numpy(), kernel0.T)
    np.testing.assert_array_equal(module[0].bias.detach().numpy(), bias0)
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(
        module(torch.from_numpy(x)).detach().numpy(), tf_model(x).numpy(), rtol=1e-5, atol=1e-6
    )


# -- CLI -------------------------------------------------------------------------------------


def _cli(*argv: str) -> tuple[int, str]:
    import argparse
    import io

    from rich.console import Console

    from trackpoint.cli.convert import add_parser

    parser = argparse.ArgumentParser(prog="trackpoint")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    out = io.StringIO()
    code = args.func(args, Console(file=out, width=200))
    return code, out.getvalue()


def test_cli_convert_with_map_and_root(tmp_path):
    src, values = _numpy_checkpoint(tmp_path)
    map_file = tmp_path / "map.json"
    map_file.write_text(json.dumps({"inner/w" + VV: "weight"}))
    dst = tmp_path / "out.safetensors"
    code, text = _cli("convert", src, str(dst), "--root", "model", "--map", str(map_file), "-v")
    assert code == 0
    assert "wrote" in text and "weight" in text
    with read_safetensors(str(dst)) as file:
        assert "weight" in file.tensors and "inner.b" in file.tensors
        _assert_same(file.tensors["weight"], values["w"])
    code, _ = _cli("convert", src, str(dst), "--force", "--to", "safetensors")
    assert code == 0


def test_cli_errors_propagate_as_checkpoint_errors(tmp_path):
    from trackpoint.errors import CheckpointError

    with pytest.raises(CheckpointError):
        _cli("convert", str(tmp_path / "missing"), str(tmp_path / "x.safetensors"))


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_torch_file_read_by_url(tmp_path, scheme):
    # file:// is local (torch maps the file), memory:// is read through fsspec: one URL rule.
    torch = pytest.importorskip("torch")
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    if scheme == "file":
        torch.save(state, tmp_path / "model.pt")
        source = f"file://{tmp_path}/model.pt"
    else:
        pytest.importorskip("fsspec")
        from trackpoint.storage import locate

        source = f"memory://tp-convert-{tmp_path.name}/model.pt"
        location = locate(source)
        with location.storage.open_atomic(source) as out:
            torch.save(state, out)
    result = convert(source, tmp_path / "out.safetensors")
    assert [target for _, target in result.names] == ["w"]
    safetensors_torch = pytest.importorskip("safetensors.torch")
    assert torch.equal(safetensors_torch.load_file(tmp_path / "out.safetensors")["w"], state["w"])
