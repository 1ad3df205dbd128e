"""One way to plan a restore (issue 28): the walk plans alike leaves by what their class
declares (``_whole_value_names``, reached through ``batch_hook``), never by a concrete type, and
the value phase checks every class's objects in one ``_prepare_restores`` call."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking import Trackable, Variable


class Pair(Trackable):
    """Two whole values per object, declared: planned from the checkpoint's attributes."""

    _whole_value_names: ClassVar[tuple[str, ...] | None] = ("a", "b")
    calls: ClassVar[list[int]] = []  # len(trackables) of each _prepare_restores call

    def __init__(self, a: float, b: float) -> None:
        self.a = np.full(2, a)
        self.b = np.full(3, b)

    def _serialize_to_tensors(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b}

    def _prepare_restore(self, restored: Mapping[str, Any]) -> Callable[[], None]:
        a, b = np.asarray(restored["a"]), np.asarray(restored["b"])
        if a.shape != self.a.shape or b.shape != self.b.shape:
            raise InvalidArgumentError(f"shapes {a.shape}, {b.shape} do not fit")

        def apply() -> None:
            self.a[...] = a
            self.b[...] = b

        return apply

    @classmethod
    def _prepare_restores(
        cls,
        trackables: Sequence[Trackable],
        restored: Sequence[Mapping[str, Any]],
        on_error: Callable[[int, InvalidArgumentError], BaseException],
    ) -> Callable[[], None]:
        cls.calls.append(len(trackables))
        return super()._prepare_restores(trackables, restored, on_error)


class Checked(Variable):
    """A variable that checks more: Variable's batch form must not restore it."""

    def _prepare_restore(self, restored_tensors: Mapping[str, Any]) -> Callable[[], None]:
        if np.any(np.asarray(restored_tensors["VARIABLE_VALUE"]) < 0):
            raise InvalidArgumentError("negative values are not allowed here")
        return super()._prepare_restore(restored_tensors)


def _pairs(count: int, scale: float) -> dict[str, Pair]:
    return {f"p{i}": Pair(scale * i, -scale * i) for i in range(count)}


def test_declared_whole_values_restore_in_one_batch_call(tmp_path: Path) -> None:
    prefix = tp.Checkpoint(pairs=_pairs(50, 1.0)).write(str(tmp_path / "ckpt"))
    targets = _pairs(50, 0.0)
    Pair.calls.clear()
    tp.Checkpoint(pairs=targets).read(prefix).assert_consumed()
    assert Pair.calls == [50]  # one call for every object of the class
    for i, pair in enumerate(targets.values()):
        np.testing.assert_array_equal(pair.a, float(i))
        np.testing.assert_array_equal(pair.b, -float(i))


def test_declared_whole_values_replay_restores_new_values(tmp_path: Path) -> None:
    first = tp.Checkpoint(pairs=_pairs(20, 1.0)).write(str(tmp_path / "one"))
    second = tp.Checkpoint(pairs=_pairs(20, 2.0)).write(str(tmp_path / "two"))
    targets = _pairs(20, 0.0)
    holder = tp.Checkpoint(pairs=targets)
    holder.read(first).assert_consumed()
    Pair.calls.clear()
    holder.read(second).assert_consumed()  # the replay of the first read's walk
    assert Pair.calls == [20]
    np.testing.assert_array_equal(targets["p7"].a, 14.0)
    np.testing.assert_array_equal(targets["p7"].b, -14.0)


def test_misfit_in_a_batch_names_object_and_keys_and_changes_nothing(tmp_path: Path) -> None:
    prefix = tp.Checkpoint(pairs=_pairs(10, 1.0)).write(str(tmp_path / "ckpt"))
    targets = _pairs(10, 0.0)
    targets["p6"].b = np.zeros(4)  # another shape
    with pytest.raises(InvalidArgumentError, match=r"pairs\.p6.*pairs/p6/\.ATTRIBUTES/a, "):
        tp.Checkpoint(pairs=targets).read(prefix)
    assert not any(pair.a.any() or pair.b.any() for pair in targets.values())


def test_a_subclass_that_checks_more_is_checked_by_its_own_method(tmp_path: Path) -> None:
    prefix = tp.Checkpoint(v=[Variable([1.0, -1.0]), Variable([2.0, 3.0])]).write(
        str(tmp_path / "ckpt")
    )
    plain, checked = Variable([0.0, 0.0]), Checked([0.0, 0.0])
    with pytest.raises(InvalidArgumentError, match=r"negative values.*\(root\)\.v\.0"):
        tp.Checkpoint(v=[checked, plain]).read(prefix)
    np.testing.assert_array_equal(plain.array, 0.0)
    tp.Checkpoint(v=[plain, Checked([0.0, 0.0])]).read(prefix).assert_consumed()
    np.testing.assert_array_equal(plain.array, [1.0, -1.0])


def test_a_variable_on_a_node_of_another_shape_is_planned_like_any_object(tmp_path: Path) -> None:
    # The saved node has a second attribute: not the declared values, so not a batch leaf.
    class Extra(Trackable):
        def __init__(self) -> None:
            self.value = np.arange(3.0)

        def _serialize_to_tensors(self) -> dict[str, Any]:
            return {"VARIABLE_VALUE": self.value, "extra": np.ones(1)}

    prefix = tp.Checkpoint(x=Extra()).write(str(tmp_path / "ckpt"))
    target = Variable(np.zeros(3))
    status = tp.Checkpoint(x=target).read(prefix)
    np.testing.assert_array_equal(target.array, [0.0, 1.0, 2.0])
    with pytest.raises(AssertionError, match="extra"):
        status.assert_consumed()  # the attribute the variable does not take is reported


def test_a_fresh_checkpoints_counter_is_restored_with_the_variables(tmp_path: Path) -> None:
    saved = {f"w{i}": np.full(2, float(i)) for i in range(30)}
    writer = tp.Checkpoint(state=saved)
    writer.save(str(tmp_path / "ckpt"))
    prefix = writer.save(str(tmp_path / "ckpt"))
    targets = {key: np.zeros(2) for key in saved}
    reader = tp.Checkpoint(state=targets)  # no counter yet: the read makes one (a Variable too)
    reader.read(prefix).assert_consumed()
    assert int(reader.save_counter.numpy()) == 2
    np.testing.assert_array_equal(targets["w29"], 29.0)
