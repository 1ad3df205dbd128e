"""nn.Module as an object graph node: keys (A2), round trip (A1), in place (B3), tied weights
(A7 aliases), deferred restoration into late and lazy modules (B1/B2), mismatches (B8), TF
interoperability."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch_helpers import Net, checkpoint_keys, same  # noqa: E402

from trackpoint.checkpoint.checkpoint import Checkpoint  # noqa: E402
from trackpoint.errors import InvalidArgumentError  # noqa: E402
from trackpoint.integrations.torch import ModuleAdapter  # noqa: E402
from trackpoint.tracking import to_trackable  # noqa: E402

VV = "/.ATTRIBUTES/VARIABLE_VALUE"


def _state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _assert_state_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert same(a[key], b[key]), key


def test_a2_module_keys_follow_state_dict_names(tmp_path):
    torch.manual_seed(0)
    model = Net()
    path = Checkpoint(model=model).save(tmp_path / "ckpt")
    expected = sorted(
        [f"model/{name.replace('.', '/')}{VV}" for name in model.state_dict()]
        + ["_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter" + VV],
        key=str.encode,
    )
    assert checkpoint_keys(path) == expected
    assert f"model/conv/1/num_batches_tracked{VV}" in expected


def test_non_persistent_buffers_are_not_saved(tmp_path):
    model = nn.Linear(2, 2)
    model.register_buffer("cache", torch.ones(2), persistent=False)
    path = Checkpoint(model=model).write(tmp_path / "ckpt")
    assert not any("cache" in key for key in checkpoint_keys(path))


def test_a1_module_tree_round_trips_values_dtypes_shapes(tmp_path):
    def build(seed: int) -> tuple[nn.Module, dict]:
        torch.manual_seed(seed)
        model = nn.Module()
        model.body = Net()
        model.half = nn.Linear(3, 2).to(torch.float16)
        model.register_buffer("step", torch.tensor(seed, dtype=torch.int64))
        model.register_buffer("empty", torch.zeros(0, 4) + seed)
        model.register_buffer("flags", torch.tensor([True, False]) ^ bool(seed))
        extras = {"scale": torch.full((2,), float(seed), dtype=torch.float64),
                  "bf16": torch.full((3,), float(seed), dtype=torch.bfloat16)}
        return model, extras

    saved, saved_extras = build(1)
    expected = _state(saved)
    path = Checkpoint(model=saved, extras=saved_extras).save(tmp_path / "ckpt")

    fresh, fresh_extras = build(0)
    Checkpoint(model=fresh, extras=fresh_extras).restore(path).assert_consumed()
    _assert_state_equal(_state(fresh), expected)
    for name in saved_extras:
        assert same(fresh_extras[name], saved_extras[name])


def test_b3_restore_keeps_parameter_objects_and_flags(tmp_path):
    torch.manual_seed(0)
    model = Net()
    model.mlp[4].weight.requires_grad_(False)  # a frozen layer stays frozen
    expected = _state(model)
    path = Checkpoint(model=model).write(tmp_path / "ckpt")
    params = {name: p for name, p in model.named_parameters()}
    flags = {name: p.requires_grad for name, p in params.items()}
    buffers = {name: b for name, b in model.named_buffers()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
        for b in model.buffers():
            b.add_(1)
    Checkpoint(model=model).read(path).assert_consumed()
    _assert_state_equal(_state(model), expected)
    for name, p in model.named_parameters():
        assert p is params[name]
        assert p.requires_grad is flags[name]
        assert p.grad_fn is None and p.device.type == "cpu"
    for name, b in model.named_buffers():
        assert b is buffers[name]


def test_tied_weights_are_saved_once_and_restored_into_every_alias(tmp_path):
    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        model = nn.Module()
        model.embed = nn.Embedding(5, 3)
        model.head = nn.Linear(3, 5, bias=False)
        model.head.weight = model.embed.weight
        return model

    saved = build(1)
    path = Checkpoint(model=saved).write(tmp_path / "ckpt")
    weight_keys = [k for k in checkpoint_keys(path) if k.endswith("weight" + VV)]
    assert weight_keys == ["model/embed/weight" + VV]  # one value, first path wins

    fresh = build(0)
    assert fresh.head.weight is fresh.embed.weight
    Checkpoint(model=fresh).read(path).assert_consumed()
    assert fresh.head.weight is fresh.embed.weight
    assert same(fresh.head.weight.detach(), saved.embed.weight.detach())


def test_b8_module_shape_mismatch_names_the_parameter(tmp_path):
    path = Checkpoint(model=nn.Linear(3, 2)).write(tmp_path / "ckpt")
    wrong = nn.Linear(4, 2)
    before = wrong.weight.detach().clone()
    with pytest.raises(InvalidArgumentError, match="incompatible tensor with shape") as info:
        Checkpoint(model=wrong).read(path)
    assert "parameter 'weight'" in str(info.value)
    assert "model/weight" + VV in str(info.value)
    assert torch.equal(wrong.weight.detach(), before)


def test_b8_module_dtype_mismatch(tmp_path):
    path = Checkpoint(model=nn.Linear(3, 2).double()).write(tmp_path / "ckpt")
    with pytest.raises(InvalidArgumentError, match="float64.*torch.float32|does not cast"):
        Checkpoint(model=nn.Linear(3, 2)).read(path)


def test_b1_module_attached_after_restore_gets_values_on_attach(tmp_path):
    torch.manual_seed(1)
    saved = Net()
    path = Checkpoint(model=saved).write(tmp_path / "ckpt")
    ckpt = Checkpoint()
    status = ckpt.read(path)
    status.assert_existing_objects_matched()
    with pytest.raises(AssertionError):
        status.assert_consumed()
    torch.manual_seed(2)
    fresh = Net()
    ckpt.model = fresh  # restored here, in place
    _assert_state_equal(_state(fresh), _state(saved))
    status.assert_consumed()


def test_b1_submodule_registered_after_restore_is_restored_on_registration(tmp_path):
    torch.manual_seed(1)
    saved = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    path = Checkpoint(model=saved).write(tmp_path / "ckpt")

    fresh = nn.Sequential()
    status = Checkpoint(model=fresh).read(path)
    status.assert_existing_objects_matched()
    fresh.append(nn.Linear(2, 3))  # registration hook restores it
    assert same(fresh[0].weight.detach(), saved[0].weight.detach())
    fresh.append(nn.ReLU())
    late = nn.Linear(3, 1)
    fresh.add_module("2", late)
    assert same(late.bias.detach(), saved[2].bias.detach())
    status.assert_consumed()


def test_b1_parameter_assigned_after_restore_is_restored(tmp_path):
    saved = nn.Module()
    saved.scale = nn.Parameter(torch.tensor([2.5]))
    path = Checkpoint(model=saved).write(tmp_path / "ckpt")
    fresh = nn.Module()
    status = Checkpoint(model=fresh).read(path)
    fresh.scale = nn.Parameter(torch.tensor([0.0]))
    assert fresh.scale.item() == 2.5
    status.assert_consumed()


def test_b1_lazy_modules_get_values_when_they_materialize(tmp_path):
    torch.manual_seed(0)
    saved = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(2))
    x = torch.randn(2, 3)
    expected_out = saved(x)
    path = Checkpoint(model=saved).write(tmp_path / "ckpt")

    torch.manual_seed(123)
    fresh = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(2))
    weight = fresh[0].weight
    Checkpoint(model=fresh).read(path).assert_consumed()
    rng = torch.get_rng_state()
    out = fresh(x)  # materializes: the values arrive now
    assert torch.equal(torch.get_rng_state(), rng)  # the random init did not shift the RNG
    assert fresh[0].weight is weight and type(weight) is nn.Parameter
    assert fresh[0].in_features == 3
    assert torch.equal(out, expected_out)
    _assert_state_equal(_state(fresh), _state(saved))


def test_lazy_values_survive_dropping_the_checkpoint(tmp_path):
    import gc

    saved = nn.LazyLinear(2)
    saved(torch.zeros(1, 3))
    path = Checkpoint(model=saved).write(tmp_path / "ckpt")
    fresh = nn.LazyLinear(2)
    Checkpoint(model=fresh).read(path).assert_consumed()  # checkpoint and status dropped
    gc.collect()
    fresh(torch.zeros(1, 3))
    assert same(fresh.weight.detach(), saved.weight.detach())
    assert not fresh._forward_pre_hooks  # the hooks removed themselves


def test_lazy_module_materialized_with_wrong_shape_raises(tmp_path):
    saved = nn.LazyLinear(2)
    saved(torch.zeros(1, 3))
    path = Checkpoint(model=saved).write(tmp_path / "ckpt")
    fresh = nn.LazyLinear(2)
    Checkpoint(model=fresh).read(path)
    with pytest.raises(InvalidArgumentError, match="incompatible tensor with shape"):
        fresh(torch.zeros(1, 5))


def test_lazy_module_restored_then_saved_keeps_the_pending_values(tmp_path):
    saved = nn.LazyLinear(2)
    saved(torch.zeros(1, 3))
    first = Checkpoint(model=saved).write(tmp_path / "first")
    fresh = nn.LazyLinear(2)
    ckpt = Checkpoint(model=fresh)
    ckpt.read(first)
    second = ckpt.write(tmp_path / "second")
    other = nn.Linear(3, 2)
    Checkpoint(model=other).read(second).assert_consumed()
    assert same(other.weight.detach(), saved.weight.detach())


def test_extra_state_is_saved_as_json(tmp_path):
    class WithExtra(nn.Linear):
        def __init__(self) -> None:
            super().__init__(2, 2)
            self.calls = 0

        def get_extra_state(self):
            return {"calls": self.calls, "scale": torch.tensor([0.5])}

        def set_extra_state(self, state):
            self.calls = state["calls"]
            self.scale = state["scale"]

    saved = WithExtra()
    saved.calls = 7
    path = Checkpoint(model=saved).write(tmp_path / "ckpt")
    assert "model/_extra_state/.ATTRIBUTES/py_state" in checkpoint_keys(path)
    fresh = WithExtra()
    Checkpoint(model=fresh).read(path).assert_consumed()
    assert fresh.calls == 7 and torch.equal(fresh.scale, torch.tensor([0.5]))


def test_module_adapter_reports_children_in_state_dict_order():
    model = nn.BatchNorm1d(3)
    adapter = to_trackable(model)
    assert isinstance(adapter, ModuleAdapter)
    assert list(adapter._trackable_children()) == list(model.state_dict())


def test_checkpoint_written_from_pytorch_loads_in_tensorflow(tmp_path, tf):
    torch.manual_seed(0)
    model = Net()
    model.register_buffer("bf16", torch.arange(4, dtype=torch.bfloat16))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 1, 6, 6)).sum().backward()
    optimizer.step()
    path = Checkpoint(model=model, optimizer=optimizer).save(tmp_path / "ckpt")
    reader = tf.train.load_checkpoint(path)
    shapes = reader.get_variable_to_shape_map()
    for name, value in model.state_dict().items():
        key = f"model/{name.replace('.', '/')}{VV}"
        assert shapes[key] == list(value.shape)
        got = reader.get_tensor(key)
        if value.dtype == torch.bfloat16:
            got = np.asarray(got).view(np.int16)
            value = value.view(torch.int16)
        np.testing.assert_array_equal(got, value.numpy(), err_msg=key)
    slot = f"model/mlp/1/weight/.OPTIMIZER_SLOT/optimizer/exp_avg{VV}"
    np.testing.assert_array_equal(
        reader.get_tensor(slot), optimizer.state[model.mlp[1].weight]["exp_avg"].numpy()
    )
