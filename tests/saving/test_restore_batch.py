"""The value phase: alike objects as a ``RestoreBatch`` among other items, grouped by class.

A restore of 100,000 variables hands them to ``restore_items`` as columns of keys. The rules of
every restore hold for them as for items (trackpoint/saving/restore.py): a missing key fails
before any object changes, and names the object; a damaged value or one that does not fit
changes nothing; objects of one class are checked in one ``_prepare_restores`` call and applied
in walk order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.bundle.reader import BundleReader
from trackpoint.errors import DataLossError, InvalidArgumentError, NotFoundError
from trackpoint.saving.restore import RestoreBatch, RestoreItem, restore_items
from trackpoint.tracking import Trackable, Variable

VV = "/.ATTRIBUTES/VARIABLE_VALUE"


class Recorder(Trackable):
    """An object with one value that records when its value was applied."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name, self.value = log, name, np.zeros(2, np.float32)

    def _serialize_to_tensors(self) -> dict[str, Any]:
        return {"VARIABLE_VALUE": self.value}

    def _prepare_restore(self, restored: Mapping[str, Any]) -> Callable[[], None]:
        saved = np.array(restored["VARIABLE_VALUE"])

        def apply() -> None:
            self.log.append(self.name)
            self.value = saved

        return apply


@pytest.fixture
def prefix(tmp_path: Path) -> str:
    saved = {f"v{i}": np.full(2, float(i), np.float32) for i in range(4)}
    return tp.Checkpoint(**saved).write(str(tmp_path / "ckpt"))


def batch(variables: list[Variable], keys: list[str], position: int = 0) -> list[RestoreBatch]:
    label = "(root).var{}".format
    return [RestoreBatch(variables, ("VARIABLE_VALUE",), [keys], label, position)]


def zeros(count: int) -> list[Variable]:
    return [Variable(np.zeros(2, np.float32)) for _ in range(count)]


def test_variables_and_items_restore_in_walk_order(prefix):
    log: list[str] = []
    first, second = Recorder(log, "first"), Recorder(log, "second")
    variables = zeros(3)
    items = [
        RestoreItem(first, {"VARIABLE_VALUE": "v0" + VV}, "(root).first"),
        RestoreItem(second, {"VARIABLE_VALUE": "v3" + VV}, "(root).second"),
    ]
    keys = ["v1" + VV, "v2" + VV, "v3" + VV]
    with BundleReader(prefix) as reader:
        restore_items(items, reader, batches=batch(variables, keys, 1))
    for variable, expected in zip(variables, (1.0, 2.0, 3.0)):
        np.testing.assert_array_equal(variable.array, expected)
    np.testing.assert_array_equal(first.value, 0.0)
    np.testing.assert_array_equal(second.value, 3.0)
    assert log == ["first", "second"]


def test_overlapping_variables_apply_in_order(prefix):
    memory = np.zeros(2, np.float32)
    whole, part = Variable.wrap(memory), Variable.wrap(memory[:])  # one memory, two objects
    with BundleReader(prefix) as reader:
        restore_items([], reader, batches=batch([whole, part], ["v1" + VV, "v2" + VV]))
    np.testing.assert_array_equal(memory, 2.0)  # the later one wins, as the walk met them


def test_missing_key_names_the_variable_and_changes_nothing(prefix):
    variables = zeros(2)
    with BundleReader(prefix) as reader, pytest.raises(NotFoundError, match=r"\(root\).var1"):
        restore_items([], reader, batches=batch(variables, ["v0" + VV, "nope" + VV]))
    assert not any(variable.array.any() for variable in variables)


def test_missing_key_wins_over_a_damaged_value(prefix, corrupt):
    corrupt(prefix, "v0" + VV)
    variables = zeros(2)
    with BundleReader(prefix) as reader, pytest.raises(NotFoundError):
        restore_items([], reader, batches=batch(variables, ["v0" + VV, "nope" + VV]))
    with BundleReader(prefix) as reader, pytest.raises(DataLossError):
        restore_items([], reader, batches=batch(variables, ["v0" + VV, "v1" + VV]))
    assert not any(variable.array.any() for variable in variables)


