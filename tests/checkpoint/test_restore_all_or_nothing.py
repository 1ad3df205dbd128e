"""A failed restore changes nothing, on every restore path (issue: one transactional engine).

Each test damages one planned value (flipped bytes: crc32c; a shape that does not fit; a
missing key) and checks every live object, optimizer state included, is exactly as before.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

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


# -- issue 27, finding 1: the checkpoint's own values (save_counter) are in the one plan ----------

COUNTER = "save_counter" + VV


def _saved_twice(directory: Path) -> tuple[str, dict[str, np.ndarray]]:
    """A checkpoint ``ckpt-2`` of two arrays and a tp.Variable, numbered by save()."""
    values = {"a": np.full(3, 1.0), "b": np.full((2, 2), 2.0, np.float32)}
    ckpt = tp.Checkpoint(**values, step=Variable(np.int64(7)))
    ckpt.save(str(directory / "ckpt"))
    return ckpt.save(str(directory / "ckpt")), values


def _fresh(layout: str) -> tuple[tp.Checkpoint, dict[str, np.ndarray], Variable]:
    live = {"a": np.zeros(3), "b": np.zeros((2, 2), np.float32)}
    step = Variable(np.int64(0))
    if layout == "root":
        root = AutoTrackable()
        root.a, root.b, root.step = live["a"], live["b"], step
        return tp.Checkpoint(root), live, step
    return tp.Checkpoint(**live, step=step), live, step


def _restore_by(how: str, ckpt: tp.Checkpoint, prefix: str) -> None:
    if how == "restore":
        ckpt.restore(prefix)
    elif how == "read":
        ckpt.read(prefix)
    else:
        tp.CheckpointManager(ckpt, str(Path(prefix).parent), max_to_keep=3).restore_or_initialize()


def _assert_saves_and_restores_normally(ckpt: tp.Checkpoint, directory: Path, good: str) -> None:
    """The Checkpoint that saw a failed restore still numbers, saves and restores."""
    assert int(ckpt.save_counter.numpy()) == 0
    first = ckpt.save(str(directory / "again"))
    assert first.endswith("again-1")
    ckpt.restore(good).assert_consumed()
    assert int(ckpt.save_counter.numpy()) == 2
    assert ckpt.save(str(directory / "again")).endswith("again-3")


@pytest.mark.parametrize("layout", ["children", "root"])
@pytest.mark.parametrize("how", ["restore", "read", "manager"])
def test_damaged_save_counter_fails_the_restore_before_any_object_changes(
    tmp_path, corrupt, how, layout
):
    good, values = _saved_twice(tmp_path / "good")
    damaged, _ = _saved_twice(tmp_path / "damaged")
    corrupt(damaged, COUNTER)
    ckpt, live, step = _fresh(layout)
    before = snapshot(live)
    with pytest.raises(DataLossError, match="save_counter"):
        _restore_by(how, ckpt, damaged)  # read() too: it fails now, not at the next save
    assert_unchanged(live, before)
    assert int(step.numpy()) == 0
    _assert_saves_and_restores_normally(ckpt, tmp_path / "other", good)
    assert_unchanged(values, {k: live[k] for k in values})  # the good restore gave the values
    assert int(step.numpy()) == 7


@pytest.mark.parametrize("failure", ["damaged value", "shape", "progress"])
def test_checkpoint_saves_and_restores_normally_after_any_failed_restore(
    tmp_path, corrupt, failure
):
    good, _ = _saved_twice(tmp_path / "good")
    bad, _ = _saved_twice(tmp_path / "bad")
    ckpt, live, step = _fresh("children")
    options = None
    if failure == "damaged value":
        corrupt(bad, "a" + VV)
    elif failure == "shape":
        ckpt.b = np.zeros(5, np.float32)
    else:
        def refuse(event: tp.ProgressEvent) -> None:
            raise RuntimeError(f"refused at {event.phase}")

        options = tp.CheckpointOptions(progress=refuse)
    with pytest.raises((CheckpointError, RuntimeError)):
        ckpt.restore(bad, options)
    if failure == "shape":
        ckpt.b = live["b"]
    assert (live["a"] == 0).all() and int(step.numpy()) == 0
    _assert_saves_and_restores_normally(ckpt, tmp_path / "other", good)


def test_read_verifies_the_counter_and_a_later_save_continues_from_it(tmp_path):
    good, _ = _saved_twice(tmp_path / "good")
    ckpt, live, _ = _fresh("children")
    ckpt.read(good).assert_existing_objects_matched()
    np.testing.assert_array_equal(live["a"], np.full(3, 1.0))
    assert int(ckpt.save_counter.numpy()) == 2  # created from the value the read verified
    assert ckpt.save(str(tmp_path / "next" / "ckpt")).endswith("ckpt-3")


def test_a_write_checkpoint_after_a_read_keeps_the_read_counter(tmp_path):
    """B4 for the counter: a later restore without one leaves the earlier one's value."""
    good, _ = _saved_twice(tmp_path / "good")
    written = tp.Checkpoint(a=np.ones(3)).write(str(tmp_path / "written"))
    ckpt = tp.Checkpoint(a=np.zeros(3))
    ckpt.read(good).expect_partial()
    ckpt.restore(written).assert_consumed()
    assert int(ckpt.save_counter.numpy()) == 2


