"""torch.optim optimizers as slot owners (F1–F3), schedulers, grad scalers and RNG state."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch_helpers import Net, checkpoint_keys, checkpoint_value, same  # noqa: E402

from trackpoint.checkpoint.checkpoint import Checkpoint  # noqa: E402
from trackpoint.errors import InvalidArgumentError  # noqa: E402
from trackpoint.integrations.torch import OptimizerAdapter, TorchRNG, training_state  # noqa: E402
from trackpoint.saving import CheckpointOptions  # noqa: E402
from trackpoint.tracking import to_trackable  # noqa: E402

VV = "/.ATTRIBUTES/VARIABLE_VALUE"
GROUPS_KEY = "optimizer/param_groups/.ATTRIBUTES/py_state"


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 1, 6, 6, generator=generator)
    return x, torch.randint(0, 3, (4,), generator=generator)


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
    model.train()
    for step in steps:
        torch.manual_seed(1000 + step)  # dropout draws the same masks in every run
        x, y = _batch(step)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def _build(kind: str, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = Net()
    if kind == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.99))
    elif kind == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, amsgrad=True)
    return model, optimizer


def test_f1_slot_keys_and_param_groups(tmp_path):
    model, optimizer = _build("adam")
    _train(model, optimizer, range(2))
    path = Checkpoint(model=model, optimizer=optimizer).write(tmp_path / "ckpt")
    keys = checkpoint_keys(path)
    for slot in ("exp_avg", "exp_avg_sq", "step"):
        assert f"model/mlp/1/weight/.OPTIMIZER_SLOT/optimizer/{slot}{VV}" in keys
    assert not any("running_mean/.OPTIMIZER_SLOT" in k for k in keys)  # buffers have no state
    assert GROUPS_KEY in keys
    config = json.loads(checkpoint_value(path, GROUPS_KEY)[()])
    hyper = config["param_groups"][0]["hyperparameters"]
    assert hyper["lr"] == 0.01 and hyper["betas"] == {"__tuple__": [0.8, 0.99]}
    assert config["param_groups"][0]["num_params"] == len(list(model.parameters()))
    step = checkpoint_value(path, f"model/mlp/1/weight/.OPTIMIZER_SLOT/optimizer/step{VV}")
    assert step.dtype == np.float32 and step.shape == () and step == 2


def test_f1_state_of_parameters_outside_the_checkpoint_fails_the_save(tmp_path):
    """TF leaves such slots out silently (F1); here their values and state would be lost, so
    the save names the first such parameter instead (nothing silently dropped)."""
    model, optimizer = _build("sgd")
    _train(model, optimizer, range(1))
    with pytest.raises(InvalidArgumentError, match=r"param_groups\[0\].*not reachable"):
        Checkpoint(mlp=model.mlp, optimizer=optimizer).write(tmp_path / "ckpt")
    assert not list(tmp_path.glob("ckpt*"))
    path = Checkpoint(model=model, optimizer=optimizer).write(tmp_path / "ckpt")
    assert [k for k in checkpoint_keys(path) if ".OPTIMIZER_SLOT" in k]


@pytest.mark.parametrize("when", ["before_any_step", "after_steps"])
def test_f1_stateless_sgd_parameter_outside_the_checkpoint_fails_the_save(tmp_path, when):
    """Plain SGD keeps no per-parameter state, but an optimized parameter the root does not
    reach still loses its value: the save names it instead of leaving it out (issue 27 #15)."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    extra = nn.Parameter(torch.randn(5))
    optimizer = torch.optim.SGD([*model.parameters(), extra], lr=0.1)
    if when == "after_steps":
        for _ in range(2):
            optimizer.zero_grad()
            (model(torch.ones(1, 3)).sum() + extra.sum()).backward()
            optimizer.step()
        assert not any(optimizer.state.values())  # nothing but the values to lose
    with pytest.raises(InvalidArgumentError, match=r"parameter 2 of param_groups\[0\] "
                       r"\(shape \(5,\)\).*not reachable"):
        Checkpoint(model=model, optimizer=optimizer).write(tmp_path / "ckpt")
    assert not list(tmp_path.glob("ckpt*"))
    path = Checkpoint(model=model, extra=extra, optimizer=optimizer).write(tmp_path / "ckpt")
    fresh = nn.Parameter(torch.zeros(5))
    fresh_model = nn.Linear(3, 2)
    fresh_optimizer = torch.optim.SGD([*fresh_model.parameters(), fresh], lr=0.5)
    Checkpoint(model=fresh_model, extra=fresh, optimizer=fresh_optimizer).read(
        path).assert_consumed()
    assert same(fresh.detach(), extra.detach())
    assert fresh_optimizer.param_groups[0]["lr"] == 0.1


def test_restore_planning_is_not_quadratic_in_parameters(tmp_path, monkeypatch):
    """Planning a slot restore looks its parameter up by identity once, not by scanning every
    parameter of the optimizer (a 50,000-parameter MoE took minutes): count the scans."""
    def build(layers):
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(layers)])
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        return model, optimizer

    def group_scans(layers):
        model, optimizer = build(layers)
        path = Checkpoint(model=model, optimizer=optimizer).write(tmp_path / f"c{layers}")
        fresh_model, fresh_optimizer = build(layers)
        fresh_optimizer.state.clear()
        scans = 0
        groups = fresh_optimizer.param_groups

        class Counting(list):
            def __iter__(self):
                nonlocal scans
                scans += 1
                return super().__iter__()

        fresh_optimizer.param_groups = Counting(groups)
        Checkpoint(model=fresh_model, optimizer=fresh_optimizer).read(path).assert_consumed()
        for p, q in zip(model.parameters(), fresh_model.parameters()):
            assert same(optimizer.state[p]["exp_avg"], fresh_optimizer.state[q]["exp_avg"])
        return scans

    small, large = group_scans(20), group_scans(80)
    assert large <= small + 5, (small, large)


