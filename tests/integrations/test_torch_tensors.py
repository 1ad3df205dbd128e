"""Torch tensors as values: dtypes (I3), shapes and strided views (I4), in-place restore (B3),
mismatch errors (B8), device snapshots, JSON state."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_helpers import DTYPES, checkpoint_keys, checkpoint_value, same, sample  # noqa: E402

from trackpoint.checkpoint.checkpoint import Checkpoint  # noqa: E402
from trackpoint.errors import FailedPreconditionError, InvalidArgumentError  # noqa: E402
from trackpoint.integrations.torch import (  # noqa: E402
    TensorVariable,
    copy_into,
    host_copy,
    numpy_dtype_for,
    to_numpy,
    torch_dtype_for,
)
from trackpoint.tracking import state_json, to_trackable  # noqa: E402

KEY = "t/.ATTRIBUTES/VARIABLE_VALUE"


def test_import_trackpoint_does_not_import_torch():
    code = "import sys, trackpoint, trackpoint.checkpoint; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_torch_objects_activate_the_integration_lazily():
    code = (
        "import sys, torch, trackpoint.tracking as t\n"
        "assert 'trackpoint.integrations.torch' not in sys.modules\n"
        "print(type(t.to_trackable(torch.zeros(2))).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "TensorVariable"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_i3_every_dtype_round_trips_through_a_checkpoint(tmp_path, dtype):
    saved = sample(dtype, seed=1)
    path = Checkpoint(t=saved).write(tmp_path / "ckpt")
    holder = sample(dtype, seed=2)
    before = holder.data_ptr()
    Checkpoint(t=holder).read(path).assert_consumed()
    assert same(holder, saved)
    assert holder.data_ptr() == before  # copied into the same storage
    stored = checkpoint_value(path, KEY)
    assert stored.dtype == numpy_dtype_for(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_to_numpy_is_a_zero_copy_view_on_cpu(dtype):
    tensor = sample(dtype)
    array = to_numpy(tensor)
    assert array.shape == tuple(tensor.shape)
    assert array.dtype == numpy_dtype_for(dtype)
    assert array.__array_interface__["data"][0] == tensor.data_ptr()
    assert torch_dtype_for(array.dtype) == dtype


def test_bfloat16_and_float8_map_to_ml_dtypes():
    assert numpy_dtype_for(torch.bfloat16) == np.dtype(ml_dtypes.bfloat16)
    assert numpy_dtype_for(torch.float8_e4m3fn) == np.dtype(ml_dtypes.float8_e4m3fn)
    assert numpy_dtype_for(torch.float8_e5m2) == np.dtype(ml_dtypes.float8_e5m2)
    value = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    np.testing.assert_array_equal(to_numpy(value).astype(np.float32), [1.5, -2.25])


@pytest.mark.filterwarnings("ignore::UserWarning")  # complex32/nested are "experimental"
@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: torch.zeros(2, dtype=torch.complex32), "complex32"),
        (lambda: torch.zeros(3).to_sparse(), "sparse"),
        (lambda: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)]), "nested"),
        (lambda: torch.zeros(2, device="meta"), "meta"),
    ],
    ids=["complex32", "sparse", "nested", "meta"],
)
def test_unsupported_tensors_raise_naming_path_and_dtype(tmp_path, make, fragment):
    module = torch.nn.Module()
    module.register_buffer("odd", make())
    with pytest.raises(InvalidArgumentError, match=rf"buffer 'odd'.*{fragment}|{fragment}.*'odd'"):
        Checkpoint(model=module).write(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt.index").exists()


@pytest.mark.filterwarnings("ignore:.*quantize")  # torch deprecates quantized tensors
def test_quantized_tensor_is_refused(tmp_path):
    quantized = torch.quantize_per_tensor(torch.zeros(2), 0.1, 0, torch.qint8)
    with pytest.raises(InvalidArgumentError, match="quantized"):
        Checkpoint(q=quantized).write(tmp_path / "ckpt")


def test_i4_non_contiguous_views_and_odd_shapes_round_trip(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    values = {
        "transposed": base.t(),
        "strided": base[::2, 1::3],
        "offset": base[1:, 2:],
        "expanded": torch.arange(3.0).expand(4, 3),
        "scalar": torch.tensor(7, dtype=torch.int64),
        "empty": torch.zeros(0, 5),
        "high_rank": torch.arange(32, dtype=torch.int16).reshape(2, 2, 2, 2, 2),
        "conj": torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj(),
        "bf16_view": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4).t(),
    }
    path = Checkpoint(**values).write(tmp_path / "ckpt")
    for name, value in values.items():
        stored = checkpoint_value(path, f"{name}/.ATTRIBUTES/VARIABLE_VALUE")
        expected = to_numpy(value.resolve_conj().contiguous())
        assert stored.dtype == expected.dtype and stored.shape == expected.shape, name
        assert stored.tobytes() == expected.tobytes(), name
    # Non-contiguous holders are restored in place too.
    holders = {
        name: torch.zeros(tuple(reversed(v.shape)), dtype=v.dtype).t() if v.dim() == 2
        else torch.zeros_like(v.resolve_conj())
        for name, v in values.items()
    }
    Checkpoint(**holders).read(path).assert_consumed()
    for name, value in values.items():
        assert same(holders[name].contiguous(), value.resolve_conj().contiguous()), name


def test_b3_restore_is_in_place_and_keeps_requires_grad_and_device(tmp_path):
    param = torch.nn.Parameter(torch.arange(4.0))
    path = Checkpoint(p=param).write(tmp_path / "ckpt")
    with torch.no_grad():
        param.mul_(-1)
    grad_before = param.requires_grad
    Checkpoint(p=param).read(path).assert_consumed()
    assert torch.equal(param.detach(), torch.arange(4.0))
    assert param.requires_grad is grad_before
    assert param.device.type == "cpu"
    assert param.grad_fn is None
    # Restoring again after more mutation works too.
    with torch.no_grad():
        param.add_(5)
    Checkpoint(p=param).read(path)
    assert torch.equal(param.detach(), torch.arange(4.0))


def test_b8_shape_mismatch_names_the_tensor_and_changes_nothing(tmp_path):
    path = Checkpoint(t=torch.ones(2)).write(tmp_path / "ckpt")
    holder = torch.zeros(1)
    with pytest.raises(InvalidArgumentError, match="incompatible tensor with shape") as info:
        Checkpoint(t=holder).read(path)
    assert KEY in str(info.value)
    assert torch.equal(holder, torch.zeros(1))


def test_b8_dtype_mismatch_is_an_error_not_a_cast(tmp_path):
    path = Checkpoint(t=torch.ones(2, dtype=torch.float64)).write(tmp_path / "ckpt")
    holder = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(InvalidArgumentError, match="does not cast"):
        Checkpoint(t=holder).read(path)
    assert torch.equal(holder, torch.zeros(2, dtype=torch.int32))


def test_copy_into_checks_before_writing():
    target = torch.zeros(2, 2)
    with pytest.raises(InvalidArgumentError, match="incompatible"):
        copy_into(target, np.ones((2, 3), dtype=np.float32), what="w")
    copy_into(target, np.ones((2, 2), dtype=np.float32), what="w")
    assert torch.equal(target, torch.ones(2, 2))


def test_read_only_file_views_restore_without_warnings(tmp_path, recwarn):
    path = Checkpoint(t=torch.ones(3)).write(tmp_path / "ckpt")
    holder = torch.zeros(3)
    Checkpoint(t=holder).read(path)
    assert not [w for w in recwarn if "not writable" in str(w.message)]


def test_host_copy_is_a_complete_private_copy():
    tensor = torch.arange(6.0).reshape(2, 3).t()
    copy = host_copy(tensor, pin_memory=False)
    assert copy.device.type == "cpu" and copy.is_contiguous()
    assert torch.equal(copy, tensor)
    tensor.add_(1)
    assert not torch.equal(copy, tensor)


def test_async_save_snapshots_torch_values_at_call_time(tmp_path):
    from trackpoint.saving import CheckpointOptions

    weights = torch.zeros(1000)
    ckpt = Checkpoint(w=weights)
    path = ckpt.write(tmp_path / "ckpt", CheckpointOptions(enable_async=True))
    weights.add_(1)  # training continues while the file is written
    ckpt.sync()
    np.testing.assert_array_equal(checkpoint_value(path, "w/.ATTRIBUTES/VARIABLE_VALUE"), 0)


def test_tensor_adapter_is_cached_per_object():
    tensor = torch.zeros(2)
    first = to_trackable(tensor)
    assert isinstance(first, TensorVariable)
    assert to_trackable(tensor) is first
    assert first.tensor is tensor


def test_uninitialized_parameter_cannot_be_saved_before_materialization(tmp_path):
    lazy = torch.nn.LazyLinear(3)
    with pytest.raises(FailedPreconditionError, match="forward pass"):
        Checkpoint(model=lazy).write(tmp_path / "ckpt")


def test_state_json_round_trips_python_values_and_tensors():
    from trackpoint.integrations.torch_tensors import TENSOR_JSON_HOOKS, tensor_to_json

    value = {
        "lr": 0.1, "betas": (0.9, 0.999), "nan": float("nan"), "inf": float("-inf"),
        "flag": True, "none": None, "name": "adam", "big": 2**100, "ints": {3: "a", 1: "b"},
        "array": np.arange(4, dtype=np.uint32), "tensor": torch.tensor([1.5], dtype=torch.bfloat16),
        "tag_like": {"__tuple__": 1}, "blob": b"\x00\xff",
    }
    data = state_json.dumps(value, what="test", default=tensor_to_json)
    assert b"NaN" not in data and b"Infinity" not in data  # strict JSON
    back = state_json.loads(data, what="test", hooks=TENSOR_JSON_HOOKS)
    assert back["betas"] == (0.9, 0.999) and isinstance(back["betas"], tuple)
    assert np.isnan(back["nan"]) and back["inf"] == float("-inf")
    assert back["big"] == 2**100 and back["ints"] == {3: "a", 1: "b"}
    np.testing.assert_array_equal(back["array"], np.arange(4, dtype=np.uint32))
    assert back["array"].dtype == np.uint32
    assert same(back["tensor"], value["tensor"])
    assert back["tag_like"] == {"__tuple__": 1}
    assert back["blob"] == b"\x00\xff"
    assert {k: back[k] for k in ("lr", "flag", "none", "name")} == {
        "lr": 0.1, "flag": True, "none": None, "name": "adam"}


def test_state_json_refuses_functions_naming_the_place():
    with pytest.raises(InvalidArgumentError, match=r"state\['fn'\]"):
        state_json.dumps({"fn": len}, what="state")


def test_checkpoint_keys_of_tensors(tmp_path):
    path = Checkpoint(t=torch.ones(1), items=[torch.zeros(2)]).write(tmp_path / "ckpt")
    assert checkpoint_keys(path) == [
        "_CHECKPOINTABLE_OBJECT_GRAPH",
        "items/0/.ATTRIBUTES/VARIABLE_VALUE",
        "t/.ATTRIBUTES/VARIABLE_VALUE",
    ]


def test_adapter_serializes_a_view_and_restores_in_place_from_read_only_arrays():
    param = torch.nn.Parameter(torch.zeros(2, 3))
    adapter = to_trackable(param)
    view = adapter._serialize_to_tensors()["VARIABLE_VALUE"]
    assert view.__array_interface__["data"][0] == param.data_ptr()  # zero copy
    saved = np.arange(6, dtype=np.float32).reshape(2, 3)
    saved.setflags(write=False)  # like a view of an mmapped checkpoint
    adapter._restore_from_tensors({"VARIABLE_VALUE": saved})
    assert torch.equal(param.detach(), torch.from_numpy(saved.copy()))
    assert param.requires_grad and param.grad_fn is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_round_trip_on_their_device_with_async_snapshots(tmp_path):
    from trackpoint.saving import CheckpointOptions

    weights = torch.nn.Parameter(torch.arange(8.0, device="cuda"))
    ckpt = Checkpoint(w=weights)
    path = ckpt.write(tmp_path / "ckpt", CheckpointOptions(enable_async=True))
    with torch.no_grad():
        weights.add_(100)  # after the snapshot: not in the file
    ckpt.sync()
    np.testing.assert_array_equal(checkpoint_value(path, "w/.ATTRIBUTES/VARIABLE_VALUE"),
                                  np.arange(8.0, dtype=np.float32))
    Checkpoint(w=weights).read(path).assert_consumed()
    assert weights.device.type == "cuda"
    assert torch.equal(weights.detach().cpu(), torch.arange(8.0))
    copy = host_copy(weights)
    assert copy.device.type == "cpu" and copy.is_pinned()