def test_missing_key_of_an_item_among_variables(prefix):
    log: list[str] = []
    item = RestoreItem(Recorder(log, "item"), {"VARIABLE_VALUE": "gone" + VV}, "(root).item")
    variables = zeros(2)
    with BundleReader(prefix) as reader, pytest.raises(NotFoundError, match=r"\(root\).item"):
        restore_items([item], reader, batches=batch(variables, ["v1" + VV, "v2" + VV], 1))
    assert not log and not any(variable.array.any() for variable in variables)


def test_value_that_does_not_fit_names_object_and_key(prefix):
    variables = [Variable(np.zeros(2, np.float32)), Variable(np.zeros(5, np.float32))]
    with (
        BundleReader(prefix) as reader,
        pytest.raises(InvalidArgumentError, match=r"incompatible.*\(root\).var1.*v2/"),
    ):
        restore_items([], reader, batches=batch(variables, ["v1" + VV, "v2" + VV]))
    assert not any(variable.array.any() for variable in variables)


def test_read_only_and_string_variables_take_the_checked_path(tmp_path):
    prefix = tp.Checkpoint(
        s=Variable(np.array([b"ab", b"c"], dtype=object)), n=np.ones(2, np.float32)
    ).write(str(tmp_path / "ckpt"))
    text = Variable(np.array([b"", b""], dtype=object))
    frozen = np.zeros(2, np.float32)
    frozen.flags.writeable = False
    with BundleReader(prefix) as reader:
        restore_items([], reader, batches=batch([text], ["s" + VV]))
        with pytest.raises(InvalidArgumentError, match="read-only"):
            restore_items([], reader, batches=batch([Variable.wrap(frozen)], ["n" + VV]))
    assert list(text.array) == [b"ab", b"c"]


def test_progress_reads_the_batch_value_by_value(prefix):
    events: list[str] = []
    variables = zeros(2)
    with BundleReader(prefix) as reader:
        restore_items(
            [],
            reader,
            progress=lambda event: events.append(event.phase),
            batches=batch(variables, ["v2" + VV, "v3" + VV]),
        )
    assert events and set(events) == {"read"}
    np.testing.assert_array_equal(variables[1].array, 3.0)


class Counted(Recorder):
    """A Recorder whose class counts its ``_prepare_restores`` calls."""

    calls: list[int] = []

    @classmethod
    def _prepare_restores(cls, trackables, restored, on_error):  # type: ignore[no-untyped-def]
        cls.calls.append(len(trackables))
        return super()._prepare_restores(trackables, restored, on_error)


def test_items_of_one_class_are_prepared_in_one_call_before_any_apply(prefix):
    log: list[str] = []
    items = [
        RestoreItem(Counted(log, f"c{i}"), {"VARIABLE_VALUE": f"v{i}" + VV}, f"(root).c{i}")
        for i in range(3)
    ]
    items.insert(1, RestoreItem(Recorder(log, "r"), {"VARIABLE_VALUE": "v3" + VV}, "(root).r"))
    Counted.calls.clear()
    with BundleReader(prefix) as reader:
        restore_items(items, reader, batches=batch(zeros(1), ["v1" + VV], 2))
    assert Counted.calls == [3]
    assert log == ["c0", "c1", "c2", "r"]  # classes in the order first met; walk order within


def test_a_check_failing_in_a_later_class_applies_nothing(prefix):
    log: list[str] = []
    variables = zeros(2)
    bad = Variable(np.zeros(5, np.float32))  # another shape, in an item after the batch
    items = [
        RestoreItem(Recorder(log, "r"), {"VARIABLE_VALUE": "v3" + VV}, "(root).r"),
        RestoreItem(bad, {"VARIABLE_VALUE": "v2" + VV}, "(root).bad"),
    ]
    with (
        BundleReader(prefix) as reader,
        pytest.raises(InvalidArgumentError, match=r"\(root\)\.bad.*v2/"),
    ):
        restore_items(items, reader, batches=batch(variables, ["v0" + VV, "v1" + VV], 0))
    assert not log and not any(variable.array.any() for variable in variables)