@pytest.mark.parametrize("kind", ["adam", "sgd", "adamw_amsgrad"])
def test_f2_fresh_optimizer_continues_exactly(tmp_path, kind):
    model, optimizer = _build(kind)
    _train(model, optimizer, range(3))
    path = Checkpoint(model=model, optimizer=optimizer).save(tmp_path / "ckpt")
    _train(model, optimizer, range(3, 6))

    fresh_model, fresh_optimizer = _build(kind, seed=42)
    assert not fresh_optimizer.state
    status = Checkpoint(model=fresh_model, optimizer=fresh_optimizer).restore(path)
    status.assert_consumed()
    for p, q in zip(model.parameters(), fresh_model.parameters()):
        assert set(fresh_optimizer.state[q]) == set(optimizer.state[p])
        if "step" in fresh_optimizer.state[q]:
            assert fresh_optimizer.state[q]["step"].device.type == "cpu"
    _train(fresh_model, fresh_optimizer, range(3, 6))
    for a, b in zip(model.state_dict().values(), fresh_model.state_dict().values()):
        assert same(a, b)
    for p, q in zip(model.parameters(), fresh_model.parameters()):
        for name, value in optimizer.state[p].items():
            assert same(value, fresh_optimizer.state[q][name]), name


def test_f2_slots_restore_in_place_into_existing_state(tmp_path):
    model, optimizer = _build("adam")
    _train(model, optimizer, range(2))
    path = Checkpoint(model=model, optimizer=optimizer).write(tmp_path / "ckpt")
    weight = model.mlp[1].weight
    exp_avg = optimizer.state[weight]["exp_avg"]
    saved = exp_avg.clone()
    _train(model, optimizer, range(2, 4))
    Checkpoint(model=model, optimizer=optimizer).read(path).assert_consumed()
    assert optimizer.state[weight]["exp_avg"] is exp_avg
    assert same(exp_avg, saved)


def test_f2_optimizer_attached_after_restore_gets_its_slots(tmp_path):
    model, optimizer = _build("sgd")
    _train(model, optimizer, range(2))
    path = Checkpoint(model=model, optimizer=optimizer).write(tmp_path / "ckpt")

    fresh_model, fresh_optimizer = _build("sgd", seed=3)
    ckpt = Checkpoint(model=fresh_model)
    status = ckpt.read(path)
    with pytest.raises(AssertionError):
        status.assert_consumed()
    ckpt.optimizer = fresh_optimizer  # slots created now, from the checkpoint
    status.assert_consumed()
    weight = fresh_model.mlp[1].weight
    assert same(fresh_optimizer.state[weight]["momentum_buffer"],
                optimizer.state[model.mlp[1].weight]["momentum_buffer"])


def test_f2_model_attached_after_the_optimizer(tmp_path):
    model, optimizer = _build("adam")
    _train(model, optimizer, range(2))
    path = Checkpoint(model=model, optimizer=optimizer).write(tmp_path / "ckpt")
    fresh_model, fresh_optimizer = _build("adam", seed=3)
    ckpt = Checkpoint(optimizer=fresh_optimizer)
    status = ckpt.read(path)
    assert not fresh_optimizer.state
    ckpt.model = fresh_model
    status.assert_consumed()
    _train(model, optimizer, range(2, 3))
    _train(fresh_model, fresh_optimizer, range(2, 3))
    for a, b in zip(model.parameters(), fresh_model.parameters()):
        assert same(a.detach(), b.detach())