def test_name_based_checkpoint_with_damaged_save_counter_changes_nothing(tmp_path, corrupt):
    """A TF1-style checkpoint (no object graph) whose ``save_counter`` key is damaged."""

    class Holder:
        def __init__(self, value: np.ndarray) -> None:
            self.value = value

    prefix = str(tmp_path / "tf1")
    MultiDeviceSaver({
        Holder(np.ones(3)): {"w": np.full(3, 4.0)},
        Holder(np.int64(5)): {"save_counter": np.int64(5)},
    }).save(prefix)
    corrupt(prefix, "save_counter")
    w = Variable(np.zeros(3), name="w")
    ckpt = tp.Checkpoint(w=w)
    with pytest.raises(DataLossError, match="save_counter"):
        ckpt.restore(prefix)
    assert (w.numpy() == 0).all()
    assert int(ckpt.save_counter.numpy()) == 0
    assert ckpt.save(str(tmp_path / "ckpt")).endswith("ckpt-1")
    good = str(tmp_path / "tf1-good")
    MultiDeviceSaver({
        Holder(np.ones(3)): {"w": np.full(3, 4.0)},
        Holder(np.int64(5)): {"save_counter": np.int64(5)},
    }).save(good)
    ckpt2 = tp.Checkpoint(w=Variable(np.zeros(3), name="w"))
    ckpt2.restore(good)
    assert int(ckpt2.save_counter.numpy()) == 5
    np.testing.assert_array_equal(ckpt2.w.numpy(), np.full(3, 4.0))


# -- issue 27, finding 8: callbacks and the apply step cannot leave a half-applied restore -------


@pytest.mark.parametrize("at", ["first", "last"])
def test_progress_callback_that_raises_on_a_read_event_changes_nothing(saved, at):
    prefix, _ = saved

    def callback(event: tp.ProgressEvent) -> None:
        if event.phase == "read" and (at == "first" or event.bytes_done == event.bytes_total):
            raise RuntimeError(f"callback refused at {event.bytes_done} bytes")

    live = fresh_values()
    before = snapshot(live)
    ckpt = tp.Checkpoint(**live)
    with pytest.raises(RuntimeError, match="callback refused"):
        ckpt.restore(prefix, tp.CheckpointOptions(progress=callback))
    assert_unchanged(live, before)
    assert int(ckpt.save_counter.numpy()) == 0


def test_progress_callback_that_raises_on_the_last_event_does_not_fail_the_restore(
    saved, caplog
):
    """Issue 27 finding 8: "restored" comes once every value is applied; what its callback
    raises then is logged, since failing would mean a restore that raised and changed all."""
    prefix, values = saved

    def callback(event: tp.ProgressEvent) -> None:
        if event.phase == "restored":
            raise RuntimeError("callback refused the last event")

    live = fresh_values()
    ckpt = tp.Checkpoint(**live)
    with caplog.at_level("ERROR", logger="trackpoint.checkpoint"):
        ckpt.restore(prefix, tp.CheckpointOptions(progress=callback)).assert_consumed()
    assert_unchanged(live, values)
    assert "callback refused the last event" in caplog.text
    assert "restore is complete" in caplog.text


def test_read_events_come_before_the_first_change_and_restored_after_the_last(saved):
    """The contract: "read" events fire while every object still holds its old value (a
    callback raising there fails the restore, nothing changed); "restored" fires once every
    object has its new value."""
    prefix, values = saved
    live = fresh_values()
    seen: list[tuple[str, bool, bool]] = []

    def callback(event: tp.ProgressEvent) -> None:
        old = all((value == -1).all() for value in live.values())
        new = all((live[name] == values[name]).all() for name in live)
        seen.append((event.phase, old, new))

    tp.Checkpoint(**live).read(prefix, tp.CheckpointOptions(progress=callback)).assert_consumed()
    assert [phase for phase, _, _ in seen] == ["read"] * len(values) + ["restored"]
    assert all(old for phase, old, _ in seen if phase == "read")
    assert seen[-1][2]


