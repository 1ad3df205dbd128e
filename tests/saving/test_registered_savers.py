"""Registered checkpoint savers (semantics G1)."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from trackpoint.bundle.reader import BundleReader
from trackpoint.bundle.writer import BundleWriter
from trackpoint.errors import InvalidArgumentError, NotFoundError
from trackpoint.saving import (
    MultiDeviceSaver,
    get_registered_saver_name,
    register_checkpoint_saver,
    registered_savers,
    unregister_checkpoint_saver,
)


class Table:
    def __init__(self, values: list[float]) -> None:
        self.values = np.array(values, np.float32)


class Other:
    pass


@pytest.fixture(autouse=True)
def clean_registry():  # noqa: ANN201
    before = {s.name for s in registered_savers()}
    yield
    for saver in registered_savers():
        if saver.name not in before:
            unregister_checkpoint_saver(saver.name)


def _noop(objects, prefix) -> None:  # noqa: ANN001
    return None


@pytest.mark.parametrize("name", ["", "a/b", "white space", None, 3])
def test_g1_invalid_names_are_rejected(name) -> None:  # noqa: ANN001
    with pytest.raises(InvalidArgumentError, match="invalid registered saver name"):
        register_checkpoint_saver(name, lambda o: True, _noop, _noop)


@pytest.mark.parametrize("position", [1, 2, 3])
def test_g1_non_callables_are_rejected(position) -> None:  # noqa: ANN001
    args = ["Valid", lambda o: True, _noop, _noop]
    args[position] = "not callable"
    with pytest.raises(InvalidArgumentError, match="must be callable"):
        register_checkpoint_saver(*args)


def test_g1_duplicate_names_are_rejected_and_unregister_works() -> None:
    register_checkpoint_saver("Dup", lambda o: True, _noop, _noop)
    with pytest.raises(InvalidArgumentError, match="'Dup' is already registered"):
        register_checkpoint_saver("Dup", lambda o: False, _noop, _noop)
    unregister_checkpoint_saver("Dup")
    register_checkpoint_saver("Dup", lambda o: True, _noop, _noop)
    with pytest.raises(NotFoundError):
        unregister_checkpoint_saver("Never")


def test_g1_predicate_lookup_prefers_later_registrations() -> None:
    register_checkpoint_saver("General", lambda o: isinstance(o, (Table, Other)), _noop, _noop)
    register_checkpoint_saver("Specific", lambda o: isinstance(o, Table), _noop, _noop)
    assert get_registered_saver_name(Table([1])) == "Specific"
    assert get_registered_saver_name(Other()) == "General"
    assert get_registered_saver_name(object()) is None


def _register_table_saver(log: list, *, strict: bool = True) -> None:
    def save_fn(objects, file_prefix):  # noqa: ANN001, ANN202
        directory = os.path.dirname(file_prefix)
        # The default shards are not written yet: no part bundle, no final index.
        temp_files = [
            n for d in os.listdir(directory) if "_temp_" in d
            for n in os.listdir(os.path.join(directory, d))
        ]
        log.append(("save", sorted(objects), file_prefix, temp_files,
                    os.path.exists(file_prefix.rsplit("-", 1)[0] + ".index")))
        with BundleWriter(file_prefix) as writer:
            for path, table in objects.items():
                writer.add(f"tables/{path}", table.values)
        with open(file_prefix + ".json", "w") as f:
            json.dump(sorted(objects), f)
        return file_prefix

    def restore_fn(objects, merged_prefix):  # noqa: ANN001, ANN202
        log.append(("restore", sorted(objects), merged_prefix))
        with BundleReader(merged_prefix) as reader:
            for path, table in objects.items():
                table.values[...] = reader.read(f"tables/{path}")

    register_checkpoint_saver(
        "TableSaver", lambda o: isinstance(o, Table), save_fn, restore_fn,
        strict_predicate_restore=strict,
    )


def test_g1_save_fn_files_end_up_under_the_final_prefix(prefix, make_holder) -> None:  # noqa: ANN001
    log: list = []
    _register_table_saver(log)
    s, s2 = Table([1, 2]), Table([3])
    holder = make_holder("h")
    saver = MultiDeviceSaver(
        {holder: {"v/.ATTRIBUTES/VARIABLE_VALUE": np.ones(2)}},
        registered_savers={"TableSaver": {"s": s, "s2": s2}},
    )
    saver.save(prefix)
    assert log == [("save", ["s", "s2"], f"{prefix}-TableSaver", [], False)]
    names = sorted(os.listdir(os.path.dirname(prefix)))
    # The returned bundle was merged (its data file renamed, its index folded in); the
    # saver's other file stays under <prefix>-<name>.
    assert names == [
        "ckpt-TableSaver.json", "ckpt.data-00000-of-00002", "ckpt.data-00001-of-00002",
        "ckpt.index",
    ]
    with BundleReader(prefix) as reader:
        assert reader.keys() == ["tables/s", "tables/s2", "v/.ATTRIBUTES/VARIABLE_VALUE"]
        assert reader.entry("tables/s").shard_id == 0  # registered bundles merge first

    s.values[...] = 0
    s2.values[...] = 0
    saver.restore(prefix)
    assert log[-1] == ("restore", ["s", "s2"], prefix)
    np.testing.assert_array_equal(s.values, [1, 2])
    np.testing.assert_array_equal(s2.values, [3])
    assert len(holder.calls) == 1  # the default restore ran too (before restore_fn)


def test_g1_restore_fn_runs_after_the_default_restore(prefix) -> None:  # noqa: ANN001
    order: list[str] = []

    class Recorder:
        def _restore_from_tensors(self, tensors) -> None:  # noqa: ANN001
            order.append("default")

    register_checkpoint_saver(
        "Ordered", lambda o: True, _noop, lambda objects, prefix: order.append("registered")
    )
    saver = MultiDeviceSaver({Recorder(): {"k": np.ones(1)}}, {"Ordered": {"x": Other()}})
    saver.save(prefix)
    saver.restore(prefix)
    assert order == ["default", "registered"]


def test_g1_strict_predicate_restore_raises(prefix) -> None:  # noqa: ANN001
    _register_table_saver([])
    MultiDeviceSaver({}, {"TableSaver": {"s": Table([1])}}).save(prefix)
    with pytest.raises(InvalidArgumentError, match="'s'.*predicate rejects it"):
        MultiDeviceSaver({}, {"TableSaver": {"s": Other()}}).restore(prefix)


def test_g1_non_strict_predicate_restore_skips(prefix) -> None:  # noqa: ANN001
    log: list = []
    _register_table_saver(log, strict=False)
    MultiDeviceSaver({}, {"TableSaver": {"s": Table([1]), "s2": Table([2])}}).save(prefix)
    target = Table([0])
    MultiDeviceSaver({}, {"TableSaver": {"s": Other(), "s2": target}}).restore(prefix)
    assert log[-1] == ("restore", ["s2"], prefix)
    np.testing.assert_array_equal(target.values, [2])


def test_g1_unknown_saver(prefix, caplog) -> None:  # noqa: ANN001
    saver = MultiDeviceSaver({None: {"k": np.ones(1)}}, {"Missing": {"s": Other()}})
    with pytest.raises(NotFoundError, match="'Missing'"):
        saver.save(prefix)
    assert not os.path.exists(prefix + ".index")
    MultiDeviceSaver({None: {"k": np.ones(1)}}).save(prefix)
    with caplog.at_level(logging.WARNING):
        saver.restore(prefix)
    assert "'Missing'" in caplog.text


def test_g1_bad_save_fn_return_value(prefix) -> None:  # noqa: ANN001
    register_checkpoint_saver("Bad", lambda o: True, lambda objects, prefix: 42, _noop)
    with pytest.raises(InvalidArgumentError, match="'Bad' returned 42"):
        MultiDeviceSaver({None: {"k": np.ones(1)}}, {"Bad": {"s": Other()}}).save(prefix)
    assert os.listdir(os.path.dirname(prefix)) == []