def test_f3_skip_slot_variables(tmp_path):
    model, optimizer = _build("adam")
    _train(model, optimizer, range(2))
    path = Checkpoint(model=model, optimizer=optimizer).write(tmp_path / "ckpt")
    fresh_model, fresh_optimizer = _build("adam", seed=1)
    options = CheckpointOptions(skip_slot_variables=True)
    status = Checkpoint(model=fresh_model, optimizer=fresh_optimizer).read(path, options)
    status.assert_consumed()
    assert not fresh_optimizer.state  # no slots created
    assert same(fresh_model.mlp[1].weight.detach(), model.mlp[1].weight.detach())


def test_param_group_layout_mismatch_is_an_error(tmp_path):
    model, optimizer = _build("sgd")
    path = Checkpoint(model=model, optimizer=optimizer).write(tmp_path / "ckpt")
    other = torch.optim.SGD(
        [{"params": model.conv.parameters()}, {"params": model.mlp.parameters()}], lr=0.1
    )
    with pytest.raises(InvalidArgumentError, match="parameter groups|groups of"):
        Checkpoint(model=model, optimizer=other).read(path)
    assert other.param_groups[0]["lr"] == 0.1


def test_hyperparameters_are_restored(tmp_path):
    model, optimizer = _build("sgd")
    optimizer.param_groups[0]["lr"] = 0.123
    path = Checkpoint(model=model, optimizer=optimizer).write(tmp_path / "ckpt")
    optimizer.param_groups[0]["lr"] = 1.0
    optimizer.param_groups[0]["momentum"] = 0.0
    Checkpoint(model=model, optimizer=optimizer).read(path).assert_consumed()
    assert optimizer.param_groups[0]["lr"] == 0.123
    assert optimizer.param_groups[0]["momentum"] == 0.9


def test_tensor_learning_rate_is_restored_in_place(tmp_path):
    param = nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.Adam([param], lr=torch.tensor(0.01))
    lr = optimizer.param_groups[0]["lr"]
    path = Checkpoint(param=param, optimizer=optimizer).write(tmp_path / "ckpt")
    lr.fill_(0.5)
    Checkpoint(param=param, optimizer=optimizer).read(path)
    assert optimizer.param_groups[0]["lr"] is lr
    assert lr.item() == pytest.approx(0.01)


def test_lbfgs_list_state_round_trips(tmp_path):
    torch.manual_seed(0)
    param = nn.Parameter(torch.randn(3))
    optimizer = torch.optim.LBFGS([param], history_size=3, max_iter=4)

    def closure():
        optimizer.zero_grad()
        loss = (param ** 2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    path = Checkpoint(p=param, optimizer=optimizer).write(tmp_path / "ckpt")
    fresh_param = nn.Parameter(param.detach().clone())
    fresh = torch.optim.LBFGS([fresh_param], history_size=3, max_iter=4)
    Checkpoint(p=fresh_param, optimizer=fresh).read(path).assert_consumed()
    state, restored = optimizer.state[param], fresh.state[fresh_param]
    assert state.keys() == restored.keys()
    assert restored["n_iter"] == state["n_iter"]
    assert len(restored["old_dirs"]) == len(state["old_dirs"])
    assert all(same(a, b) for a, b in zip(state["old_dirs"], restored["old_dirs"]))


def test_add_slot_is_not_supported_for_torch_optimizers():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    adapter = to_trackable(optimizer)
    assert isinstance(adapter, OptimizerAdapter)
    with pytest.raises(NotImplementedError, match="step"):
        adapter.add_slot(torch.zeros(1), "m")


@pytest.mark.parametrize(
    "make",
    [
        lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
        lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=20),
        lambda opt: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=3),
        lambda opt: torch.optim.lr_scheduler.SequentialLR(
            opt, [torch.optim.lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=2),
                  torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)], milestones=[2]),
    ],
    ids=["step", "one_cycle", "cosine_restarts", "sequential"],
)
def test_lr_schedulers_round_trip(tmp_path, make):
    def build():
        param = nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.9)
        return param, optimizer, make(optimizer)

    param, optimizer, scheduler = build()
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    path = Checkpoint(p=param, optimizer=optimizer, scheduler=scheduler).write(tmp_path / "ckpt")
    expected = []
    for _ in range(4):
        optimizer.step()
        scheduler.step()
        expected.append(optimizer.param_groups[0]["lr"])

    fresh_param, fresh_optimizer, fresh_scheduler = build()
    Checkpoint(p=fresh_param, optimizer=fresh_optimizer, scheduler=fresh_scheduler).read(
        path).assert_consumed()
    got = []
    for _ in range(4):
        fresh_optimizer.step()
        fresh_scheduler.step()
        got.append(fresh_optimizer.param_groups[0]["lr"])
    assert got == expected


