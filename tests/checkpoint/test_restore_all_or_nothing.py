"""A failed restore changes nothing, on every restore path (issue: one transactional engine).

Each test damages one planned value (flipped bytes: crc32c; a shape that does not fit; a
missing key) and checks every live object, optimizer state included, is exactly as before.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trackpoint as tp
from trackpoint.errors import CheckpointError, DataLossError, InvalidArgumentError
from trackpoint.saving import MultiDeviceSaver
from trackpoint.tracking import AutoTrackable, Variable

VV = "/.ATTRIBUTES/VARIABLE_VALUE"



def snapshot(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: value.copy() for name, value in values.items()}


def assert_unchanged(values: dict[str, np.ndarray], before: dict[str, np.ndarray]) -> None:
    for name, value in values.items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


@pytest.fixture
def saved(tmp_path: Path) -> tuple[str, dict[str, np.ndarray]]:
    values = {f"v{i}": np.full((3, 4), float(i), np.float32) for i in range(6)}
    prefix = tp.Checkpoint(**values).write(str(tmp_path / "ckpt"))
    return prefix, values


def fresh_values() -> dict[str, np.ndarray]:
    return {f"v{i}": np.full((3, 4), -1.0, np.float32) for i in range(6)}


def progress_options() -> tp.CheckpointOptions:
    return tp.CheckpointOptions(progress=lambda event: None)


@pytest.mark.parametrize("options", [None, "progress"])
@pytest.mark.parametrize("damaged", [0, 3, 5])
def test_damaged_value_changes_nothing(saved, options, damaged, corrupt):
    prefix, _ = saved
    corrupt(prefix, f"v{damaged}{VV}")
    live = fresh_values()
    before = snapshot(live)
    opts = progress_options() if options == "progress" else None
    with pytest.raises(DataLossError):
        tp.Checkpoint(**live).read(prefix, opts)
    assert_unchanged(live, before)


def test_shape_mismatch_in_a_later_object_changes_nothing(saved):
    prefix, _ = saved
    live = fresh_values()
    live["v4"] = np.zeros((4, 3), np.float32)  # does not fit: a later object of the walk
    before = snapshot(live)
    with pytest.raises(InvalidArgumentError, match=r"v4.*Nothing was restored"):
        tp.Checkpoint(**live).read(prefix)
    assert_unchanged(live, before)


def test_sliced_values_are_verified_before_any_change(tmp_path, corrupt):
    """Partitioned values (read as slices) go through the same verify-then-apply engine."""

    class Partitioned(AutoTrackable):
        def __init__(self, full: np.ndarray) -> None:
            self.full = full

        def _serialize_to_tensors(self):
            shape = "4 2"
            return {"VARIABLE_VALUE": {
                f"{shape} 0,2:-": self.full[:2], f"{shape} 2,2:-": self.full[2:],
            }}

        def _prepare_restore(self, restored):
            parts = restored["VARIABLE_VALUE"]
            top, bottom = (np.asarray(v) for v in parts.values())

            def apply() -> None:
                self.full[:2] = top
                self.full[2:] = bottom

            return apply

    saved_full = np.arange(8, dtype=np.float32).reshape(4, 2)
    other = np.ones(3, np.float32)
    prefix = tp.Checkpoint(p=Partitioned(saved_full.copy()), other=other).write(
        str(tmp_path / "ckpt")
    )
    corrupt(prefix, f"other{VV}")
    target = Partitioned(np.zeros((4, 2), np.float32))
    other_live = np.zeros(3, np.float32)
    with pytest.raises(DataLossError):
        tp.Checkpoint(p=target, other=other_live).read(prefix)
    assert (target.full == 0).all() and (other_live == 0).all()
    # Undamaged, both restore.
    prefix = tp.Checkpoint(p=Partitioned(saved_full.copy()), other=other).write(
        str(tmp_path / "ok")
    )
    tp.Checkpoint(p=target, other=other_live).read(prefix).assert_consumed()
    np.testing.assert_array_equal(target.full, saved_full)


def test_deferred_restore_is_all_or_nothing_for_the_attached_object(tmp_path):
    root = AutoTrackable()
    root.child = AutoTrackable()
    root.child.a = Variable(np.ones(2, np.float32))
    root.child.b = Variable(np.full(3, 2.0, np.float32))
    prefix = tp.Checkpoint(root=root).write(str(tmp_path / "ckpt"))

    new_root = AutoTrackable()
    status = tp.Checkpoint(root=new_root).read(prefix)
    child = AutoTrackable()
    child.a = Variable(np.zeros(2, np.float32))
    child.b = Variable(np.zeros(4, np.float32))  # wrong shape: attaching must fail
    with pytest.raises(InvalidArgumentError):
        new_root.child = child
    assert (child.a.numpy() == 0).all() and (child.b.numpy() == 0).all()
    # A fitting object attached afterwards still gets the values (the failed try left no trace).
    good = AutoTrackable()
    good.a = Variable(np.zeros(2, np.float32))
    good.b = Variable(np.zeros(3, np.float32))
    new_root.child = good
    np.testing.assert_array_equal(good.a.numpy(), [1, 1])
    np.testing.assert_array_equal(good.b.numpy(), [2, 2, 2])
    status.assert_existing_objects_matched()


def test_multi_device_saver_restore_is_all_or_nothing(tmp_path):
    class Holder:
        def __init__(self, value: np.ndarray) -> None:
            self.value = value

        def _prepare_restore(self, restored):
            saved = np.asarray(restored["VARIABLE_VALUE"])
            if saved.shape != self.value.shape:
                raise InvalidArgumentError(f"shape {saved.shape} != {self.value.shape}")
            return lambda: np.copyto(self.value, saved)

    a, b = Holder(np.ones(2)), Holder(np.full(3, 2.0))
    prefix = str(tmp_path / "ckpt")
    MultiDeviceSaver({a: {f"a{VV}": a.value}, b: {f"b{VV}": b.value}}).save(prefix)
    a2, b2 = Holder(np.zeros(2)), Holder(np.zeros(4))
    with pytest.raises(InvalidArgumentError):
        MultiDeviceSaver({a2: {f"a{VV}": a2.value}, b2: {f"b{VV}": b2.value}}).restore(prefix)
    assert (a2.value == 0).all() and (b2.value == 0).all()


def test_registered_saver_runs_only_after_every_value_verified(tmp_path, corrupt):
    calls: list[str] = []

    class Table(AutoTrackable):
        pass

    def save_fn(trackables, file_prefix):
        calls.append("save")
        return []

    def restore_fn(trackables, merged_prefix):
        calls.append("restore")

    tp.register_checkpoint_saver(
        name="AllOrNothingTable", predicate=lambda obj: isinstance(obj, Table),
        save_fn=save_fn, restore_fn=restore_fn,
    )
    prefix = tp.Checkpoint(t=Table(), v=np.ones(2, np.float32)).write(str(tmp_path / "ckpt"))
    corrupt(prefix, f"v{VV}")
    with pytest.raises(DataLossError):
        tp.Checkpoint(t=Table(), v=np.zeros(2, np.float32)).read(prefix)
    assert calls == ["save"]  # the user's restore_fn never ran on a damaged checkpoint


def test_optimizer_state_is_untouched_by_a_failed_restore(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    path = tp.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ckpt"))

    other = torch.nn.Linear(4, 5)
    other_opt = torch.optim.Adam(other.parameters())
    weight = other.weight.detach().clone()
    with pytest.raises(InvalidArgumentError):
        tp.Checkpoint(model=other, optimizer=other_opt).restore(path)
    assert len(other_opt.state) == 0  # no Adam state of the wrong shape was put in
    assert torch.equal(other.weight, weight)
    other(torch.randn(2, 4)).sum().backward()
    other_opt.step()  # the optimizer still works

    # The matching model restores its optimizer state, created from the checkpoint.
    same = torch.nn.Linear(4, 3)
    same_opt = torch.optim.Adam(same.parameters())
    tp.Checkpoint(model=same, optimizer=same_opt).restore(path).assert_consumed()
    for param, twin in zip(model.parameters(), same.parameters()):
        assert torch.equal(opt.state[param]["exp_avg"], same_opt.state[twin]["exp_avg"])


def test_optimizer_param_group_sizes_are_checked_before_any_change(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    opt = torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.5
    )
    path = tp.Checkpoint(model=model, optimizer=opt).write(str(tmp_path / "ckpt"))
    twin = copy.deepcopy(model)
    for p in twin.parameters():
        torch.nn.init.zeros_(p)
    merged = torch.optim.SGD(twin.parameters(), lr=0.1)  # one group instead of two
    with pytest.raises(InvalidArgumentError, match="groups"):
        tp.Checkpoint(model=twin, optimizer=merged).read(path)
    assert all((p == 0).all() for p in twin.parameters())  # model values untouched too
    assert merged.param_groups[0]["lr"] == 0.1


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    count=st.integers(2, 12),
    data=st.data(),
)
def test_random_injected_failures_never_change_any_object(tmp_path_factory, count, data, corrupt):
    """Property: whatever planned value fails, and however, no live object changes."""
    root = tmp_path_factory.mktemp("prop")
    shapes = [tuple(data.draw(st.lists(st.integers(1, 4), min_size=0, max_size=2)))
              for _ in range(count)]
    values = {f"x{i}": np.full(shape, float(i + 1), np.float64) for i, shape in enumerate(shapes)}
    prefix = tp.Checkpoint(**values).write(str(root / "ckpt"))
    victim = data.draw(st.integers(0, count - 1))
    how = data.draw(st.sampled_from(["crc", "shape", "dtype"]))
    live = {name: np.zeros_like(value) for name, value in values.items()}
    name = f"x{victim}"
    if how == "crc" and values[name].size:
        corrupt(prefix, f"{name}{VV}")
    elif how == "dtype":
        live[name] = np.zeros(values[name].shape, np.float32)
    else:
        live[name] = np.zeros((*values[name].shape, 2))
    before = snapshot(live)
    with pytest.raises(CheckpointError):
        tp.Checkpoint(**live).read(prefix)
    assert_unchanged(live, before)


def test_optimizer_parameter_outside_the_checkpoint_fails_the_save(tmp_path):
    """Nothing reachable is silently dropped: an optimizer's parameter the root does not reach
    would lose its value and its Adam state; the save names it instead."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 3)
    extra = torch.nn.Parameter(torch.ones(5))
    opt = torch.optim.Adam(list(model.parameters()) + [extra])
    (model(torch.randn(2, 4)).sum() + extra.sum()).backward()
    opt.step()
    prefix = str(tmp_path / "ckpt")
    with pytest.raises(InvalidArgumentError, match=r"parameter 2 of param_groups\[0\] \(shape"):
        tp.Checkpoint(model=model, optimizer=opt).write(prefix)
    assert not Path(f"{prefix}.index").exists()
    # The fix the message names: make the parameter reachable; it then round-trips.
    path = tp.Checkpoint(model=model, optimizer=opt, extra=extra).write(prefix)
    model2, extra2 = torch.nn.Linear(4, 3), torch.nn.Parameter(torch.zeros(5))
    opt2 = torch.optim.Adam(list(model2.parameters()) + [extra2])
    tp.Checkpoint(model=model2, optimizer=opt2, extra=extra2).read(path).assert_consumed()
    assert torch.equal(extra2, extra)
    assert torch.equal(opt2.state[extra2]["exp_avg"], opt.state[extra]["exp_avg"])