@pytest.mark.parametrize("kind", ["expanded", "inference", "readonly numpy", "dtype"])
def test_apply_is_validated_before_the_first_write(tmp_path, kind):
    """Targets that would refuse the copy are refused while checking, before any change."""
    torch = pytest.importorskip("torch")
    prefix = tp.Checkpoint(a=np.ones(3), z=np.arange(3, dtype=np.float32)).write(
        str(tmp_path / "ckpt")
    )
    a = np.zeros(3)
    if kind == "expanded":  # three elements, one memory location: copy_ refuses
        z: Any = torch.zeros(1).expand(3)
    elif kind == "inference":  # in-place updates outside inference mode are refused
        with torch.inference_mode():
            z = torch.zeros(3)
    elif kind == "readonly numpy":
        z = np.zeros(3, np.float32)
        z.flags.writeable = False
    else:
        z = torch.zeros(3, dtype=torch.float64)  # no cast on restore
    with pytest.raises(InvalidArgumentError, match=r"(?s)\(root\)\.z.*Nothing was restored"):
        tp.Checkpoint(a=a, z=z).read(prefix)
    assert (a == 0).all()
    assert (np.asarray(z) == 0).all()


def test_an_interrupt_during_apply_is_delivered_after_the_whole_apply(tmp_path):
    """A SIGINT arriving mid-apply cannot leave half the objects restored: it is raised once
    every object has its value."""
    import signal

    class Interrupting(AutoTrackable):
        def __init__(self) -> None:
            self.seen = np.zeros(2)

        def _serialize_to_tensors(self):
            return {"VARIABLE_VALUE": self.seen}

        def _prepare_restore(self, restored):
            saved = np.array(restored["VARIABLE_VALUE"])

            def apply() -> None:
                signal.raise_signal(signal.SIGINT)  # Ctrl-C, now
                self.seen[...] = saved

            return apply

    first = Interrupting()
    first.seen[...] = 3.0
    prefix = tp.Checkpoint(a_first=first, z=np.full(4, 5.0)).write(str(tmp_path / "ckpt"))
    target, z = Interrupting(), np.zeros(4)
    with pytest.raises(KeyboardInterrupt):
        tp.Checkpoint(a_first=target, z=z).read(prefix)
    np.testing.assert_array_equal(target.seen, [3.0, 3.0])
    np.testing.assert_array_equal(z, np.full(4, 5.0))


def test_registered_saver_refusing_its_objects_changes_nothing(tmp_path):
    """A strict predicate that rejects an object is known before the apply: nothing changes."""

    class Store(AutoTrackable):
        pass

    class NotAStore(AutoTrackable):
        pass

    tp.register_checkpoint_saver(
        name="AllOrNothingStrictStore", predicate=lambda obj: isinstance(obj, Store),
        save_fn=lambda trackables, file_prefix: [],
        restore_fn=lambda trackables, merged_prefix: None,
    )
    prefix = tp.Checkpoint(s=Store(), v=np.ones(2)).write(str(tmp_path / "ckpt"))
    live = np.zeros(2)
    with pytest.raises(InvalidArgumentError, match="predicate"):
        tp.Checkpoint(s=NotAStore(), v=live).read(prefix)
    assert (live == 0).all()


@pytest.mark.parametrize("how", ["restore", "read"])
def test_damaged_save_counter_fails_a_replayed_read_too(tmp_path, corrupt, how):
    """A second read of the same object graph replays the first one's walk (checkpoint/replay.py):
    the counter is planned there too, so the damage is found before any object changes."""
    good, values = _saved_twice(tmp_path / "good")
    damaged, _ = _saved_twice(tmp_path / "damaged")
    corrupt(damaged, COUNTER)
    ckpt, live, step = _fresh("children")
    ckpt.read(good).expect_partial()  # the walk is kept; the counter is not created
    ckpt.read(good).expect_partial()  # replayed
    for value in live.values():
        value[...] = -5
    before = snapshot(live)
    with pytest.raises(DataLossError, match="save_counter"):
        _restore_by(how, ckpt, damaged)
    assert_unchanged(live, before)
    assert int(ckpt.save_counter.numpy()) == 2  # the good read's counter, kept
    assert ckpt.save(str(tmp_path / "next" / "ckpt")).endswith("ckpt-3")
