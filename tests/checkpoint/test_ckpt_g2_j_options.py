"""Scenario G2 (lazily computed values), J2 (write callbacks) and the async path of J1."""

from __future__ import annotations

import numpy as np
import pytest
from ckpt_helpers import value_of

from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.errors import CheckpointError
from trackpoint.management.state_file import latest_checkpoint
from trackpoint.saving import CheckpointOptions
from trackpoint.tracking import Trackable, Variable


class _Lazy(Trackable):
    def __init__(self) -> None:
        self.state = np.array([1.0, 2.0])
        self.calls = 0

    def _compute(self) -> np.ndarray:
        self.calls += 1
        return self.state * 10

    def _serialize_to_tensors(self):
        return {"value": self._compute}

    def _restore_from_tensors(self, restored_tensors):
        self.state[...] = np.asarray(restored_tensors["value"]) / 10


def test_g2_callable_values_are_evaluated_once_per_save(tmp_path):
    lazy = _Lazy()
    ckpt = Checkpoint(lazy=lazy)
    path = ckpt.save(tmp_path / "ckpt")
    assert lazy.calls == 1
    ckpt.save(tmp_path / "ckpt")
    assert lazy.calls == 2
    lazy.state[:] = [5.0, 6.0]
    ckpt.restore(path).assert_consumed()
    np.testing.assert_array_equal(lazy.state, [1.0, 2.0])
    assert lazy.calls == 2  # restoring never evaluates the callable


def test_j2_write_callbacks_order_args_and_state_file(tmp_path):
    calls = []
    ckpt = Checkpoint(v=Variable(1.0))
    first = ckpt.save(tmp_path / "ckpt")

    def with_path(path):
        calls.append(("path", path, latest_checkpoint(tmp_path)))
        return "ignored"

    options = CheckpointOptions(write_callbacks=[lambda: calls.append(("none",)), with_path])
    second = ckpt.save(tmp_path / "ckpt", options=options)
    # user callbacks run in order, before the state file names the new checkpoint
    assert calls == [("none",), ("path", second, first)]
    assert latest_checkpoint(tmp_path) == second
    calls.clear()
    written = ckpt.write(tmp_path / "exact", options)
    assert calls == [("none",), ("path", written, second)]
    assert options.write_callbacks[0] is not with_path and len(options.write_callbacks) == 2


def test_j2_callback_with_two_parameters_is_rejected():
    with pytest.raises(ValueError, match="write callback"):
        CheckpointOptions(write_callbacks=[lambda prefix, extra: None])


def test_j1_async_save_snapshots_at_call_time(tmp_path):
    v = Variable([1.0, 2.0])
    ckpt = Checkpoint(v=v)
    done = []
    options = CheckpointOptions(enable_async=True, write_callbacks=[done.append])
    path = ckpt.save(tmp_path / "ckpt", options=options)
    assert path == str(tmp_path / "ckpt-1")
    v.assign([9.0, 9.0])  # after the call: must not reach the file
    ckpt.sync()
    assert done == [path]
    assert latest_checkpoint(tmp_path) == path
    np.testing.assert_array_equal(value_of(path, "v/.ATTRIBUTES/VARIABLE_VALUE"), [1.0, 2.0])
    ckpt.save(tmp_path / "ckpt", options=options)
    ckpt.restore(path).assert_consumed()  # waits for the pending write first
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    assert latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-2")


def test_j1_async_write_error_surfaces_at_sync(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    ckpt = Checkpoint(v=Variable(1.0))
    ckpt.write(blocker / "ckpt", CheckpointOptions(enable_async=True))
    with pytest.raises(CheckpointError):
        ckpt.sync()
    ckpt.sync()  # reported once


def test_registered_saver_through_checkpoint(tmp_path):
    """The graph's registered-saver seam: objects by path, recorded on their nodes (G1)."""
    from trackpoint.management import object_metadata
    from trackpoint.saving import register_checkpoint_saver, unregister_checkpoint_saver

    class Table(Trackable):
        def __init__(self, data):
            self.data = dict(data)

    calls = []

    def save_fn(objects, file_prefix):
        calls.append(("save", sorted(objects), file_prefix))
        for path, table in objects.items():
            (tmp_path / f"{path}.json").write_text(repr(table.data))

    def restore_fn(objects, merged_prefix):
        calls.append(("restore", sorted(objects), merged_prefix))
        for path, table in objects.items():
            table.data = eval((tmp_path / f"{path}.json").read_text())  # noqa: S307 - test data

    register_checkpoint_saver("TestTables", lambda o: isinstance(o, Table), save_fn, restore_fn)
    try:
        ckpt = Checkpoint(s=Table({"a": 1}), s2=Table({"b": 2}), v=Variable(1.0))
        path = ckpt.save(tmp_path / "ckpt")
        assert calls == [("save", ["s", "s2"], f"{path}-TestTables")]
        node = object_metadata(path).nodes[1]
        assert (node.registered_saver.name, node.registered_saver.object_name) == (
            "TestTables", "s")
        fresh = Checkpoint(s=Table({}), s2=Table({}), v=Variable(0.0))
        fresh.restore(path).assert_consumed()
        assert fresh.s.data == {"a": 1} and fresh.s2.data == {"b": 2}
        assert calls[-1] == ("restore", ["s", "s2"], path)
    finally:
        unregister_checkpoint_saver("TestTables")