def test_reduce_lr_on_plateau_and_grad_scaler(tmp_path):
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0)
    for loss in (1.0, 2.0, 3.0):
        plateau.step(loss)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    path = Checkpoint(plateau=plateau, scaler=scaler).write(tmp_path / "ckpt")
    fresh_plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
        torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), patience=0
    )
    fresh_scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    Checkpoint(plateau=fresh_plateau, scaler=fresh_scaler).read(path).assert_consumed()
    assert fresh_plateau.state_dict() == plateau.state_dict()
    assert fresh_scaler.state_dict() == scaler.state_dict()


def test_torch_rng_state_resumes_the_random_stream(tmp_path):
    torch.manual_seed(7)
    torch.rand(3)
    rng = TorchRNG()
    path = Checkpoint(rng=rng).write(tmp_path / "ckpt")
    expected = torch.rand(5)
    torch.manual_seed(999)
    Checkpoint(rng=TorchRNG()).read(path).assert_consumed()
    assert torch.equal(torch.rand(5), expected)
    assert "rng/cpu" + VV in checkpoint_keys(path)


def test_custom_generator_and_mismatched_state(tmp_path):
    generator = torch.Generator().manual_seed(3)
    path = Checkpoint(g=generator).write(tmp_path / "ckpt")
    expected = torch.rand(4, generator=generator)
    other = torch.Generator().manual_seed(4)
    Checkpoint(g=other).read(path).assert_consumed()
    assert torch.equal(torch.rand(4, generator=other), expected)
    bad = Checkpoint(g=torch.ones(3, dtype=torch.uint8)).write(tmp_path / "bad")
    with pytest.raises(InvalidArgumentError, match="Generator"):
        Checkpoint(g=torch.Generator()).read(bad)


@pytest.mark.parametrize("make", [
    lambda: np.random.default_rng(5),
    lambda: np.random.Generator(np.random.MT19937(5)),
    lambda: np.random.RandomState(5),
], ids=["pcg64", "mt19937", "random_state"])
def test_numpy_generator_state_round_trips_as_json(tmp_path, make):
    generator = make()
    generator.random(3)
    path = Checkpoint(rng=generator).write(tmp_path / "ckpt")
    expected = generator.random(4)
    fresh = make()
    Checkpoint(rng=fresh).read(path).assert_consumed()
    np.testing.assert_array_equal(fresh.random(4), expected)
    json.loads(checkpoint_value(path, "rng/.ATTRIBUTES/py_state")[()])  # plain JSON, no pickle


def test_training_state_helper(tmp_path):
    model, optimizer = _build("adam")
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2)
    state = training_state(model, optimizer, scheduler)
    assert set(state) == {"model", "optimizer", "scheduler", "rng"}
    path = Checkpoint(**state).write(tmp_path / "ckpt")
    Checkpoint(**training_state(*_build("adam", 1)[:2], rng=False)).read(path).expect_partial()


def test_lazy_module_and_empty_optimizer_restored_before_the_first_forward(tmp_path):
    def build(seed: int):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(2))
        return model, torch.optim.Adam(model.parameters(), lr=0.1)

    def step(model, optimizer, index: int) -> None:
        x = torch.randn(3, 5, generator=torch.Generator().manual_seed(index))
        optimizer.zero_grad()
        model(x).pow(2).sum().backward()
        optimizer.step()

    model, optimizer = build(0)
    for index in range(3):
        step(model, optimizer, index)
    path = Checkpoint(model=model, optimizer=optimizer).write(tmp_path / "ckpt")

    fresh_model, fresh_optimizer = build(1)  # parameters still uninitialized, state empty
    Checkpoint(model=fresh_model, optimizer=fresh_optimizer).read(path).assert_consumed()
    for index in range(3, 5):
        step(model, optimizer, index)
        step(fresh_model, fresh_optimizer, index)
    for a, b in zip(model.parameters(), fresh_model.parameters()):
        assert same(a.detach(), b.detach())
