"""Load status assertions (C1/C2) of a torch model with its optimizer, answered from the
structure the read's bindings form (no second walk of the program) and exact: a module or a
parameter added since the read, and optimizer state the checkpoint lacks, are not bound. And
the optimizer's state adapters, made in one batch, keep their names (B8) and identity."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import trackpoint.checkpoint.load_status as load_status  # noqa: E402
from trackpoint.checkpoint.checkpoint import Checkpoint  # noqa: E402
from trackpoint.errors import InvalidArgumentError  # noqa: E402
from trackpoint.tracking import to_trackable  # noqa: E402


def _no_walk(*args, **kwargs):
    raise AssertionError("the status walked the program")


def _trained(seed: int, layers: int = 3) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(layers)))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_c1_model_and_optimizer_assertions_without_a_second_walk(tmp_path, monkeypatch):
    model, optimizer = _trained(0)
    saved_model, saved_optimizer = _trained(1)
    path = Checkpoint(model=saved_model, optimizer=saved_optimizer).write(tmp_path / "ckpt")
    status = Checkpoint(model=model, optimizer=optimizer).read(path)
    monkeypatch.setattr(load_status, "list_objects", _no_walk)
    assert status.assert_consumed() is status
    status.assert_existing_objects_matched().assert_nontrivial_match()
    for a, b in zip(model.parameters(), saved_model.parameters()):
        assert torch.equal(a, b)


def test_c1_module_added_after_the_read_is_not_bound(tmp_path):
    saved_model, saved_optimizer = _trained(1)
    path = Checkpoint(model=saved_model, optimizer=saved_optimizer).write(tmp_path / "ckpt")
    model, optimizer = _trained(0)
    status = Checkpoint(model=model, optimizer=optimizer).read(path)
    status.assert_consumed()
    model.add_module("head", nn.Linear(4, 1))
    with pytest.raises(AssertionError, match=r"not bound to checkpointed values.*head"):
        status.assert_existing_objects_matched()
    status.expect_partial()


def test_c2_optimizer_state_the_checkpoint_lacks_is_not_bound(tmp_path, monkeypatch):
    # Saved before any step: the checkpoint has parameters but no optimizer state.
    torch.manual_seed(1)
    saved = nn.Sequential(nn.Linear(4, 4))
    path = Checkpoint(model=saved, optimizer=torch.optim.AdamW(saved.parameters())).write(
        tmp_path / "ckpt"
    )
    model, optimizer = _trained(0, layers=1)  # has exp_avg, exp_avg_sq, step per parameter
    status = Checkpoint(model=model, optimizer=optimizer).read(path).expect_partial()
    monkeypatch.setattr(load_status, "list_objects", _no_walk)
    with pytest.raises(AssertionError, match=r"Found 6 Python objects that were not bound"):
        status.assert_existing_objects_matched()
    monkeypatch.undo()
    walked = Checkpoint(model=model, optimizer=optimizer).read(path).expect_partial()
    walked._bound_structure = lambda: None  # type: ignore[method-assign]  # the walk answers
    with pytest.raises(AssertionError, match=r"Found 6 Python objects that were not bound"):
        walked.assert_existing_objects_matched()


# -- optimizer state adapters, made in one batch -----------------------------------------------


def test_b8_optimizer_state_that_does_not_fit_is_named_by_its_parameter(tmp_path):
    saved_model, saved_optimizer = _trained(1)
    path = Checkpoint(model=saved_model, optimizer=saved_optimizer).write(tmp_path / "ckpt")
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(3)))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    # The live state of one parameter has another shape: the restore refuses it, by name.
    last = model[2].bias
    optimizer.state[last]["exp_avg"] = torch.zeros(5)
    with pytest.raises(
        InvalidArgumentError, match=r"AdamW state 'exp_avg' of parameter '2\.bias'"
    ):
        Checkpoint(model=model, optimizer=optimizer).read(path)


def test_optimizer_state_adapters_are_made_once_and_kept(monkeypatch):
    import trackpoint.integrations.torch_optim as torch_optim

    model, optimizer = _trained(0)
    calls = []
    real = torch_optim.to_trackables
    monkeypatch.setattr(
        torch_optim, "to_trackables", lambda values: calls.append(len(values)) or real(values)
    )
    adapter = to_trackable(optimizer)
    params = list(model.parameters())
    slots = {(name, i): adapter.get_slot(p, name) for i, p in enumerate(params)
             for name in ("exp_avg", "exp_avg_sq", "step")}
    assert calls == [3 * len(params)]  # every state tensor adapted in one call
    assert all(slot is not None for slot in slots.values())
    for (name, i), slot in slots.items():
        assert slot.tensor is optimizer.state[params[i]][name]
        assert adapter.get_slot(params[i], name) is slot  # kept
    # New state after that is adapted as it is met, one at a time.
    optimizer.state[params[0]]["exp_avg"] = torch.zeros_like(params[0])
    fresh = adapter.get_slot(params[0], "exp_avg")
    assert fresh is not slots[("exp_avg", 0)]
    assert fresh.tensor is optimizer.state[params[0]]["exp_avg"]
    assert calls == [3 * len(params)]
