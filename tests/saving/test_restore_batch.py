"""The value phase's bulk path: plain variables as a ``VariableBatch`` among other items.

A restore of 100,000 variables hands them to ``restore_items`` as parallel lists. The rules of
every restore hold for them as for items (trackpoint/saving/restore.py): a missing key fails
before any object changes, and names the object; a damaged value or one that does not fit
changes nothing; values are read, checked and applied in walk order, items among variables.
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
from trackpoint.saving.restore import RestoreItem, VariableBatch, restore_items
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


def batch(variables: list[Variable], keys: list[str], positions: list[int]) -> VariableBatch:
    return VariableBatch(variables, keys, positions, lambda i: f"(root).var{i}")


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
        restore_items(items, reader, variables=batch(variables, keys, [1, 3]))
    for variable, expected in zip(variables, (1.0, 2.0, 3.0)):
        np.testing.assert_array_equal(variable.array, expected)
    np.testing.assert_array_equal(first.value, 0.0)
    np.testing.assert_array_equal(second.value, 3.0)
    assert log == ["first", "second"]


def test_overlapping_variables_apply_in_order(prefix):
    memory = np.zeros(2, np.float32)
    whole, part = Variable.wrap(memory), Variable.wrap(memory[:])  # one memory, two objects
    with BundleReader(prefix) as reader:
        restore_items([], reader, variables=batch([whole, part], ["v1" + VV, "v2" + VV], []))
    np.testing.assert_array_equal(memory, 2.0)  # the later one wins, as the walk met them


def test_missing_key_names_the_variable_and_changes_nothing(prefix):
    variables = zeros(2)
    with BundleReader(prefix) as reader, pytest.raises(NotFoundError, match=r"\(root\).var1"):
        restore_items([], reader, variables=batch(variables, ["v0" + VV, "nope" + VV], []))
    assert not any(variable.array.any() for variable in variables)


def test_missing_key_wins_over_a_damaged_value(prefix, corrupt):
    corrupt(prefix, "v0" + VV)
    variables = zeros(2)
    with BundleReader(prefix) as reader, pytest.raises(NotFoundError):
        restore_items([], reader, variables=batch(variables, ["v0" + VV, "nope" + VV], []))
    with BundleReader(prefix) as reader, pytest.raises(DataLossError):
        restore_items([], reader, variables=batch(variables, ["v0" + VV, "v1" + VV], []))
    assert not any(variable.array.any() for variable in variables)


def test_missing_key_of_an_item_among_variables(prefix):
    log: list[str] = []
    item = RestoreItem(Recorder(log, "item"), {"VARIABLE_VALUE": "gone" + VV}, "(root).item")
    variables = zeros(2)
    with BundleReader(prefix) as reader, pytest.raises(NotFoundError, match=r"\(root\).item"):
        restore_items([item], reader, variables=batch(variables, ["v1" + VV, "v2" + VV], [1]))
    assert not log and not any(variable.array.any() for variable in variables)


def test_value_that_does_not_fit_names_object_and_key(prefix):
    variables = [Variable(np.zeros(2, np.float32)), Variable(np.zeros(5, np.float32))]
    with (
        BundleReader(prefix) as reader,
        pytest.raises(InvalidArgumentError, match=r"incompatible.*\(root\).var1.*v2/"),
    ):
        restore_items([], reader, variables=batch(variables, ["v1" + VV, "v2" + VV], []))
    assert not any(variable.array.any() for variable in variables)


def test_read_only_and_string_variables_take_the_checked_path(tmp_path):
    prefix = tp.Checkpoint(
        s=Variable(np.array([b"ab", b"c"], dtype=object)), n=np.ones(2, np.float32)
    ).write(str(tmp_path / "ckpt"))
    text = Variable(np.array([b"", b""], dtype=object))
    frozen = np.zeros(2, np.float32)
    frozen.flags.writeable = False
    with BundleReader(prefix) as reader:
        restore_items([], reader, variables=batch([text], ["s" + VV], []))
        with pytest.raises(InvalidArgumentError, match="read-only"):
            restore_items([], reader, variables=batch([Variable.wrap(frozen)], ["n" + VV], []))
    assert list(text.array) == [b"ab", b"c"]


def test_progress_reads_the_batch_value_by_value(prefix):
    events: list[str] = []
    variables = zeros(2)
    with BundleReader(prefix) as reader:
        restore_items(
            [],
            reader,
            progress=lambda event: events.append(event.phase),
            variables=batch(variables, ["v2" + VV, "v3" + VV], []),
        )
    assert events and set(events) == {"read"}
    np.testing.assert_array_equal(variables[1].array, 3.0)
